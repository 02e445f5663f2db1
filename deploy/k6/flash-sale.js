// Flash sale: one hot SKU, tens of thousands of buyers, STOCK (default 1,000) units.
// setup() creates the event in booking, the product in it (hot: the Redis stock gate answers
// the surplus without a query; only an admission of the product's event may buy it) and the
// waiting room's config. Each buyer (one iteration):
//   login -> join -> poll until admitted
//   -> PUT /api/events/{event}/cart/items/{sku} {"quantity": QTY}
//   -> POST /api/orders {"source": "cart"} with Idempotency-Key
//        201 PENDING_PAYMENT | 409 SOLD_OUT (counted: the expected answer for most buyers)
//   -> POST /api/orders/{id}/pay {"payment_method": "pm_card_visa"} with Idempotency-Key
// teardown() reads the product's counters: sold + reserved + available = stock, never more
// sold than stock. `loadgen verify` checks the same against Postgres and the payment sandbox.
import http from 'k6/http';
import { check } from 'k6';
import { Counter, Trend } from 'k6/metrics';
import exec from 'k6/execution';
import {
  BASE_URL, BOOKING_ADMIN_URL, QUICK, env, num, flag, jsonHeaders, body, code, unexpectedResponse,
  newKey, runId, perEndpoint, login, waitForAdmission, putGatewayConfig, adminRequest, ensureEvent,
  isoAgo,
} from './lib/floodgate.js';

const EVENT = env('EVENT', 'flash');
const STOCK = num('STOCK', 1000);
const PRICE = num('PRICE', 4980);
const QTY = num('QTY', 1);
const PEAK_RATE = num('PEAK_RATE', 100); // buyers arriving per second at the peak
const RAMP = env('RAMP', '10s');
const HOLD = env('HOLD', '50s');
const RAMP_DOWN = env('RAMP_DOWN', '0s');
const ADMIT_PER_MINUTE = num('ADMIT_PER_MINUTE', 60000);
const MAX_WAIT_S = num('MAX_WAIT_S', 300);
const PAY = flag('PAY', '1');
const SETUP = flag('SETUP', '1');

const soldOut = new Counter('sold_out');
const ordersCreated = new Counter('orders_created');
const ordersPaid = new Counter('orders_paid');
const declined = new Counter('payments_declined');
const timeToOrder = new Trend('time_to_order', true);
// Order latency by outcome: a sold-out answer comes from the Redis gate; a created order is a
// Postgres transaction on the one hot inventory row (one durable commit each), so they are
// held to different bounds.
const soldOutAnswer = new Trend('order_sold_out_ms', true);
const orderCreated = new Trend('order_created_ms', true);

export const options = {
  scenarios: {
    buyers: {
      executor: 'ramping-arrival-rate',
      startRate: 1,
      timeUnit: '1s',
      preAllocatedVUs: num('PRE_VUS', 100),
      maxVUs: num('MAX_VUS', 2000),
      stages: [
        { target: PEAK_RATE, duration: RAMP },
        { target: PEAK_RATE, duration: HOLD },
        { target: 0, duration: RAMP_DOWN },
      ],
      gracefulStop: env('GRACEFUL_STOP', '1m'),
    },
  },
  thresholds: Object.assign(
    perEndpoint(['login', 'join', 'status', 'cart', 'order', 'pay']),
    {
      unexpected_responses: ['count<1'],
      http_req_failed: ['rate<0.001'],
      checks: ['rate>0.999'],
      // Never more orders than units (each order here takes QTY units).
      orders_created: [`count<=${Math.floor(STOCK / QTY)}`],
    },
    QUICK
      ? {}
      : {
          // A sold-out answer must be fast: the gate answers it without touching Postgres.
          order_sold_out_ms: ['p(95)<300', 'p(99)<800'],
          // A created order queues on the SKU's inventory row behind the other buyers' commits
          // (one durable commit each): seconds at the peak are expected, a spinner is not.
          order_created_ms: ['p(99)<5000'],
          'http_req_duration{name:cart}': ['p(99)<1000'],
        },
  ),
  summaryTrendStats: ['min', 'med', 'avg', 'p(90)', 'p(95)', 'p(99)', 'max', 'count'],
};

export function setup() {
  const run = runId();
  const sku = env('SKU', `flash-${run}`);
  if (SETUP) {
    ensureEvent({ id: EVENT, name: `Flash sale ${EVENT}`, venue: 'k6', sale_start: isoAgo(60) });
    const res = adminRequest('POST', `${BOOKING_ADMIN_URL}/admin/products`, {
      sku, event: EVENT, name: `Flash sale item ${run}`, price: PRICE, stock: STOCK, hot: true,
    }, 'admin_product');
    if (res.status !== 201 && res.status !== 200) throw new Error(`creating product ${sku}: ${res.status} ${res.body}`);
    putGatewayConfig(EVENT, { sale_start: isoAgo(60), admit_per_minute: ADMIT_PER_MINUTE, mode: env('MODE', 'queue'), max_active: num('MAX_ACTIVE', 0) });
  }
  return { run, sku };
}

export default function (data) {
  const buyer = exec.scenario.iterationInTest;
  const started = Date.now();
  const identity = login(`buyer-${data.run}-${buyer}`, buyer);
  if (!identity) return;
  const adm = waitForAdmission(EVENT, identity, MAX_WAIT_S);
  if (adm.state === 'sold_out') {
    soldOut.add(1, { step: 'queue' });
    return;
  }
  if (adm.state !== 'admitted') return;
  const token = adm.token;

  let res = http.put(`${BASE_URL}/api/events/${EVENT}/cart/items/${data.sku}`, JSON.stringify({ quantity: QTY }), {
    headers: jsonHeaders(token),
    tags: { name: 'cart' },
  });
  if (res.status !== 200 && res.status !== 201) {
    unexpectedResponse(res, 'cart');
    return;
  }
  res = http.post(`${BASE_URL}/api/orders`, JSON.stringify({ source: 'cart' }), {
    headers: jsonHeaders(token, { 'Idempotency-Key': newKey() }),
    tags: { name: 'order' },
  });
  if (res.status === 409 && code(res) === 'SOLD_OUT') {
    soldOut.add(1, { step: 'order' });
    soldOutAnswer.add(res.timings.duration);
    return;
  }
  if (res.status !== 201) {
    unexpectedResponse(res, 'order');
    return;
  }
  orderCreated.add(res.timings.duration);
  const order = body(res);
  ordersCreated.add(1);
  timeToOrder.add(Date.now() - started);
  check(order, { 'order pending payment at the snapshot price': (o) => o.status === 'PENDING_PAYMENT' && o.total === PRICE * QTY });
  if (!PAY) return;
  res = http.post(`${BASE_URL}/api/orders/${order.id}/pay`, JSON.stringify({ payment_method: env('PAYMENT_METHOD', 'pm_card_visa') }), {
    headers: jsonHeaders(token, { 'Idempotency-Key': newKey() }),
    tags: { name: 'pay' },
  });
  if (res.status === 402) {
    declined.add(1);
    return;
  }
  if (res.status !== 200) {
    unexpectedResponse(res, 'pay');
    return;
  }
  if (check(body(res), { 'order paid': (p) => p.status === 'PAID' })) ordersPaid.add(1);
}

export function teardown(data) {
  if (!SETUP) return;
  const res = adminRequest('GET', `${BOOKING_ADMIN_URL}/admin/products/${data.sku}`, undefined, 'admin_product');
  if (res.status !== 200) {
    unexpectedResponse(res, 'admin_product');
    return;
  }
  const p = body(res);
  console.log(`product ${data.sku}: ${JSON.stringify(p)}`);
  check(p, {
    'stock is conserved (available + reserved + sold = stock)': (x) => x.available + x.reserved + x.sold === STOCK,
    'never sold more than stock': (x) => x.sold <= STOCK,
  });
}

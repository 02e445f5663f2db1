// Launch surge: fans arrive at a ramping rate, wait in the virtual waiting room, and the
// admitted ones buy seats. Each fan (one k6 iteration):
//   dev login (or a real token from LOGIN_TOKENS_FILE) -> POST /queue/{event}/join
//   -> GET /queue/{event}/status, honouring poll_after_ms, until admitted (admission token)
//   -> GET /api/events/{event}/seats (cached per VU for SEAT_CACHE_MS)
//   -> POST /api/events/{event}/holds (on 409 SEAT_TAKEN retry other seats, HOLD_RETRIES times)
//   -> POST /api/orders {"hold_id"} with Idempotency-Key
//   -> POST /api/orders/{id}/pay {"payment_method": "pm_card_visa"} with Idempotency-Key
//
// Full profile of the design seed (2,000,000 arrivals in 10 minutes for 60,000 seats):
//   PEAK_RATE=4200 RAMP=2m HOLD=6m RAMP_DOWN=2m SEATS=60000 ADMIT_PER_MINUTE=30000
//   (4200/s x (60 s + 360 s + 60 s) = 2.0 M arrivals). See README.md for VU sizing.
//
// Registered-room profile (ACCESS=registered): setup() makes the room registered-only and
// uploads the accounts of the expected arrivals (PUT /admin/events/{event}/registrations,
// REGISTER_BATCH ids per upload) except every UNREGISTERED_EVERY-th fan, who must be refused
// with 403 NOT_REGISTERED (counted in `not_registered`; any other answer fails the run).
import http from 'k6/http';
import { check, fail } from 'k6';
import { Counter, Trend } from 'k6/metrics';
import exec from 'k6/execution';
import {
  BASE_URL, GATEWAY_ADMIN_URL, ADMIN_TOKEN, QUICK, env, num, flag, jsonHeaders, body, code, unexpectedResponse, newKey, runId, perEndpoint,
  login, waitForAdmission, ensureEvent, putGatewayConfig, seatMap, isoAgo, bookingEvent,
} from './lib/floodgate.js';

const EVENT = env('EVENT', 'demo');
const PEAK_RATE = num('PEAK_RATE', 50); // arrivals per second at the peak
const START_RATE = num('START_RATE', 1);
const RAMP = env('RAMP', '20s');
const HOLD = env('HOLD', '40s');
const RAMP_DOWN = env('RAMP_DOWN', '10s');
const SEATS = num('SEATS', 2000); // seats of the event created by setup (if it does not exist)
const SEATS_PER_FAN = num('SEATS_PER_FAN', 2);
const HOLD_RETRIES = num('HOLD_RETRIES', 3);
const SEAT_CACHE_MS = num('SEAT_CACHE_MS', 1000);
const MAX_WAIT_S = num('MAX_WAIT_S', 900); // a fan gives up after this long in the queue
const PAY = flag('PAY', '1');
const PAYMENT_METHOD = env('PAYMENT_METHOD', 'pm_card_visa');
const SETUP = flag('SETUP', '1'); // create the event / set the gateway config in setup()
const ADMIT_PER_MINUTE = num('ADMIT_PER_MINUTE', 3000);
const MAX_ACTIVE = num('MAX_ACTIVE', 0);
const PRE_VUS = num('PRE_VUS', 100);
const REGISTERED = env('ACCESS', 'open') === 'registered';
const UNREGISTERED_EVERY = num('UNREGISTERED_EVERY', 10); // 0: everyone is registered
const REGISTER_BATCH = num('REGISTER_BATCH', 100000);
const MAX_VUS = num('MAX_VUS', 2000);

const timeToTicket = new Trend('time_to_ticket', true);
const soldOut = new Counter('sold_out');
const seatTaken = new Counter('seat_taken');
const ticketsBought = new Counter('tickets');
const ordersPaid = new Counter('orders_paid');
const declined = new Counter('payments_declined');
const noSeatAfterRetries = new Counter('hold_gave_up');
const notRegistered = new Counter('not_registered');
const uploadMs = new Trend('registration_upload_ms', true);

// Seconds in a k6 duration such as '20s', '2m', '1m30s'.
function seconds(d) {
  let total = 0;
  for (const [, n, u] of String(d).matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h)/g)) {
    total += Number(n) * { ms: 0.001, s: 1, m: 60, h: 3600 }[u];
  }
  return total;
}

// Arrivals the ramping-arrival-rate stages produce (trapezoids), with 10 % to spare.
function expectedArrivals() {
  const up = ((START_RATE + PEAK_RATE) / 2) * seconds(RAMP);
  const flat = PEAK_RATE * seconds(HOLD);
  const down = (PEAK_RATE / 2) * seconds(RAMP_DOWN);
  return Math.ceil((up + flat + down) * 1.1) + 10;
}

function isRegistered(fan) {
  return !(UNREGISTERED_EVERY > 0 && fan % UNREGISTERED_EVERY === UNREGISTERED_EVERY - 1);
}

// Uploads the registered fans' accounts in batches (mode=add: idempotent, any order).
function uploadRegistrations(run) {
  const total = expectedArrivals();
  let registered = 0;
  for (let from = 0; from < total; from += REGISTER_BATCH) {
    const ids = [];
    for (let i = from; i < Math.min(total, from + REGISTER_BATCH); i++) {
      if (isRegistered(i)) ids.push(`fan-${run}-${i}`);
    }
    const res = http.put(`${GATEWAY_ADMIN_URL}/admin/events/${EVENT}/registrations?mode=add`, ids.join('\n') + '\n', {
      headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'text/plain' },
      tags: { name: 'admin_registrations' },
      timeout: '120s',
    });
    if (res.status !== 200) fail(`uploading registrations: ${res.status} ${res.body}`);
    uploadMs.add(res.timings.duration);
    registered += ids.length;
  }
  console.log(`registered ${registered} of ${total} expected fans for ${EVENT}`);
}

// An unregistered fan's join: refused, with nothing to wait for.
function refusedJoin(identity) {
  const res = http.post(`${BASE_URL}/queue/${EVENT}/join`, null, {
    headers: jsonHeaders(identity),
    tags: { name: 'join' },
    responseCallback: http.expectedStatuses(403),
  });
  if (res.status === 403 && code(res) === 'NOT_REGISTERED') {
    notRegistered.add(1);
    return;
  }
  unexpectedResponse(res, 'join');
}

const timing = QUICK
  ? {}
  : {
      // Slow holds: the seat pick must feel instant even at the peak.
      'http_req_duration{name:hold}': ['p(95)<500', 'p(99)<1000'],
      // The waiting room itself: a status poll is one Redis round trip.
      'http_req_duration{name:status}': ['p(99)<50'],
      'http_req_duration{name:join}': ['p(99)<100'],
      'http_req_duration{name:order}': ['p(95)<800'],
    };

export const options = {
  scenarios: {
    surge: {
      executor: 'ramping-arrival-rate',
      startRate: START_RATE,
      timeUnit: '1s',
      preAllocatedVUs: PRE_VUS,
      maxVUs: MAX_VUS,
      stages: [
        { target: PEAK_RATE, duration: RAMP },
        { target: PEAK_RATE, duration: HOLD },
        { target: 0, duration: RAMP_DOWN },
      ],
      gracefulStop: env('GRACEFUL_STOP', '2m'),
    },
  },
  thresholds: Object.assign(
    perEndpoint(['login', 'join', 'status', 'seats', 'hold', 'order', 'pay']),
    {
      // Any answer the flow does not expect (5xx, 401, 429, a malformed 4xx) fails the run.
      unexpected_responses: ['count<1'],
      // 2xx/409 are expected answers; this catches transport errors and everything else.
      http_req_failed: ['rate<0.001'],
      checks: ['rate>0.999'],
    },
    timing,
    // The registered-room profile must have met (and refused) its unregistered fans.
    REGISTERED && UNREGISTERED_EVERY > 0 ? { not_registered: ['count>0'] } : {},
  ),
  summaryTrendStats: ['min', 'med', 'avg', 'p(90)', 'p(95)', 'p(99)', 'max', 'count'],
};

export function setup() {
  if (SETUP) {
    ensureEvent({
      id: EVENT,
      name: `Launch surge ${EVENT}`,
      venue: 'k6',
      sale_start: isoAgo(60),
      hold_ttl_s: num('HOLD_TTL_S', 600),
      max_tickets_per_account: Math.max(4, SEATS_PER_FAN),
      price_tiers: [{ tier: 'A', price: 12000 }, { tier: 'B', price: 8000 }],
      seat_map: seatMap(SEATS),
      ga_tiers: [],
    });
    const room = {
      sale_start: isoAgo(60),
      admit_per_minute: ADMIT_PER_MINUTE,
      mode: env('MODE', 'queue'),
      max_active: MAX_ACTIVE,
    };
    if (REGISTERED) Object.assign(room, { access: 'registered', registration_closes: isoAgo(61) });
    putGatewayConfig(EVENT, room);
  }
  const run = runId();
  if (SETUP && REGISTERED) uploadRegistrations(run);
  const before = SETUP ? bookingEvent(EVENT) : null;
  return { run, before };
}

// Per-VU seat map cache: {at, free: [seat ids]}.
let cache = { at: 0, free: [] };

function freeSeats(token) {
  if (Date.now() - cache.at < SEAT_CACHE_MS && cache.free.length > 0) return cache.free;
  const res = http.get(`${BASE_URL}/api/events/${EVENT}/seats`, { headers: jsonHeaders(token), tags: { name: 'seats' } });
  if (res.status !== 200) {
    unexpectedResponse(res, 'seats');
    return null;
  }
  const seats = body(res).seats || [];
  cache = { at: Date.now(), free: seats.filter((s) => s.status === 'available').map((s) => s.seat_id) };
  return cache.free;
}

// Picks n seats: side by side in the seat map order where possible, from a random start.
function pick(free, n) {
  if (free.length < n) return free.slice();
  const start = Math.floor(Math.random() * (free.length - n + 1));
  return free.slice(start, start + n);
}

function forget(seats) {
  const gone = new Set(seats);
  cache.free = cache.free.filter((s) => !gone.has(s));
}

function hold(token) {
  for (let attempt = 0; attempt <= HOLD_RETRIES; attempt++) {
    const free = freeSeats(token);
    if (free === null) return { error: true };
    if (free.length === 0) {
      if (Date.now() - cache.at < SEAT_CACHE_MS) {
        // The cached map says nothing is left; look again once before calling it sold out.
        cache.at = 0;
        const fresh = freeSeats(token);
        if (fresh === null) return { error: true };
        if (fresh.length === 0) return { soldOut: true };
      } else {
        return { soldOut: true };
      }
    }
    const want = pick(cache.free, SEATS_PER_FAN);
    const res = http.post(`${BASE_URL}/api/events/${EVENT}/holds`, JSON.stringify({ seats: want }), {
      headers: jsonHeaders(token),
      tags: { name: 'hold' },
    });
    if (res.status === 201) {
      forget(want);
      return { hold: body(res) };
    }
    const c = code(res);
    if (res.status === 409 && c === 'SEAT_TAKEN') {
      seatTaken.add(1);
      forget(body(res).seats || want);
      continue;
    }
    if (res.status === 409 && c === 'SOLD_OUT') return { soldOut: true };
    unexpectedResponse(res, 'hold');
    return { error: true };
  }
  noSeatAfterRetries.add(1);
  return { gaveUp: true };
}

export default function (data) {
  const fan = exec.scenario.iterationInTest;
  const account = `fan-${data.run}-${fan}`;
  const started = Date.now();

  const identity = login(account, fan);
  if (!identity) return;
  if (REGISTERED && !isRegistered(fan)) {
    refusedJoin(identity);
    return;
  }
  const adm = waitForAdmission(EVENT, identity, MAX_WAIT_S);
  if (adm.state === 'sold_out') {
    soldOut.add(1, { step: 'queue' });
    return;
  }
  if (adm.state !== 'admitted') return;
  const token = adm.token;

  const h = hold(token);
  if (h.soldOut) {
    soldOut.add(1, { step: 'hold' });
    return;
  }
  if (!h.hold) return;
  check(h.hold, { 'hold has id and seats': (x) => !!x.hold_id && x.seats.length === SEATS_PER_FAN });

  const orderKey = newKey();
  let res = http.post(`${BASE_URL}/api/orders`, JSON.stringify({ hold_id: h.hold.hold_id }), {
    headers: jsonHeaders(token, { 'Idempotency-Key': orderKey }),
    tags: { name: 'order' },
  });
  if (res.status !== 201) {
    unexpectedResponse(res, 'order');
    return;
  }
  const order = body(res);
  check(order, { 'order pending payment': (o) => o.status === 'PENDING_PAYMENT' && o.total > 0 });
  if (!PAY) return;

  const payKey = newKey();
  res = http.post(`${BASE_URL}/api/orders/${order.id}/pay`, JSON.stringify({ payment_method: PAYMENT_METHOD }), {
    headers: jsonHeaders(token, { 'Idempotency-Key': payKey }),
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
  const paid = body(res);
  if (check(paid, { 'order paid with tickets': (p) => p.status === 'PAID' && (p.tickets || []).length === SEATS_PER_FAN })) {
    ordersPaid.add(1);
    ticketsBought.add(SEATS_PER_FAN);
    timeToTicket.add(Date.now() - started);
  }
}

export function teardown(data) {
  if (!SETUP) return;
  // Report the event's counts; the invariant checks against Postgres and the payment
  // sandbox are `loadgen verify` (run by deploy/bench/run after every script).
  const after = bookingEvent(EVENT);
  if (after) console.log(`event ${EVENT}: ${JSON.stringify({ before: data.before, after })}`);
}

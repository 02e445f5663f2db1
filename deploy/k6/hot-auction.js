// Hot auction: thousands of bidders in the last minute of one auction. setup() creates the
// event in booking (an auction belongs to an event, and only an admission of that event may
// create it, bid on it or watch it) and the auction (ending DURATION_S from now) through the
// public API with a seller's admission;
// every VU is one bidder who gets admitted once, then bids increasing amounts until the
// auction closes:
//   POST /api/auctions/{id}/bids {"amount"} with a fresh Idempotency-Key per bid
//   201 accepted | 409 BID_TOO_LOW (counted, not failed: someone outbid us; the body carries
//   min_next_bid) | 409 AUCTION_CLOSED (the end; stop) | 200 replay (only after our own retry).
// A bid whose answer is lost (transport error), or that is answered 503 with Retry-After, is
// retried once with the SAME key: the server must answer with the original result (200
// replay) or place it exactly once.
//
// Invariants (final price = highest accepted bid, no bid after the end, bids in Postgres
// = accepted answers) are checked by `loadgen verify` against Postgres after the run.
import http from 'k6/http';
import { check, sleep } from 'k6';
import { Counter, Trend } from 'k6/metrics';
import exec from 'k6/execution';
import {
  BASE_URL, QUICK, env, num, flag, jsonHeaders, body, code, unexpectedResponse, newKey, runId, perEndpoint,
  login, waitForAdmission, putGatewayConfig, ensureEvent, isoAgo, isoIn,
} from './lib/floodgate.js';

const EVENT = env('EVENT', 'auction-day'); // the auction's event and the waiting room bidders pass through
const BIDDERS = num('BIDDERS', 200);
const DURATION_S = num('DURATION_S', 60); // the auction ends this long after setup
const HOT = flag('HOT', '1'); // Redis Lua path (hot) or the Postgres conditional UPDATE (cold)
const START_PRICE = num('START_PRICE', 1000);
const MIN_INCREMENT = num('MIN_INCREMENT', 10);
// Anti-sniping extends the end by 2 minutes per late leading bid, up to this many times.
const MAX_EXTENSIONS = num('MAX_EXTENSIONS', 0);
// Mean pause between one bidder's bids (uniform in [0.5, 1.5] x this). The booking service
// limits a bidder to 5 bids/s; keep this above 250 ms or 429s appear (and fail the run).
const BID_INTERVAL_MS = num('BID_INTERVAL_MS', 1000);
const AUCTION_ID = env('AUCTION_ID', ''); // bid on an existing auction instead of creating one
const SETUP = flag('SETUP', '1');

const accepted = new Counter('bids_accepted');
const tooLow = new Counter('bids_too_low');
const afterClose = new Counter('bids_after_close');
const replays = new Counter('bid_replays');
const busyRetries = new Counter('bids_retried_after_503');
const acceptedAmount = new Trend('accepted_bid_amount');
const finalPrice = new Trend('final_price');

const maxDuration = `${DURATION_S + MAX_EXTENSIONS * 120 + 60}s`;

export const options = {
  scenarios: {
    bidders: {
      executor: 'per-vu-iterations',
      vus: BIDDERS,
      iterations: 1,
      maxDuration,
    },
  },
  thresholds: Object.assign(
    perEndpoint(['login', 'join', 'status', 'bid']),
    {
      unexpected_responses: ['count<1'],
      http_req_failed: ['rate<0.001'],
      checks: ['rate>0.999'],
      // The auction actually took bids (a run where every bid bounced proves nothing).
      bids_accepted: ['count>0'],
    },
    QUICK
      ? {}
      : {
          'http_req_duration{name:bid}': ['p(95)<200', 'p(99)<500'],
        },
  ),
  summaryTrendStats: ['min', 'med', 'avg', 'p(90)', 'p(95)', 'p(99)', 'max', 'count'],
};

function admit(account) {
  const identity = login(account, 0);
  if (!identity) return null;
  const adm = waitForAdmission(EVENT, identity, DURATION_S);
  return adm.state === 'admitted' ? adm.token : null;
}

export function setup() {
  const run = runId();
  if (SETUP) {
    ensureEvent({ id: EVENT, name: `Auction day ${EVENT}`, venue: 'k6', sale_start: isoAgo(60) });
    // Bidders are admitted at once: this scenario measures bidding, not queueing.
    putGatewayConfig(EVENT, { sale_start: isoAgo(60), admit_per_minute: 100000, mode: env('MODE', 'passthrough'), max_active: 0 });
  }
  const sellerToken = admit(`seller-${run}`);
  if (!sellerToken) throw new Error('the seller was not admitted; is the gateway config for EVENT set?');
  let auction;
  if (AUCTION_ID) {
    const res = http.get(`${BASE_URL}/api/auctions/${AUCTION_ID}`, { headers: jsonHeaders(sellerToken), tags: { name: 'auction' } });
    if (res.status !== 200) throw new Error(`auction ${AUCTION_ID}: ${res.status} ${res.body}`);
    auction = body(res);
  } else {
    const res = http.post(
      `${BASE_URL}/api/auctions`,
      JSON.stringify({
        event: EVENT,
        title: `k6 hot auction ${run}`,
        start_price: START_PRICE,
        min_increment: MIN_INCREMENT,
        end_time: isoIn(DURATION_S),
        hot: HOT,
        max_extensions: MAX_EXTENSIONS,
      }),
      { headers: jsonHeaders(sellerToken, { 'Idempotency-Key': newKey() }), tags: { name: 'create_auction' } },
    );
    if (res.status !== 201) throw new Error(`creating the auction: ${res.status} ${res.body}`);
    auction = body(res);
  }
  console.log(`auction ${auction.id} (hot=${auction.hot}) ends ${auction.end_time}`);
  return { run, auction: auction.id, sellerToken, increment: MIN_INCREMENT, start: auction.current_price || START_PRICE };
}

function placeBid(data, token, amount) {
  const key = newKey();
  const params = { headers: jsonHeaders(token, { 'Idempotency-Key': key }), tags: { name: 'bid' } };
  const url = `${BASE_URL}/api/auctions/${data.auction}/bids`;
  const payload = JSON.stringify({ amount });
  // A retry carries the same key, so the bid lands at most once: 200 is the landed bid's replay.
  const again = () => {
    const r = http.post(url, payload, params);
    if (r.status === 200) replays.add(1);
    return r;
  };
  let res = http.post(url, payload, params);
  // The answer was lost.
  if (res.status === 0) res = again();
  if (res.status === 503) {
    // Booking could not decide in time (say its Redis answered after the 1 s response
    // timeout) and says when to come back: a bidding client retries once, after Retry-After.
    // A second 503 is unexpected.
    busyRetries.add(1);
    sleep(Math.min(Number(res.headers['Retry-After'] || 1), 5));
    res = again();
  }
  return res;
}

export default function (data) {
  const bidder = exec.vu.idInTest;
  const token = admit(`bidder-${data.run}-${bidder}`);
  if (!token) return;
  // What this bidder believes the minimum next bid is; refreshed from every answer.
  let minNext = data.start + data.increment;
  for (;;) {
    // Bid the minimum, or a little more (up to 3 increments) as eager bidders do.
    const amount = minNext + data.increment * Math.floor(Math.random() * 3);
    const res = placeBid(data, token, amount);
    const b = body(res);
    if (res.status === 201 || res.status === 200) {
      accepted.add(1);
      acceptedAmount.add(b.amount);
      check(b, { 'accepted bid leads at its amount': (x) => x.status === 'ACCEPTED' && x.current_price === amount && x.amount === amount });
      minNext = b.amount + data.increment;
    } else if (res.status === 409 && code(res) === 'BID_TOO_LOW') {
      tooLow.add(1);
      check(b, { 'too-low answer names the next minimum': (x) => x.min_next_bid > amount || x.current_price >= amount });
      minNext = Math.max(minNext, Number(b.min_next_bid || 0));
    } else if (res.status === 409 && code(res) === 'AUCTION_CLOSED') {
      afterClose.add(1);
      return;
    } else {
      unexpectedResponse(res, 'bid');
      return;
    }
    sleep((BID_INTERVAL_MS * (0.5 + Math.random())) / 1000);
  }
}

export function teardown(data) {
  // Wait for the closer (it runs every second), then report the final state.
  for (let i = 0; i < 30; i++) {
    const res = http.get(`${BASE_URL}/api/auctions/${data.auction}`, { headers: jsonHeaders(data.sellerToken), tags: { name: 'auction' } });
    if (res.status !== 200) {
      unexpectedResponse(res, 'auction');
      return;
    }
    const a = body(res);
    if (a.status === 'CLOSED') {
      finalPrice.add(a.current_price);
      check(a, { 'closed auction has a leader': (x) => x.leader !== null && x.current_price >= data.start });
      console.log(`auction ${data.auction} closed: price ${a.current_price}, leader ${a.leader}, bids ${a.bid_count}`);
      return;
    }
    sleep(1);
  }
  check(null, { 'auction closed after its end': () => false });
}

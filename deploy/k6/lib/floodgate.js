// Shared pieces of the Floodgate k6 scripts: configuration from the environment, the fan's
// path through the waiting room (login -> join -> poll -> admitted), admin calls for setup,
// and the conventions every script follows:
//   - every request carries a `name` tag (login, join, status, seats, hold, order, pay, ...)
//     so thresholds and the summary are per endpoint;
//   - 2xx and 409 are "expected" answers (a 409 is a business outcome: SEAT_TAKEN, SOLD_OUT,
//     BID_TOO_LOW); anything else is counted in `unexpected_responses` with its code, and
//     the scripts' thresholds fail the run on it;
//   - nothing here sleeps for a fixed time hoping the server is ready: polling follows the
//     server's own `poll_after_ms`.
import http from 'k6/http';
import { sleep, fail } from 'k6';
import { Counter, Trend } from 'k6/metrics';
import { SharedArray } from 'k6/data';

export const env = (name, dflt) => (__ENV[name] !== undefined && __ENV[name] !== '' ? __ENV[name] : dflt);
export const num = (name, dflt) => {
  const v = Number(env(name, dflt));
  if (!Number.isFinite(v)) fail(`${name} must be a number, got ${__ENV[name]}`);
  return v;
};
export const flag = (name, dflt) => ['1', 'true', 'yes'].includes(String(env(name, dflt)).toLowerCase());

export const BASE_URL = env('BASE_URL', 'http://127.0.0.1:8080');
export const GATEWAY_ADMIN_URL = env('GATEWAY_ADMIN_URL', 'http://127.0.0.1:8081');
export const BOOKING_ADMIN_URL = env('BOOKING_ADMIN_URL', 'http://127.0.0.1:8090');
export const ADMIN_TOKEN = env('ADMIN_TOKEN', '');
// QUICK=1: the CI smoke profile. Invariant-style thresholds stay; timing thresholds go
// (a shared 2-core CI box makes timings noise).
export const QUICK = flag('QUICK', '0');

// 2xx and 409 are answers the scripts handle; everything else marks the request failed.
http.setResponseCallback(http.expectedStatuses({ min: 200, max: 299 }, 409));

export const unexpected = new Counter('unexpected_responses');
export const rateLimited = new Counter('rate_limited');
export const timeInQueue = new Trend('time_in_queue', true);
export const abandoned = new Counter('abandoned_fans');

// Real login tokens instead of dev login: LOGIN_TOKENS_FILE, one identity JWT per line
// (minted by the site's login for test accounts). Fan i uses line i modulo the count.
const loginTokens = new SharedArray('login tokens', () => {
  const f = env('LOGIN_TOKENS_FILE', '');
  if (!f) return [];
  return open(f).split('\n').map((l) => l.trim()).filter((l) => l.length > 0);
});

// Always-true thresholds on each endpoint's latency: k6 only breaks a metric down by tag
// (in the summary and in --summary-export) when a threshold names that sub-metric. The real
// timing thresholds of a script replace these for the endpoints they cover.
export function perEndpoint(names) {
  const t = {};
  for (const n of names) t[`http_req_duration{name:${n}}`] = ['max>=0'];
  return t;
}

export function jsonHeaders(token, extra) {
  const h = { 'Content-Type': 'application/json' };
  if (token) h.Authorization = `Bearer ${token}`;
  return Object.assign(h, extra || {});
}

export function body(res) {
  try {
    return res.json();
  } catch (_) {
    return {};
  }
}

export function code(res) {
  const b = body(res);
  return b && typeof b === 'object' && !Array.isArray(b) ? b.code : undefined;
}

// Records a response that none of the script's branches expected; the first few per VU are
// logged with their body (LOG_UNEXPECTED per VU, default 3) so a failed run says why.
const LOG_UNEXPECTED = Number(env('LOG_UNEXPECTED', 3));
let logged = 0;
export function unexpectedResponse(res, step) {
  if (res.status === 429) rateLimited.add(1, { step });
  unexpected.add(1, { step, status: String(res.status), code: String(code(res) || '') });
  if (logged < LOG_UNEXPECTED) {
    logged++;
    console.warn(`unexpected answer at ${step}: ${res.status} ${res.error || ''} ${String(res.body || '').slice(0, 300)}`);
  }
}

export function newKey() {
  return crypto.randomUUID();
}

// A run id keeps account names of repeated runs against the same event apart (an account that
// already holds tickets from an earlier run would hit the per-account limit).
export function runId() {
  return `${Date.now().toString(36)}${Math.floor(Math.random() * 1296).toString(36)}`;
}

// The fan's identity token: dev login (local stack) or a real token from LOGIN_TOKENS_FILE.
export function login(account, fanIndex) {
  if (loginTokens.length > 0) return loginTokens[fanIndex % loginTokens.length];
  const res = http.post(`${BASE_URL}/dev/login`, JSON.stringify({ account }), {
    headers: jsonHeaders(),
    tags: { name: 'login' },
  });
  if (res.status !== 200) {
    unexpectedResponse(res, 'login');
    return null;
  }
  return body(res).token;
}

// Join, then poll status as told by `poll_after_ms` until admitted.
// Returns {state: 'admitted', token, queuedMs} | {state: 'sold_out'|'closed'|'gave_up'|'error'}.
export function waitForAdmission(event, identity, maxWaitS) {
  const started = Date.now();
  const hdr = { headers: jsonHeaders(identity), tags: { name: 'join' } };
  let res = http.post(`${BASE_URL}/queue/${event}/join`, null, hdr);
  if (res.status === 409) {
    const c = code(res);
    return { state: c === 'SOLD_OUT' ? 'sold_out' : 'closed' };
  }
  if (res.status !== 200 && res.status !== 201) {
    unexpectedResponse(res, 'join');
    return { state: 'error' };
  }
  let b = body(res);
  let rejoined = false;
  // The join's place receipt, shown on status polls: the gateway then answers a waiting
  // fan from memory instead of Redis (a browser sends it as the fg_place cookie).
  let receipt = b.receipt;
  for (;;) {
    if (b.receipt) receipt = b.receipt;
    if (b.state === 'admitted' && b.token) {
      const queuedMs = Date.now() - started;
      timeInQueue.add(queuedMs);
      return { state: 'admitted', token: b.token, queuedMs };
    }
    if (b.state === 'sold_out' || b.state === 'closed') return { state: b.state };
    if ((Date.now() - started) / 1000 > maxWaitS) {
      abandoned.add(1);
      return { state: 'gave_up' };
    }
    // Admitted by the join itself (passthrough) comes without a token: the status call
    // mints it. Otherwise wait as long as the server asks.
    const waitMs = b.state === 'admitted' ? 0 : Number(b.poll_after_ms || 1000);
    if (waitMs > 0) sleep(waitMs / 1000);
    const statusHeaders = jsonHeaders(identity);
    if (receipt) statusHeaders['X-Floodgate-Place'] = receipt;
    res = http.get(`${BASE_URL}/queue/${event}/status`, { headers: statusHeaders, tags: { name: 'status' } });
    if (res.status === 429) {
      // Over the poll budget: honour Retry-After, as the waiting page does.
      rateLimited.add(1, { step: 'status' });
      sleep(Number(res.headers['Retry-After'] || 1));
      b = { state: 'waiting', poll_after_ms: 0 };
      continue;
    }
    if (res.status !== 200) {
      unexpectedResponse(res, 'status');
      return { state: 'error' };
    }
    b = body(res);
    if (b.state === 'expired' && !rejoined) {
      // The admission was not claimed in time (a slow VU): join again once.
      rejoined = true;
      res = http.post(`${BASE_URL}/queue/${event}/join`, null, hdr);
      if (res.status !== 200 && res.status !== 201) {
        unexpectedResponse(res, 'join');
        return { state: 'error' };
      }
      b = body(res);
    } else if (b.state === 'expired') {
      return { state: 'gave_up' };
    }
  }
}

// ---- admin (setup) ----------------------------------------------------------------------

function requireAdminToken() {
  if (!ADMIN_TOKEN) fail('ADMIN_TOKEN is required for setup (the admin secret: FLOODGATE_ADMIN_TOKEN or .stack/admin_token)');
}

export function adminRequest(method, url, payload, name) {
  requireAdminToken();
  return http.request(method, url, payload === undefined ? null : JSON.stringify(payload), {
    headers: jsonHeaders(ADMIN_TOKEN),
    tags: { name: name || 'admin' },
    responseCallback: http.expectedStatuses({ min: 200, max: 499 }),
  });
}

// Creates the event in booking unless it exists (then its current counts are reported).
export function ensureEvent(spec) {
  const got = adminRequest('GET', `${BOOKING_ADMIN_URL}/admin/events/${spec.id}`, undefined, 'admin_event');
  if (got.status === 200) return body(got);
  const res = adminRequest('POST', `${BOOKING_ADMIN_URL}/admin/events`, spec, 'admin_event');
  if (res.status !== 201) fail(`creating event ${spec.id}: ${res.status} ${res.body}`);
  return body(res);
}

export function bookingEvent(id) {
  const res = adminRequest('GET', `${BOOKING_ADMIN_URL}/admin/events/${id}`, undefined, 'admin_event');
  return res.status === 200 ? body(res) : null;
}

// Sets the gateway's waiting-room config for an event (absolute PUT, so re-running is fine).
export function putGatewayConfig(event, cfg) {
  const res = adminRequest('PUT', `${GATEWAY_ADMIN_URL}/admin/events/${event}/config`, cfg, 'admin_config');
  if (res.status !== 200) fail(`gateway config for ${event}: ${res.status} ${res.body}`);
  return body(res);
}

// A seat map of `seats` seats in sections of 50 rows x 50 seats (the last one shorter),
// alternating price tiers A and B.
export function seatMap(seats) {
  const perRow = 50;
  const rows = Math.ceil(seats / perRow);
  const sections = [];
  let left = rows;
  for (let i = 1; left > 0; i++) {
    const r = Math.min(50, left);
    sections.push({ name: `S${i}`, rows: r, seats_per_row: perRow, price_tier: i % 2 ? 'A' : 'B' });
    left -= r;
  }
  return { sections };
}

export function isoAgo(seconds) {
  return new Date(Date.now() - seconds * 1000).toISOString();
}

export function isoIn(seconds) {
  return new Date(Date.now() + seconds * 1000).toISOString();
}

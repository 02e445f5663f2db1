#!/usr/bin/env bash
# The OpenAPI documents against the running stack (issue 18), run by .ci/run:
#
#  1. docs/openapi/*.json are generated from the code (utoipa) and checked equal to what is
#     committed by `cargo test` (booking/tests/api/openapi.rs, gateway/tests/openapi.rs);
#  2. a private stack (`deploy/stack up` on its own ports and state directory, the binaries of
#     this checkout's target directory) serves them unchanged at GET /openapi.json: booking,
#     the gateway's public listener and its admin listener;
#  3. schemathesis (pinned by hash, deploy/openapi/requirements.txt) generates requests from
#     each document — valid and invalid bodies, parameters, headers — with real credentials
#     (an admin operator's credential, a fan's identity token and an admission token of the demo event) and
#     runs every check (`--checks all`): no 5xx, only documented status codes, bodies and
#     headers as documented, and the data checks: a request the document forbids is refused
#     (negative_data_rejection) and one it allows is not refused as invalid
#     (positive_data_acceptance).
#
# Bounded: OPENAPI_MAX_EXAMPLES cases per operation and phase (default 25) and a fixed seed so
# a failure reproduces (OPENAPI_SEED). Path parameters `event` are the demo event's id, so the
# fan endpoints get past WRONG_EVENT. Each document's full report stays in
# target/openapi/last/. Prints PASS or FAIL.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STARTED=$SECONDS
say() { printf '[openapi] %s\n' "$*" >&2; }

VENV="$ROOT/target/openapi/venv"
REQ="$ROOT/deploy/openapi/requirements.txt"
MAX_EXAMPLES="${OPENAPI_MAX_EXAMPLES:-25}"
SEED="${OPENAPI_SEED:-20261202}"
REPORTS="$ROOT/target/openapi/last"

if [ ! -x "$VENV/bin/schemathesis" ] || ! cmp -s "$REQ" "$VENV/requirements.txt"; then
  say "installing schemathesis (pinned by hash) into target/openapi/venv"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  if ! PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install -q --require-hashes -r "$REQ"; then
    rm -rf "$VENV"
    say "error: could not install deploy/openapi/requirements.txt (PyPI reachable?)"
    exit 1
  fi
  cp "$REQ" "$VENV/requirements.txt"
fi

TMP="$(mktemp -d /tmp/fg-openapi.XXXXXX)"
cleanup() {
  local rc=$?
  set +e
  FLOODGATE_STACK_DIR="$TMP/stack" "$ROOT/deploy/stack" down >/dev/null 2>&1
  if [ "$rc" != 0 ] && [ -d "$TMP/stack/logs" ]; then
    for f in "$TMP"/stack/logs/*.log; do say "--- $f"; tail -20 "$f" >&2; done
  fi
  rm -rf "$TMP"
  if [ "$rc" = 0 ]; then echo "openapi: PASS ($((SECONDS - STARTED)) s)"; else echo "openapi: FAIL ($((SECONDS - STARTED)) s)"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# private_stack_ports, service_bin_dir
. "$ROOT/deploy/tests/lib.sh"
BIN_DIR="$(service_bin_dir)"

export FLOODGATE_STACK_DIR="$TMP/stack" FLOODGATE_BIN_DIR="$BIN_DIR"
export FLOODGATE_PROFILE; FLOODGATE_PROFILE="$(basename "$BIN_DIR")"
private_stack_ports
export FLOODGATE_ADMIN_TOKEN; FLOODGATE_ADMIN_TOKEN="openapi-$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')"
unset FLOODGATE_REDIS_CLUSTER
# The fuzzer sends wrong and missing credentials on purpose; locking its address out after 20
# of them would turn the rest of the run into 429s (the lockout has its own tests).
export FLOODGATE_BOOKING__ADMIN_AUTH_FAILURES_PER_IP_PER_MIN=0
export FLOODGATE_GATEWAY__LIMITS__ADMIN_AUTH_FAILURES_PER_IP_PER_MIN=0

say "deploy/stack up (own ports, binaries from $BIN_DIR)"
if ! "$ROOT/deploy/stack" up >"$TMP/up.log" 2>&1; then
  tail -30 "$TMP/up.log" >&2
  say "FAILED: deploy/stack up"
  exit 1
fi

GW="http://$FLOODGATE_GATEWAY_ADDR" GA="http://$FLOODGATE_GATEWAY_ADMIN_ADDR" BK="http://$FLOODGATE_BOOKING_ADDR"

# 2. Each listener serves its committed document byte for byte.
for pair in "$BK booking" "$GW gateway" "$GA gateway-admin"; do
  set -- $pair
  curl -sf --max-time 5 "$1/openapi.json" -o "$TMP/served.json" || { say "FAILED: GET $1/openapi.json"; exit 1; }
  cmp -s "$TMP/served.json" "$ROOT/docs/openapi/$2.json" || { say "FAILED: $1/openapi.json is not docs/openapi/$2.json"; exit 1; }
done
say "each listener serves its document"

# Credentials: a fan's identity token (dev login) and an admission token for the demo event.
json_field() { python3 -c 'import json,sys; print(json.load(sys.stdin).get(sys.argv[1]) or "")' "$1"; }
IDENTITY="$(curl -sf --max-time 5 -X POST -H 'content-type: application/json' \
  -d '{"account":"openapi-fuzzer@example.test"}' "$GW/dev/login" | json_field token)"
[ -n "$IDENTITY" ] || { say "FAILED: dev login"; exit 1; }
curl -sf --max-time 5 -X POST -H "authorization: Bearer $IDENTITY" "$GW/queue/demo/join" >/dev/null \
  || { say "FAILED: join the demo event"; exit 1; }
ADMISSION=""
for _ in $(seq 1 120); do
  ADMISSION="$(curl -s --max-time 5 -H "authorization: Bearer $IDENTITY" "$GW/queue/demo/status" | json_field token)"
  [ -n "$ADMISSION" ] && break
  sleep 0.5
done
[ -n "$ADMISSION" ] || { say "FAILED: not admitted to the demo event within 60 s"; exit 1; }
# The admin operations are fuzzed as a named admin operator (the bootstrap secret would need
# X-Floodgate-Actor on every change, which the document leaves optional): issued with the
# bootstrap secret, then accepted by the gateway's admin listener once booking has published it.
OPERATOR="$(curl -sf --max-time 5 -X POST -H "authorization: Bearer $FLOODGATE_ADMIN_TOKEN" \
  -H 'x-floodgate-actor: openapi.sh' -H 'content-type: application/json' \
  -d '{"name":"openapi fuzzer","role":"admin"}' "$BK/admin/operators" | json_field credential)"
[ -n "$OPERATOR" ] || { say "FAILED: issue an admin operator"; exit 1; }
for _ in $(seq 1 40); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H "authorization: Bearer $OPERATOR" \
       "$GA/admin/events/demo/config")" = 200 ] && break
  sleep 0.25
done
[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H "authorization: Bearer $OPERATOR" \
     "$GA/admin/events/demo/config")" = 200 ] \
  || { say "FAILED: the gateway's admin listener did not learn the operator within 10 s"; exit 1; }
say "credentials ready (an admin operator, identity token, admission token of demo)"

export FG_ADMIN="$OPERATOR" FG_IDENTITY="$IDENTITY" FG_ADMISSION="$ADMISSION"
# The data checks' expected answers for booking. A request the document forbids may also be
# refused `413` (a list over its maxItems is over the body limit). A request the document allows
# is never refused as invalid (`400`/`422`), except by the operations listed below, each for a
# rule no JSON Schema states: a reference that does not exist (seats, tiers, events, sections), a
# rule across fields or against stored state, an opaque cursor that is not ours, or a webhook
# signature (the document cannot sign). A 413/415, a 5xx or an undocumented status still fails.
# An integer written as a float (`76.0`) is that integer (booking/src/platform/json.rs).
cat >"$TMP/booking.toml" <<'TOML'
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "429"]
[auth.openapi.admin]
bearer = "${FG_ADMIN}"
[auth.openapi.admission]
bearer = "${FG_ADMISSION}"
# The fan's own tickets (issue 43): class identity, the login token.
[auth.openapi.identity]
bearer = "${FG_IDENTITY}"

# 422 UNKNOWN_SEATS: seat ids the event does not have.
[[operations]]
include-name = ["POST /admin/events/{event}/seat-kills", "DELETE /admin/events/{event}/seat-kills",
                "POST /admin/events/{event}/seat-kills/release"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

# 422 UNKNOWN_TIER (a GA tier the event does not have); IDEMPOTENCY_KEY_REUSED on a release
# (the key of another request).
[[operations]]
include-name = ["POST /admin/events/{event}/ga-holdbacks",
                "POST /admin/events/{event}/ga-holdbacks/{id}/release"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

# 422: the cursor of another list, or created_from not before created_to.
[[operations]]
include-name = ["GET /admin/audit", "GET /admin/orders", "GET /api/orders"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

# 422: across fields: GA shards at most the capacity, tiers and sections that refer to each
# other; an edit that changes nothing (every field null).
[[operations]]
include-name = ["POST /admin/events", "PATCH /admin/events/{event}"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

# 422: an operator's or a scanner's expiry against the clock (in the future, at most 366 or 7
# days away), the names booking reserves for itself (bootstrap, payments, ...), a gate with a
# control character.
[[operations]]
include-name = ["POST /admin/operators", "POST /admin/events/{event}/scanners"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

# 422: an e-mail address the mail library refuses (RFC 5321/5322 rules no pattern states), an
# offer to oneself; the conflicts list's `before` cursor is opaque (another list's is 422).
[[operations]]
include-name = ["POST /api/tickets/{id}/transfers", "POST /api/transfers/{id}/accept",
                "GET /admin/events/{event}/checkin/conflicts"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

# 422 UNKNOWN_EVENT: a product of an event that does not exist.
[[operations]]
include-name = ["POST /admin/products", "PUT /admin/products/{sku}"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

# 422: seats, sections or tiers the event does not have.
[[operations]]
include-name = "POST /api/events/{event}/holds"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

# 422 CART_EMPTY: an order from the caller's cart when the cart is empty.
[[operations]]
include-name = "POST /api/orders"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

# 422 IDEMPOTENCY_KEY_REUSED: an Idempotency-Key the fuzzer already sent with another request
# (stored state; the operations above that take a key have it in their own entries).
[[operations]]
include-name = ["POST /api/auctions", "POST /api/auctions/{id}/bids", "POST /api/orders/{id}/pay",
                "POST /admin/orders/{id}/refund", "POST /admin/orders/{id}/cancel"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

# 400 INVALID_SIGNATURE: the document cannot sign a webhook.
# (Filters by operation name, "METHOD /path": an entry's include-path and include-method are
# alternatives, not both required, so together they matched every operation of either.)
[[operations]]
include-name = "POST /webhooks/payments"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]
TOML
{ printf '[parameters]\n"path.event" = "demo"\n'; cat "$TMP/booking.toml"; } >"$TMP/booking-demo.toml"
cat >"$TMP/gateway.toml" <<'TOML'
[parameters]
"path.event" = "demo"
[auth.openapi.identity]
bearer = "${FG_IDENTITY}"

# The payment webhook is forwarded to booking, which refuses what the document cannot sign
# (400) and checks the body's media type (415), as in booking's own run.
[[operations]]
include-name = "POST /webhooks/payments"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]
checks.negative_data_rejection.expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
TOML
cat >"$TMP/gateway-admin.toml" <<'TOML'
[parameters]
"path.event" = "demo"
[auth.openapi.admin]
bearer = "${FG_ADMIN}"

# Validation the schema cannot carry: rules between fields (max_session_s >= token_ttl_s,
# auto.ceiling >= auto.floor, registration_closes with access and not after sale_start,
# safety_net with mode) and against the clock (a change's `at` in the future, its merged
# config valid then). Schema-valid bodies may be 422 there, and only there.
[[operations]]
include-name = "PUT /admin/events/{event}/config"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429", "5xx"]

[[operations]]
include-name-regex = "^(POST|PUT) /admin/events/\\{event\\}/schedule"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429", "5xx"]
TOML

# /readyz is left out: its 503 is the designed answer of a process that is not ready (and
# documented), which the server-error check would count against it. So are the gateway
# document's `/api/…` operations: they are booking's (fuzzed above against booking's document,
# which names every method booking answers there); the gateway's document lists only its own
# answers on them (ROOM_FULL and the like), and the gateway answers any method on `/api/…`
# without an admission 401, never the 405 an undocumented method gets from booking.
fuzz() { # document url config [more schemathesis options]
  local doc="$1" url="$2" cfg="$3"
  shift 3
  say "schemathesis: docs/openapi/$doc.json against $url with $cfg ($MAX_EXAMPLES cases per operation, seed $SEED)"
  (cd "$TMP" && "$VENV/bin/schemathesis" --no-color --config-file "$TMP/$cfg.toml" run \
     "$ROOT/docs/openapi/$doc.json" --url "$url" --exclude-path /readyz "$@" \
     --checks all \
     --phases examples,coverage,fuzzing --max-examples "$MAX_EXAMPLES" --seed "$SEED" \
     --request-timeout 10 --workers 1 --suppress-health-check all \
     --generation-database none --continue-on-failure) >"$REPORTS/$cfg.out" 2>&1 && return 0
  # The failures (each with a curl line that reproduces it) and the summary.
  sed -n '/^=* \(ERRORS\|FAILURES\) =*$/,$p' "$REPORTS/$cfg.out" | head -300 >&2
  return 1
}
rm -rf "$REPORTS" && mkdir -p "$REPORTS"
rc=0
# Booking twice: fan paths in the demo event (past WRONG_EVENT, into the handlers), then any
# event id the generator draws.
fuzz booking "$BK" booking-demo || rc=1
fuzz booking "$BK" booking || rc=1
fuzz gateway "$GW" gateway --exclude-path-regex '^/api/' || rc=1
fuzz gateway-admin "$GA" gateway-admin || rc=1
[ "$rc" = 0 ] || say "FAILED: the stack answered outside its OpenAPI documents (above)"
exit "$rc"

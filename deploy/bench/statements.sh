#!/usr/bin/env bash
# Statement budget benchmark (issue 16): Postgres statements and round trips per booking
# operation, counted by pg_stat_statements (deterministic: no timing involved).
#
#   deploy/bench/statements.sh [--quick] [OUT_DIR]   (or: deploy/bench/run statements)
#
# 1. starts the sandbox provider (webhooks queued until flushed) and a release booking with
#    its background jobs off (their statements would be counted) on private ports, against a
#    fresh database on the private Postgres, which must load pg_stat_statements
#    (deploy/stack deps starts it so);
# 2. `loadgen statements`: one client drives each operation STATEMENTS_COUNT times through
#    the HTTP API (seat hold, GA hold, order from hold, order from cart, pay, webhook, cold
#    bid, and the whole purchase hold -> order -> pay -> webhook), resetting the statistics
#    before each operation;
# 3. a markdown table to $BENCH_OUT: statements and round trips per operation and each
#    operation's most frequent statements;
# 4. fails when a whole purchase costs more than STATEMENTS_PURCHASE_BUDGET statements (a
#    ratchet: the issue-16 goal is 12; lower it as the purchase gets cheaper);
# 5. then the purchase rate: PURCHASE_CLIENTS fans (64; 8 with --quick) buying one seat after
#    another for PURCHASE_SECONDS (15; 3), with booking's and Postgres' CPU per purchase,
#    booking's Postgres pool STATEMENTS_DB_POOL (8, as deploy/local.toml sizes it for this
#    machine); fails if any purchase failed.
# BENCH_BIN_DIR picks the binaries (default $CARGO_TARGET_DIR/release or target/release);
# statement counts do not depend on the build profile.
set -euo pipefail

QUICK="${BENCH_QUICK:-0}"
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RESULTS="${1:-$(mktemp -d)}"
mkdir -p "$RESULTS"
PG_PORT="${FLOODGATE_PG_PORT:-55432}"
REDIS_PORT="${FLOODGATE_REDIS_PORT:-56379}"
BK_PORT="${BENCH_BOOKING_PORT:-18093}"
SB_PORT="${BENCH_SANDBOX_PORT:-18094}"
if [ "$QUICK" = 1 ]; then COUNT="${STATEMENTS_COUNT:-5}"; else COUNT="${STATEMENTS_COUNT:-50}"; fi
# The purchase rate after the counts: fans buying at once for a few seconds.
if [ "$QUICK" = 1 ]; then RATE_CLIENTS="${PURCHASE_CLIENTS:-8}"; RATE_S="${PURCHASE_SECONDS:-3}"
else RATE_CLIENTS="${PURCHASE_CLIENTS:-64}"; RATE_S="${PURCHASE_SECONDS:-15}"; fi
# Booking's Postgres pool: the stack's own on this machine (deploy/local.toml: 8, sized for
# Postgres sharing two cores with everything else; 32, the default for a Postgres of its own,
# runs more backends than there are cores here).
DB_POOL="${STATEMENTS_DB_POOL:-8}"
BUDGET="${STATEMENTS_PURCHASE_BUDGET:-11}"
GOAL=12
OUT="${BENCH_OUT:-/dev/stdout}"
BIN="${BENCH_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}"
DB="fg_bench_statements_$(date +%s)_$$"
PREFIX="bench-statements-$$:"
ADMIN="bench-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
SBKEY="sk_test_bench_$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
WHSEC="whsec_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
WORK="$(mktemp -d)"
PIDS=()

log() { printf '\033[1m[bench statements]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
psql_q() { psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
command -v curl >/dev/null || die "curl not found"
command -v jq >/dev/null || die "jq not found (apt-get install jq)"
psql_q -d postgres -c "SELECT 1" >/dev/null 2>&1 || die "private Postgres not reachable on :$PG_PORT (run deploy/stack deps)"
case ",$(psql_q -d postgres -c 'SHOW shared_preload_libraries')," in
  *pg_stat_statements*) ;;
  *) die "the Postgres on :$PG_PORT does not load pg_stat_statements; restart it with deploy/stack down && deploy/stack deps" ;;
esac

cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  redis-cli -p "$REDIS_PORT" --scan --pattern "${PREFIX}*" 2>/dev/null \
    | xargs -r -n 1000 redis-cli -p "$REDIS_PORT" UNLINK >/dev/null 2>&1 || true
  psql_q -d postgres -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  log "building release binaries"
  (cd "$ROOT" && cargo build --release --workspace --bins)
fi
for b in booking sandbox-provider loadgen; do [ -x "$BIN/$b" ] || die "missing $BIN/$b"; done
psql_q -d postgres -c "CREATE DATABASE \"$DB\"" >/dev/null
# Planning time per statement too (the purchase rate's table shows it).
psql_q -d postgres -c "ALTER DATABASE \"$DB\" SET pg_stat_statements.track_planning = on" >/dev/null

# exec: the background PID must be the service itself so cleanup stops it.
service_env() {
  exec env -i PATH="$PATH" HOME="${HOME:-/tmp}" \
    DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$DB" \
    FLOODGATE_DATABASE__MAX_CONNECTIONS="$DB_POOL" \
    REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
    FLOODGATE_REDIS__KEY_PREFIX="$PREFIX" \
    FLOODGATE_DEV=1 \
    FLOODGATE_ADMIN_TOKEN="$ADMIN" \
    FLOODGATE_BOOKING__LISTEN="127.0.0.1:$BK_PORT" \
    FLOODGATE_BOOKING__JOBS_ENABLED=false \
    FLOODGATE_PAYMENTS__PROVIDER_URL="http://127.0.0.1:$SB_PORT" \
    FLOODGATE_PAYMENTS__API_KEY="$SBKEY" \
    FLOODGATE_PAYMENTS__WEBHOOK_SECRETS="[\"$WHSEC\"]" \
    FLOODGATE_SANDBOX__API_KEY="$SBKEY" \
    FLOODGATE_SANDBOX__WEBHOOK_SECRET="$WHSEC" \
    FLOODGATE_SANDBOX__WEBHOOK_URL="http://127.0.0.1:$BK_PORT/webhooks/payments" \
    FLOODGATE_SANDBOX__WEBHOOK_MODE=manual \
    FLOODGATE_SANDBOX__LISTEN="127.0.0.1:$SB_PORT" \
    FLOODGATE_LOG__LEVEL=warn FLOODGATE_LOG__FORMAT=json \
    "$@"
}
start() { # name health-url
  local name="$1" url="$2"
  service_env "$BIN/$name" >>"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 200); do
    curl -fsS "$url" >/dev/null 2>&1 && return 0
    kill -0 "${PIDS[-1]}" 2>/dev/null || { tail -20 "$WORK/$name.log" >&2; die "$name exited"; }
    sleep 0.1
  done
  tail -20 "$WORK/$name.log" >&2; die "$name not ready at $url"
}
log "sandbox :$SB_PORT, booking :$BK_PORT (database $DB), $COUNT requests per operation"
start sandbox-provider "http://127.0.0.1:$SB_PORT/healthz"
start booking "http://127.0.0.1:$BK_PORT/readyz"
BOOKING_PID="${PIDS[-1]}"

FLOODGATE_ADMIN_TOKEN="$ADMIN" FLOODGATE_SANDBOX__API_KEY="$SBKEY" \
DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$DB" \
  "$BIN/loadgen" statements --booking "http://127.0.0.1:$BK_PORT" \
    --sandbox "http://127.0.0.1:$SB_PORT" --count "$COUNT" \
    --purchase-clients "$RATE_CLIENTS" --purchase-seconds "$RATE_S" --booking-pid "$BOOKING_PID" \
    --json "$RESULTS/statements.json" --markdown "$WORK/table.md" >&2 \
  || { tail -20 "$WORK/booking.log" >&2; die "loadgen statements failed"; }

PURCHASE="$(jq -r '.ops[] | select(.name == "whole purchase") | .statements_per_op' "$RESULTS/statements.json")"
[ -n "$PURCHASE" ] || die "no whole-purchase figure"
{
  echo "## Statements per operation (issue 16)"
  echo
  echo "Counted by \`pg_stat_statements\` (\`track = all\`, utility statements included), $COUNT"
  echo "requests per operation from one client, booking's jobs off, webhooks flushed by hand."
  echo "Round trips: statements less the \`SET LOCAL\`s sent in one simple query with their"
  echo "\`BEGIN\` (the pool's ping on each acquire is not counted). A whole purchase costs"
  echo "**$PURCHASE** statements (goal ≤ $GOAL; this bench fails above $BUDGET)."
  echo
  cat "$WORK/table.md"
  echo
  echo "Booking's Postgres pool in this run: $DB_POOL connections (\`STATEMENTS_DB_POOL\`; the"
  echo "stack's own on this machine, deploy/local.toml; the notes of session 22 compare 8 and 32)."
} > "$OUT"
RATE_ERRORS="$(jq -r '.purchase_rate.errors // 0' "$RESULTS/statements.json")"
[ "$RATE_ERRORS" = 0 ] || die "$RATE_ERRORS purchases failed during the purchase rate"
awk -v p="$PURCHASE" -v b="$BUDGET" 'BEGIN { exit !(p <= b) }' \
  || die "a whole purchase costs $PURCHASE statements, over the budget of $BUDGET"

#!/usr/bin/env bash
# Auction benchmark (issue 6): hundreds of concurrent bidders on ONE cold auction (Postgres
# decides) and on ONE hot auction (Redis Lua decides), versus the cold bid statement in pgbench.
#
#   deploy/bench/auctions.sh [--quick]  (or: deploy/bench/run auctions, deploy/stack bench auctions)
#
# 1. starts a release booking on a private port against a fresh database on the private
#    Postgres/Redis (deploy/stack deps), jobs on (the hot-bid consumer and the closer run);
# 2. `loadgen auctions` on a cold auction, then on a hot one: BENCH_CLIENTS bidders, each bid
#    a fresh bidder account at (about) the minimum next amount, for BENCH_DURATION_S seconds
#    -> accepted bids/s, decided bids/s, latency p50/p99 over every bid request;
# 3. waits until the consumer has written every accepted hot bid to Postgres and checks the
#    invariants: bids logged = 201s answered, max logged bid = price, leader = its bidder;
# 4. pgbench: THE cold bid statement, extracted from booking/src/auctions/bids.rs (COLD_BID)
#    so it cannot drift, preceded by a read of the minimum next bid, on its own auction;
# 5. raw Redis: THE hot bid script, extracted from booking/src/auctions/hot.rs (PLACE_BID),
#    driven by redis-benchmark (EVALSHA) with the same number of clients on an auction of its
#    own, every call a fresh bidder and request id at the start price (so, as in the service,
#    one wins and the rest are refused) -> scripts/s, the ceiling of the hot path here.
# Results go to $BENCH_OUT as a markdown section (see deploy/bench/run).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PG_PORT="${FLOODGATE_PG_PORT:-55432}"
REDIS_PORT="${FLOODGATE_REDIS_PORT:-56379}"
PORT="${BENCH_AUCTIONS_PORT:-18093}"
QUICK="${BENCH_QUICK:-0}"
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
RESULTS="${1:-}"
if [ "$QUICK" = 1 ]; then DUR="${BENCH_DURATION_S:-3}"; else DUR="${BENCH_DURATION_S:-20}"; fi
CLIENTS="${BENCH_CLIENTS:-256}"
POOL="${BENCH_POOL:-32}"
OUT="${BENCH_OUT:-/dev/stdout}"
DB="fg_bench_auctions_$(date +%s)_$$"
URL="http://127.0.0.1:$PORT"
PREFIX="bench-auctions-$$:"
WORK="$(mktemp -d)"
BOOKING_PID=""

log() { printf '\033[1m[bench auctions]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
psql_q() { psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
PGBENCH="$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | sort -V | tail -1 || true)"
[ -n "$PGBENCH" ] || die "pgbench not found (deploy/stack bench installs postgresql-contrib)"
command -v curl >/dev/null || die "curl not found"
command -v redis-benchmark >/dev/null || die "redis-benchmark not found (it comes with redis-server / redis-tools)"
psql_q -d postgres -c "SELECT 1" >/dev/null 2>&1 || die "private Postgres not reachable on :$PG_PORT (run deploy/stack deps)"

stop_booking() {
  if [ -n "$BOOKING_PID" ]; then
    kill "$BOOKING_PID" 2>/dev/null || true
    wait "$BOOKING_PID" 2>/dev/null || true
    BOOKING_PID=""
  fi
}
cleanup() {
  stop_booking
  psql_q -d postgres -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true
  # Only this run's keys (its own prefix); never FLUSHDB a shared Redis.
  redis-cli -p "$REDIS_PORT" --scan --pattern "${PREFIX}*" 2>/dev/null \
    | xargs -r -n 500 redis-cli -p "$REDIS_PORT" unlink >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  log "building release binaries"
  (cd "$ROOT" && cargo build --workspace --bins --release)
fi
BOOKING_BIN="$ROOT/target/release/booking"
LOADGEN_BIN="$ROOT/target/release/loadgen"
[ -x "$BOOKING_BIN" ] && [ -x "$LOADGEN_BIN" ] || die "release binaries missing"

psql_q -d postgres -c "CREATE DATABASE \"$DB\"" >/dev/null

log "starting booking on $URL (database $DB)"
env -i PATH="$PATH" HOME="${HOME:-/tmp}" \
  DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$DB" \
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
  FLOODGATE_DEV=1 \
  FLOODGATE_REDIS__KEY_PREFIX="$PREFIX" \
  FLOODGATE_BOOKING__LISTEN="127.0.0.1:$PORT" \
  FLOODGATE_DATABASE__MAX_CONNECTIONS="$POOL" \
  FLOODGATE_LOG__LEVEL=warn FLOODGATE_LOG__FORMAT=json \
  "$BOOKING_BIN" >>"$WORK/booking.log" 2>&1 &
BOOKING_PID=$!
for _ in $(seq 1 100); do
  curl -fsS "$URL/readyz" >/dev/null 2>&1 && break
  kill -0 "$BOOKING_PID" 2>/dev/null || { tail -20 "$WORK/booking.log" >&2; die "booking exited"; }
  sleep 0.1
done
curl -fsS "$URL/readyz" >/dev/null 2>&1 || die "booking not ready on $URL"
# The auctions' event (booking takes bids only with an admission of the auction's event;
# loadgen's tokens and auctions use `--event`, default auction-day). Booking has migrated the
# database by the time it is ready.
EVENT="auction-day"
psql_q -d "$DB" -c "INSERT INTO events (id, name, sale_start, hold_ttl_s, max_tickets_per_account)
  VALUES ('$EVENT', 'bench auctions', clock_timestamp(), 600, 4)" >/dev/null

json_num() { grep -m1 "\"$2\"" "$1" | sed -E 's/.*: *([0-9.eE+-]+).*/\1/'; }
json_str() { grep -m1 "\"$2\"" "$1" | sed -E 's/.*: *"([^"]*)".*/\1/'; }

run_loadgen() {
  local json="$1"; shift
  "$LOADGEN_BIN" auctions --booking "$URL" --event "$EVENT" --clients "$CLIENTS" \
    --duration-s "$DUR" --json "$json" "$@" >&2
}

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
log "cold auction: $CLIENTS bidders x ${DUR}s"
run_loadgen "$WORK/cold.json"
log "hot auction: $CLIENTS bidders x ${DUR}s"
run_loadgen "$WORK/hot.json" --hot
HALF=$(( CLIENTS / 2 > 1 ? CLIENTS / 2 : 1 ))
log "hot auction: $HALF bidders x ${DUR}s"
"$LOADGEN_BIN" auctions --booking "$URL" --event "$EVENT" --clients "$HALF" --duration-s "$DUR" \
  --json "$WORK/hot-half.json" --hot >&2

# check AUCTION ACCEPTED: Postgres has every accepted bid once, the price is the max bid, the
# leader is its bidder. For the hot auction, waits (bounded) for the consumer to catch up.
check() {
  local id="$1" accepted="$2" logged=""
  for _ in $(seq 1 300); do
    logged="$(psql_q -d "$DB" -c "SELECT count(*) FROM bids WHERE auction_id = '$id'")"
    [ "$logged" -ge "$accepted" ] && break
    sleep 0.2
  done
  [ "$logged" = "$accepted" ] || die "auction $id: $logged bids logged, $accepted accepted"
  local bad
  bad="$(psql_q -d "$DB" -c "
    SELECT count(*) FROM auctions a
     WHERE a.id = '$id'
       AND (a.current_price <> (SELECT max(amount) FROM bids WHERE auction_id = a.id)
            OR a.leader_id IS DISTINCT FROM (SELECT bidder_id FROM bids WHERE auction_id = a.id
                                              ORDER BY amount DESC LIMIT 1)
            OR (SELECT count(*) FROM bids WHERE auction_id = a.id)
               <> (SELECT count(DISTINCT request_id) FROM bids WHERE auction_id = a.id))")"
  [ "$bad" = 0 ] || die "auction $id: price/leader/log invariant violated"
}
COLD_ID="$(json_str "$WORK/cold.json" auction)"
HOT_ID="$(json_str "$WORK/hot.json" auction)"
T_DRAIN_START=$(date +%s.%N)
check "$COLD_ID" "$(json_num "$WORK/cold.json" accepted)"
check "$HOT_ID" "$(json_num "$WORK/hot.json" accepted)"
check "$(json_str "$WORK/hot-half.json" auction)" "$(json_num "$WORK/hot-half.json" accepted)"
T_DRAIN=$(awk -v a="$T_DRAIN_START" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
stop_booking

log "pgbench: the cold bid statement, $POOL connections"
psql_q -d "$DB" -c "INSERT INTO auctions (id, seller_id, title, start_price, min_increment,
    current_price, end_time, max_extensions, event_id)
  VALUES ('pgbench', 'pg-seller', 'pgbench', 1000, 10, 1000, clock_timestamp() + interval '1 day', 30, '$EVENT')" >/dev/null
{
  echo '\set r random(1, 9000000000000000)'
  echo "SELECT CASE WHEN leader_id IS NULL THEN current_price ELSE current_price + min_increment END AS amt FROM auctions WHERE id = :auction \\gset"
  sed -n '/^const COLD_BID: &str = r#"$/,/^"#;$/p' "$ROOT/booking/src/auctions/bids.rs" | sed '1d;$d' \
    | grep -v '^ *--' \
    | sed -e 's/\$1/:auction/g; s/\$2/:r/g; s/\$3/:amt/g; s/\$4/:r/g; s/\$5/:r/g; s/\$6/120/g' \
    | tr '\n' ' '
  echo ';'
} > "$WORK/bid.sql"
grep -q 'UPDATE auctions' "$WORK/bid.sql" || die "could not extract COLD_BID from bids.rs"
PG_OUT="$("$PGBENCH" -h 127.0.0.1 -p "$PG_PORT" -U postgres -n -M prepared -c "$POOL" -j 2 \
  -T "$DUR" -D auction=pgbench -f "$WORK/bid.sql" "$DB" 2>&1)" || { echo "$PG_OUT" >&2; die "pgbench failed"; }
PG_TPS="$(echo "$PG_OUT" | sed -nE 's/^tps = ([0-9.]+) \(without initial connection time\).*/\1/p')"
PG_LAT="$(echo "$PG_OUT" | sed -nE 's/^latency average = ([0-9.]+) ms.*/\1/p')"
PG_ACC="$(psql_q -d "$DB" -c "SELECT count(*) FROM bids WHERE auction_id = 'pgbench'")"
PG_ACC_S="$(awk -v n="$PG_ACC" -v d="$DUR" 'BEGIN { printf "%.0f", n / d }')"

log "raw Redis: the bid script through redis-benchmark (EVALSHA), $CLIENTS clients"
sed -n '/^static PLACE_BID: LazyLock<Script> = LazyLock::new(|| {$/,/^"#,$/p' \
  "$ROOT/booking/src/auctions/hot.rs" | sed '1,3d;$d' > "$WORK/place_bid.lua"
grep -q "redis.call('XADD'" "$WORK/place_bid.lua" || die "could not extract PLACE_BID from hot.rs"
RK="${PREFIX}auction:{raw-bench}"
redis-cli -p "$REDIS_PORT" hset "$RK:state" status OPEN price 1000 inc 10 \
  end "$(( ($(date +%s) + 3600) * 1000 ))" seller raw-seller ext 0 maxext 30 bids 0 >/dev/null
SHA="$(redis-cli -p "$REDIS_PORT" script load "$(cat "$WORK/place_bid.lua")")"
[ "${#SHA}" = 40 ] || die "SCRIPT LOAD failed: $SHA"
# KEYS state reqs stream; ARGV bidder amount request_id bid_id window_ms, then the recorded
# floor (price, leader, bids, ext) exactly as booking passes it.
RAW_N=$(( DUR * 40000 ))
RAW_CSV="$(redis-benchmark -p "$REDIS_PORT" -c "$CLIENTS" -n "$RAW_N" -r 1000000000 --csv \
  EVALSHA "$SHA" 3 "$RK:state" "$RK:reqs" "$RK:bids" bidder-__rand_int__ 1000 \
  req-__rand_int__ bid-__rand_int__ 120000 1000 '' 0 0 2>&1 | tail -1)"
RAW_RPS="$(echo "$RAW_CSV" | awk -F'","' '{ print $2 }')"
RAW_P50="$(echo "$RAW_CSV" | awk -F'","' '{ print $5 }')"
RAW_P99="$(echo "$RAW_CSV" | awk -F'","' '{ print $7 }')"
[ -n "$RAW_RPS" ] && awk -v r="$RAW_RPS" 'BEGIN { exit !(r > 0) }' || die "redis-benchmark failed: $RAW_CSV"

fmt() { awk -v a="$1" 'BEGIN { printf "%.0f", a }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / b; else print "n/a" }'; }
row() {
  local f="$1" label="$2" raw="${3:-}"
  printf '| %s | %s | %s | %s | %s ms | %s ms | %s ms | %s |\n' "$label" \
    "$(fmt "$(json_num "$f" accepted_per_s)")" "$(fmt "$(json_num "$f" decided_per_s)")" \
    "$(json_num "$f" requests)" "$(json_num "$f" p50_ms)" "$(json_num "$f" p99_ms)" "$(json_num "$f" max_ms)" \
    "$([ -n "$raw" ] && ratio "$(json_num "$f" decided_per_s)" "$raw" || echo "—")"
}
bar() {
  awk -v r="$(json_num "$1" decided_per_s)" -v p="$(json_num "$1" p99_ms)" \
    'BEGIN { printf "%s (%.0f decided bids/s, p99 %.0f ms)", (r >= 2000 && p < 200) ? "met" : "NOT met", r, p }'
}

{
  echo "## Auctions"
  echo
  echo "Recorded $(date -u +%Y-%m-%dT%H:%MZ) by \`deploy/bench/auctions.sh\` on $(nproc) cores, Postgres $(psql_q -d postgres -c 'SHOW server_version' | cut -d' ' -f1), Redis $(redis-cli -p "$REDIS_PORT" info server | sed -nE 's/^redis_version:([0-9.]+).*/\1/p') with appendfsync $(redis-cli -p "$REDIS_PORT" config get appendfsync | tail -1), commit $(cd "$ROOT" && git rev-parse --short HEAD)$([ "$QUICK" = 1 ] && echo ' — QUICK smoke run, numbers not representative')."
  echo "Load average before the runs: $LOAD_BEFORE (other work on the machine depresses every figure; compare with the pgbench baseline from the same run)."
  echo "Booking (release, pool $POOL), loadgen ($CLIENTS concurrent bidders) and both stores share the machine. One auction per run; each bid is a fresh bidder account at (about) the minimum next amount, so most bids race and lose: *accepted* counts 201s, *decided* counts 201 + 409 BID_TOO_LOW (every one a real decision). Latency is over all bid requests. ${DUR} s per run."
  echo
  echo "| auction | accepted bids/s | decided bids/s | requests | p50 | p99 | max | service / raw Redis |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  row "$WORK/cold.json" "cold (one conditional UPDATE + bid row, Postgres)"
  row "$WORK/hot.json" "hot (one Lua script + XADD, Redis)" "$RAW_RPS"
  row "$WORK/hot-half.json" "hot, $HALF bidders" "$RAW_RPS"
  printf '| raw Redis: [the bid script](../booking/src/auctions/hot.rs) by redis-benchmark (EVALSHA), %s clients | %s | %s | %s | %s ms | %s ms | — | 100%% |\n' \
    "$CLIENTS" "—" "$(fmt "$RAW_RPS")" "$RAW_N" "$RAW_P50" "$RAW_P99"
  echo
  echo "The raw Redis row runs the hot bid script (extracted from the source) with no HTTP, no token check and no booking process: each call a fresh bidder and request id bidding the start price, so one is accepted and the rest refused, like the service's race. It is the ceiling of the hot path on this machine (Redis, and redis-benchmark as the client, share the cores with nothing else of ours); *service / raw Redis* is decided bids/s over its scripts/s."
  echo
  echo "Design bar for a hot auction: 2,000 bids/s with p99 < 200 ms — $CLIENTS bidders: **$(bar "$WORK/hot.json")**; $HALF bidders: **$(bar "$WORK/hot-half.json")**. With a closed loop of N bidders, latency ≈ N / throughput (Little's law), so at a fixed throughput p99 falls with fewer bidders in flight."
  echo "Why few bids are *accepted*: every bidder bids about the same minimum next amount at the same moment, so of each wave one wins and the rest are refused; the accepted rate is bounded by the round trip, not by the decision path."
  echo "After the runs every accepted bid was in Postgres exactly once (the hot consumer caught up within ${T_DRAIN} s of the end), each auction's price equals its highest logged bid and its leader that bid's bidder."
  echo
  echo "Baseline, pgbench with $POOL connections: [the cold bid statement](../booking/src/auctions/bids.rs) (extracted from the source) after a read of the minimum next bid, on one auction row: **$(fmt "$PG_TPS") tx/s** (latency average $PG_LAT ms), of which **$PG_ACC_S accepted bids/s** (the rest lost the race: refused by the same statement). Every accepted bid holds the row lock through its durable commit (WAL flush), which caps one auction's accepted rate. The service can decide more cold bids per second than this raw loop because bids below a price floor the process has already seen are refused from a lock-free read instead of queueing on the row lock (docs/decisions.md, \"Early rejection\")."
  echo
} > "$OUT"
if [ -n "$RESULTS" ]; then
  # For the summary's issue-16 table (deploy/bench/summary): the hot auction against raw Redis.
  mkdir -p "$RESULTS"
  cp "$WORK"/*.json "$RESULTS/" 2>/dev/null || true
  printf '{"clients": %s, "hot_decided_per_s": %s, "hot_p99_ms": %s, "raw_redis_per_s": %s}\n' \
    "$CLIENTS" "$(json_num "$WORK/hot.json" decided_per_s)" "$(json_num "$WORK/hot.json" p99_ms)" \
    "${RAW_RPS:-0}" > "$RESULTS/auctions.json"
fi
log "done"

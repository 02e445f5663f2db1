#!/usr/bin/env bash
# Baselines for the benchmark report, measured in the same run as the scenarios so every
# figure can be given as a ratio to what the raw parts do on this machine:
#   - redis-benchmark for the Redis commands Floodgate uses (queue ZADD NX / ZRANK / ZPOPMIN,
#     Lua via EVALSHA, cart HSET, hot-bid XADD), one at a time and pipelined x16;
#   - pgbench for THE hold statement (4 adjacent seats out of 60,000, with constant churn) and
#     the cold bid statement (one hot auction row: every bid waits for the previous commit).
# nginx as a plain reverse proxy is measured by deploy/bench/gateway.sh (gateway engineer).
#
#   deploy/bench/baselines.sh [--quick] OUT_DIR      writes OUT_DIR/baselines.json
#
# Uses the private Postgres/Redis of the local stack; touches only keys `fgbench:*` and the
# scratch database `fg_bench_baseline` (dropped and recreated each run).
set -euo pipefail

QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
OUT="${1:?usage: baselines.sh [--quick] OUT_DIR}"
mkdir -p "$OUT"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PG_PORT="${FLOODGATE_PG_PORT:-55432}"
REDIS_PORT="${FLOODGATE_REDIS_PORT:-56379}"
DB=fg_bench_baseline
PGBIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
PGBENCH="$(command -v pgbench || echo "$PGBIN/pgbench")"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

if [ "$QUICK" = 1 ]; then N=20000; PG_T=3; else N=200000; PG_T=15; fi
log() { printf '\033[1m[baselines]\033[0m %s\n' "$*" >&2; }
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }

# ---- Redis ---------------------------------------------------------------------------------
log "redis-benchmark ($N requests per test, 50 clients)"
cleanup_redis() {
  rcli --scan --pattern 'fgbench:*' | xargs -r -n 1000 redis-cli -p "$REDIS_PORT" UNLINK >/dev/null
}
cleanup_redis
# The join script's shape: refuse if sold out, else ZADD NX and remember the session.
JOIN_LUA="if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('ZADD', KEYS[1], 'NX', ARGV[1], ARGV[2])
return redis.call('HSETNX', KEYS[3], ARGV[2], ARGV[1])"
SHA="$(rcli SCRIPT LOAD "$JOIN_LUA")"
declare -a NAMES CMDS
add() { NAMES+=("$1"); CMDS+=("$2"); }
add "PING" "PING"
add "ZADD NX (join)" "ZADD fgbench:{e}:q NX __rand_int__ m:__rand_int__"
add "ZRANK (status)" "ZRANK fgbench:{e}:q m:__rand_int__"
add "EVALSHA join script" "EVALSHA $SHA 3 fgbench:{e}:q2 fgbench:{e}:soldout fgbench:{e}:sess __rand_int__ m:__rand_int__"
add "ZPOPMIN 10 (admission)" "ZPOPMIN fgbench:{e}:q 10"
add "HSET (cart line)" "HSET fgbench:cart:__rand_int__ sku-1 2"
add "XADD (hot bid log)" "XADD fgbench:{a}:bids MAXLEN ~ 100000 * amount __rand_int__"

RESULTS="$TMP/redis.csv"
: > "$RESULTS"
set -f # `XADD ... *` must reach redis-benchmark as a literal star
for pipe in 1 16; do
  for i in "${!NAMES[@]}"; do
    # shellcheck disable=SC2086 # the command is split into words on purpose
    line="$(redis-benchmark -p "$REDIS_PORT" -c 50 -n "$N" -r 1000000 -P "$pipe" --csv ${CMDS[$i]} 2>/dev/null | tail -1)"
    # "test","rps","avg","min","p50","p95","p99","max"
    echo "${NAMES[$i]}|$pipe|$line" >> "$RESULTS"
  done
done
set +f
cleanup_redis
jq -R -s '
  split("\n") | map(select(length > 0) | split("|") as $p
    | ($p[2] | gsub("\""; "") | split(",")) as $f
    | {command: $p[0], pipeline: ($p[1] | tonumber), rps: ($f[1] | tonumber),
       p50_ms: ($f[4] | tonumber), p99_ms: ($f[6] | tonumber)})' "$RESULTS" > "$TMP/redis.json"

# ---- Postgres ------------------------------------------------------------------------------
psql_() { psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
log "pgbench: scratch database $DB with the project's migrations"
psql_ -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null
psql_ -d postgres -c "CREATE DATABASE $DB" >/dev/null
for m in "$ROOT"/migrations/*.sql; do psql_ -d "$DB" -f "$m" >/dev/null; done
psql_ -d "$DB" >/dev/null <<'SQL'
INSERT INTO events (id, name, sale_start, hold_ttl_s, max_tickets_per_account)
VALUES ('pgb', 'pgbench', clock_timestamp() - interval '1 hour', 600, 4);
INSERT INTO price_tiers VALUES ('pgb', 'A', 12000);
INSERT INTO seats (event_id, seat_id, section, row_no, number, tier)
SELECT 'pgb', 's' || lpad(g::text, 5, '0'), 'S', g / 50, g % 50, 'A' FROM generate_series(0, 59999) g;
INSERT INTO auctions (id, seller_id, title, start_price, min_increment, current_price, end_time, max_extensions)
VALUES ('pgb', 'seller', 'pgbench', 1000, 10, 1000, clock_timestamp() + interval '1 day', 0);
VACUUM ANALYZE;
SQL

# THE hold statement (booking/src/holds.rs, take_seats_tx), 4 adjacent seats at random.
# held_until = clock_timestamp() makes every hold expire at once, so seats are constantly
# reclaimed (the churn of a surge) instead of running out.
cat > "$TMP/hold.sql" <<'SQL'
\set s random(0, 59996)
BEGIN;
SET LOCAL synchronous_commit = off;
WITH wanted AS (
    SELECT seat_id, hold_id AS prev_hold FROM seats
    WHERE event_id = 'pgb'
      AND seat_id = ANY (ARRAY['s' || lpad((:s)::text, 5, '0'), 's' || lpad((:s + 1)::text, 5, '0'),
                               's' || lpad((:s + 2)::text, 5, '0'), 's' || lpad((:s + 3)::text, 5, '0')])
      AND (status = 'available' OR (status = 'held' AND held_until <= clock_timestamp()))
    ORDER BY seat_id
    FOR UPDATE)
UPDATE seats s SET status = 'held', hold_id = md5(random()::text), held_until = clock_timestamp()
FROM wanted w, price_tiers p
WHERE s.event_id = 'pgb' AND s.seat_id = w.seat_id AND p.event_id = 'pgb' AND p.tier = s.tier
RETURNING s.seat_id, w.prev_hold, p.price;
COMMIT;
SQL
# The same with a durable commit (what booking does when async_commit_holds = false).
sed '/synchronous_commit/d' "$TMP/hold.sql" > "$TMP/hold_sync.sql"

# The cold bid statement (booking/src/auctions/bids.rs, COLD_BID) on one auction row: the
# amount is always the next minimum, so every bid is accepted and contends for the row lock.
cat > "$TMP/bid.sql" <<'SQL'
\set b random(1, 100000000)
WITH upd AS (
    UPDATE auctions a
       SET current_price = a.current_price + a.min_increment, leader_id = 'b' || :b,
           bid_count = a.bid_count + 1, last_bid_at = clock_timestamp(), last_bid_extended = false
     WHERE a.id = 'pgb' AND a.status = 'OPEN' AND NOT a.hot AND a.seller_id <> 'b' || :b
       AND a.end_time > clock_timestamp()
 RETURNING a.id, a.current_price, a.end_time, a.last_bid_at), ins AS (
    INSERT INTO bids (id, auction_id, bidder_id, request_id, amount, placed_at, end_time, extended, path)
    SELECT md5(random()::text), upd.id, 'b' || :b, md5(random()::text), upd.current_price,
           upd.last_bid_at, upd.end_time, false, 'cold' FROM upd
    RETURNING id)
SELECT id FROM ins;
SQL

pgb() { # name script clients
  local out
  out="$("$PGBENCH" -h 127.0.0.1 -p "$PG_PORT" -U postgres -n -c "$3" -j 2 -T "$PG_T" -f "$2" "$DB" 2>&1)" \
    || { echo "$out" >&2; return 1; }
  local tps lat
  tps="$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out" | head -1)"
  lat="$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' <<<"$out" | head -1)"
  log "  $1: $tps tps, avg $lat ms ($3 clients)"
  jq -n --arg n "$1" --argjson c "$3" --argjson t "$tps" --argjson l "${lat:-0}" \
    '{statement: $n, clients: $c, tps: $t, latency_avg_ms: $l}'
}
{
  pgb "hold 4 seats of 60,000 (async commit, churn)" "$TMP/hold.sql" 32
  pgb "hold 4 seats of 60,000 (durable commit, churn)" "$TMP/hold_sync.sql" 32
  pgb "cold bid on one auction row (durable)" "$TMP/bid.sql" 32
} | jq -s . > "$TMP/pg.json"
psql_ -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null

jq -n --slurpfile r "$TMP/redis.json" --slurpfile p "$TMP/pg.json" \
  --arg quick "$QUICK" '{quick: ($quick == "1"), redis: $r[0], pgbench: $p[0]}' > "$OUT/baselines.json"
log "wrote $OUT/baselines.json"

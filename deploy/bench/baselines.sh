#!/usr/bin/env bash
# Redis baselines for the commands Floodgate's hot paths are built on, measured in the same
# run as the scenarios so their figures can be read as ratios to what Redis itself does on
# this machine. The other baselines live with their benchmarks, so nothing is measured twice:
#   - the join/status Lua scripts and bare ZADD NX / ZRANK: deploy/bench/gateway.sh;
#   - nginx as a plain reverse proxy: deploy/bench/gateway.sh;
#   - pgbench for the hold statements: deploy/bench/holds.sh; for the cold bid: auctions.sh.
# Here: PING (the client's own ceiling), ZPOPMIN (the admission tick), HSET (a cart line),
# XADD (the hot-bid log), one at a time (50 clients) and pipelined x16, with the Redis
# persistence setting in force (the stack runs AOF `appendfsync always`, so every write
# waits for an fsync shared by the writes of one event-loop turn).
#
#   deploy/bench/baselines.sh [--quick] [OUT_DIR]     (normally via deploy/bench/run)
#
# Touches only keys `fgbench:base:<pid>:*` of the private Redis and deletes them afterwards.
set -euo pipefail

QUICK="${BENCH_QUICK:-0}"
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
OUT="${1:-$(mktemp -d)}"
mkdir -p "$OUT"
BENCH_OUT="${BENCH_OUT:-/dev/stdout}"
REDIS_PORT="${FLOODGATE_REDIS_PORT:-56379}"
PREFIX="fgbench:base:$$:"
if [ "$QUICK" = 1 ]; then N=20000; else N=200000; fi

log() { printf '\033[1m[bench baselines]\033[0m %s\n' "$*" >&2; }
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }
rcli ping >/dev/null 2>&1 || { log "private Redis not reachable on :$REDIS_PORT (run deploy/stack deps)"; exit 1; }
cleanup() {
  rcli --scan --pattern "${PREFIX}*" 2>/dev/null | xargs -r -n 1000 redis-cli -p "$REDIS_PORT" UNLINK >/dev/null 2>&1 || true
}
trap cleanup EXIT

NAMES=(); CMDS=()
add() { NAMES+=("$1"); CMDS+=("$2"); }
add "PING" "PING"
add "ZADD (fill the queue)" "ZADD ${PREFIX}{e}:q __rand_int__ m:__rand_int__"
add "ZPOPMIN 10 (admission tick)" "ZPOPMIN ${PREFIX}{e}:q 10"
add "HSET (cart line)" "HSET ${PREFIX}cart:__rand_int__ sku-1 2"
add "XADD (hot-bid log)" "XADD ${PREFIX}{a}:bids MAXLEN ~ 100000 * amount __rand_int__"

log "redis-benchmark, $N requests per command, 50 clients (appendfsync $(rcli config get appendfsync | tail -1))"
RESULTS="$OUT/redis-baselines.csv"
echo "command,pipeline,rps,p50_ms,p99_ms" > "$RESULTS"
set -f # `XADD ... *` must reach redis-benchmark as a literal star
for pipe in 1 16; do
  for i in "${!NAMES[@]}"; do
    # shellcheck disable=SC2086 # the command is split into words on purpose
    line="$(redis-benchmark -p "$REDIS_PORT" -c 50 -n "$N" -r 1000000 -P "$pipe" --csv ${CMDS[$i]} 2>/dev/null | tail -1)"
    # "test","rps","avg","min","p50","p95","p99","max"
    IFS=, read -r _ rps _ _ p50 _ p99 _ <<<"${line//\"/}"
    echo "${NAMES[$i]},$pipe,$rps,$p50,$p99" >> "$RESULTS"
    log "  ${NAMES[$i]} (pipeline $pipe): $rps/s, p50 $p50 ms, p99 $p99 ms"
  done
done
set +f

{
  echo "## Redis baselines (same run)"
  echo
  echo "redis-benchmark against the stack's private Redis (AOF \`appendfsync $(rcli config get appendfsync | tail -1)\`), 50 clients, $N requests per command. The join/status scripts, ZADD NX and ZRANK are measured in the gateway section; holds and bids against pgbench in theirs."
  echo
  echo "| command | one at a time: req/s | p50 ms | p99 ms | pipelined ×16: req/s | p50 ms | p99 ms |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  for i in "${!NAMES[@]}"; do
    a="$(awk -F, -v n="${NAMES[$i]}" '$1 == n && $2 == 1 {printf "%.0f | %s | %s", $3, $4, $5}' "$RESULTS")"
    b="$(awk -F, -v n="${NAMES[$i]}" '$1 == n && $2 == 16 {printf "%.0f | %s | %s", $3, $4, $5}' "$RESULTS")"
    echo "| ${NAMES[$i]} | $a | $b |"
  done
  echo
} > "$BENCH_OUT"

#!/usr/bin/env bash
# One event's joins on the Redis Cluster, whole and split (`queue_shards`, issue 17): the
# gateway's own join script (EVALSHA, the arguments the gateway sends) run by redis-benchmark
#   1. against the one master that holds an unsplit event (`fg:{e}:…`), and
#   2. against the three masters that hold a split event's three sub-queues (`fg:{e:k}:…`),
#      one redis-benchmark per sub-queue, at the same time, with the same total clients
#      and requests,
# in the same run, so the ratio is what splitting buys on this machine (all six cluster nodes
# and the load generators share its cores).
#
#   deploy/bench/split.sh [--quick] OUT_DIR        (normally via deploy/bench/run)
#
# Uses the stack's local cluster (FLOODGATE_REDIS_CLUSTER=1 deploy/stack deps: created once,
# reused) under a unique key prefix that it deletes afterwards.
set -euo pipefail

QUICK="${BENCH_QUICK:-0}"
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
OUT="${1:?usage: split.sh [--quick] OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BENCH_OUT="${BENCH_OUT:-$OUT/split.md}"
if [ "$QUICK" = 1 ]; then N=30000; else N=600000; fi
CLIENTS=150
SHARDS=3

log() { printf '\033[1m[split-bench]\033[0m %s\n' "$*" >&2; }

FLOODGATE_REDIS_CLUSTER=1 "$ROOT/deploy/stack" deps >&2
SEED="${FLOODGATE_REDIS_CLUSTER_PORTS:-17001}"; SEED="${SEED%% *}"
PREFIX="fgbench:split:$$:"
MASTERS=()
cleanup() {
  for m in "${MASTERS[@]:-}"; do
    [ -n "$m" ] || continue
    redis-cli -p "$m" --scan --pattern "${PREFIX}*" 2>/dev/null \
      | while read -r k; do redis-cli -p "$m" UNLINK "$k" >/dev/null; done
  done
}
trap cleanup EXIT

# The master port serving a key's slot (from CLUSTER NODES: a master's line ends with its
# slot ranges, "a-b" or "a").
master_of() {
  local slot; slot="$(redis-cli -p "$SEED" CLUSTER KEYSLOT "$1")"
  redis-cli -p "$SEED" CLUSTER NODES | awk -v s="$slot" '
    $3 ~ /master/ && $3 !~ /fail/ {
      split($2, a, /[:@]/)
      for (i = 9; i <= NF; i++) {
        n = split($i, r, "-"); lo = r[1] + 0; hi = (n > 1 ? r[2] : r[1]) + 0
        if (s + 0 >= lo && s + 0 <= hi) { print a[2]; exit }
      }
    }'
}
# An event whose sub-queues land on three different masters (what operations.md tells ops to
# check; the gateway's key layout decides the slots, this only picks the name).
EVENT=""
for i in $(seq 0 200); do
  e="sb$i"; ms=()
  for k in $(seq 0 $((SHARDS - 1))); do
    if [ "$k" = 0 ]; then tag="$e"; else tag="$e:$k"; fi
    ms+=("$(master_of "${PREFIX}fg:{$tag}:q")")
  done
  if [ "$(printf '%s\n' "${ms[@]}" | sort -u | grep -c .)" = "$SHARDS" ]; then EVENT="$e"; MASTERS=("${ms[@]}"); break; fi
done
[ -n "$EVENT" ] || { log "no event name spreads over $SHARDS masters (is the cluster whole?)"; exit 1; }
SPLIT_MASTERS="${MASTERS[*]}"
log "event $EVENT: sub-queues on masters $SPLIT_MASTERS"

JOIN="$(cd "$ROOT" && cargo bench -q --workspace --bench token -- lua join)"
for m in "${MASTERS[@]}"; do
  SHA="$(redis-cli -p "$m" SCRIPT LOAD "$JOIN")"
done

# One redis-benchmark of the join script on sub-queue `tag` (master port), `n` requests,
# `c` clients; ARGV[9] '1' when the room is split (the FIFO histogram is kept).
rb() { # port tag c n split csv-out
  local port="$1" tag="$2" c="$3" n="$4" split="$5" out="$6" k="${PREFIX}fg:{$2}:"
  redis-cli -p "$port" HSET "${k}cfg" mode queue sale_start_ms 0 >/dev/null
  redis-benchmark -p "$port" -c "$c" -n "$n" -r 1000000 --csv EVALSHA "$SHA" 13 \
    "${k}cfg" "${k}q" "${k}places" "${k}adm" "${k}sold_out" "${k}active" "${k}prog" "${k}hist" \
    "${k}qgone" "${k}revoked" "${k}reg" "${k}drawn" "${k}fhist" \
    "m:__rand_int__" -4000000000 "s:__rand_int__" 600000 "" "" "" "" "$split" 2>/dev/null \
    | tail -1 > "$out"
}
# CPU seconds a node has used (user + system), for the cores each row kept busy.
cpu_s() { redis-cli -p "$1" INFO cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.3f", s}'; }
cores() { # ms, then before/after pairs
  local ms="$1"; shift
  awk -v ms="$ms" 'BEGIN { t = 0; for (i = 1; i < ARGC; i += 2) t += ARGV[i+1] - ARGV[i]; printf "%.2f", t * 1000 / ms; exit }' "$@"
}
field() { awk -F'","' -v i="$2" '{gsub(/"/,"",$i); print $i}' "$1"; }
now_ms() { date +%s%3N; }

TMP="$(mktemp -d)"
# 0. the same on the stack's single waiting-room Redis (not a cluster node), for reference.
SINGLE_PORT="${FLOODGATE_QUEUE_REDIS_PORT:-56380}"
MASTERS+=("$SINGLE_PORT")
SHA="$(redis-cli -p "$SINGLE_PORT" SCRIPT LOAD "$JOIN")"
t0="$(now_ms)"
rb "$SINGLE_PORT" "s$EVENT" "$CLIENTS" "$N" "" "$TMP/single.csv"
t1="$(now_ms)"
SINGLE_RPS="$(awk -v n="$N" -v ms="$((t1 - t0))" 'BEGIN { printf "%.0f", n * 1000 / ms }')"
log "single Redis: $SINGLE_RPS joins/s"
# 1. unsplit: all clients on the event's one master (its own event, so the split row's
# sub-queue 0 starts empty too).
WHOLE="w$EVENT"
WHOLE_MASTER="$(master_of "${PREFIX}fg:{$WHOLE}:q")"
MASTERS+=("$WHOLE_MASTER")
SHA="$(redis-cli -p "$WHOLE_MASTER" SCRIPT LOAD "$JOIN")"
c0="$(cpu_s "$WHOLE_MASTER")"
t0="$(now_ms)"
rb "$WHOLE_MASTER" "$WHOLE" "$CLIENTS" "$N" "" "$TMP/whole.csv"
t1="$(now_ms)"
WHOLE_CORES="$(cores $((t1 - t0)) "$c0" "$(cpu_s "$WHOLE_MASTER")")"
WHOLE_RPS="$(awk -v n="$N" -v ms="$((t1 - t0))" 'BEGIN { printf "%.0f", n * 1000 / ms }')"
log "one queue: $WHOLE_RPS joins/s"
# 2. split: the same clients and requests spread over the sub-queues, at once.
read -r -a SM <<<"$SPLIT_MASTERS"
C0=(); for m in "${SM[@]}"; do C0+=("$(cpu_s "$m")"); done
t0="$(now_ms)"
for k in $(seq 0 $((SHARDS - 1))); do
  if [ "$k" = 0 ]; then tag="$EVENT"; else tag="$EVENT:$k"; fi
  rb "${MASTERS[$k]}" "$tag" $((CLIENTS / SHARDS)) $((N / SHARDS)) 1 "$TMP/split-$k.csv" &
done
wait
t1="$(now_ms)"
PAIRS=(); i=0; for m in "${SM[@]}"; do PAIRS+=("${C0[$i]}" "$(cpu_s "$m")"); i=$((i + 1)); done
SPLIT_CORES="$(cores $((t1 - t0)) "${PAIRS[@]}")"
SPLIT_RPS="$(awk -v n="$N" -v ms="$((t1 - t0))" 'BEGIN { printf "%.0f", n * 1000 / ms }')"
log "$SHARDS sub-queues: $SPLIT_RPS joins/s"
# Every join landed: each sub-queue holds its share (random accounts: some joined twice).
TOTAL=0
for k in $(seq 0 $((SHARDS - 1))); do
  if [ "$k" = 0 ]; then tag="$EVENT"; else tag="$EVENT:$k"; fi
  n="$(redis-cli -p "${MASTERS[$k]}" ZCARD "${PREFIX}fg:{$tag}:q")"
  [ "$n" -gt 0 ] || { log "sub-queue $k is empty"; exit 1; }
  TOTAL=$((TOTAL + n))
done
RATIO="$(awk -v a="$SPLIT_RPS" -v b="$WHOLE_RPS" 'BEGIN { printf "%.2f", a / b }')"
P99S=""; for k in $(seq 0 $((SHARDS - 1))); do P99S="$P99S $(field "$TMP/split-$k.csv" 7)"; done

{
  echo "## Split queue: one event's joins on the Redis Cluster, whole vs \`queue_shards\` = $SHARDS (issue 17)"
  echo
  echo "Recorded $(date -u +%Y-%m-%dT%H:%MZ) by \`deploy/bench/split.sh\` on $(nproc) cores, commit $(cd "$ROOT" && git rev-parse --short HEAD)."
  echo "The gateway's join script (EVALSHA, the gateway's keys and arguments) driven by redis-benchmark on the"
  echo "local cluster (3 masters + 3 replicas, \`appendfsync everysec\`), $CLIENTS clients and $N joins in each row; the"
  echo "split row runs one redis-benchmark per sub-queue at once, each on the master its hash tag maps to"
  echo "(event \`$EVENT\`: masters $SPLIT_MASTERS). Every node and load generator shares this machine's cores."
  echo
  echo "| layout | masters | joins/s | p50 | p99 | vs one queue | cores the masters used |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  echo "| one queue, the single waiting-room Redis (:$SINGLE_PORT, not a cluster) | 1 | $SINGLE_RPS | $(field "$TMP/single.csv" 5) ms | $(field "$TMP/single.csv" 7) ms | $(awk -v a="$SINGLE_RPS" -v b="$WHOLE_RPS" 'BEGIN { printf "%.2f", a / b }')× | — |"
  echo "| one queue (\`fg:{$WHOLE}:…\`) | 1 | $WHOLE_RPS | $(field "$TMP/whole.csv" 5) ms | $(field "$TMP/whole.csv" 7) ms | 1.00× | $WHOLE_CORES |"
  echo "| $SHARDS sub-queues (\`fg:{$EVENT:k}:…\`) | $SHARDS | $SPLIT_RPS | $(field "$TMP/split-0.csv" 5) ms (sub-queue 0) | ${P99S# } ms (each) | ${RATIO}× | $SPLIT_CORES |"
  echo
  echo "$TOTAL places queued over the $SHARDS sub-queues by the split row's $N joins (accounts drawn at random from a million: a repeat join keeps its place)."
} > "$BENCH_OUT"
cat "$BENCH_OUT" >&2
rm -rf "$TMP"

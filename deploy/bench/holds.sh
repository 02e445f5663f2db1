#!/usr/bin/env bash
# Seat-hold benchmark (issue 2): booking's hold endpoint versus the same SQL in pgbench.
#
#   deploy/bench/holds.sh [--quick] [OUT_DIR]   (or: deploy/bench/run holds; deploy/stack bench)
#
# 1. starts a release booking on a private port against a fresh database on the private
#    Postgres (deploy/stack deps starts it), with the sweeper on and logs at warn;
# 2. creates fresh 60,000-seat events (30 sections x 40 rows x 50 seats) through the admin
#    API and reports how long creation took;
# 3. runs `loadgen holds`: BENCH_CLIENTS concurrent clients, each holding 4 random adjacent
#    seats as a fresh account and releasing them again, for BENCH_DURATION_S seconds
#    -> successful holds/s, hold latency p50/p99;
# 4. runs pgbench with deploy/bench/sql/hold_seats.sql (the very statements booking runs for
#    that hold and that release) on its own fresh 60,000-seat event -> the raw rate; reports
#    service/raw. Both with synchronous_commit off for hold transactions (booking's default,
#    async_commit_holds) and on. Service and raw alternate, each raw run right after its
#    service run, for BENCH_HOLDS_ROUNDS rounds (2; 1 with --quick): the ratio is the sum of
#    the service's rates over the sum of the raw ones, so a box that slows down or speeds up
#    during the run weighs on both sides alike instead of on whichever ran later;
# 5. GA: one counter row versus eight, through booking (loadgen) and raw (pgbench running
#    deploy/bench/sql/ga_hold.sql: booking's hold statement and release, per cycle).
# Results go to $BENCH_OUT as a markdown section (see deploy/bench/run), and the raw loadgen
# reports plus a summary to OUT_DIR/holds.json when OUT_DIR is given.
#
#   BENCH_AB_BASE=/path/to/other/booking deploy/bench/holds.sh
#
# instead compares two builds of booking on this box's noise: BENCH_AB_ROUNDS rounds (3) of
# the explicit seat holds and the 8-shard GA holds, the other build and this one alternating
# on the same events, and prints the table of rates and CPU per cycle (nothing else runs).
set -euo pipefail

QUICK="${BENCH_QUICK:-0}"
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
RESULTS="${1:-}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BENCH="$ROOT/deploy/bench"
PG_PORT="${FLOODGATE_PG_PORT:-55432}"
PORT="${BENCH_HOLDS_PORT:-18095}"
if [ "$QUICK" = 1 ]; then DUR="${BENCH_DURATION_S:-3}"; else DUR="${BENCH_DURATION_S:-20}"; fi
GA_DUR=$(( DUR / 2 > 2 ? DUR / 2 : 2 ))
CLIENTS="${BENCH_CLIENTS:-64}"
POOL="${BENCH_POOL:-32}"          # booking's Postgres pool; pgbench gets as many connections
OUT="${BENCH_OUT:-/dev/stdout}"
DB="fg_bench_holds_$(date +%s)_$$"
URL="http://127.0.0.1:$PORT"
ADMIN="bench-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
WORK="$(mktemp -d)"
BOOKING_PID=""
AB_BASE="${BENCH_AB_BASE:-}"
if [ "$QUICK" = 1 ]; then ROUNDS="${BENCH_HOLDS_ROUNDS:-1}"; else ROUNDS="${BENCH_HOLDS_ROUNDS:-2}"; fi
AB_ROUNDS="${BENCH_AB_ROUNDS:-3}"

log() { printf '\033[1m[bench holds]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
psql_q() { psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
PGBENCH="$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | sort -V | tail -1 || true)"
[ -n "$PGBENCH" ] || die "pgbench not found (deploy/stack bench installs postgresql-contrib)"
command -v curl >/dev/null || die "curl not found"
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

# Starts booking with hold transactions async (true) or durable (false). A clean environment:
# no FLOODGATE_* from the caller's shell; dev mode, so the dev token key (loadgen mints with it)
# is accepted.
start_booking() {
  local async="$1"
  stop_booking
  # Make sure whatever answers on $PORT afterwards is the booking we start here.
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    die "port $PORT is already in use (set BENCH_HOLDS_PORT)"
  fi
  env -i PATH="$PATH" HOME="${HOME:-/tmp}" \
    DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$DB" \
    REDIS_URL="redis://127.0.0.1:${FLOODGATE_REDIS_PORT:-56379}" \
    FLOODGATE_REDIS__KEY_PREFIX="bench-holds-$$:" \
    FLOODGATE_DEV=1 \
    FLOODGATE_ADMIN_TOKEN="$ADMIN" \
    FLOODGATE_BOOKING__LISTEN="127.0.0.1:$PORT" \
    FLOODGATE_BOOKING__ASYNC_COMMIT_HOLDS="$async" \
    FLOODGATE_DATABASE__MAX_CONNECTIONS="$POOL" \
    FLOODGATE_LOG__LEVEL=warn FLOODGATE_LOG__FORMAT=json \
    "$BOOKING_BIN" >>"$WORK/booking.log" 2>&1 &
  BOOKING_PID=$!
  for _ in $(seq 1 100); do
    curl -fsS "$URL/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$BOOKING_PID" 2>/dev/null || { tail -20 "$WORK/booking.log" >&2; die "booking exited"; }
    sleep 0.1
  done
  die "booking not ready on $URL"
}

# create_event ID [ga_shards]: a 60,000-seat event, or a GA-only event with 10M units.
create_event() {
  local id="$1" body
  if [ $# -ge 2 ]; then
    body="{\"id\":\"$id\",\"name\":\"bench $id\",\"sale_start\":\"2020-01-01T00:00:00Z\",\"ga_tiers\":[{\"tier\":\"FLOOR\",\"price\":9000,\"capacity\":10000000,\"shards\":$2}]}"
  else
    local sections="" i
    for i in $(seq 1 30); do
      sections+="${sections:+,}{\"name\":\"S$i\",\"rows\":40,\"seats_per_row\":50,\"price_tier\":\"$([ $((i % 2)) = 0 ] && echo A || echo B)\"}"
    done
    body="{\"id\":\"$id\",\"name\":\"bench $id\",\"sale_start\":\"2020-01-01T00:00:00Z\",\"price_tiers\":[{\"tier\":\"A\",\"price\":12000},{\"tier\":\"B\",\"price\":8000}],\"seat_map\":{\"sections\":[$sections]}}"
  fi
  curl -fsS -o "$WORK/create-$id.json" -w '%{time_total}' -H "authorization: Bearer $ADMIN" \
    -H 'content-type: application/json' -d "$body" "$URL/admin/events" \
    || die "creating event $id failed"
}

# json_num FILE KEY: the first numeric value of "KEY" in a JSON file.
json_num() { grep -oE "\"$2\": *[0-9.eE+-]+" "$1" | head -1 | sed -E 's/.*: *//'; }

# CPU accounting. The machine is shared (booking, loadgen, Postgres, and whatever else runs),
# so alongside the rates we measure CPU seconds per hold+release cycle for each party from
# /proc: that figure does not depend on how busy the machine is.
TICK="$(getconf CLK_TCK)"
# This database's client backends and Postgres' own background processes (with async commits
# the WAL writer does the flushing the backends would), not other databases' clients.
backend_pids() {
  psql_q -d postgres -c "SELECT pid FROM pg_stat_activity WHERE datname = '$DB' AND backend_type = 'client backend' OR datname IS NULL AND backend_type <> 'client backend'"
}
# cpu_table PID...: "pid cpu_seconds" of each live pid, read in one go. (One awk per pid took
# ~2 s with 37 pids on a saturated box, which pushed the end of the window past the end of
# the run: pgbench's async row then read 0.00 ms of Postgres CPU.)
cpu_table() {
  [ "$#" -gt 0 ] || return 0
  local p files=()
  for p in "$@"; do files+=("/proc/$p/stat"); done
  cat "${files[@]}" 2>/dev/null | awk -v t="$TICK" '{ print $1, ($14 + $15) / t }'
}
cpu_mark() { # cpu_mark PID...: remembers the CPU time of the given pids and of the Postgres pids
  cpu_table "$@" $(backend_pids) > "$WORK/cpu0"
  T0="$(date +%s.%N)"
}
cpu_since() { # cpu_since PID...: prints "app_cpu_s pg_cpu_s wall_s" since cpu_mark
  local t1
  t1="$(date +%s.%N)"
  cpu_table "$@" $(backend_pids) | awk -v apps=" $* " -v t0="$T0" -v t1="$t1" '
    NR == FNR { z[$1] = $2; next }
    { d = $2 - ($1 in z ? z[$1] : 0); if (index(apps, " " $1 " ")) app += d; else pg += d }
    END { printf "%s %s %s\n", app + 0, pg + 0, t1 - t0 }' "$WORK/cpu0" -
}
# measure NAME DUR CMD...: runs CMD in the background, samples CPU from 1 s in to 3/4 of the
# run (well before the end even on a loaded machine, now that a sample is one read); leaves
# "app pg wall" in $WORK/NAME.cpu (app = booking + the client process).
measure() {
  local name="$1" dur="$2"; shift 2
  # Every run starts right after a checkpoint: one falling inside a run (the events' 540,000
  # seat rows make plenty of WAL) would charge that run alone the full-page writes of every
  # page it touches first after it.
  psql_q -d "$DB" -c "CHECKPOINT" >/dev/null
  "$@" &
  local pid=$!
  sleep 1
  if [ "$dur" -gt 3 ]; then
    cpu_mark "$pid" $BOOKING_PID
    sleep $(( dur * 3 / 4 - 1 ))
    cpu_since "$pid" $BOOKING_PID > "$WORK/$name.cpu"
  else
    echo "0 0 0" > "$WORK/$name.cpu"
  fi
  wait "$pid"
}

# loadgen_holds EVENT JSON [ARGS]: CPU is recorded under $CPU_NAME (default: the event).
loadgen_holds() {
  local event="$1" json="$2"; shift 2
  measure "${CPU_NAME:-$event}" "$DUR" "$LOADGEN_BIN" holds --booking "$URL" --event "$event" --clients "$CLIENTS" \
    --duration-s "$DUR" --json "$json" "$@" >&2
}

pgbench_tps() {
  local script="$1" event="$2" async="$3" dur="$4"
  # Booking's hold connections' settings (db::pool's and holds::take::hold_pool's, defaults),
  # for the whole session, as booking sets them at connect time.
  local sync=on; [ "$async" = 1 ] && sync=off
  PGOPTIONS="-c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c synchronous_commit=$sync -c jit=off -c statement_timeout=30000 -c idle_in_transaction_session_timeout=60000 -c client_connection_check_interval=200ms" \
  measure "${CPU_NAME:-$event}" "$dur" "$PGBENCH" -h 127.0.0.1 -p "$PG_PORT" -U postgres -n -M prepared -c "$POOL" -j 2 -T "$dur" \
    -D event="$event" -D async="$async" -f "$script" "$DB" > "$WORK/pgbench-$event.log" 2>&1
  cat "$WORK/pgbench-$event.log" >> "$WORK/pgbench.log"
  sed -nE 's/^tps = ([0-9.]+) \(without initial connection time\).*/\1/p' "$WORK/pgbench-$event.log"
}

# cpu_per_cycle NAME RATE: "pg_ms app_ms" CPU milliseconds per cycle over the sampled window.
cpu_per_cycle() {
  read -r app pg wall < "$WORK/$1.cpu"
  awk -v a="$app" -v p="$pg" -v w="$wall" -v r="$2" 'BEGIN {
    if (w > 0 && r > 0) printf "%.2f %.2f", 1000 * p / (w * r), 1000 * a / (w * r); else print "0 0" }'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / b; else print "n/a" }'; }
fmt() { awk -v a="$1" 'BEGIN { printf "%.0f", a }'; }
# GA holds that pgbench took and released (its script rolls back a hold that found every shard
# busy, where booking would go on piecewise).
ga_released() { psql_q -d "$DB" -c "SELECT count(*) FROM holds WHERE event_id = '$1' AND status = 'released'"; }

log "starting booking on $URL (database $DB)"
start_booking true
log "creating 60,000-seat events"
T_CREATE="$(create_event svc-async)"
SEATS="$(json_num "$WORK/create-svc-async.json" seats)"
[ "$SEATS" = 60000 ] || die "expected 60000 seats, got $SEATS"
create_event svc-sync >/dev/null
create_event best-async >/dev/null
create_event pg-async >/dev/null
create_event pg-sync >/dev/null
create_event ga1 1 >/dev/null; create_event ga8 8 >/dev/null
create_event pg-ga1 1 >/dev/null; create_event pg-ga8 8 >/dev/null
psql_q -d "$DB" -c "VACUUM ANALYZE" >/dev/null

if [ -n "$AB_BASE" ]; then
  [ -x "$AB_BASE" ] || die "BENCH_AB_BASE=$AB_BASE is not an executable"
  THIS_BIN="$BOOKING_BIN"
  {
    echo "A/B, $AB_ROUNDS rounds alternating on the same events (async hold commits, $CLIENTS clients, pool $POOL, ${DUR} s seat holds, ${GA_DUR} s GA over 8 shards): base $AB_BASE, this build $THIS_BIN."
    echo
    echo "| round | build | seat holds/s | CPU per cycle: Postgres + booking & loadgen | GA 8 shards holds/s | CPU per cycle |"
    echo "| ---: | --- | ---: | ---: | ---: | ---: |"
  } > "$WORK/ab.md"
  for round in $(seq 1 "$AB_ROUNDS"); do
    for build in base this; do
      if [ "$build" = base ]; then BOOKING_BIN="$AB_BASE"; else BOOKING_BIN="$THIS_BIN"; fi
      log "A/B round $round: $build"
      start_booking true
      loadgen_holds svc-async "$WORK/ab-seats.json"
      DUR="$GA_DUR" loadgen_holds ga8 "$WORK/ab-ga8.json" --ga-tier FLOOR
      seats="$(json_num "$WORK/ab-seats.json" holds_per_s)"; ga="$(json_num "$WORK/ab-ga8.json" holds_per_s)"
      read -r sp sa <<< "$(cpu_per_cycle svc-async "$seats")"; read -r gp ga_app <<< "$(cpu_per_cycle ga8 "$ga")"
      echo "| $round | $build | $(fmt "$seats") | $sp + $sa ms | $(fmt "$ga") | $gp + $ga_app ms |" >> "$WORK/ab.md"
    done
  done
  stop_booking
  cat "$WORK/ab.md" >> "$OUT"
  log "done"
  exit 0
fi

# Seat holds, service and raw alternating (see 4. above). Booking is stopped while pgbench
# runs, so that the raw run has the box to itself as the service run had.
# holds_per_statement: the running booking's mean explicit seat holds per hold statement (its
# hold batcher's `floodgate_booking_seat_hold_batch_size`, booking/src/inventory/holds/grouped.rs; 1.0: every
# hold on its own).
holds_per_statement() {
  curl -fsS "$URL/metrics" | awk '/^floodgate_booking_seat_hold_batch_size_sum/ { s = $2 } /^floodgate_booking_seat_hold_batch_size_count/ { c = $2 }
    END { if (c > 0) printf "%.1f", s / c; else print "–" }'
}
declare -A SVC_RATE PG_RATE BATCH
for round in $(seq 1 "$ROUNDS"); do
  for mode in async sync; do
    if [ "$mode" = async ]; then start_booking true; else start_booking false; fi
    log "round $round/$ROUNDS, $mode hold commits: service, $CLIENTS clients x ${DUR}s"
    CPU_NAME="svc-$mode-$round" loadgen_holds "svc-$mode" "$WORK/svc-$mode-$round.json"
    SVC_RATE[$mode-$round]="$(json_num "$WORK/svc-$mode-$round.json" holds_per_s)"
    BATCH[$mode-$round]="$(holds_per_statement)"
    stop_booking
    log "round $round/$ROUNDS, $mode hold commits: pgbench, same SQL, $POOL connections"
    rate="$(CPU_NAME="pg-$mode-$round" pgbench_tps "$BENCH/sql/hold_seats.sql" "pg-$mode" "$([ "$mode" = async ] && echo 1 || echo 0)" "$DUR")"
    [ -n "$rate" ] || { tail -30 "$WORK/pgbench.log" >&2; die "pgbench failed"; }
    PG_RATE[$mode-$round]="$rate"
  done
done
# mean RATE... : the mean of the given rates (one per round).
mean() { printf '%s\n' "$@" | awk '{ s += $1 } END { print s / NR }'; }
rates_of() { local -n rates="$1"; local r; for r in $(seq 1 "$ROUNDS"); do echo "${rates[$2-$r]}"; done; }
SVC_ASYNC="$(mean $(rates_of SVC_RATE async))"; SVC_SYNC="$(mean $(rates_of SVC_RATE sync))"
PG_ASYNC="$(mean $(rates_of PG_RATE async))"; PG_SYNC="$(mean $(rates_of PG_RATE sync))"

start_booking true
log "best available, async hold commits: $CLIENTS clients x ${DUR}s"
loadgen_holds best-async "$WORK/best-async.json" --best-available
log "GA through the service: 1 shard vs 8"
DUR="$GA_DUR" loadgen_holds ga1 "$WORK/ga1.json" --ga-tier FLOOR
DUR="$GA_DUR" loadgen_holds ga8 "$WORK/ga8.json" --ga-tier FLOOR
stop_booking

log "pgbench GA: one row vs eight shards"
declare -A GA
for mode in 0 1; do
  before="$(ga_released pg-ga1)"; pgbench_tps "$BENCH/sql/ga_hold.sql" pg-ga1 "$mode" "$GA_DUR" >/dev/null
  GA[single-$mode]=$(( $(ga_released pg-ga1) - before ))
  before="$(ga_released pg-ga8)"; pgbench_tps "$BENCH/sql/ga_hold.sql" pg-ga8 "$mode" "$GA_DUR" >/dev/null
  GA[split-$mode]=$(( $(ga_released pg-ga8) - before ))
done

# Invariants after the run: every held seat belongs to a live hold (an expired one only until
# the sweeper or the next hold tidies it), usage never negative, every GA tier adds up:
# capacity = available + sold + units of live holds.
BAD="$(psql_q -d "$DB" -c "
  SELECT (SELECT count(*) FROM seats s LEFT JOIN holds h ON h.id = s.hold_id
          WHERE s.status = 'held' AND (h.id IS NULL OR h.status NOT IN ('active', 'expired')))
       + (SELECT count(*) FROM account_event_usage WHERE tickets < 0)
       + (SELECT count(*) FROM ga_tiers t
          WHERE t.capacity <> (SELECT sum(c.available + c.sold) FROM ga_counters c
                               WHERE c.event_id = t.event_id AND c.tier = t.tier)
                            + (SELECT COALESCE(sum(i.quantity), 0) FROM hold_ga_items i
                               JOIN holds h ON h.id = i.hold_id
                               WHERE h.event_id = t.event_id AND h.status IN ('active', 'ordered')))")"
[ "$BAD" = 0 ] || die "invariant violated after the run ($BAD rows)"

# hold_row MODE ROUND LABEL: one round's service run beside its raw run.
hold_row() {
  local mode="$1" round="$2" label="$3"
  local f="$WORK/svc-$mode-$round.json" raw="${PG_RATE[$mode-$round]}"
  local hps p50 p99 attempts s_pg s_app r_pg r_app
  hps="${SVC_RATE[$mode-$round]}"; p50="$(json_num "$f" p50_ms)"; p99="$(json_num "$f" p99_ms)"
  attempts="$(json_num "$f" requests)"
  read -r s_pg s_app <<< "$(cpu_per_cycle "svc-$mode-$round" "$hps")"
  read -r r_pg r_app <<< "$(cpu_per_cycle "pg-$mode-$round" "$raw")"
  printf '| %s | %s | %s | %s | %.1f ms | %.1f ms | %s | %s | %s + %s ms | %s + %s ms | %s |\n' "$label" "$(fmt "$hps")" "$attempts" "${BATCH[$mode-$round]}" "$p50" "$p99" "$(fmt "$raw")" "$(ratio "$hps" "$raw")" \
    "$s_pg" "$s_app" "$r_pg" "$r_app" "$(ratio "$(awk -v a="$r_pg" -v b="$r_app" 'BEGIN { print a + b }')" "$(awk -v a="$s_pg" -v b="$s_app" 'BEGIN { print a + b }')")"
}
# mode_rows MODE LABEL: every round of a mode, then the mode's rates over all rounds.
mode_rows() {
  local mode="$1" label="$2" r svc raw
  if [ "$ROUNDS" = 1 ]; then hold_row "$mode" 1 "**$label**"; return; fi
  for r in $(seq 1 "$ROUNDS"); do hold_row "$mode" "$r" "$label, round $r"; done
  if [ "$mode" = async ]; then svc="$SVC_ASYNC"; raw="$PG_ASYNC"; else svc="$SVC_SYNC"; raw="$PG_SYNC"; fi
  printf '| **%s, mean of %s rounds** | **%s** | | | | | **%s** | **%s** | | | |\n' "$label" "$ROUNDS" "$(fmt "$svc")" "$(fmt "$raw")" "$(ratio "$svc" "$raw")"
}
ga_rate() { awk -v u="$1" -v d="$2" 'BEGIN { printf "%.0f", u / d }'; }

{
  echo "## Seat holds"
  echo
  echo "Recorded $(date -u +%Y-%m-%dT%H:%MZ) by \`deploy/bench/holds.sh\` on $(nproc) cores, $(psql_q -d postgres -c 'SHOW server_version' | cut -d' ' -f1) Postgres (private instance), commit $(cd "$ROOT" && git rev-parse --short HEAD)$([ "$QUICK" = 1 ] && echo ' — QUICK smoke run, numbers not representative')."
  echo "Booking (release build, pool $POOL) and loadgen ($CLIENTS clients) and Postgres share the machine."
  echo "Each loadgen client holds 4 random adjacent seats of a fresh 60,000-seat event as a new account, then releases them (so every hold meets the same half-empty hall); pgbench runs [the same statements](../deploy/bench/sql/hold_seats.sql) (the one hold statement: usage, hold row, seats; then the one release statement) with $POOL connections on its own fresh 60,000-seat event. Booking runs that hold statement for a hold that arrives alone, and holds of one event that arrive while earlier ones are in Postgres together in one statement (group commit, \`[booking] hold_batch_max\`; the column *holds per statement*), each still all or nothing; pgbench runs every hold on its own. ${DUR} s per run. Service and raw runs alternate, each raw run right after its service run (booking stopped meanwhile), for $ROUNDS round(s) per commit mode; the goal is judged on each mode's rates over all its rounds (the rows in bold), so that the box slowing down or speeding up during the run weighs on both sides alike."
  echo
  echo "60,000-seat event created through the admin API in **$(awk -v t="$T_CREATE" 'BEGIN { printf "%.2f", t }') s** (one transaction, \`generate_series\` per section)."
  echo
  echo "| hold commits | holds/s (service) | hold requests | holds per statement | p50 | p99 | pgbench hold+release/s | service / raw rate | CPU per cycle, service: Postgres + booking & loadgen | CPU per cycle, raw: Postgres + pgbench | raw CPU / service CPU |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  mode_rows async "async (synchronous_commit off, default)"
  mode_rows sync "durable (synchronous_commit on)"
  echo
  echo "Load average when the run ended: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores. The rate ratio compares two runs made one after the other on a shared machine, so it moves with whatever else runs; the CPU columns (from /proc, per hold+release cycle) depend less on that load, though contention still inflates them: the last column is the share of the service's total CPU that the same SQL needs on its own, i.e. the rate ratio to expect when booking, loadgen and Postgres compete for the same cores."
  echo
  echo "Best available versus explicit seats, same run (async hold commits, 4 seats per hold, released at once, so every best-available request wants the front-row blocks of an empty 60,000-seat hall; booking serves them in per-event batches, one candidate read per batch, and takes each block with the guarded statement, which also locks the row neighbours, where this event's explicit holds run the plain one): explicit **$(fmt "$SVC_ASYNC") holds/s** (the async rounds' mean), best available **$(fmt "$(json_num "$WORK/best-async.json" holds_per_s)") holds/s** (p99 $(json_num "$WORK/best-async.json" p99_ms) ms), $(ratio "$(json_num "$WORK/best-async.json" holds_per_s)" "$SVC_ASYNC") of explicit."
  echo
  echo "GA holds, one counter row versus a tier split over 8 shards (1 unit per hold, hold commits async):"
  echo
  echo "| path | 1 row | 8 shards |"
  echo "| --- | ---: | ---: |"
  printf '| service (loadgen hold+release, holds/s; p99) | %s; %s ms | %s; %s ms |\n' \
    "$(fmt "$(json_num "$WORK/ga1.json" holds_per_s)")" "$(json_num "$WORK/ga1.json" p99_ms)" \
    "$(fmt "$(json_num "$WORK/ga8.json" holds_per_s)")" "$(json_num "$WORK/ga8.json" p99_ms)"
  printf '| raw pgbench hold+release/s (same SQL), commits async | %s | %s |\n' "$(ga_rate "${GA[single-1]}" "$GA_DUR")" "$(ga_rate "${GA[split-1]}" "$GA_DUR")"
  printf '| raw pgbench hold+release/s (same SQL), commits durable | %s | %s |\n' "$(ga_rate "${GA[single-0]}" "$GA_DUR")" "$(ga_rate "${GA[split-0]}" "$GA_DUR")"
  echo
} > "$OUT"
if [ -n "$RESULTS" ]; then
  mkdir -p "$RESULTS"
  cp "$WORK"/svc-*.json "$WORK"/best-*.json "$WORK"/ga*.json "$RESULTS/" 2>/dev/null || true
  # GA: the service's holds commit asynchronously, so its raw rates are pgbench's async ones.
  printf '{"create_60k_s": %s, "best_available_holds_per_s": %s, "service_async_holds_per_s": %s, "service_sync_holds_per_s": %s, "pgbench_async_per_s": %s, "pgbench_sync_per_s": %s, "ga_one_row_per_s": %s, "ga_shards_per_s": %s, "ga_raw_one_row_per_s": %s, "ga_raw_shards_per_s": %s}\n' \
    "$T_CREATE" "$(json_num "$WORK/best-async.json" holds_per_s)" "$SVC_ASYNC" "$SVC_SYNC" \
    "$PG_ASYNC" "$PG_SYNC" "$(json_num "$WORK/ga1.json" holds_per_s)" "$(json_num "$WORK/ga8.json" holds_per_s)" \
    "$(ga_rate "${GA[single-1]}" "$GA_DUR")" "$(ga_rate "${GA[split-1]}" "$GA_DUR")" > "$RESULTS/holds.json"
fi
log "done"

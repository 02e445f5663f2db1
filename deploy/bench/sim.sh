#!/usr/bin/env bash
# Launch dry-run simulator benchmark (`floodgate-sim`, DESIGN §8 "Simulator", issue 17).
#
#   deploy/bench/sim.sh [--quick] [OUT_DIR]     (normally via deploy/bench/run sim)
#
# Needs nothing running: the simulator is one binary (release build of gateway's
# floodgate-sim) and jq.
#   --quick (CI): two small simulations (a surge with a sell-out; an on-sale with a pre-sale
#      draw and a max_active cap), invariants checked from their summary.json and per-second
#      timeline: admitted by second t never above rate·(t − sale start) + one burst, no
#      window over rate·W + burst, max_active held, nobody admitted before the sale start,
#      waits non-negative, a sell-out whenever demand exceeds the seats. Non-zero exit on a
#      violation.
#   full: (1) the seed launch — 2,000,000 fans over 10 minutes, 60,000 seats — timed on the
#      wall clock (must finish in SIM_SEED_BUDGET_S, default 60 s); (2) the 200,000-fan surge
#      profile of deploy/bench/surge.sh replayed over SIM_RUNS random seeds (default 101) and
#      compared with the measured surge (docs/benchmarks.md, bench:surge: 2026-11-30 18:56
#      UTC); the measured figures are below (SIM_MEASURED_*), update them when the surge is
#      re-measured. The comparison is reported, not enforced: a model gap is not an invariant.
# The markdown section goes to $BENCH_OUT; summaries, timelines and HTML reports stay in
# OUT_DIR.
set -euo pipefail

QUICK="${BENCH_QUICK:-0}"
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$(mktemp -d)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BENCH_OUT="${BENCH_OUT:-/dev/stdout}"
SIM="${BENCH_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}/floodgate-sim"
RUNS="${SIM_RUNS:-101}"
BUDGET="${SIM_SEED_BUDGET_S:-60}"
# The measured surge (docs/benchmarks.md, bench:surge, run of 2026-11-30 18:56 UTC).
M_P50="${SIM_MEASURED_WAIT_P50_S:-40.4}"
M_P99="${SIM_MEASURED_WAIT_P99_S:-83.1}"
M_SOLD_OUT="${SIM_MEASURED_SOLD_OUT_S:-94}"
M_ADMITTED="${SIM_MEASURED_ADMITTED:-9246}"
M_ORDERS="${SIM_MEASURED_ORDERS:-3000}"
M_STATUS="${SIM_MEASURED_STATUS:-411847}"
M_JOINS_PER_S="${SIM_MEASURED_JOINS_PER_S:-1538}"
M_STATUS_PER_S="${SIM_MEASURED_STATUS_PER_S:-3167}"
M_TOLD="${SIM_MEASURED_TOLD_SOLD_OUT:-136324}"
M_STILL="${SIM_MEASURED_STILL_WAITING:-54430}"

log() { printf '\033[1m[bench sim]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
command -v jq >/dev/null || die "jq not found (apt-get install jq)"
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  log "building floodgate-sim (release)"
  (cd "$ROOT" && cargo build --release --workspace --bin floodgate-sim)
fi
[ -x "$SIM" ] || die "missing $SIM"

# The surge bench's profile (deploy/bench/surge.sh, full): its sale opened a minute before
# the first arrival; loadgen fans look at the map again every second.
SURGE=(--arrivals ramp:peak=5000,ramp=30,hold=10,down=30 --sale-start-s -60 --admit-per-minute 6000
       --seats 6000 --seats-per-fan 2 --vanish 0.1 --think-ms 200 --hold-ttl-s 20 --look-every-ms 1000)

# check DIR: the invariants of one run, from its summary and timeline.
failed=0
check() {
  local dir="$1" s="$1/summary.json"
  local problems
  problems="$(jq -r '
    .checks as $c
    | (if $c.admission_within_rate then empty else "a window admitted \($c.max_window_excess) > rate·W + burst \($c.burst)" end),
      (if $c.within_max_active then empty else "peak holding \($c.peak_holding) over max_active" end),
      (if $c.admitted_before_sale_start == 0 then empty else "\($c.admitted_before_sale_start) admitted before the sale start" end),
      (if ($c.min_wait_s // 0) >= 0 then empty else "negative wait \($c.min_wait_s)" end),
      (if ($c.seats > 0 and $c.demand_seats > $c.seats and .sold_out_at_s == null) then "demand \($c.demand_seats) > \($c.seats) seats but no sell-out" else empty end),
      (if .wait_s.count == .fans.claimed then empty else "\(.wait_s.count) waits for \(.fans.claimed) claims" end)' "$s")"
  # Admitted by the end of second t never above rate·(t + 1 − sale start) + one burst.
  local rate start burst
  rate="$(jq -r .admit_per_minute_used "$s")"; start="$(jq -r .sale_start_s "$s")"; burst="$(jq -r .checks.burst "$s")"
  problems+=$'\n'"$(awk -F, -v r="$rate" -v s="$start" -v b="$burst" 'NR > 1 {
      cum += $4; bound = r / 60 * ($1 + 1 - s); if (bound < 0) bound = 0
      if (cum > bound + b + 1e-6) { printf "second %s: %d admitted > rate·t + burst = %.1f\n", $1, cum, bound + b; exit }
    }' "$dir/timeline.csv")"
  problems="$(printf '%s\n' "$problems" | grep -v '^$' || true)"
  if [ -n "$problems" ]; then
    log "invariant violated in $dir:"; printf '%s\n' "$problems" >&2; failed=1
  fi
}

if [ "$QUICK" = 1 ]; then
  log "quick: a small surge and a small on-sale"
  "$SIM" --arrivals ramp:peak=500,ramp=10,hold=10,down=10 --sale-start-s -5 --admit-per-minute 3000 \
    --seats 600 --hold-ttl-s 10 --vanish 0.2 --check --out "$OUT/quick-surge" >"$OUT/quick-surge.txt" \
    || { cat "$OUT/quick-surge.txt" >&2; die "floodgate-sim failed (quick surge)"; }
  "$SIM" --arrivals seed:fans=20000,duration=120,presale=30,tau=20 --admit-per-minute 6000 --max-active 400 \
    --seats 2000 --hold-ttl-s 30 --check --out "$OUT/quick-onsale" >"$OUT/quick-onsale.txt" \
    || { cat "$OUT/quick-onsale.txt" >&2; die "floodgate-sim failed (quick on-sale)"; }
  check "$OUT/quick-surge"; check "$OUT/quick-onsale"
  {
    echo "## Launch simulator (quick)"
    echo
    echo '```'
    cat "$OUT/quick-surge.txt" "$OUT/quick-onsale.txt"
    echo '```'
  } > "$BENCH_OUT"
  [ "$failed" = 0 ] || die "simulator invariants violated"
  log "done"
  exit 0
fi

# ---- 1. the seed launch, timed ---------------------------------------------------------------
cat > "$OUT/seed-room.json" <<'JSON'
{"sale_start": "2027-01-10T10:00:00Z", "admit_per_minute": 12000, "mode": "queue", "max_active": 0,
 "claim_deadline_s": 120}
JSON
SEED=(--arrivals seed --room "$OUT/seed-room.json" --seats 60000 --seats-per-fan 2 --vanish 0.1
      --hold-ttl-s 600 --look-every-ms 8000)
log "seed launch: floodgate-sim ${SEED[*]}"
t0="$(date +%s.%N)"
"$SIM" "${SEED[@]}" --check --out "$OUT/seed" >"$OUT/seed.txt" || { cat "$OUT/seed.txt" >&2; die "seed simulation failed"; }
t1="$(date +%s.%N)"
WALL="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
cat "$OUT/seed.txt" >&2
check "$OUT/seed"
awk -v w="$WALL" -v b="$BUDGET" 'BEGIN { exit !(w < b) }' || { log "seed simulation took $WALL s (budget $BUDGET s)"; failed=1; }

# ---- 2. the surge profile over several seeds, against the measured surge ----------------------
log "surge profile x $RUNS seeds"
for i in $(seq 1 "$RUNS"); do
  "$SIM" "${SURGE[@]}" --stop-after-sold-out-s 35 --seed "$i" --check --out "$OUT/surge-$i" >"$OUT/surge-$i.txt" \
    || { cat "$OUT/surge-$i.txt" >&2; die "surge simulation (seed $i) failed"; }
  check "$OUT/surge-$i"
done
jq -s '.' "$OUT"/surge-*/summary.json > "$OUT/surge-runs.json"
# stats EXPR: median, 10th and 90th percentile over the runs, one decimal.
stats() {
  jq -r "[.[] | $1] | sort | [.[length / 2 | floor], .[length / 10 | floor], .[length * 9 / 10 | floor]] | map(. * 10 | round / 10) | @tsv" "$OUT/surge-runs.json"
}
row() { # label measured expr unit
  local label="$1" measured="$2" expr="$3" unit="$4" med lo hi
  read -r med lo hi < <(stats "$expr")
  awk -v l="$label" -v m="$measured" -v s="$med" -v lo="$lo" -v hi="$hi" -v u="$unit" 'BEGIN {
    d = (s - m) / m * 100
    inside = (m >= lo && m <= hi) ? "yes" : "no"
    printf "| %s | %s%s | %s%s | %+.1f %% | %s–%s%s | %s |\n", l, m, u, s, u, d, lo, hi, u, inside
  }'
}
SO_MED="$(stats .sold_out_at_s | cut -f1)"
{
  echo "## Launch simulator (\`floodgate-sim\`)"
  echo
  echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores: \`deploy/bench/sim.sh\` (release build). The simulator"
  echo "replays an arrival curve against a room config with the gateway's own admission tick (a mirror"
  echo "of \`TICK_LUA\`), poll cadence and checkout slot rules, in simulated time (docs/operations.md,"
  echo "\"Sizing a launch with the simulator\")."
  echo
  echo "### The seed launch: 2,000,000 fans over 10 minutes, 60,000 seats"
  echo
  echo "\`floodgate-sim ${SEED[*]/#$OUT\//}\` (room: 12,000 admitted/min, no \`max_active\`; a quarter of the"
  echo "fans in the two minutes before the sale start, then a rush decaying with a 90 s time constant;"
  echo "fans look at the 60,000-seat map every 8 s as \`shop.js\` does): **simulated in $WALL s** of"
  echo "wall-clock time (budget $BUDGET s; the simulation itself: $(jq -r '.wall_ms' "$OUT/seed/summary.json") ms)."
  echo
  echo '```'
  grep -v '^  wrote ' "$OUT/seed.txt"
  echo '```'
  echo
  echo "### Against the measured surge"
  echo
  echo "The surge bench's profile (\`${SURGE[*]} --stop-after-sold-out-s 35\`) over $RUNS random seeds"
  echo "(draw order, poll jitter, think times, which fans vanish), against the run recorded in"
  echo "\`bench:surge\` (2026-11-30 18:56 UTC; time in queue measured by loadgen from a fan's start to the"
  echo "status answer that admits them, sold-out as the first once-a-second sample of booking showing every"
  echo "seat sold, both from the first arrival; that sample comes up to a second after the last payment,"
  echo "which is the simulator's sell-out). \"simulated\" is each row's median over the runs; p10–p90 the"
  echo "range of the middle 80 % of runs."
  echo
  echo "| | measured | simulated (median) | difference | simulated p10–p90 | measured inside p10–p90 |"
  echo "| --- | ---: | ---: | ---: | ---: | --- |"
  row "time in queue p50" "$M_P50" .wait_s.p50 " s"
  row "time in queue p99" "$M_P99" .wait_s.p99 " s"
  row "sold out at" "$M_SOLD_OUT" .sold_out_at_s " s"
  row "fans admitted" "$M_ADMITTED" .fans.admitted ""
  row "orders" "$M_ORDERS" .fans.orders ""
  row "status polls (all)" "$M_STATUS" .status_polls.total ""
  row "status polls/s, mean over the run" "$M_STATUS_PER_S" .status_polls.mean_per_s ""
  row "joins/s, mean over the run" "$M_JOINS_PER_S" .joins.mean_per_s ""
  row "told sold out while queued" "$M_TOLD" .fans.told_sold_out_in_queue ""
  row "still waiting at the end" "$M_STILL" .fans.still_waiting_at_end ""
  echo
  echo "The measured sell-out ($M_SOLD_OUT s) is later than $(jq -r --argjson so "$M_SOLD_OUT" '[.[] | select(.sold_out_at_s != null and .sold_out_at_s <= $so)] | length' "$OUT/surge-runs.json") of the $RUNS simulated runs'"
  echo "(simulated: $(jq -r '[.[] | .sold_out_at_s // empty] | sort | "\(.[0] * 10 | round / 10)–\(.[-1] * 10 | round / 10) s, quartiles \(.[length / 4 | floor] * 10 | round / 10), \(.[length / 2 | floor] * 10 | round / 10), \(.[length * 3 / 4 | floor] * 10 | round / 10) s"' "$OUT/surge-runs.json"))."
  echo
  echo "**Why the sell-out varies from run to run.** About 3,000 buyers take every seat within ~35 s;"
  echo "what remains are the 10 % who vanish with a hold. Their seats come back 20 s later and go to fans"
  echo "still looking, 10 % of whom vanish again, and so on: a chain of k vanishes that began with a hold"
  echo "at time h ends near h + 20·k s. The last seat sells when the latest chain ends, so sell-outs fall"
  echo "in clusters about 20 s apart, decided by whether any of the ~330 first vanishes late in the sale"
  echo "is followed by a second or third (odds 0.1 and 0.01 each). The measured run is one draw of this."
  echo "A run's waits and polls follow its sell-out (admission runs at 100/s until the sold-out flag, so"
  echo "a later sell-out admits more fans, each later); the run closest to the measured sell-out:"
  echo
  jq -r --argjson so "$M_SOLD_OUT" 'map(select(.sold_out_at_s != null)) | min_by((.sold_out_at_s - $so) | fabs)
    | "seed \(.seed): sold out at \(.sold_out_at_s * 10 | round / 10) s, time in queue p50 \(.wait_s.p50 * 10 | round / 10) s, p99 \(.wait_s.p99 * 10 | round / 10) s, \(.fans.admitted) admitted, \(.status_polls.total | round) status polls, \(.fans.still_waiting_at_end) still waiting at the end."' "$OUT/surge-runs.json"
} > "$BENCH_OUT"
log "median sell-out $SO_MED s (measured $M_SOLD_OUT s); seed launch simulated in $WALL s"
[ "$failed" = 0 ] || die "simulator benchmark failed (invariant or time budget; see above)"
log "done"

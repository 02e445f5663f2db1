#!/usr/bin/env bash
# Seat-map benchmark (issue 16): fans refreshing a 60,000-seat map, JSON versus compact.
#
#   deploy/bench/seatmap.sh [--quick] [OUT_DIR]   (or: deploy/bench/run seatmap)
#
# 1. starts a release booking on a private port against a fresh database on the private
#    Postgres (deploy/stack deps starts it);
# 2. creates a 60,000-seat event (30 sections x 40 rows x 50 seats);
# 3. runs `loadgen seatmap` four times: the JSON map and the compact map (layout once, then
#    the availability with If-None-Match), each plain and gzipped. BENCH_FANS fans (1,000)
#    refresh every BENCH_EVERY_MS (1,000 ms) while 2 writers hold and release seats (the map
#    changes a few times a second). The JSON map runs with BENCH_JSON_FANS (100) fans: 1,000
#    fans x 5 MB per second is more than this box can move, and the point is its size.
# -> bytes per fetch, p50/p99 fetch latency (target for the compact map: p99 < 50 ms), and
#    how many answers were 304. Results: markdown to $BENCH_OUT, JSON to OUT_DIR.
# Ports: BENCH_SEATMAP_PORT (18180), FLOODGATE_PG_PORT (55432), FLOODGATE_REDIS_PORT (56379).
set -euo pipefail

QUICK="${BENCH_QUICK:-0}"
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
RESULTS="${1:-}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PG_PORT="${FLOODGATE_PG_PORT:-55432}"
REDIS_PORT="${FLOODGATE_REDIS_PORT:-56379}"
PORT="${BENCH_SEATMAP_PORT:-18180}"
if [ "$QUICK" = 1 ]; then
  DUR="${BENCH_DURATION_S:-3}"; FANS="${BENCH_FANS:-200}"; JSON_FANS="${BENCH_JSON_FANS:-20}"
else
  DUR="${BENCH_DURATION_S:-20}"; FANS="${BENCH_FANS:-1000}"; JSON_FANS="${BENCH_JSON_FANS:-100}"
fi
EVERY="${BENCH_EVERY_MS:-1000}"
OUT="${BENCH_OUT:-/dev/stdout}"
DB="fg_bench_seatmap_$(date +%s)_$$"
URL="http://127.0.0.1:$PORT"
ADMIN="bench-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
WORK="$(mktemp -d)"
BOOKING_PID=""

log() { printf '\033[1m[bench seatmap]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
psql_q() { psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
command -v curl >/dev/null || die "curl not found"
psql_q -d postgres -c "SELECT 1" >/dev/null 2>&1 || die "private Postgres not reachable on :$PG_PORT (run deploy/stack deps)"

cleanup() {
  if [ -n "$BOOKING_PID" ]; then kill "$BOOKING_PID" 2>/dev/null || true; wait "$BOOKING_PID" 2>/dev/null || true; fi
  psql_q -d postgres -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  log "building release binaries"
  (cd "$ROOT" && cargo build --release --workspace --bins)
fi
BOOKING_BIN="$TARGET/release/booking"
LOADGEN_BIN="$TARGET/release/loadgen"
[ -x "$BOOKING_BIN" ] && [ -x "$LOADGEN_BIN" ] || die "release binaries missing in $TARGET"

psql_q -d postgres -c "CREATE DATABASE \"$DB\"" >/dev/null
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
  die "port $PORT is already in use (set BENCH_SEATMAP_PORT)"
fi
# A clean environment; dev mode, so the dev token key (loadgen mints with it) is accepted.
env -i PATH="$PATH" HOME="${HOME:-/tmp}" \
  DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$DB" \
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
  FLOODGATE_REDIS__KEY_PREFIX="bench-seatmap-$$:" \
  FLOODGATE_DEV=1 \
  FLOODGATE_ADMIN_TOKEN="$ADMIN" \
  FLOODGATE_BOOKING__LISTEN="127.0.0.1:$PORT" \
  FLOODGATE_LOG__LEVEL=warn FLOODGATE_LOG__FORMAT=json \
  "$BOOKING_BIN" >>"$WORK/booking.log" 2>&1 &
BOOKING_PID=$!
for _ in $(seq 1 100); do
  curl -fsS "$URL/readyz" >/dev/null 2>&1 && break
  kill -0 "$BOOKING_PID" 2>/dev/null || { tail -20 "$WORK/booking.log" >&2; die "booking exited"; }
  sleep 0.1
done
curl -fsS "$URL/readyz" >/dev/null 2>&1 || die "booking not ready on $URL"

sections=""
for i in $(seq 1 30); do
  sections+="${sections:+,}{\"name\":\"S$i\",\"rows\":40,\"seats_per_row\":50,\"price_tier\":\"$([ $((i % 2)) = 0 ] && echo A || echo B)\"}"
done
body="{\"id\":\"map\",\"name\":\"bench map\",\"sale_start\":\"2020-01-01T00:00:00Z\",\"max_tickets_per_account\":10,\"price_tiers\":[{\"tier\":\"A\",\"price\":12000},{\"tier\":\"B\",\"price\":8000}],\"seat_map\":{\"sections\":[$sections]}}"
curl -fsS -o /dev/null -H "authorization: Bearer $ADMIN" -H 'content-type: application/json' \
  -d "$body" "$URL/admin/events" || die "creating the event failed"

# run NAME FORM FANS [--gzip]
run() {
  local name="$1" form="$2" fans="$3"; shift 3
  log "$name: $fans fans, $form $*"
  "$LOADGEN_BIN" seatmap --booking "$URL" --event map --form "$form" --fans "$fans" \
    --every-ms "$EVERY" --duration-s "$DUR" --shape 30x40x50 --json "$WORK/$name.json" "$@" >&2 \
    || die "loadgen seatmap $name failed"
}
run json-plain json "$JSON_FANS"
run json-gzip json "$JSON_FANS" --gzip
run compact-plain compact "$FANS"
run compact-gzip compact "$FANS" --gzip
# Booking's registry prefixes its metrics (floodgate_booking_); informational, never fatal.
BUILDS="$(curl -fsS "$URL/metrics" | grep -E '^(floodgate_booking_)?seat_map_builds_total' \
  | sed -E 's/^(floodgate_booking_)?seat_map_builds_total\{part="([a-z]+)"\} /\2=/' | tr '\n' ' ' || true)"

row() { # row NAME LABEL: one markdown row from a loadgen report
  python3 - "$WORK/$1.json" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); f = r["fetch"]; o = f["outcomes"]
print(f"| {sys.argv[2]} | {r['fans']} | {f['requests']} | {r['bytes_per_fetch']:,.0f} | "
      f"{r['layout_bytes']:,} | {o.get('304', 0)} | {f['p50_ms']:.1f} | {f['p99_ms']:.1f} | "
      f"{sum(v for k, v in o.items() if k not in ('200', '304'))} |")
PY
}
P99="$(python3 -c "import json; print(json.load(open('$WORK/compact-gzip.json'))['fetch']['p99_ms'])")"
VERDICT="$(python3 -c "print('met' if $P99 < 50 else 'missed')")"
{
  echo "## Seat map: JSON versus compact (issue 16)"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores$([ "$QUICK" = 1 ] && echo ', quick run (numbers not representative)'). A 60,000-seat event;"
  echo "each fan refreshes every $EVERY ms for $DUR s while 2 writers hold and release seats."
  echo "Bytes are per fetch as received (a 304 counts 0; the compact layout is read once per fan)."
  echo
  echo "| form | fans | fetches | bytes/fetch | layout bytes | 304s | p50 ms | p99 ms | errors |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  row json-plain "JSON map"
  row json-gzip "JSON map, gzip"
  row compact-plain "compact"
  row compact-gzip "compact, gzip"
  echo
  echo "Target p99 < 50 ms for the compact map (gzip): $VERDICT ($P99 ms). Map builds in booking: $BUILDS"
} >"$WORK/section.md"
cat "$WORK/section.md" >>"$OUT"
if [ -n "$RESULTS" ]; then mkdir -p "$RESULTS" && cp "$WORK"/*.json "$RESULTS/"; fi
# Errors (non-200/304 answers) fail the benchmark.
for n in json-plain json-gzip compact-plain compact-gzip; do
  python3 -c "
import json, sys
o = json.load(open('$WORK/$n.json'))['fetch']['outcomes']
bad = {k: v for k, v in o.items() if k not in ('200', '304')}
sys.exit(1 if bad else 0)" || die "$n: failed fetches"
done

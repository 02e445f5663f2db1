#!/usr/bin/env bash
# Tickets benchmark (issue 43): the codes a door checks, and mailing a sold-out event.
#
#   deploy/bench/tickets.sh [--quick] [OUT_DIR]   (or: deploy/bench/run tickets; deploy/stack bench)
#
# 1. codes: `cargo bench -p booking --bench ticket_codes` — signing and verifying a ticket
#    code (Ed25519 compact JWS; goal: verify ≤ 50 µs), a rotating code's TOTP, against the
#    admission-token check (HS256) measured in the same run as the baseline;
# 2. mail: a sold-out event mailed to a local SMTP sink (deploy/smtp/mailsink.py --sink, a real
#    SMTP server that counts and keeps nothing): a release booking on a private port and a fresh
#    database, BENCH_TICKETS_ORDERS paid orders of 4 seats each (15,000 = a 60,000-seat
#    stadium; 600 with --quick) written as the payment path writes them (order, tickets,
#    e-mail address, `order.paid` in the outbox) in one go, then timed from that commit until
#    the sink has accepted the last message: messages/s, time to the last one (goal: all in
#    under 5 minutes), none twice (distinct Message-IDs = messages = orders), none missing
#    (every delivery `sent`), and the CPU seconds of booking (relay, consumer and mailer) and
#    of the SMTP server.
# Results go to $BENCH_OUT as a markdown section (deploy/bench/run), JSON to OUT_DIR.
#
# BENCH_TICKETS_MAIL_CONCURRENCY / _BATCH override `[mail] concurrency` / `batch` (the
# defaults are what a launch runs with).
set -euo pipefail

QUICK="${BENCH_QUICK:-0}"
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
RESULTS="${1:-}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PG_PORT="${FLOODGATE_PG_PORT:-55432}"
PORT="${BENCH_TICKETS_PORT:-18097}"
SMTP_PORT="${BENCH_TICKETS_SMTP_PORT:-18525}"
VIEW_PORT="${BENCH_TICKETS_VIEW_PORT:-18580}"
if [ "$QUICK" = 1 ]; then ORDERS="${BENCH_TICKETS_ORDERS:-600}"; else ORDERS="${BENCH_TICKETS_ORDERS:-15000}"; fi
OUT="${BENCH_OUT:-/dev/stdout}"
DB="fg_bench_tickets_$(date +%s)_$$"
URL="http://127.0.0.1:$PORT"
ADMIN="bench-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
WORK="$(mktemp -d)"
BOOKING_PID=""
SINK_PID=""
EVENT="bench-tickets"
# How long the mail part may take before it is called a failure (the goal is 300 s).
MAIL_DEADLINE_S="${BENCH_TICKETS_DEADLINE_S:-600}"

log() { printf '\033[1m[bench tickets]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
psql_q() { psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
psql_q -d postgres -c "SELECT 1" >/dev/null 2>&1 || die "private Postgres not reachable on :$PG_PORT (run deploy/stack deps)"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import aiosmtpd' 2>/dev/null \
  || die "python3-aiosmtpd missing (deploy/stack deps installs it)"

cleanup() {
  [ -n "$BOOKING_PID" ] && { kill "$BOOKING_PID" 2>/dev/null || true; wait "$BOOKING_PID" 2>/dev/null || true; }
  [ -n "$SINK_PID" ] && { kill "$SINK_PID" 2>/dev/null || true; wait "$SINK_PID" 2>/dev/null || true; }
  psql_q -d postgres -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---- 1. codes --------------------------------------------------------------------------------
log "ticket codes: sign / verify / TOTP against the admission-token check"
args=(); [ "$QUICK" = 1 ] && args+=(--quick)
(cd "$ROOT" && cargo bench -q -p booking --bench ticket_codes -- "${args[@]}") >"$WORK/codes.txt" 2>"$WORK/codes.err" \
  || { cat "$WORK/codes.err" >&2; die "the ticket_codes bench failed"; }
cat "$WORK/codes.txt" >&2
CODES_JSON="$(grep '^{"bench":"ticket_codes"' "$WORK/codes.txt")" || die "no JSON line from ticket_codes"
jget() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
SIGN_US="$(jget "$CODES_JSON" sign_us)"; VERIFY_US="$(jget "$CODES_JSON" verify_us)"
ADM_US="$(jget "$CODES_JSON" admission_verify_us)"; RATIO="$(jget "$CODES_JSON" verify_ratio)"
ROT_US="$(jget "$CODES_JSON" rotating_us)"; CODE_BYTES="$(jget "$CODES_JSON" code_bytes)"
VERIFY_OK="$(python3 -c "print('yes' if $VERIFY_US <= 50 else 'NO')")"

# ---- 2. mail -----------------------------------------------------------------------------------
BOOKING_BIN="$ROOT/target/release/booking"
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  log "building release booking"
  (cd "$ROOT" && cargo build -q -p booking --bin booking --release)
fi
[ -x "$BOOKING_BIN" ] || die "release booking missing ($BOOKING_BIN)"
for p in "$PORT" "$SMTP_PORT" "$VIEW_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    die "port $p is already in use (set BENCH_TICKETS_PORT / _SMTP_PORT / _VIEW_PORT)"
  fi
done
psql_q -d postgres -c "CREATE DATABASE \"$DB\"" >/dev/null

/usr/bin/python3 "$ROOT/deploy/smtp/mailsink.py" --smtp-port "$SMTP_PORT" --http-port "$VIEW_PORT" --sink \
  >"$WORK/sink.log" 2>&1 &
SINK_PID=$!
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$VIEW_PORT/api/stats" >/dev/null 2>&1 && break
  kill -0 "$SINK_PID" 2>/dev/null || { cat "$WORK/sink.log" >&2; die "the SMTP sink exited"; }
  sleep 0.1
done

# Dev mode (the dev ticket keys), logs at warn; mail to the sink, polled often, as a launch
# would configure it.
env -i PATH="$PATH" HOME="${HOME:-/tmp}" \
  DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$DB" \
  REDIS_URL="redis://127.0.0.1:${FLOODGATE_REDIS_PORT:-56379}" \
  FLOODGATE_REDIS__KEY_PREFIX="bench-tickets-$$:" \
  FLOODGATE_DEV=1 FLOODGATE_ADMIN_TOKEN="$ADMIN" \
  FLOODGATE_BOOKING__LISTEN="127.0.0.1:$PORT" \
  FLOODGATE_MAIL__SMTP_URL="smtp://127.0.0.1:$SMTP_PORT" FLOODGATE_MAIL__STARTTLS=off \
  FLOODGATE_MAIL__POLL_MS="${BENCH_TICKETS_MAIL_POLL_MS:-100}" \
  ${BENCH_TICKETS_MAIL_CONCURRENCY:+FLOODGATE_MAIL__CONCURRENCY="$BENCH_TICKETS_MAIL_CONCURRENCY"} \
  ${BENCH_TICKETS_MAIL_BATCH:+FLOODGATE_MAIL__BATCH="$BENCH_TICKETS_MAIL_BATCH"} \
  FLOODGATE_LOG__LEVEL=warn FLOODGATE_LOG__FORMAT=json \
  "$BOOKING_BIN" >>"$WORK/booking.log" 2>&1 &
BOOKING_PID=$!
for _ in $(seq 1 150); do
  curl -fsS "$URL/readyz" >/dev/null 2>&1 && break
  kill -0 "$BOOKING_PID" 2>/dev/null || { tail -20 "$WORK/booking.log" >&2; die "booking exited"; }
  sleep 0.1
done
curl -fsS "$URL/readyz" >/dev/null || die "booking not ready on $URL"

# The event: ORDERS*4 seats in sections of 40 rows x 50 seats, with a date (so every message
# carries its .ics) and a venue.
SECTIONS=$(( (ORDERS * 4 + 1999) / 2000 ))
sections=""
for i in $(seq 1 "$SECTIONS"); do sections+="${sections:+,}{\"name\":\"S$i\",\"rows\":40,\"seats_per_row\":50,\"price_tier\":\"A\"}"; done
curl -fsS -o "$WORK/event.json" -H "authorization: Bearer $ADMIN" -H 'content-type: application/json' \
  -d "{\"id\":\"$EVENT\",\"name\":\"Bench Stadium Night\",\"sale_start\":\"2020-01-01T00:00:00Z\",\"starts_at\":\"2027-08-01T09:00:00Z\",\"doors_at\":\"2027-08-01T08:00:00Z\",\"timezone\":\"Asia/Tokyo\",\"venue_address\":\"1-3-61 Koraku, Bunkyo, Tokyo\",\"price_tiers\":[{\"tier\":\"A\",\"price\":10000}],\"seat_map\":{\"sections\":[$sections]}}" \
  "$URL/admin/events" || die "creating the event failed: $(cat "$WORK/event.json" 2>/dev/null)"

# ORDERS paid orders of 4 seats, written as the payment path writes them (the order PAID, its
# tickets, the address, `order.paid` in the outbox) in one transaction: the clock starts at
# its commit, and what follows is the relay, the consumer, the mailer and SMTP.
log "mail: $ORDERS paid orders of 4 tickets ($(( ORDERS * 4 )) seats) to the SMTP sink"
psql_q -d "$DB" -v ev="$EVENT" -v n="$ORDERS" >/dev/null <<'SQL'
BEGIN;
CREATE TEMP TABLE pick ON COMMIT DROP AS
  SELECT seat_id, ((row_number() OVER (ORDER BY seat_id)) - 1) / 4 AS n
    FROM seats WHERE event_id = :'ev' ORDER BY seat_id LIMIT :n * 4;
INSERT INTO orders (id, account_id, idempotency_key, status, source, hold_id, event_id, total,
                    currency, expires_at, paid_at)
  SELECT 'bo' || n, 'bench-fan-' || n, 'k' || n, 'PAID', 'hold', 'bh' || n, :'ev', 40000, 'JPY',
         now() + interval '1 hour', now()
    FROM generate_series(0, :n - 1) n;
UPDATE seats s SET status = 'sold', order_id = 'bo' || p.n
  FROM pick p WHERE s.event_id = :'ev' AND s.seat_id = p.seat_id;
INSERT INTO tickets (id, event_id, seat_id, order_id, account_id, holder_account)
  SELECT 'bt-' || seat_id, :'ev', seat_id, 'bo' || n, 'bench-fan-' || n, 'bench-fan-' || n
    FROM pick;
INSERT INTO order_contacts (order_id, email)
  SELECT 'bo' || n, 'fan-' || n || '@bench.test' FROM generate_series(0, :n - 1) n;
INSERT INTO outbox (event_id, topic, aggregate_id, payload)
  SELECT 'be' || p.n, 'order.paid', 'bo' || p.n, jsonb_build_object(
           'order_id', 'bo' || p.n, 'account_id', 'bench-fan-' || p.n, 'event', :'ev',
           'source', 'hold', 'total', 40000, 'payment_id', 'bp' || p.n,
           'provider_payment_id', 'pi_bench_' || p.n,
           'tickets', jsonb_agg(jsonb_build_object('id', 'bt-' || p.seat_id,
                                                   'seat_id', p.seat_id, 'ga_tier', NULL)
                                ORDER BY p.seat_id))
    FROM pick p GROUP BY p.n ORDER BY p.n;
COMMIT;
SQL
TICK="$(getconf CLK_TCK)"
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
b0="$(cpu_ticks "$BOOKING_PID")"; s0="$(cpu_ticks "$SINK_PID")"
t0="$(date +%s.%N)"
stat_of() { curl -fsS "http://127.0.0.1:$VIEW_PORT/api/stats"; }
accepted=0
while :; do
  st="$(stat_of)" || die "the SMTP sink stopped answering"
  accepted="$(jget "$st" accepted)"
  [ "$accepted" -ge "$ORDERS" ] && break
  elapsed="$(python3 -c "print(int($(date +%s.%N) - $t0))")"
  [ "$elapsed" -lt "$MAIL_DEADLINE_S" ] || die "only $accepted of $ORDERS messages after $MAIL_DEADLINE_S s"
  kill -0 "$BOOKING_PID" 2>/dev/null || { tail -20 "$WORK/booking.log" >&2; die "booking exited"; }
  sleep 0.2
done
t1="$(date +%s.%N)"
b1="$(cpu_ticks "$BOOKING_PID")"; s1="$(cpu_ticks "$SINK_PID")"
# Anything sent twice would arrive after the last new one: give stragglers a moment.
sleep 2
st="$(stat_of)"
log "SMTP server: $st"
ACCEPTED="$(jget "$st" accepted)"; DISTINCT="$(jget "$st" distinct_message_ids)"
SENT_ROWS="$(psql_q -d "$DB" -c "SELECT count(*) FROM mail_deliveries WHERE kind = 'tickets' AND state = 'sent'")"
OTHER_ROWS="$(psql_q -d "$DB" -c "SELECT count(*) FROM mail_deliveries WHERE state <> 'sent'")"
[ "$ACCEPTED" = "$ORDERS" ] || die "the sink accepted $ACCEPTED messages for $ORDERS orders (one sent twice?)"
[ "$DISTINCT" = "$ORDERS" ] || die "$DISTINCT distinct Message-IDs for $ORDERS orders"
[ "$SENT_ROWS" = "$ORDERS" ] && [ "$OTHER_ROWS" = 0 ] \
  || die "deliveries: $SENT_ROWS sent, $OTHER_ROWS not sent, for $ORDERS orders"
MAIL_S="$(python3 -c "print(round($t1 - $t0, 1))")"
RATE="$(python3 -c "print(round($ORDERS / ($t1 - $t0), 1))")"
BOOKING_CPU="$(python3 -c "print(round(($b1 - $b0) / $TICK, 1))")"
SINK_CPU="$(python3 -c "print(round(($s1 - $s0) / $TICK, 1))")"
MAIL_OK="$(python3 -c "print('yes' if $t1 - $t0 < 300 else 'NO')")"
log "mail: $ORDERS messages in $MAIL_S s ($RATE/s), none twice, none missing"
MAIL_JSON="{\"bench\":\"ticket_mail\",\"quick\":$([ "$QUICK" = 1 ] && echo true || echo false),\"orders\":$ORDERS,\"tickets\":$(( ORDERS * 4 )),\"seconds\":$MAIL_S,\"messages_per_s\":$RATE,\"accepted\":$ACCEPTED,\"distinct_message_ids\":$DISTINCT,\"booking_cpu_s\":$BOOKING_CPU,\"smtp_cpu_s\":$SINK_CPU}"
MAIL_SECTION="| Mailing a sold-out event | |
|---|---:|
| paid orders (4 tickets each; each message: text, HTML, 4 inline QR PNGs, .ics) | $ORDERS |
| **time from the commit to the last message accepted** (goal < 300 s at 15,000: $MAIL_OK) | **$MAIL_S s** |
| messages/s | $RATE |
| messages accepted / distinct Message-IDs / deliveries \`sent\` | $ACCEPTED / $DISTINCT / $SENT_ROWS |
| booking CPU (relay, consumer, mailer; one process) | $BOOKING_CPU s |
| SMTP server CPU (aiosmtpd sink) | $SINK_CPU s |

"

{
  echo "## Tickets: codes and mail (issue 43)"
  echo
  echo "\`deploy/stack bench tickets\`$([ "$QUICK" = 1 ] && echo ' --quick (smoke profile: numbers not representative)'), $(date -u +%Y-%m-%d), $(nproc) cores."
  echo
  echo "| Ticket code operation (one core, median) | µs |"
  echo "|---|---:|"
  echo "| sign (Ed25519 compact JWS, $CODE_BYTES bytes) | $SIGN_US |"
  echo "| **verify** (goal ≤ 50 µs: $VERIFY_OK) | **$VERIFY_US** |"
  echo "| admission-token check (HS256, baseline) | $ADM_US |"
  echo "| verify / admission check | ${RATIO}x |"
  echo "| rotating text (TOTP for one 15 s step) | $ROT_US |"
  echo
  printf '%s' "$MAIL_SECTION"
} >"$OUT"
if [ -n "$RESULTS" ]; then
  mkdir -p "$RESULTS"
  printf '%s\n' "$CODES_JSON" >"$RESULTS/codes.json"
  printf '%s\n' "$MAIL_JSON" >"$RESULTS/mail.json"
fi

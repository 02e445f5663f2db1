#!/usr/bin/env bash
# The front door as a newcomer meets it (issue 14, item 10), run by .ci/run:
#
#  1. a fresh `git clone` of this checkout inside a directory of mode 700 (like /root), then
#     `deploy/stack up` there: as root Postgres runs as the `postgres` user, who cannot enter
#     that directory;
#  2. booking and Postgres' postmaster killed with `kill -9` under a parent that never reaps
#     them (a subreaper standing in for a container's PID 1 without --init), so they stay
#     zombies; the sandbox killed too and its pid file pointed at an unrelated live process
#     (pid reuse); then `deploy/stack up` again must bring all back (booking /readyz 200, so
#     Postgres too) and leave the unrelated process alone;
#  3. `deploy/stack down` of that clone, with one pid file naming an unrelated process that
#     must survive it.
#
# Own ports and directories (never the default ones), so it runs beside a stack that is up.
# It builds nothing itself: `up` runs the binaries of this checkout's target directory
# (FLOODGATE_BIN_DIR; built in debug first if absent). Prints PASS or FAIL; exit 0 or 1.
#
#   deploy/tests/frontdoor.sh
#   FRONTDOOR_STACK_REV=<rev> deploy/tests/frontdoor.sh   # run another revision's deploy/stack
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STARTED=$SECONDS
say() { printf '[frontdoor] %s\n' "$*" >&2; }

TMP="$(mktemp -d /tmp/fg-frontdoor.XXXXXX)"   # mode 700, owned by the caller
CLONE="$TMP/home/floodgate"
REAPER_PID="" DECOY_PID="" PG_BASE=""

cleanup() {
  local rc=$?
  set +e
  if [ -x "$CLONE/deploy/stack" ]; then "$CLONE/deploy/stack" down >/dev/null 2>&1; fi
  [ -n "$REAPER_PID" ] && kill "$REAPER_PID" 2>/dev/null   # its zombies go to init, reaped
  [ -n "$DECOY_PID" ] && kill "$DECOY_PID" 2>/dev/null
  case "$PG_BASE" in
    /var/lib/floodgate/stack-*) rm -rf "$PG_BASE"; rmdir /var/lib/floodgate 2>/dev/null ;;
  esac
  rm -rf "$TMP"
  if [ "$rc" = 0 ]; then
    echo "frontdoor: PASS ($((SECONDS - STARTED)) s)"
  else
    echo "frontdoor: FAIL ($((SECONDS - STARTED)) s)"
  fi
  exit "$rc"
}
trap cleanup EXIT

fail() {
  say "FAILED: $*"
  for f in "$TMP"/up*.log; do [ -s "$f" ] && { say "--- $f"; tail -25 "$f" >&2; }; done
  exit 1
}

# private_stack_ports, service_bin_dir
. "$ROOT/deploy/tests/lib.sh"

http_code() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$1" || true; }

proc_state() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1; }

# Binaries: this checkout's, so the clone needs no second (release) build.
BIN_DIR="${FRONTDOOR_BIN_DIR:-$(service_bin_dir)}"

mkdir -p "$TMP/home"
chmod 700 "$TMP" "$TMP/home"
git clone -q "$ROOT" "$CLONE"
if [ -n "${FRONTDOOR_STACK_REV:-}" ]; then
  git -C "$CLONE" checkout -q "$FRONTDOOR_STACK_REV" -- deploy/stack
  say "deploy/stack of $FRONTDOOR_STACK_REV"
fi
say "clone $(git -C "$CLONE" rev-parse --short HEAD) in $CLONE (mode 700 above it), binaries $BIN_DIR"

unset FLOODGATE_STACK_DIR CARGO_TARGET_DIR
export FLOODGATE_BIN_DIR="$BIN_DIR" FLOODGATE_PROFILE=debug
private_stack_ports
# The Redis servers answering on the stack's default ports now (a developer's stack; in CI the
# one `deploy/stack deps` started): they must still answer after this private stack's `down`.
OTHERS=()
for p in 56379 56380 17001 17002 17003 17004 17005 17006; do
  redis-cli -p "$p" ping >/dev/null 2>&1 && OTHERS+=("$p")
done
STATE="$CLONE/.stack"

# `deploy/stack up` under a parent that never reaps: the services it leaves behind are
# re-parented to this subreaper, which waits only for `up` itself and then sleeps.
cat > "$TMP/reaper.py" <<'PY'
import ctypes, os, signal, subprocess, sys
PR_SET_CHILD_SUBREAPER = 36
if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
rc = subprocess.call(sys.argv[2:], stdout=open(sys.argv[1] + ".log", "w"), stderr=subprocess.STDOUT)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(rc))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    signal.pause()
PY
say "deploy/stack up (first run: initdb, migrations, demo event)"
python3 "$TMP/reaper.py" "$TMP/up1" "$CLONE/deploy/stack" up &
REAPER_PID=$!
for _ in $(seq 1 1200); do
  [ -s "$TMP/up1" ] && break
  kill -0 "$REAPER_PID" 2>/dev/null || fail "the subreaper died"
  sleep 0.5
done
[ -s "$TMP/up1" ] || fail "deploy/stack up did not finish within 10 minutes"
[ -L "$STATE/pg" ] && PG_BASE="$(dirname "$(readlink "$STATE/pg")")"
[ "$(cat "$TMP/up1")" = 0 ] || fail "deploy/stack up exited $(cat "$TMP/up1")"
for url in "http://$FLOODGATE_BOOKING_ADDR/healthz" "http://$FLOODGATE_GATEWAY_ADMIN_ADDR/healthz" \
           "http://$FLOODGATE_SANDBOX_ADDR/healthz"; do
  [ "$(http_code "$url")" = 200 ] || fail "$url is not 200 after up"
done
say "up: every service healthy$([ -n "$PG_BASE" ] && echo ", Postgres data in $PG_BASE")"

# Booking: kill -9, left unreaped. The sandbox: kill -9 too, and its pid now names a live
# process that is not ours (as after pid reuse).
# Postgres' postmaster: kill -9, left unreaped too.
BOOKING_PID="$(cat "$STATE/booking.pid")"
SANDBOX_PID="$(cat "$STATE/sandbox-provider.pid")"
POSTMASTER_PID="$(head -1 "$STATE/pg/postmaster.pid")"
kill -9 "$BOOKING_PID" "$SANDBOX_PID" "$POSTMASTER_PID"
for pid in "$BOOKING_PID" "$POSTMASTER_PID"; do
  for _ in $(seq 1 100); do
    [ "$(proc_state "$pid")" = Z ] && break
    sleep 0.1
  done
  [ "$(proc_state "$pid")" = Z ] || fail "$pid is not a zombie: state '$(proc_state "$pid")'"
done
sleep 600 &
DECOY_PID=$!
echo "$DECOY_PID" > "$STATE/sandbox-provider.pid"
say "booking $BOOKING_PID and postmaster $POSTMASTER_PID are zombies; sandbox pid file names an unrelated process ($DECOY_PID)"

rc=0
"$CLONE/deploy/stack" up >"$TMP/up2.log" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "second deploy/stack up exited $rc"
[ "$(http_code "http://$FLOODGATE_BOOKING_ADDR/readyz")" = 200 ] || fail "booking (and Postgres) not back after up"
[ "$(http_code "http://$FLOODGATE_SANDBOX_ADDR/healthz")" = 200 ] || fail "sandbox not back after up"
[ "$(cat "$STATE/booking.pid")" != "$BOOKING_PID" ] || fail "booking's pid file still names the zombie"
kill -0 "$DECOY_PID" 2>/dev/null || fail "up killed the unrelated process"
say "up again: Postgres, booking and sandbox back (booking /readyz 200)"

# `down` with a pid file naming an unrelated process: that process must survive.
GATEWAY_PID="$(cat "$STATE/gateway.pid")"
kill -9 "$GATEWAY_PID"
echo "$DECOY_PID" > "$STATE/gateway.pid"
"$CLONE/deploy/stack" down >"$TMP/down.log" 2>&1 || fail "deploy/stack down failed"
kill -0 "$DECOY_PID" 2>/dev/null || fail "down killed an unrelated process"
for url in "http://$FLOODGATE_BOOKING_ADDR/healthz" "http://$FLOODGATE_GATEWAY_ADMIN_ADDR/healthz"; do
  [ "$(http_code "$url")" = 000 ] || fail "$url still answers after down"
done
if "$CLONE/deploy/stack" status | grep -q ': running'; then fail "status shows something running after down"; fi
for p in "${OTHERS[@]}"; do
  redis-cli -p "$p" ping >/dev/null 2>&1 || fail "down stopped the Redis on :$p, which is not this stack's"
done
say "down: everything stopped (and the ${#OTHERS[@]} Redis servers of other stacks still answer)"

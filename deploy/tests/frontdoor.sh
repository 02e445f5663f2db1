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
#     must survive it;
#  0. before all that, `up` with its Postgres port and then its gateway admin port held by a
#     listening process: it must stop at once, naming the port and the variable that moves it;
#  5. (first of all) cargo knows the profile and packages `up` builds for a newcomer;
#  4. when run as root, `up` and `down` once more as a normal user (a throwaway system user, no
#     sudo, a normal user's PATH without /usr/sbin) in a clone that user owns: Postgres then runs
#     as that user.
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
REAPER_PID="" DECOY_PID="" PG_BASE="" HOLDER_PID=""
FD_USER="" USER_TMP=""

cleanup() {
  local rc=$?
  set +e
  if [ -x "$CLONE/deploy/stack" ]; then "$CLONE/deploy/stack" down >/dev/null 2>&1; fi
  [ -n "$HOLDER_PID" ] && kill "$HOLDER_PID" 2>/dev/null
  if [ -n "$FD_USER" ]; then
    as_user "$USER_TMP/floodgate/deploy/stack" down >/dev/null 2>&1
    userdel "$FD_USER" 2>/dev/null || userdel -f "$FD_USER"
  fi
  [ -n "$USER_TMP" ] && rm -rf "$USER_TMP"
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
  for f in "$TMP"/up*.log "$TMP"/port*.log; do [ -s "$f" ] && { say "--- $f"; tail -25 "$f" >&2; }; done
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

# The build `up` runs for a newcomer (CI's `up`s below run prebuilt binaries instead): cargo must
# know its profile and packages, else `up` stops at once ("profile `local` is not defined", as
# after a merge once dropped the profile). A bin name no package has makes cargo stop right
# after reading both, building nothing.
read -r -a UP_BUILD < <(cd "$CLONE" && env -u FLOODGATE_PROFILE bash -c \
  'register_component() { :; }; . deploy/stack.d/services.sh; echo "${SERVICE_PACKAGES[@]} --profile $PROFILE"')
out="$(cd "$CLONE" && cargo build "${UP_BUILD[@]}" --bin __frontdoor_no_such_bin__ 2>&1 || true)"
grep -q 'no bin target named' <<<"$out" || fail "deploy/stack up's build (cargo build ${UP_BUILD[*]}) fails before compiling: $out"
say "up's build is known to cargo: ${UP_BUILD[*]}"

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

# A port held by a listening process (another clone's stack, say): `up` stops at once, before
# starting or building anything, naming the port and its variable (no retries, no "Postgres did
# not start"). Python holds it: bind + listen, until killed.
hold_port() {
  python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); print("ok", flush=True); time.sleep(600)' "$1" \
    >"$TMP/holder.out" 2>&1 &
  HOLDER_PID=$!
  for _ in $(seq 1 50); do grep -q ok "$TMP/holder.out" 2>/dev/null && return 0; sleep 0.1; done
  fail "could not hold port $1"
}
expect_port_refused() { # VAR PORT
  local var="$1" port="$2" rc=0 t0=$SECONDS
  hold_port "$port"
  timeout 120 "$CLONE/deploy/stack" up >"$TMP/port-$var.log" 2>&1 || rc=$?
  kill "$HOLDER_PID"; wait "$HOLDER_PID" 2>/dev/null || true; HOLDER_PID=""
  [ "$rc" != 0 ] || fail "up succeeded with port $port ($var) held by a listener"
  grep -q "port $port ($var) is already taken by a listening process" "$TMP/port-$var.log" \
    || fail "up did not name port $port and $var: $(tail -3 "$TMP/port-$var.log")"
  [ $((SECONDS - t0)) -le 30 ] || fail "up took $((SECONDS - t0)) s to refuse a taken port"
  for url in "http://$FLOODGATE_BOOKING_ADDR/healthz" "http://$FLOODGATE_SANDBOX_ADDR/healthz"; do
    [ "$(http_code "$url")" = 000 ] || fail "up started $url though port $port was taken"
  done
  say "port $port ($var) held by a listener: up refused at once ($((SECONDS - t0)) s)"
}
expect_port_refused FLOODGATE_PG_PORT "$FLOODGATE_PG_PORT"
expect_port_refused FLOODGATE_GATEWAY_ADMIN_ADDR "${FLOODGATE_GATEWAY_ADMIN_ADDR##*:}"

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
           "http://$FLOODGATE_SANDBOX_ADDR/healthz" "http://127.0.0.1:$FLOODGATE_MAIL_VIEW_PORT/api/stats"; do
  [ "$(http_code "$url")" = 200 ] || fail "$url is not 200 after up"
done
# `up` says where to read the mail the stack sends (the local SMTP server's view).
grep -q "mail  *http://127.0.0.1:$FLOODGATE_MAIL_VIEW_PORT/" "$TMP/up1.log" \
  || fail "up did not print where to read mail: $(tail -12 "$TMP/up1.log")"
say "up: every service healthy$([ -n "$PG_BASE" ] && echo ", Postgres data in $PG_BASE")"

# Named operators on the fresh stack (issue 42): `deploy/stack operator` issues a support
# credential with the bootstrap secret; booking knows it at once, the gateway's admin listener
# within seconds (from booking's list in Redis); a support operator may not change the room.
"$CLONE/deploy/stack" operator "Frontdoor Support" support >"$TMP/operator.log" 2>&1 \
  || fail "deploy/stack operator: $(cat "$TMP/operator.log")"
CRED="$(sed -n 's/^credential \(fgop_[A-Za-z0-9_-]*\)$/\1/p' "$TMP/operator.log")"
[ -n "$CRED" ] || fail "deploy/stack operator printed no credential: $(cat "$TMP/operator.log")"
auth_code() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H "authorization: Bearer $CRED" "$@" || true; }
[ "$(auth_code "http://$FLOODGATE_BOOKING_ADDR/admin/operators/me")" = 200 ] \
  || fail "booking does not know the operator it just issued"
for _ in $(seq 1 40); do
  [ "$(auth_code "http://$FLOODGATE_GATEWAY_ADMIN_ADDR/admin/events/demo/config")" = 200 ] && break
  sleep 0.25
done
[ "$(auth_code "http://$FLOODGATE_GATEWAY_ADMIN_ADDR/admin/events/demo/config")" = 200 ] \
  || fail "the gateway's admin listener did not learn the operator within 10 s"
[ "$(auth_code -X PUT -H 'content-type: application/json' -d '{"sold_out": true}' \
     "http://$FLOODGATE_GATEWAY_ADMIN_ADDR/admin/events/demo/sold_out")" = 403 ] \
  || fail "a support operator changed the room's sold-out flag"
say "operator: issued by deploy/stack, known to booking and the gateway, support refused a room change"

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

# 4. The two commands as a normal user: no root, no sudo, a normal user's PATH (no /usr/sbin, so
# no runuser or ss on it), every package already installed. Only root can make such a user.
as_user() {
  "$(command -v runuser || echo /usr/sbin/runuser)" -u "$FD_USER" -- env -i HOME="$USER_TMP/home" \
    PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 FLOODGATE_BIN_DIR="$USER_BIN" FLOODGATE_PROFILE=debug \
    FLOODGATE_PG_PORT="$FLOODGATE_PG_PORT" FLOODGATE_REDIS_PORT="$FLOODGATE_REDIS_PORT" \
    FLOODGATE_QUEUE_REDIS_PORT="$FLOODGATE_QUEUE_REDIS_PORT" FLOODGATE_REDIS_CLUSTER_PORTS="$FLOODGATE_REDIS_CLUSTER_PORTS" \
    FLOODGATE_SMTP_PORT="$FLOODGATE_SMTP_PORT" FLOODGATE_MAIL_VIEW_PORT="$FLOODGATE_MAIL_VIEW_PORT" \
    FLOODGATE_GATEWAY_ADDR="$FLOODGATE_GATEWAY_ADDR" FLOODGATE_GATEWAY_ADMIN_ADDR="$FLOODGATE_GATEWAY_ADMIN_ADDR" \
    FLOODGATE_BOOKING_ADDR="$FLOODGATE_BOOKING_ADDR" FLOODGATE_SANDBOX_ADDR="$FLOODGATE_SANDBOX_ADDR" "$@"
}
if [ "$(id -u)" != 0 ]; then
  say "not root: the runs above were already a normal user's (skipping the throwaway user)"
  exit 0
fi
FD_USER="fgfd$$"
USER_TMP="$(mktemp -d /tmp/fg-frontdoor-user.XXXXXX)"
useradd --system --no-create-home --home-dir "$USER_TMP/home" --shell /bin/sh "$FD_USER" \
  || { FD_USER=""; fail "useradd failed"; }
mkdir -p "$USER_TMP/home"
git clone -q "$ROOT" "$USER_TMP/floodgate"
if [ -n "${FRONTDOOR_STACK_REV:-}" ]; then git -C "$USER_TMP/floodgate" checkout -q "$FRONTDOOR_STACK_REV" -- deploy/stack; fi
USER_BIN="$BIN_DIR"
if ! runuser -u "$FD_USER" -- test -x "$BIN_DIR/booking"; then
  # This checkout's target directory is out of that user's reach: give it copies.
  USER_BIN="$USER_TMP/bin"; mkdir -p "$USER_BIN"
  cp "$BIN_DIR/booking" "$BIN_DIR/gateway" "$BIN_DIR/sandbox-provider" "$USER_BIN/"
fi
chown -R "$FD_USER" "$USER_TMP"
private_stack_ports
say "as the normal user $FD_USER (no sudo, PATH without /usr/sbin): deploy/stack up"
rc=0
as_user "$USER_TMP/floodgate/deploy/stack" up >"$TMP/up-user.log" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "deploy/stack up as a normal user exited $rc"
[ "$(http_code "http://$FLOODGATE_BOOKING_ADDR/readyz")" = 200 ] || fail "booking not ready after the normal user's up"
[ "$(http_code "http://$FLOODGATE_GATEWAY_ADDR/e/demo")" = 200 ] || fail "the waiting page is not 200 after the normal user's up"
POSTMASTER_USER="$(stat -c %U "$USER_TMP/floodgate/.stack/pg/postmaster.pid" 2>/dev/null || true)"
[ "$POSTMASTER_USER" = "$FD_USER" ] || fail "Postgres does not run as $FD_USER (postmaster.pid owned by '$POSTMASTER_USER')"
as_user "$USER_TMP/floodgate/deploy/stack" down >"$TMP/down-user.log" 2>&1 || fail "deploy/stack down as a normal user failed"
for url in "http://$FLOODGATE_BOOKING_ADDR/healthz" "http://$FLOODGATE_GATEWAY_ADMIN_ADDR/healthz"; do
  [ "$(http_code "$url")" = 000 ] || fail "$url still answers after the normal user's down"
done
say "normal user: up (waiting page 200, Postgres as $FD_USER) and down"

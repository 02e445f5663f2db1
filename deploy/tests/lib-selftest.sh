#!/usr/bin/env bash
# Self-test of deploy/tests/lib.sh's free_port, which picks the private stacks' ports of
# frontdoor.sh and openapi.sh. It once drew from 20000-39999 and tested with a connect, so it
# could hand out a port in the kernel's ephemeral range that an outgoing connection held: CI's
# OpenAPI step then failed with Postgres' "could not bind ... Address already in use".
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
say() { echo "[lib-selftest] $*" >&2; }
. "$ROOT/deploy/tests/lib.sh"

lo="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range)"
seen=" "
for _ in $(seq 1 40); do
  free_port p
  [ "$p" -ge 10000 ] && [ "$p" -lt "$lo" ] || { say "FAIL: port $p is not in 10000..$((lo - 1))"; exit 1; }
  case "$seen" in *" $p "*) say "FAIL: port $p handed out twice"; exit 1 ;; esac
  seen="$seen$p "
done

# A port held by a socket that is bound but not listening (what an outgoing connection looks
# like to bind) is never handed out: hold every port but one of a small range and ask for ports.
python3 - "$ROOT" <<'PY'
import socket, subprocess, sys
root = sys.argv[1]
held = []
for port in range(10000, 10040):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        held.append(s)
    except OSError:
        pass
if not held:
    sys.exit("[lib-selftest] FAIL: no port of 10000-10039 could be bound for the test")
# Release one port: the only one the narrowed picker may return.
last = held.pop()
free = last.getsockname()[1]
last.close()
script = f'''
. "{root}/deploy/tests/lib.sh"
# Narrow the range to the 40 ports above by faking ip_local_port_range's low end.
awk() {{ echo 10040; }}
free_port p && echo "$p"
'''
out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
got = out.stdout.strip()
if got != str(free):
    sys.exit(f"[lib-selftest] FAIL: picker returned {got!r} (stderr {out.stderr.strip()!r}); only {free} was free")
PY
say "PASS"

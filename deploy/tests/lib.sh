# Shared by the scripts of deploy/tests that run a private stack beside any other
# (frontdoor.sh, openapi.sh). Source it after setting ROOT and defining say().

# A port nobody holds, below the kernel's ephemeral range (ip_local_port_range) so no outgoing
# connection can be sitting on it when the service binds, checked by binding it (a connect test
# misses client sockets), and never one this script has handed out already. A picked port can
# still be taken by another process before the service binds; below the ephemeral range only a
# process that binds ports by number can do that. Sets the variable named by $1 (not a command
# substitution: the subshell would forget the ports handed out).
FREE_PORTS_GIVEN=" "
free_port() {
  local _fp_lo _fp_p
  _fp_lo="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
  [ "$_fp_lo" -gt 10001 ] 2>/dev/null || _fp_lo=32768
  for _ in $(seq 1 500); do
    _fp_p=$((10000 + (RANDOM * 32768 + RANDOM) % (_fp_lo - 10000)))
    case "$FREE_PORTS_GIVEN" in *" $_fp_p "*) continue ;; esac
    if python3 -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' \
         "$_fp_p" 2>/dev/null; then
      FREE_PORTS_GIVEN="$FREE_PORTS_GIVEN$_fp_p "
      printf -v "$1" '%s' "$_fp_p"; return 0
    fi
  done
  echo "no free port below $_fp_lo" >&2
  return 1
}

# Exports a free port for every port `deploy/stack` uses: its `down` stops whatever Redis
# answers on the ports it is given, so a private stack left on a default port (the waiting
# room's Redis, the cluster's six) shared the developer's and then shut it down. The cluster
# never runs in a private stack; its ports only keep `down` away from a real one.
private_stack_ports() {
  local p cluster="" gw admin booking sandbox _
  free_port FLOODGATE_PG_PORT || return 1
  free_port FLOODGATE_REDIS_PORT || return 1
  free_port FLOODGATE_QUEUE_REDIS_PORT || return 1
  # The local SMTP server and its mail view (deploy/stack.d/smtp.sh).
  free_port FLOODGATE_SMTP_PORT || return 1
  free_port FLOODGATE_MAIL_VIEW_PORT || return 1
  for _ in 1 2 3 4 5 6; do free_port p || return 1; cluster="$cluster${cluster:+ }$p"; done
  free_port gw && free_port admin && free_port booking && free_port sandbox || return 1
  export FLOODGATE_PG_PORT FLOODGATE_REDIS_PORT FLOODGATE_QUEUE_REDIS_PORT FLOODGATE_SMTP_PORT FLOODGATE_MAIL_VIEW_PORT
  export FLOODGATE_REDIS_CLUSTER_PORTS="$cluster" FLOODGATE_GATEWAY_ADDR="127.0.0.1:$gw" \
    FLOODGATE_GATEWAY_ADMIN_ADDR="127.0.0.1:$admin" FLOODGATE_BOOKING_ADDR="127.0.0.1:$booking" \
    FLOODGATE_SANDBOX_ADDR="127.0.0.1:$sandbox"
}

# The service binaries of this checkout's target directory (debug, else release), built in
# debug if neither has all three. Prints the directory.
service_bin_dir() {
  local target="${CARGO_TARGET_DIR:-$ROOT/target}" profile
  for profile in debug release; do
    if [ -x "$target/$profile/booking" ] && [ -x "$target/$profile/gateway" ] \
       && [ -x "$target/$profile/sandbox-provider" ]; then echo "$target/$profile"; return 0; fi
  done
  say "building the service binaries (debug) in $ROOT"
  (cd "$ROOT" && cargo build -q -p booking -p gateway -p sandbox-provider --bins) >&2
  echo "$target/debug"
}

# shellcheck shell=bash disable=SC2015,SC2153  # A && B || C on purpose; ROOT, STATE, LOGS come from deploy/stack
# Sourced first by deploy/stack: logging, root, package installs, process checks, port checks,
# local secrets, and the component registry that `up`, `down`, `status` and `deps` walk.

log() { printf '\033[1m[stack]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

is_root() { [ "$(id -u)" = 0 ]; }

# A tool on the PATH, or in an sbin directory: a normal user's PATH has no /usr/sbin, though
# the tools there (runuser, ss) run fine for them. Prints the path.
tool() {
  local d
  command -v "$1" 2>/dev/null && return 0
  for d in /usr/local/sbin /usr/sbin /sbin; do
    [ -x "$d/$1" ] && { echo "$d/$1"; return 0; }
  done
  return 1
}
have() { tool "$1" >/dev/null; }

as_root() { if is_root; then "$@"; else sudo "$@"; fi; }

apt_install() {
  local missing=("$@")
  [ ${#missing[@]} -eq 0 ] && return 0
  if ! is_root && ! have sudo; then
    die "missing Debian packages: ${missing[*]}; install them as root (apt-get install -y --no-install-recommends ${missing[*]}), then run deploy/stack again"
  fi
  log "installing Debian packages: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Alive and not a zombie, whatever it runs (just after `&` the pid may not have exec'd yet).
# Field 3 of /proc/PID/stat is the state; the command name before it may contain spaces.
is_alive() {
  local state
  state="$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)"
  case "$state" in Z|X|x|"") return 1 ;; *) return 0 ;; esac
}

# Is PID alive and one of ours, i.e. running the service binary NAME? `kill -0` alone is not
# enough: it succeeds for a zombie (a service killed where no init reaps it, e.g. a container
# without --init) and for an unrelated process that got the pid after a crash.
is_ours() { # pid name
  local pid="$1" name="$2" exe
  [ -n "$pid" ] && is_alive "$pid" || return 1
  exe="$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | head -1)"
  [ "$(basename -- "${exe:-/}")" = "$name" ]
}

is_running() { local f="$STATE/$1.pid"; [ -s "$f" ] && is_ours "$(cat "$f")" "$1"; }

admin_token() {
  if [ -n "${FLOODGATE_ADMIN_TOKEN:-}" ]; then echo "$FLOODGATE_ADMIN_TOKEN"; return; fi
  if [ ! -s "$STATE/admin_token" ]; then
    (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$STATE/admin_token")
  fi
  cat "$STATE/admin_token"
}

# Local-only secrets, generated once and kept under .stack/.
local_secret() {
  local f="$STATE/$1"
  if [ ! -s "$f" ]; then (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$f"); fi
  cat "$f"
}

# ---- Ports ---------------------------------------------------------------------------------

# Does something accept connections on HOST:PORT? A connect succeeds only against a listener
# (an outgoing socket on the same port does not answer), which is exactly what would make our
# bind fail for good.
port_listened() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# Who listens on PORT, when ss can tell ("redis-server, pid 123"; other users' processes are
# visible only to root).
port_owner() {
  local ss; ss="$(tool ss)" || return 0
  "$ss" -ltnpH "( sport = :$1 )" 2>/dev/null | grep -o 'users:(("[^"]*",pid=[0-9]*' | head -1 \
    | sed -E 's/users:\(\("([^"]*)",pid=([0-9]+)/\1, pid \2/'
}

# check_port VAR HOST PORT: die at once, naming the port, its holder and the variable that
# chooses another, when a listening process already has it.
check_port() {
  local var="$1" host="$2" port="$3" owner example
  case "$host" in 0.0.0.0|"*"|"") host=127.0.0.1 ;; "[::]") host=::1 ;; esac
  host="${host#[}"; host="${host%]}"
  port_listened "$host" "$port" || return 0
  owner="$(port_owner "$port")"
  case "$var" in
    *_ADDR) example="$var=127.0.0.1:<free port>" ;;
    *_PORTS) example="$var=\"<six free ports>\"" ;;
    *) example="$var=<free port>" ;;
  esac
  die "port $port ($var) is already taken by a listening process${owner:+ ($owner)}: stop it, or choose another port, e.g. $example deploy/stack ${STACK_CMD:-up}"
}

# addr_port ADDR / addr_host ADDR: "127.0.0.1:8080" -> 8080 / 127.0.0.1.
addr_port() { echo "${1##*:}"; }
addr_host() { echo "${1%:*}"; }

# ---- Components ----------------------------------------------------------------------------
#
# Each file of deploy/stack.d/ (other than this one) registers its components with
#   register_component ORDER NAME KIND
# KIND `dep` (started by `deps`, hence by `up`, `test` and `bench`) or `service` (started by
# `up` after the build). Components start in increasing ORDER and stop (and report their
# status) in the reverse order. For a NAME, with `-` written `_`, the file defines:
#   NAME_start, NAME_stop, NAME_status   (status prints one line or nothing)
# and may define:
#   NAME_packages   prints the Debian packages it misses (checked before anything starts)
#   NAME_ports      prints "VAR HOST PORT" for each port it is about to bind (nothing for a
#                   port its own running process holds); a port another process listens on
#                   stops the command before anything starts or builds.
# A new piece (an SMTP server, a sample origin, a Patroni cluster) is a new file.
COMPONENTS=()
register_component() { COMPONENTS+=("$1 $2 $3"); }

# components KIND... [--reverse]: the registered names of those kinds, in start order.
components() {
  local sort=(sort -n) kinds=() c
  for c in "$@"; do
    if [ "$c" = --reverse ]; then sort=(sort -rn); else kinds+=("$c"); fi
  done
  for c in "${COMPONENTS[@]}"; do echo "$c"; done | "${sort[@]}" | while read -r _ name kind; do
    for c in "${kinds[@]}"; do [ "$c" = "$kind" ] && echo "$name"; done
  done
}

# component_call NAME HOOK [ARGS]: runs NAME_HOOK if the component defines it.
component_call() {
  local fn="${1//-/_}_$2"; shift 2
  if declare -F "$fn" >/dev/null; then "$fn" "$@"; fi
}

# Every port the components of these kinds are about to bind must be free of listeners.
preflight_ports() {
  local name var host port
  for name in $(components "$@"); do
    while read -r var host port; do
      [ -n "$var" ] && check_port "$var" "$host" "$port"
    done < <(component_call "$name" ports)
  done
  return 0
}

start_components() { local name; for name in $(components "$@"); do component_call "$name" start; done; }
stop_components() { local name; for name in $(components "$@" --reverse); do component_call "$name" stop; done; }
status_components() { local name; for name in $(components "$@" --reverse); do component_call "$name" status; done; }

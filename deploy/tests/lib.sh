# Shared by the scripts of deploy/tests that run a private stack beside any other
# (frontdoor.sh, openapi.sh). Source it after setting ROOT and defining say().

# A port nobody listens on, drawn from a range away from the stack's defaults.
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  return 1
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

# shellcheck shell=bash disable=SC2015,SC2153  # A && B || C on purpose; ROOT, STATE, LOGS come from deploy/stack
# Floodgate's own processes (the payment sandbox, booking, the gateway): their environment,
# start and stop by pid file, the demo event, and the build that `up` runs first.
GATEWAY_ADDR="${FLOODGATE_GATEWAY_ADDR:-127.0.0.1:8080}"
GATEWAY_ADMIN_ADDR="${FLOODGATE_GATEWAY_ADMIN_ADDR:-127.0.0.1:8081}"
BOOKING_ADDR="${FLOODGATE_BOOKING_ADDR:-127.0.0.1:8090}"
SANDBOX_ADDR="${FLOODGATE_SANDBOX_ADDR:-127.0.0.1:8099}"
# The cargo profile `up` builds: `local` (Cargo.toml: release without LTO, many codegen units,
# for a short first start); `release` is the benchmarks' fully optimised build; `debug` (or
# `dev`) the test build.
PROFILE="${FLOODGATE_PROFILE:-local}"
BIN_DIR=""   # where the service binaries are; set by build_services
# What `up` builds: the three services only (not loadgen): the first start is what a new user
# waits for. deploy/tests/frontdoor.sh checks that cargo knows these and the profile.
SERVICE_PACKAGES=(-p gateway -p booking -p sandbox-provider)
register_component 50 sandbox-provider service
register_component 60 booking service
register_component 70 gateway service

service_env() {
  export FLOODGATE_ADMIN_TOKEN; FLOODGATE_ADMIN_TOKEN="$(admin_token)"
  export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/floodgate"
  export REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  export FLOODGATE_REDIS__QUEUE_URL="redis://127.0.0.1:$QREDIS_PORT"
  if [ "$REDIS_CLUSTER" = 1 ]; then
    FLOODGATE_REDIS__QUEUE_URL="$(cluster_seeds)"
    export FLOODGATE_REDIS__MODE=cluster
  fi
  export FLOODGATE_CONFIG="$ROOT/deploy/local.toml"
  export FLOODGATE_TOKENS__CURRENT_KID="local-1"
  export FLOODGATE_TOKENS__KEYS; FLOODGATE_TOKENS__KEYS="[{kid=\"local-1\", secret=\"$(local_secret token_key)\"}]"
  export FLOODGATE_IDENTITY__KEY; FLOODGATE_IDENTITY__KEY="$(local_secret identity_key)"
  export FLOODGATE_PAYMENTS__WEBHOOK_SECRETS; FLOODGATE_PAYMENTS__WEBHOOK_SECRETS="[\"whsec_$(local_secret webhook_secret)\"]"
  export FLOODGATE_SANDBOX__WEBHOOK_SECRET; FLOODGATE_SANDBOX__WEBHOOK_SECRET="whsec_$(local_secret webhook_secret)"
  export FLOODGATE_BOOKING__LISTEN="$BOOKING_ADDR"
  export FLOODGATE_GATEWAY__LISTEN="$GATEWAY_ADDR"
  export FLOODGATE_GATEWAY__ADMIN_LISTEN="$GATEWAY_ADMIN_ADDR"
  export FLOODGATE_GATEWAY__STATIC_DIR="$ROOT/static"   # whatever directory `up` runs from
  # The gateway forwards to this stack's booking, not local.toml's 8090 (another stack's, or
  # nothing, when FLOODGATE_BOOKING_ADDR moves booking: private stacks, the OpenAPI run).
  export FLOODGATE_GATEWAY__UPSTREAMS="[\"$BOOKING_ADDR\"]"
  export FLOODGATE_SANDBOX__LISTEN="$SANDBOX_ADDR"
  # Booking and the sandbox find each other even when the addresses above are overridden.
  export FLOODGATE_PAYMENTS__PROVIDER_URL="http://$SANDBOX_ADDR"
  export FLOODGATE_SANDBOX__WEBHOOK_URL="http://$BOOKING_ADDR/webhooks/payments"
  # Ticket e-mail goes to this stack's SMTP server (deploy/stack.d/smtp.sh), and links to this
  # stack's gateway, whatever ports they were moved to.
  export FLOODGATE_MAIL__SMTP_URL="smtp://127.0.0.1:$SMTP_PORT"
  export FLOODGATE_MAIL__TICKET_PAGE_URL="http://$GATEWAY_ADDR/e/{event}/tickets?order={order}"
}

# FLOODGATE_BIN_DIR: run binaries built elsewhere (e.g. CI's own checkout) without building.
build_services() {
  BIN_DIR="${FLOODGATE_BIN_DIR:-}"
  [ -n "$BIN_DIR" ] && return 0
  local cargo_profile="$PROFILE" dir="$PROFILE"
  case "$PROFILE" in debug|dev) cargo_profile=dev dir=debug ;; esac
  log "building ($PROFILE)"
  (cd "$ROOT" && cargo build "${SERVICE_PACKAGES[@]}" --bins --profile "$cargo_profile")
  BIN_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/$dir"
}

start_service() { # name binary health-url
  local name="$1" bin="$2" url="$3"
  if is_running "$name"; then log "$name already running (pid $(cat "$STATE/$name.pid"))"; return 0; fi
  rm -f "$STATE/$name.pid"   # stale: a crash, a zombie or a reused pid
  [ -x "$bin" ] || { log "$name: $bin not built; skipping"; return 0; }
  log "starting $name"
  nohup "$bin" >>"$LOGS/$name.log" 2>&1 &
  echo $! > "$STATE/$name.pid"
  for _ in $(seq 1 100); do
    curl -fsS "$url" >/dev/null 2>&1 && return 0
    is_alive "$(cat "$STATE/$name.pid")" || { tail -30 "$LOGS/$name.log" >&2; die "$name exited"; }
    sleep 0.2
  done
  tail -30 "$LOGS/$name.log" >&2; die "$name did not become ready at $url"
}

stop_service() {
  local name="$1" f="$STATE/$1.pid"
  [ -s "$f" ] || return 0
  local pid; pid="$(cat "$f")"
  # Never signal a pid that is no longer our service (a zombie cannot be stopped anyway).
  if is_ours "$pid" "$name"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do is_ours "$pid" "$name" || break; sleep 0.2; done
    is_ours "$pid" "$name" && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

service_status() {
  if is_running "$1"; then echo "$1: running (pid $(cat "$STATE/$1.pid"))"; else echo "$1: stopped"; fi
}

# service_ports NAME VAR ADDR...: the listeners NAME is about to open (none while it runs).
service_ports() {
  local name="$1"; shift
  is_running "$name" && return 0
  while [ $# -ge 2 ]; do
    echo "$1 $(addr_host "$2") $(addr_port "$2")"; shift 2
  done
}

sandbox_provider_ports() { service_ports sandbox-provider FLOODGATE_SANDBOX_ADDR "$SANDBOX_ADDR"; }
sandbox_provider_start() { start_service sandbox-provider "$BIN_DIR/sandbox-provider" "http://$SANDBOX_ADDR/healthz"; }
sandbox_provider_stop() { stop_service sandbox-provider; }
sandbox_provider_status() { service_status sandbox-provider; }

booking_ports() { service_ports booking FLOODGATE_BOOKING_ADDR "$BOOKING_ADDR"; }
booking_start() { start_service booking "$BIN_DIR/booking" "http://$BOOKING_ADDR/readyz"; }
booking_stop() { stop_service booking; }
booking_status() { service_status booking; }

gateway_ports() {
  service_ports gateway FLOODGATE_GATEWAY_ADDR "$GATEWAY_ADDR" FLOODGATE_GATEWAY_ADMIN_ADDR "$GATEWAY_ADMIN_ADDR"
}
gateway_start() { start_service gateway "$BIN_DIR/gateway" "http://$GATEWAY_ADMIN_ADDR/healthz"; }
gateway_stop() { stop_service gateway; }
gateway_status() { service_status gateway; }

seed_demo() {
  local tok; tok="$(admin_token)"
  local code
  code="$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $tok" "http://$BOOKING_ADDR/admin/events/demo")"
  if [ "$code" != 200 ]; then
    log "seeding demo event 'demo' (2,000 seats + 1,000 GA)"
    curl -fsS -H "Authorization: Bearer $tok" -H 'Content-Type: application/json' \
      -d @"$ROOT/deploy/demo-event.json" "http://$BOOKING_ADDR/admin/events" >/dev/null \
      || die "seeding the demo event failed"
  fi
  # Tell the gateway about the event (idempotent absolute PUT).
  if curl -fsS "http://$GATEWAY_ADMIN_ADDR/healthz" >/dev/null 2>&1; then
    curl -fsS -X PUT -H "Authorization: Bearer $tok" -H 'Content-Type: application/json' \
      -d '{"sale_start":"2026-01-01T00:00:00Z","admit_per_minute":600,"mode":"queue","max_active":500}' \
      "http://$GATEWAY_ADMIN_ADDR/admin/events/demo/config" >/dev/null || log "warning: gateway config for demo not applied"
  fi
}

cmd_up() {
  # Every port first, before the build: a taken one must not cost a build to learn about.
  ensure_packages
  preflight_ports dep service
  deps_start
  build_services
  service_env
  start_components service
  seed_demo
  cat <<MSG

  Floodgate is up.
    waiting room   http://$GATEWAY_ADDR/         (demo event: http://$GATEWAY_ADDR/e/demo)
    gateway admin  http://$GATEWAY_ADMIN_ADDR/admin/events/demo/config
    booking        http://$BOOKING_ADDR/          (internal)
    ops page       http://$BOOKING_ADDR/ops/      (booking's listener only; sign in with an operator credential)
    sandbox pay    http://$SANDBOX_ADDR/
    mail           http://127.0.0.1:$MAIL_VIEW_PORT/   (what booking sent: the local SMTP server on 127.0.0.1:$SMTP_PORT keeps it; nothing leaves this machine)
    admin token    $(admin_token)   (the bootstrap secret: automation, and issuing operators)
  Issue yourself an operator credential: deploy/stack operator "Your Name" admin|support|viewer
    logs           $LOGS/
  Stop with: deploy/stack down
MSG
}

# operator NAME ROLE: issues an operator credential on the running stack's booking with the
# bootstrap secret and prints it (shown this once; docs/operations.md "Running sale day with
# named operators").
cmd_operator() {
  local name="${1:-}" role="${2:-}"
  case "$role" in viewer|support|admin) ;; *)
    echo "usage: deploy/stack operator NAME viewer|support|admin" >&2; return 2 ;;
  esac
  [ -n "$name" ] || { echo "usage: deploy/stack operator NAME viewer|support|admin" >&2; return 2; }
  local body answer
  body="$(NAME="$name" ROLE="$role" python3 -c 'import json,os; print(json.dumps({"name": os.environ["NAME"], "role": os.environ["ROLE"]}))')"
  answer="$(curl -sS --max-time 10 -X POST "http://$BOOKING_ADDR/admin/operators" \
    -H "authorization: Bearer $(admin_token)" -H "x-floodgate-actor: deploy/stack operator ($(id -un))" \
    -H 'content-type: application/json' -d "$body")" \
    || { log "booking at $BOOKING_ADDR did not answer: is the stack up (deploy/stack up)?"; return 1; }
  printf '%s' "$answer" | python3 -c '
import json, sys
a = json.load(sys.stdin)
if "credential" not in a:
    sys.exit("refused: %s" % json.dumps(a))
print("operator   %s (%s), id %s, expires %s" % (a["name"], a["role"], a["id"], a["expires_at"]))
print("credential %s" % a["credential"])
print("(shown this once: keep it like a password; revoke with DELETE /admin/operators/%s)" % a["id"])'
}

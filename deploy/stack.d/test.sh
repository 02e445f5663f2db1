# shellcheck shell=bash disable=SC2015,SC2153  # A && B || C on purpose; ROOT, STATE, LOGS come from deploy/stack
# `deploy/stack test`: the whole test suite against the private Postgres and Redis.

cmd_test() {
  deps chromium python zbar
  python_tools
  export FLOODGATE_TEST_PYTHON="$PY_VENV/bin/python"
  FLOODGATE_TEST_NODE_MODULES="$("$ROOT/deploy/node/install.sh" "$STATE/node")"; export FLOODGATE_TEST_NODE_MODULES  # npm tools (Node >= 20), cached per lock
  export FLOODGATE_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
  export FLOODGATE_TEST_REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  export FLOODGATE_TEST_REDIS_PORT="$REDIS_PORT"
  export FLOODGATE_TEST_QUEUE_REDIS_URL="redis://127.0.0.1:$QREDIS_PORT"
  # The local SMTP server (deploy/stack.d/smtp.sh): tests mail to it and read what arrived.
  export FLOODGATE_TEST_SMTP_URL="smtp://127.0.0.1:$SMTP_PORT"
  export FLOODGATE_TEST_MAIL_VIEW_URL="http://127.0.0.1:$MAIL_VIEW_PORT"
  if [ "$REDIS_CLUSTER" = 1 ]; then
    # The waiting room's tests run on the cluster; booking's own Redis stays one server.
    export FLOODGATE_TEST_STANDALONE_REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
    FLOODGATE_TEST_REDIS_URL="$(cluster_seeds)"
    FLOODGATE_TEST_QUEUE_REDIS_URL="$FLOODGATE_TEST_REDIS_URL"
    export FLOODGATE_TEST_REDIS_CLUSTER=1
    log "waiting-room tests against the Redis Cluster on ${CLUSTER_PORTS[*]}"
  fi
  # Databases left by earlier test runs (each test makes its own); ones still in use by a
  # concurrent run stay. DROP DATABASE forces a checkpoint (~1 s each), so this tidies in the
  # background instead of delaying the run; CI machines start clean and skip it.
  if [ -z "${CI:-}" ]; then
    ( psql_admin -d postgres -c "SELECT datname FROM pg_database d WHERE datname LIKE 'fg\_test\_%'
        AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)" \
      | while read -r db; do [ -n "$db" ] && psql_admin -d postgres -c "DROP DATABASE IF EXISTS \"$db\"" >/dev/null 2>&1 || true; done
    ) </dev/null >/dev/null 2>&1 &
  fi
  cd "$ROOT" || die "cannot enter $ROOT"
  local out="$STATE/test-output.log" rc=0 which=(--workspace) summary="$STATE/test-summary" a
  # `test -p NAME`: only that package (with --workspace cargo would ignore -p and run all).
  for a in "$@"; do case "$a" in -p|--package|--package=*) which=() ;; esac; done
  if [ "$REDIS_CLUSTER" = 1 ]; then
    # The suites that use the waiting room's Redis (booking's own Redis is one server).
    which=(-p gateway -p e2e) out="$STATE/test-output-cluster.log" summary="$STATE/test-summary-cluster"
  fi
  cargo test "${which[@]}" --all-targets --no-fail-fast "$@" 2>&1 | tee "$out" || rc=$?
  # One plain closing line over every test binary, e.g. "tests: 179 passed, 0 failed".
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
       END { printf "tests: %d passed, %d failed\n", p, f }' "$out" | tee "$summary"
  return "$rc"
}

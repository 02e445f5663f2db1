# shellcheck shell=bash disable=SC2015,SC2153  # A && B || C on purpose; ROOT, STATE, LOGS come from deploy/stack
# `deploy/stack bench`: the benchmark suite (deploy/bench/run builds the release profile).

cmd_bench() {
  deps bench
  if [ -x "$ROOT/deploy/bench/run" ]; then
    exec "$ROOT/deploy/bench/run" "$@"
  fi
  die "benchmark runner deploy/bench/run not found"
}

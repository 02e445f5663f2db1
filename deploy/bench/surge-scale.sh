#!/usr/bin/env bash
# The launch surge across processes (issue 17): 2 gateway processes and 2 booking processes,
# the waiting room on the local Redis Cluster (3 masters + 3 replicas), and the gateway that
# holds the event's admission lease killed with `kill -9` in the middle of the surge. The
# same surge, invariant check and report as deploy/bench/surge.sh (which this runs), plus
# the takeover time and the admit rate around the kill.
#
#   deploy/bench/surge-scale.sh [--quick] [OUT_DIR]     (normally via deploy/bench/run)
#
# Knobs: those of surge.sh, and SURGE_KILL_LEADER_AT (seconds into the surge; default the
# middle of the arrival peak).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
QUICK="${BENCH_QUICK:-0}"
[ "${1:-}" = "--quick" ] && QUICK=1
# The cluster is the stack's own (created once, reused); deps also keeps Postgres and the
# single Redis servers up, which booking and the cleanup use.
FLOODGATE_REDIS_CLUSTER=1 "$ROOT/deploy/stack" deps >&2
if [ "$QUICK" = 1 ]; then at="${SURGE_KILL_LEADER_AT:-10}"; else at="${SURGE_KILL_LEADER_AT:-40}"; fi
# The room is split over 3 sub-queues, one per master (`queue_shards`): the leader killed
# mid-surge is the one merging them.
export SURGE_GATEWAYS=2 SURGE_BOOKINGS=2 SURGE_REDIS_CLUSTER=1 SURGE_KILL_LEADER_AT="$at"
export SURGE_QUEUE_SHARDS="${SURGE_QUEUE_SHARDS:-3}"
export SURGE_K6=0 SURGE_PLOT_PREFIX=surge-scale
export SURGE_TITLE="Launch surge across processes: 2 gateways, 2 bookings, Redis Cluster, queue split over 3 sub-queues, leader killed (issue 17)"
exec "$ROOT/deploy/bench/surge.sh" "$@"

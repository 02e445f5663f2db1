# shellcheck shell=bash disable=SC2015,SC2153  # A && B || C on purpose; ROOT, STATE, LOGS come from deploy/stack
# FLOODGATE_REDIS_CLUSTER=1 (or `up --redis-cluster`): the waiting room runs on a local Redis
# Cluster of 3 masters + 3 replicas (Debian's redis-server) instead of the single queue Redis.
REDIS_CLUSTER="${FLOODGATE_REDIS_CLUSTER:-0}"
# Below the ephemeral port range, and so is each node's cluster bus (port + 10000).
# shellcheck disable=SC2206  # a space-separated list of ports
CLUSTER_PORTS=(${FLOODGATE_REDIS_CLUSTER_PORTS:-17001 17002 17003 17004 17005 17006})
# Between Postgres and the single Redis servers: `down` and `status` walk in reverse, so the
# cluster's line follows the two Redis lines as it always has.
register_component 15 cluster dep

cluster_seeds() { local p out=(); for p in "${CLUSTER_PORTS[@]}"; do out+=("redis://127.0.0.1:$p"); done; (IFS=,; echo "${out[*]}"); }

cluster_ok() { redis-cli -p "$1" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; }

cluster_ports() {
  [ "$REDIS_CLUSTER" = 1 ] || return 0
  local p
  for p in "${CLUSTER_PORTS[@]}"; do
    redis_is_ours "$p" "$STATE/cluster/$p" "$STATE/cluster/$p/redis.pid" && continue
    echo "FLOODGATE_REDIS_CLUSTER_PORTS 127.0.0.1 $p"
  done
}

# Six cluster-enabled servers (AOF everysec, data under $STATE/cluster/PORT); the first start
# joins them into 3 masters + 3 replicas. Restarts reuse nodes.conf and need no re-create.
cluster_start() {
  [ "$REDIS_CLUSTER" = 1 ] || return 0
  local p
  for p in "${CLUSTER_PORTS[@]}"; do
    mkdir -p "$STATE/cluster/$p" "$LOGS"
    redis-cli -p "$p" ping >/dev/null 2>&1 && continue
    redis-server --port "$p" --bind 127.0.0.1 --daemonize yes --dir "$STATE/cluster/$p" \
      --pidfile "$STATE/cluster/$p/redis.pid" --logfile "$LOGS/cluster-$p.log" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --appendonly yes --appendfsync everysec --save "" --maxclients 20000 \
      --repl-diskless-sync-delay 0 >/dev/null
  done
  for p in "${CLUSTER_PORTS[@]}"; do
    for _ in $(seq 1 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
    redis-cli -p "$p" ping >/dev/null 2>&1 || { tail -20 "$LOGS/cluster-$p.log" >&2; die "cluster node :$p did not start"; }
  done
  if ! cluster_ok "${CLUSTER_PORTS[0]}"; then
    if [ "$(redis-cli -p "${CLUSTER_PORTS[0]}" cluster info | awk -F: '/^cluster_known_nodes/ {print $2+0}')" -le 1 ]; then
      log "creating the Redis Cluster (3 masters + 3 replicas) on ${CLUSTER_PORTS[*]}"
      local nodes=(); for p in "${CLUSTER_PORTS[@]}"; do nodes+=("127.0.0.1:$p"); done
      redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$LOGS/cluster-create.log" 2>&1 \
        || { cat "$LOGS/cluster-create.log" >&2; die "redis-cli --cluster create failed"; }
    fi
    for _ in $(seq 1 100); do
      local all=1; for p in "${CLUSTER_PORTS[@]}"; do cluster_ok "$p" || all=0; done
      [ "$all" = 1 ] && break; sleep 0.1
    done
    cluster_ok "${CLUSTER_PORTS[0]}" || die "the Redis Cluster did not become ready (see $LOGS/cluster-*.log)"
  fi
  # A replica that never synced with its master cannot take over from it.
  for p in "${CLUSTER_PORTS[@]}"; do
    for _ in $(seq 1 100); do
      redis-cli -p "$p" info replication | grep -Eq '^(role:master|master_link_status:up)' && break
      sleep 0.1
    done
  done
}

# Always (whatever FLOODGATE_REDIS_CLUSTER says): a cluster started by an earlier run stops too.
cluster_stop() {
  local p
  for p in "${CLUSTER_PORTS[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
}

cluster_status() {
  if cluster_ok "${CLUSTER_PORTS[0]}"; then echo "redis cluster: ok (${CLUSTER_PORTS[*]})"; fi
}

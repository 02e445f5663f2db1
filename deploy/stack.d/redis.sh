# shellcheck shell=bash disable=SC2015,SC2153  # A && B || C on purpose; ROOT, STATE, LOGS come from deploy/stack
# The two private Redis servers: booking's (AOF always) and the waiting room's (AOF everysec).
REDIS_PORT="${FLOODGATE_REDIS_PORT:-56379}"
# Redis AOF fsync policy. `always`: an acknowledged hot-auction bid survives a crash of the
# machine; `everysec`: up to ~1 s of acknowledged bids can be lost (see docs/operations.md).
REDIS_APPENDFSYNC="${FLOODGATE_REDIS_APPENDFSYNC:-always}"
# The waiting room's own Redis (queue, places, admissions, revocations): `everysec`, so a join
# at the arrival peak does not wait for a disk flush. A crash loses at most the last second of
# joins, and those fans get their place back from their signed receipt when the waiting page
# joins again (docs/operations.md, "What a Redis crash loses").
QREDIS_PORT="${FLOODGATE_QUEUE_REDIS_PORT:-56380}"
QREDIS_APPENDFSYNC="${FLOODGATE_QUEUE_REDIS_APPENDFSYNC:-everysec}"
register_component 20 redis dep

redis_packages() {
  have redis-server || echo redis-server
  have redis-cli || echo redis-tools
}

# redis_is_ours PORT DIR PIDFILE: the Redis on PORT is this stack's: it keeps its data in DIR
# (another clone's stack on the same port does not, and must not be shared), or, while it
# cannot answer yet (loading its AOF after a crash), PIDFILE names a live redis-server.
redis_is_ours() {
  local dir pid
  if redis-cli -p "$1" ping 2>/dev/null | grep -qx PONG; then
    dir="$(redis-cli -p "$1" --raw config get dir 2>/dev/null | sed -n 2p)"
    [ -n "$dir" ] && [ "$dir" = "$(realpath -m "$2")" ]
    return
  fi
  pid="$(cat "$3" 2>/dev/null || true)"
  [ -n "$pid" ] && is_alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = redis-server ]
}

# redis_port_free VAR PORT DIR PIDFILE: prints the port for preflight_ports unless our own
# Redis has it.
redis_port_free() {
  redis_is_ours "$2" "$3" "$4" && return 0
  echo "$1 127.0.0.1 $2"
}

redis_ports() {
  redis_port_free FLOODGATE_REDIS_PORT "$REDIS_PORT" "$STATE/redis" "$STATE/redis.pid"
  redis_port_free FLOODGATE_QUEUE_REDIS_PORT "$QREDIS_PORT" "$STATE/redis-queue" "$STATE/redis-queue.pid"
}

# redis_port_taken NAME FROM: this start's part of the log (after byte FROM) says the port was taken.
redis_port_taken() { tail -c +"$(( $2 + 1 ))" "$LOGS/$1.log" 2>/dev/null | grep -q "Address already in use"; }

# redis_one PORT NAME FSYNC: one private Redis (AOF on, data under $STATE/NAME).
redis_one() {
  local port="$1" name="$2" fsync="$3"
  mkdir -p "$STATE/$name" "$LOGS"
  if redis-cli -p "$port" ping >/dev/null 2>&1; then return 0; fi
  log "starting Redis ($name) on 127.0.0.1:$port (appendfsync $fsync)"
  local attempt from
  for attempt in 1 2 3 4 5; do
    from="$(stat -c %s "$LOGS/$name.log" 2>/dev/null || echo 0)"
    redis-server --port "$port" --bind 127.0.0.1 --daemonize yes \
      --dir "$STATE/$name" --pidfile "$STATE/$name.pid" --logfile "$LOGS/$name.log" \
      --appendonly yes --appendfsync "$fsync" --save "" \
      --maxclients 20000 --protected-mode yes >/dev/null
    for _ in $(seq 1 50); do
      redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
      # Like Postgres' port, the default ones lie in the ephemeral range (see pg_start).
      redis_port_taken "$name" "$from" && break
      sleep 0.1
    done
    redis_port_taken "$name" "$from" && [ "$attempt" -lt 5 ] || break
    log "port $port is held by another socket; retrying in 3 s"
    sleep 3
  done
  tail -20 "$LOGS/$name.log" >&2; die "Redis ($name) did not start"
}

redis_start() {
  redis_one "$REDIS_PORT" redis "$REDIS_APPENDFSYNC"
  redis_one "$QREDIS_PORT" redis-queue "$QREDIS_APPENDFSYNC"
}

redis_stop() {
  redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  redis-cli -p "$QREDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
}

redis_status() {
  if redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then echo "redis: running (:$REDIS_PORT)"; else echo "redis: stopped"; fi
  if redis-cli -p "$QREDIS_PORT" ping >/dev/null 2>&1; then echo "redis (waiting room): running (:$QREDIS_PORT)"; else echo "redis (waiting room): stopped"; fi
}

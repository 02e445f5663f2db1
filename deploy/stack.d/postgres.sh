# shellcheck shell=bash disable=SC2015,SC2153  # A && B || C on purpose; ROOT, STATE, LOGS come from deploy/stack
# The private Postgres cluster (data under $STATE/pg) and the `floodgate` database.
PG_PORT="${FLOODGATE_PG_PORT:-55432}"
register_component 10 postgres dep

pg_bin() {
  local d
  d="$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -1 || true)"
  [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

postgres_packages() {
  [ -n "$(pg_bin)" ] || echo postgresql postgresql-contrib
  have psql || echo postgresql-client
  # Only root needs runuser (to run Postgres as the `postgres` user).
  if is_root; then have runuser || echo util-linux; fi
}

# Runs a Postgres tool as the `postgres` user when we are root (Postgres refuses root), from
# `/`: the caller's directory may be one the postgres user cannot enter (a checkout in /root).
pg_run() {
  if is_root; then (cd / && "$(tool runuser)" -u postgres -- "$@"); else "$@"; fi
}

# Where Postgres keeps its data, and its log. Normally $STATE/pg and $LOGS/postgres.log. As
# root Postgres runs as the `postgres` user, who cannot reach a checkout under a directory it
# may not enter (a clone in /root, mode 700): then the cluster lives in
# /var/lib/floodgate/stack-<hash of $STATE>/ and $STATE/pg is a symlink to it. The place is a
# function of $STATE alone, so `down`, `status`, re-runs and crash recovery all find it.
PG_DATA="" PG_LOG=""
pg_paths() {
  [ -n "$PG_DATA" ] && return 0
  mkdir -p "$STATE" "$LOGS"
  chmod 755 "$STATE" "$LOGS"
  PG_DATA="$STATE/pg" PG_LOG="$LOGS/postgres.log"
  is_root || return 0
  id postgres >/dev/null 2>&1 || die "user postgres missing (reinstall the postgresql package)"
  local base
  if [ -L "$STATE/pg" ]; then
    base="$(dirname "$(readlink "$STATE/pg")")"
  elif (cd / && "$(tool runuser)" -u postgres -- test -x "$LOGS"); then
    return 0
  else
    [ -s "$STATE/pg/PG_VERSION" ] && die "the postgres user cannot reach $STATE/pg; make its parent directories traversable (chmod o+x) or move that cluster away"
    rmdir "$STATE/pg" 2>/dev/null || true   # left empty by a run that failed here
    base="${FLOODGATE_PG_HOME:-/var/lib/floodgate}/stack-$(printf '%s' "$STATE" | sha256sum | cut -c1-16)"
    log "the postgres user cannot enter $STATE: keeping Postgres data in $base (linked from $STATE/pg)"
  fi
  mkdir -p "$base/pg"
  chown postgres "$base" "$base/pg"
  chmod 700 "$base/pg"
  [ -L "$STATE/pg" ] || ln -s "$base/pg" "$STATE/pg"
  if [ ! -L "$LOGS/postgres.log" ]; then
    rm -f "$LOGS/postgres.log"; ln -s "$base/postgres.log" "$LOGS/postgres.log"
  fi
  PG_DATA="$base/pg" PG_LOG="$base/postgres.log"
}

# A postmaster killed where nothing reaps it stays a zombie, and a crash can leave its pid to
# another process: either way its lock files (data directory, socket) look alive to pg_ctl
# and to Postgres itself. Drop such lock files (Postgres' shared-memory interlock still
# refuses to start while any old backend is attached).
pg_drop_stale_locks() {
  local lock pm
  for lock in "$PG_DATA/postmaster.pid" "/tmp/.s.PGSQL.$PG_PORT.lock"; do
    pm="$(head -1 "$lock" 2>/dev/null || true)"
    if [ -n "$pm" ] && ! is_ours "$pm" postgres; then rm -f "$lock"; fi
  done
}

pg_running() {
  local bin; bin="$(pg_bin)" || return 1
  [ -s "$STATE/pg/PG_VERSION" ] || return 1
  pg_paths
  pg_drop_stale_locks
  pg_run "$bin/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1
}

postgres_ports() { pg_running || echo "FLOODGATE_PG_PORT 127.0.0.1 $PG_PORT"; }

pg_start() {
  local bin; bin="$(pg_bin)" || die "PostgreSQL binaries not found"
  pg_paths
  local data="$PG_DATA"
  if is_root; then
    touch "$PG_LOG"; chown postgres "$PG_LOG"
  fi
  if [ ! -s "$data/PG_VERSION" ]; then
    log "initialising private Postgres cluster in $data"
    mkdir -p "$data"
    if is_root; then chown postgres "$data"; fi
    chmod 700 "$data"
    pg_run "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
  fi
  pg_drop_stale_locks
  if pg_run "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    return 0
  fi
  log "starting Postgres on 127.0.0.1:$PG_PORT"
  # The default port lies in the kernel's ephemeral range, so an outgoing connection can hold it
  # for a while ("Address already in use"): such a holder goes away, so wait for it, briefly.
  # A listening holder never goes away: preflight_ports has refused it already.
  local attempt
  for attempt in 1 2 3 4 5; do
    pg_run "$bin/pg_ctl" -D "$data" -l "$PG_LOG" -w -t 60 start -o \
      "-p $PG_PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=/tmp \
       -c max_connections=500 -c shared_buffers=512MB -c max_locks_per_transaction=256 \
       -c log_min_messages=warning -c log_min_error_statement=panic \
       -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all \
       -c pg_stat_statements.track_utility=on" >/dev/null && return 0
    tail -5 "$PG_LOG" | grep -q "Address already in use" && [ "$attempt" -lt 5 ] || break
    log "port $PG_PORT is held by another socket; retrying in 3 s"
    sleep 3
  done
  tail -20 "$PG_LOG" >&2; die "Postgres did not start"
}

psql_admin() { psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }

postgres_start() {
  pg_start
  psql_admin -d postgres -c "SELECT 1" >/dev/null || die "cannot connect to private Postgres"
  if [ "$(psql_admin -d postgres -c "SELECT 1 FROM pg_database WHERE datname = 'floodgate'")" != 1 ]; then
    psql_admin -d postgres -c "CREATE DATABASE floodgate" >/dev/null
  fi
}

postgres_stop() {
  local bin; bin="$(pg_bin)" || return 0
  [ -s "$STATE/pg/PG_VERSION" ] || return 0
  pg_paths
  pg_run "$bin/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null 2>&1 || true
}

postgres_status() {
  local data="$STATE/pg"; [ -L "$data" ] && data="$(readlink "$data")"
  if psql_admin -d postgres -c "SELECT 1" >/dev/null 2>&1; then echo "postgres: running (:$PG_PORT, data $data)"; else echo "postgres: stopped (data $data)"; fi
}

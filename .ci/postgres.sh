#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the dashboard's store tests.
#
#   eval "$(bash .ci/postgres.sh start)"   # prints the exports: GNOMON_TEST_PG_URL, GNOMON_TEST_PG_DIR
#   bash .ci/postgres.sh stop              # stops the cluster in $GNOMON_TEST_PG_DIR, removes it
#
# Debian's server (installed when missing), initdb'd as the postgres user (initdb refuses root)
# into a temporary folder, listening on 127.0.0.1 at a free port with password (scram) logins,
# so the tests can also check a wrong password. pg_ctl logs to a file, so the server holds none
# of the caller's pipes open.
set -euo pipefail

password=gnomon-test-pw

start() {
  if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    echo "ci: installing Debian's postgresql" >&2
    sudo=""
    if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2
  fi
  local bin
  bin=$(dirname "$(ls -d /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")
  local dir
  dir=$(mktemp -d /tmp/gnomon-pg.XXXXXX)
  chmod 755 "$dir"
  local as=()
  if [[ $(id -u) -eq 0 ]]; then
    chown postgres: "$dir"
    as=(runuser -u postgres --)
  fi
  printf '%s\n' "$password" > "$dir/pwfile"
  chmod 644 "$dir/pwfile"
  "${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres --pwfile="$dir/pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  local port
  port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=100" start >&2 \
    || { cat "$dir/server.log" >&2; exit 1; }
  echo "export GNOMON_TEST_PG_DIR=$dir"
  echo "export GNOMON_TEST_PG_URL=postgresql+psycopg://postgres:$password@127.0.0.1:$port/postgres"
}

stop() {
  local dir=${GNOMON_TEST_PG_DIR:-}
  [[ -n "$dir" && -d "$dir" ]] || return 0
  local bin
  bin=$(dirname "$(ls -d /usr/lib/postgresql/*/bin/pg_ctl | sort -V | tail -1)")
  local as=()
  if [[ $(id -u) -eq 0 ]]; then as=(runuser -u postgres --); fi
  "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
  rm -rf "$dir"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

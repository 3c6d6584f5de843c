#!/usr/bin/env bash
# Run a command with PostgreSQL and Redis reachable, exporting DATABASE_URL,
# REDIS_URL and CELERY_BROKER_URL for it.
#
#   DATABASE_URL / REDIS_URL if set; else 127.0.0.1:5432 (the shell's user,
#   trust auth) and 127.0.0.1:6379. If nothing listens there and the server
#   binaries are installed, start disposable instances in a temporary
#   directory and stop them afterwards; otherwise fail in one line naming what
#   to install.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-$here/../.venv/bin/python}"
tmp=""
started_pg=""
started_redis=""

cleanup() {
  if [[ -n "$started_pg" ]]; then
    ${PG_AS:-} pg_ctl -D "$tmp/pg" -m immediate stop >/dev/null 2>&1 || true
  fi
  if [[ -n "$started_redis" ]]; then
    redis-cli -p "$started_redis" shutdown nosave >/dev/null 2>&1 || true
  fi
  if [[ -n "$tmp" ]]; then rm -rf "$tmp"; fi
}
trap cleanup EXIT

listening() {  # host port
  "$py" -c 'import socket,sys; s=socket.socket(); s.settimeout(1); sys.exit(s.connect_ex((sys.argv[1], int(sys.argv[2]))))' "$1" "$2"
}

free_port() {
  "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

find_bin() {  # name -> path (PATH, then PostgreSQL's versioned folders)
  command -v "$1" 2>/dev/null || ls /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -1
}

user="$(id -un)"
if [[ -z "${DATABASE_URL:-}" ]]; then
  if listening 127.0.0.1 5432; then
    export DATABASE_URL="postgres://$user@127.0.0.1:5432/boxoffice"
  else
    initdb="$(find_bin initdb)"; pg_ctl="$(find_bin pg_ctl)"
    if [[ -z "$initdb" || -z "$pg_ctl" ]]; then
      echo "make test: no PostgreSQL on 127.0.0.1:5432 and no server binaries; install PostgreSQL (apt-get install postgresql) or set DATABASE_URL" >&2
      exit 2
    fi
    tmp="${tmp:-$(mktemp -d /tmp/boxoffice-services.XXXXXX)}"
    chmod 755 "$tmp"
    port="$(free_port)"
    PG_AS=""
    if [[ "$(id -u)" == "0" ]]; then
      # PostgreSQL refuses to run as root.
      PG_AS="runuser -u postgres --"
      mkdir -p "$tmp/pg" && chown postgres "$tmp/pg"
    fi
    PATH="$(dirname "$pg_ctl"):$PATH"
    $PG_AS "$initdb" -D "$tmp/pg" -U "$user" --auth=trust >/dev/null
    $PG_AS "$pg_ctl" -D "$tmp/pg" -l "$tmp/pg/log" -w \
      -o "-p $port -k $tmp/pg -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
    started_pg=1
    export DATABASE_URL="postgres://$user@127.0.0.1:$port/boxoffice"
    echo "started a disposable PostgreSQL on port $port"
  fi
fi

if [[ -z "${REDIS_URL:-}" ]]; then
  if listening 127.0.0.1 6379; then
    export REDIS_URL="redis://127.0.0.1:6379/15"
  else
    if ! command -v redis-server >/dev/null; then
      echo "make test: no Redis on 127.0.0.1:6379 and no redis-server; install Redis (apt-get install redis-server) or set REDIS_URL" >&2
      exit 2
    fi
    tmp="${tmp:-$(mktemp -d /tmp/boxoffice-services.XXXXXX)}"
    port="$(free_port)"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
      --dir "$tmp" --daemonize yes --logfile "$tmp/redis.log" >/dev/null
    for _ in $(seq 50); do listening 127.0.0.1 "$port" && break; sleep 0.1; done
    started_redis="$port"
    export REDIS_URL="redis://127.0.0.1:$port/15"
    echo "started a disposable Redis on port $port"
  fi
fi
export CELERY_BROKER_URL="${CELERY_BROKER_URL:-$REDIS_URL}"

"$@"

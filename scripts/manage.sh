#!/usr/bin/env bash
# make manage CMD="...": one manage.py command (audit_sagas, resume_sagas
# --dry-run, chase_compensations, seed_demo, ...) with the environment of
# make run (scripts/env.sh), e.g. from a second shell while the stack runs.
# Give it the same DATABASE_URL / CELERY_BROKER_URL / PORT as make run; it
# says on stderr which ones it uses. With no DATABASE_URL it uses the
# embedded PostgreSQL of make run: the running one, or one it starts for the
# command and stops after it. Runs from the repository's root.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
boxoffice_pg_start
echo "manage.sh: database $(boxoffice_database); broker $(boxoffice_broker);" \
     "gateway $PAYMENT_GATEWAY_URL" >&2
if [[ -z "$boxoffice_pg_pid" ]]; then exec python manage.py "$@"; fi
trap boxoffice_pg_stop EXIT
python manage.py "$@"

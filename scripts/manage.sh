#!/usr/bin/env bash
# make manage CMD="...": one manage.py command (audit_sagas, resume_sagas
# --dry-run, chase_compensations, seed_demo, ...) with the environment of
# make run (scripts/env.sh), e.g. from a second shell while the stack runs.
# Give it the same DATABASE_URL / CELERY_BROKER_URL / PORT as make run; it
# says on stderr which ones it uses. Runs from the repository's root.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
echo "manage.sh: database $(boxoffice_database); broker $(boxoffice_broker);" \
     "gateway $PAYMENT_GATEWAY_URL" >&2
exec python manage.py "$@"

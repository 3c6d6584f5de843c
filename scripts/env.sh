# The environment of `make run`, in one place. Sourced (from the repository's
# root) by scripts/run.sh, which starts the stack, and by scripts/manage.sh
# (`make manage CMD=...`), which runs one management command, so that a
# command sees the database, broker, gateway and metrics folder of the stack.
# What the shell already sets wins: DATABASE_URL, CELERY_BROKER_URL (none:
# SQLite and kombu's filesystem transport under var/), PORT, DEBUG,
# PAYMENT_GATEWAY_URL, PROMETHEUS_MULTIPROC_DIR, BOXOFFICE_VAR_DIR,
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

# Where the data lives, in words (the banner of run.sh, the first line of
# manage.sh).
boxoffice_database() {
  if [[ -n "${DATABASE_URL:-}" ]]; then echo "$DATABASE_URL"
  else echo "SQLite in ${BOXOFFICE_VAR_DIR:-var}/ (embedded)"; fi
}
boxoffice_broker() {
  if [[ -n "${CELERY_BROKER_URL:-}" ]]; then echo "$CELERY_BROKER_URL"
  else echo "filesystem transport in ${BOXOFFICE_VAR_DIR:-var}/broker (embedded)"; fi
}

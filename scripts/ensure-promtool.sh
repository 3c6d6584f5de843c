#!/usr/bin/env bash
# The checker of the alerting rules (tests/test_monitoring.py runs
# `promtool check rules` and `promtool test rules` on deploy/monitoring/):
# Debian's package `prometheus` ships it as /usr/bin/promtool. Called by
# `make test` before pytest.
#
#   found (PROMTOOL, or promtool on the PATH): nothing to do;
#   missing, and we are root with apt-get: install Debian's package `prometheus`
#   (without its recommends; on a machine run by systemd this also enables
#   the Prometheus server on :9090: `systemctl disable --now prometheus`);
#   otherwise (or if that fails): one line naming the package, exit 2. The
#   rule tests are never skipped silently.
set -euo pipefail

PROMTOOL="${PROMTOOL:-promtool}"

if command -v "$PROMTOOL" >/dev/null; then
  exit 0
fi

if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null; then
  echo "make test: promtool is missing; installing Debian's package prometheus (apt-get)" >&2
  log="$(mktemp /tmp/ensure-promtool.XXXXXX.log)"
  if { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
         prometheus; } >"$log" 2>&1 && command -v "$PROMTOOL" >/dev/null; then
    rm -f "$log"
    exit 0
  fi
  echo "make test: installing prometheus failed (log: $log)" >&2
fi

echo "make test: no promtool for the alert rule tests; install Debian's package prometheus (apt-get install prometheus)" >&2
exit 2

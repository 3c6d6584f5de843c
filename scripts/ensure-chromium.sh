#!/usr/bin/env bash
# The browser of the browser tests (tests/test_pages_browser.py) and of the
# docs' screenshots (devtools/screenshots.py): Debian's Chromium at
# /usr/bin/chromium, driven by Playwright (which downloads no browser of its
# own here). Called by `make test` before pytest.
#
#   found: nothing to do;
#   missing, and we are root with apt-get: install Debian's package `chromium`;
#   otherwise (or if that fails): one line naming the package, exit 2. The
#   browser tests are never skipped silently.
set -euo pipefail

CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

if [[ -x "$CHROMIUM" ]]; then
  exit 0
fi

if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null; then
  echo "make test: $CHROMIUM is missing; installing Debian's package chromium (apt-get)" >&2
  log="$(mktemp /tmp/ensure-chromium.XXXXXX.log)"
  if { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
         chromium fonts-dejavu-core; } >"$log" 2>&1 && [[ -x "$CHROMIUM" ]]; then
    rm -f "$log"
    exit 0
  fi
  echo "make test: installing chromium failed (log: $log)" >&2
fi

echo "make test: no $CHROMIUM for the browser tests; install Debian's package chromium (apt-get install chromium)" >&2
exit 2

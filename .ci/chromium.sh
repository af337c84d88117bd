#!/usr/bin/env bash
# Debian's headless-capable Chromium, for the report's browser test (tests/reporting/test_report_browser.py).
#
#   bash .ci/chromium.sh
#
# Idempotent: does nothing when /usr/bin/chromium exists. Otherwise, as root, installs the
# `chromium` package with apt-get; not as root, it says so and leaves the browser test to
# skip itself. Prints one line to stderr, nothing to stdout; exits 0 unless apt-get fails.
set -euo pipefail

log() { printf 'chromium.sh: %s\n' "$*" >&2; }

if [[ -x /usr/bin/chromium ]]; then
	log "found $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
	exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
	log "no /usr/bin/chromium and not root: run 'sudo apt-get install chromium'; the browser test will skip"
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	log "no /usr/bin/chromium and no apt-get: install Chromium by hand; the browser test will skip"
	exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt_log=$(mktemp)
trap 'rm -f "$apt_log"' EXIT
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; } >"$apt_log" 2>&1; then
	cat "$apt_log" >&2
	log "error: apt-get could not install chromium"
	exit 1
fi
log "installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"

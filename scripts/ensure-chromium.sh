#!/usr/bin/env bash
# Make sure Debian's Chromium is at /usr/bin/chromium for the browser tests
# (Playwright drives it; `playwright install` downloads are never used).
#
# When it is missing and this runs as root with apt-get, the `chromium`
# package is installed; otherwise it says so and succeeds: the browser tests
# then skip with that reason.
set -euo pipefail

me="ensure-chromium"
say() { echo "$me: $*" >&2; }
BROWSER=${CORRAL_TEST_CHROMIUM:-/usr/bin/chromium}

if [ -x "$BROWSER" ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "$BROWSER not found and cannot install it here (needs root and apt-get); browser tests will be skipped"
    say "install it with: apt-get install chromium"
    exit 0
fi
say "Chromium not found; installing the Debian 'chromium' package"
apt-get update -qq </dev/null >/dev/null
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium </dev/null >/dev/null; then
    say "installing chromium failed; browser tests will be skipped"
fi
exit 0

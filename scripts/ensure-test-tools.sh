#!/usr/bin/env bash
# Make sure the outside tools some tests drive are installed:
#   - Debian's Chromium at /usr/bin/chromium, for the dashboard's browser tests
#     (Playwright drives it; `playwright install` downloads are never used);
#   - promtool (Debian package `prometheus`), which checks docs/alerts.yml.
#
# When one is missing and this runs as root with apt-get, its Debian package is
# installed; otherwise it says so and succeeds: those tests then skip with
# that reason, except in CI (CI set), where they fail.
set -euo pipefail

me="ensure-test-tools"
say() { echo "$me: $*" >&2; }
BROWSER=${CORRAL_TEST_CHROMIUM:-/usr/bin/chromium}

packages=()
[ -x "$BROWSER" ] || packages+=(chromium)
command -v promtool >/dev/null 2>&1 || packages+=(prometheus)
[ ${#packages[@]} -gt 0 ] || exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "missing: ${packages[*]}; cannot install here (needs root and apt-get); their tests will be skipped (in CI: fail)"
    say "install with: apt-get install ${packages[*]}"
    exit 0
fi
say "installing the Debian packages: ${packages[*]}"
apt-get update -qq </dev/null >/dev/null
for p in "${packages[@]}"; do
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" </dev/null >/dev/null; then
        say "installing $p failed; its tests will be skipped (in CI: fail)"
    fi
done
exit 0

#!/usr/bin/env bash
# The system packages a make target needs, named as apt names them (default: both):
#   bubblewrap  the code sandbox: the code domains verify every completion inside it
#   postgresql  the throwaway server `make test` runs the store tests against
# Installed with apt when missing and we are root. Otherwise stop here, in one line, before pip
# or pytest runs: a test that needs a missing package would fail far from its cause.
# SYSTEM_DEPS=skip installs nothing and carries on (make test then skips what needs them, saying why).
set -euo pipefail
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=(bubblewrap postgresql)
has() {
  case $1 in
    bubblewrap) command -v bwrap >/dev/null 2>&1 ;;
    postgresql) ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 ;;
  esac
}
purpose() {
  case $1 in bubblewrap) echo "bubblewrap (the code sandbox)" ;; postgresql) echo "postgresql (the store tests' server)" ;; esac
}
missing=()
for pkg in "${wanted[@]}"; do has "$pkg" || missing+=("$pkg"); done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "${SYSTEM_DEPS:-install}" = skip ]; then
  echo "SYSTEM_DEPS=skip: going on without ${missing[*]}" >&2
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  exit 0
fi
why=$([ "$(id -u)" -eq 0 ] && echo "there is no apt-get" || echo "this is not root")
named=$(for pkg in "${missing[@]}"; do purpose "$pkg"; done | paste -sd, - | sed 's/,/, /g')
echo "palestra: missing $named; installing needs root and apt-get, and $why: run" \
     "'sudo apt-get install ${missing[*]}', or 'make test SYSTEM_DEPS=skip' to run only the tests that need neither" >&2
exit 1

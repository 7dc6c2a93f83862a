#!/usr/bin/env bash
# System tools the tests and the code sandbox need: bubblewrap (the sandbox) and PostgreSQL (the
# store's server-backed tests). Installed with apt when missing and we are root; otherwise we say
# what is missing and carry on (the tests that need them then fail with a clear message).
set -euo pipefail
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then missing+=(postgresql); fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "warning: missing system packages: ${missing[*]} (install them with apt-get)" >&2
fi

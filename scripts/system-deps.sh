#!/usr/bin/env bash
# System packages the test suite needs beyond the Python venv, installed from Debian when missing:
#   chromium (headless UI tests through Playwright) and maven (assembles Apache Pulsar from Maven
#   Central once; later runs start from the cache). Sourced by scripts/test.sh.
set -euo pipefail

_missing=()
command -v chromium >/dev/null 2>&1 || [ -n "${CHROMIUM_PATH:-}" ] || _missing+=(chromium)
command -v mvn >/dev/null 2>&1 || _missing+=(maven)

if [ "${#_missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] apt-get install ${_missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${_missing[@]}" >/dev/null 2>&1 || {
      apt-get update -q >/dev/null 2>&1
      apt-get install -y -q "${_missing[@]}" >/dev/null
    }
  else
    echo "[setup] missing system packages: ${_missing[*]}; install them (e.g. sudo apt-get install ${_missing[*]})" >&2
    exit 1
  fi
fi

#!/usr/bin/env bash
# The whole test suite: lint (ruff), types (mypy), then unit and integration tests (pytest).
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$PROJECT_ROOT/scripts/system-deps.sh"
echo "[test] Apache Pulsar classpath (Maven Central once, then the cache) and Java 21" >&2
python -m pulsar_standalone classpath

echo "[test] ruff check" >&2
ruff check .
ruff format --check .
echo "[test] mypy" >&2
mypy
echo "[test] pytest (unit + integration)" >&2
set +e
pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[test] pytest collected no tests: failing, since the suite must run" >&2
  exit 1
fi
exit "$rc"

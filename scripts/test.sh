#!/usr/bin/env bash
# The whole test suite: lint (ruff), types (mypy), then unit and integration tests (pytest).
# Usage: scripts/test.sh [pytest args...]
#        scripts/test.sh --quick
#
# Without arguments the suite runs as three pytest processes side by side, each with its own session
# broker, Airflow home and temp dirs: most integration tests wait on brokers, JVM start-up and Airflow's
# scheduler loops, so three shards keep CI's 2 cores busy. Shard 1 holds the fault suite, the Apache
# Pulsar 4.0 LTS subset (its kill case is a fault case), the version-bound installs and the provider's
# integration tests; shard 2 the Airflow stack tests, the runs-everywhere matrix (masters x output roots,
# with its kill cases), the benchmark harness's smoke runs and the wheel installs; the last shard
# everything else. Each shard's session broker is the newest Apache Pulsar tested. This is what CI runs.
# With arguments, one pytest process runs exactly what is asked (e.g. scripts/test.sh tests/unit -x).
#
# --quick is the inner loop (under 3 minutes on 2 cores): ruff check, ruff format --check, mypy, then the
# unit tests not marked `integration` (so no Apache Pulsar is started) with, beside them, one smoke
# replay end to end on the embedded pulsar-lite broker (SMOKE below; it mostly waits on its JVM and
# broker). It needs no Apache Pulsar classpath, Maven or Chromium.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

quick=0
if [ "${1:-}" = "--quick" ]; then
  [ "$#" -eq 1 ] || { echo "[test] --quick takes no other arguments" >&2; exit 2; }
  quick=1
else
  source "$PROJECT_ROOT/scripts/system-deps.sh"
  echo "[test] Apache Pulsar classpaths of the tested versions (Maven Central once, then the cache) and Java 21" >&2
  python -m pulsar_standalone classpath --all
fi

echo "[test] ruff check" >&2
ruff check .
ruff format --check .
echo "[test] mypy" >&2
mypy

# pytest exit code 5 (nothing collected) is a failure: the suite must run.
checked() {
  local rc=$1 name=$2
  if [ "$rc" -eq 5 ]; then
    echo "[test] $name collected no tests: failing, since the suite must run" >&2
    return 1
  fi
  return "$rc"
}

if [ "$quick" -eq 1 ]; then
  SMOKE="tests/integration/replay/test_replay_embedded.py::test_replay_on_the_embedded_broker"
  smoke_log="$(mktemp "${TMPDIR:-/tmp}/dlq-test-smoke.XXXXXX")"
  trap 'rm -f "$smoke_log"' EXIT
  echo "[test] quick: unit tests not marked integration, and beside them the smoke replay on the" \
    "embedded broker ($SMOKE; log below when it ends)" >&2
  started=$SECONDS
  set +e
  pytest -q "$SMOKE" >"$smoke_log" 2>&1 &
  smoke_pid=$!
  pytest -q tests/unit -m "not integration"
  rc_unit=$?
  wait "$smoke_pid"
  rc_smoke=$?
  set -e
  echo "[test] ---------------- smoke replay ----------------" >&2
  cat "$smoke_log"
  echo "[test] quick: unit exit $rc_unit, smoke exit $rc_smoke; pytest wall time $((SECONDS - started)) s" >&2
  fail=0
  checked "$rc_unit" "unit tests" || fail=1
  checked "$rc_smoke" "smoke replay" || fail=1
  exit "$fail"
fi

if [ "$#" -gt 0 ]; then
  echo "[test] pytest $*" >&2
  set +e
  pytest "$@"
  rc=$?
  set -e
  checked "$rc" pytest
  exit $?
fi

# Each shard but the last: a space-separated list of test paths; the last shard runs everything else.
SHARDS=(
  "${DLQ_TEST_SHARD1:-tests/integration/faults tests/integration/matrix/test_matrix_lts.py tests/integration/packaging/test_version_bounds.py tests/integration/provider}"
  "${DLQ_TEST_SHARD2:-tests/integration/stack tests/integration/replay/test_replay_everywhere.py tests/integration/test_bench_smoke.py tests/integration/packaging/test_wheels.py}"
)
LAST_IGNORE=()
for shard in "${SHARDS[@]}"; do
  for path in $shard; do LAST_IGNORE+=("--ignore=$path"); done
done
logs=()
trap 'rm -f "${logs[@]}"' EXIT
echo "[test] pytest in $((${#SHARDS[@]} + 1)) shards side by side; the last runs all that the others do not" >&2
started=$SECONDS
pids=()
set +e
for i in "${!SHARDS[@]}"; do
  logs+=("$(mktemp "${TMPDIR:-/tmp}/dlq-test-shard$((i + 1)).XXXXXX")")
  # shellcheck disable=SC2086 # a shard is a list of paths
  pytest --durations=15 ${SHARDS[$i]} >"${logs[$i]}" 2>&1 &
  pids+=($!)
done
pytest --durations=25 ${DLQ_TEST_LAST:-tests} "${LAST_IGNORE[@]}"
rc_last=$?
rcs=()
for pid in "${pids[@]}"; do
  wait "$pid"
  rcs+=($?)
done
set -e
fail=0
for i in "${!SHARDS[@]}"; do
  echo "[test] ---------------- shard $((i + 1)): ${SHARDS[$i]} ----------------" >&2
  cat "${logs[$i]}"
  echo "[test] shard $((i + 1)) exit ${rcs[$i]}" >&2
  checked "${rcs[$i]}" "shard $((i + 1))" || fail=1
done
echo "[test] last shard exit $rc_last; pytest wall time $((SECONDS - started)) s" >&2
checked "$rc_last" "last shard" || fail=1
exit "$fail"

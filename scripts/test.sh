#!/usr/bin/env bash
# The whole test suite: lint (ruff), types (mypy), then unit and integration tests (pytest).
# Usage: scripts/test.sh [pytest args...]
#        scripts/test.sh --quick
#
# Without arguments the suite runs as two pytest processes side by side, each with its own session
# broker, Airflow home and temp dirs: most integration tests wait on brokers, JVM start-up and Airflow's
# scheduler loops, so two shards on CI's 2 cores finish in about half the wall time. Shard 1 holds the
# fault suite, the Airflow stack tests, the Apache Pulsar 4.0 LTS subset (its kill case is a fault case),
# the runs-everywhere matrix (masters x output roots, with its kill cases), the benchmark harness's
# smoke runs and the wheel installs, shard 2 everything else;
# each shard's session broker is the newest Apache Pulsar tested. This is what CI runs. With arguments,
# one pytest process runs exactly what is asked (e.g. scripts/test.sh tests/unit -x).
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

SHARD1=(${DLQ_TEST_SHARD1:-tests/integration/faults tests/integration/stack tests/integration/matrix/test_matrix_lts.py tests/integration/replay/test_replay_everywhere.py tests/integration/test_bench_smoke.py tests/integration/packaging/test_wheels.py})
read -r -a SHARD2_IGNORE <<< "$(printf -- '--ignore=%s ' "${SHARD1[@]}")"
log1="$(mktemp "${TMPDIR:-/tmp}/dlq-test-shard1.XXXXXX")"
trap 'rm -f "$log1"' EXIT
echo "[test] pytest in two shards: 1 = ${SHARD1[*]} (log below when it ends), 2 = the rest" >&2
started=$SECONDS
set +e
pytest --durations=15 "${SHARD1[@]}" >"$log1" 2>&1 &
pid1=$!
pytest --durations=25 ${DLQ_TEST_SHARD2:-tests} "${SHARD2_IGNORE[@]}"
rc2=$?
wait "$pid1"
rc1=$?
set -e
echo "[test] ---------------- shard 1: ${SHARD1[*]} ----------------" >&2
cat "$log1"
echo "[test] shard 1 exit $rc1, shard 2 exit $rc2; pytest wall time $((SECONDS - started)) s" >&2
fail=0
checked "$rc1" "shard 1" || fail=1
checked "$rc2" "shard 2" || fail=1
exit "$fail"

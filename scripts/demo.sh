#!/usr/bin/env bash
# The demo: an example orders service fills real DLQs on the embedded broker, then the
# dlq_nightly_replay DAG (airflow dags test) replays them with Spark. Everything it starts, it stops.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec python examples/demo.py "$@"

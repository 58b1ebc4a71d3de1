#!/usr/bin/env bash
# Bootstrap the project environment; sourced by scripts/test.sh and scripts/demo.sh.
# Installs uv if missing, syncs the locked venv, and exports what Airflow and Spark need.
set -euo pipefail

PROJECT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PROJECT_ROOT
cd "$PROJECT_ROOT"

if ! command -v uv >/dev/null 2>&1; then
  if [ -x "$HOME/.local/bin/uv" ]; then
    export PATH="$HOME/.local/bin:$PATH"
  else
    echo "[setup] uv not found: installing it with pip (python3 -m pip install --user uv)" >&2
    python3 -m pip install --quiet --user uv || python3 -m pip install --quiet uv
    export PATH="$HOME/.local/bin:$PATH"
  fi
fi

command -v java >/dev/null 2>&1 || {
  echo "[setup] java not found: Spark needs Java 17 (e.g. apt-get install openjdk-17-jre-headless)" >&2
  exit 1
}

# --compile-bytecode: every Python process of a run (the driver, each Spark worker) imports pandas, pyarrow
# and pulsar-client from this venv; uv installs no .pyc files, and where PYTHONDONTWRITEBYTECODE is set
# (as in many container images) each process would compile them again at every start.
echo "[setup] uv sync --frozen --compile-bytecode (venv: $PROJECT_ROOT/.venv)" >&2
uv sync --frozen --all-extras --quiet --compile-bytecode

VENV="$PROJECT_ROOT/.venv"
export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"                        # spark-submit, airflow, pytest
export AIRFLOW_HOME="${AIRFLOW_HOME:-$PROJECT_ROOT/.airflow}"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_FOLDER="${AIRFLOW__CORE__DAGS_FOLDER:-$PROJECT_ROOT/dags}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
export PYSPARK_PYTHON="$VENV/bin/python"
export PYSPARK_DRIVER_PYTHON="$VENV/bin/python"
export SPARK_HOME="$("$VENV/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
export PYTHONUNBUFFERED=1
mkdir -p "$AIRFLOW_HOME"

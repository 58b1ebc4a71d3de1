#!/usr/bin/env bash
# One-shot init of docker/compose.yaml (service airflow-init, runs as root, then exits 0):
#   1. hand the shared volumes to the Airflow/Spark user (AIRFLOW_UID 50000, GID 0)
#   2. migrate the Airflow metadata DB
#   3. set the login of the API server (SimpleAuthManager passwords file)
#   4. create the Airflow connections pulsar_default and spark_default if they do not exist yet
#   5. the Airflow pool dlq_replay with one slot (the replay tasks of both DAGs run in it)
#   6. Pulsar: DLQ and origin namespaces with deduplication on, the durable replayer subscription on each DLQ
# Every step is idempotent: re-running `docker compose up` keeps existing connections and data.
set -euo pipefail

log() { echo "[airflow-init] $*"; }
die() { echo "[airflow-init] ERROR: $*" >&2; exit 1; }

: "${AIRFLOW_UID:?AIRFLOW_UID is not set (docker/compose.yaml sets it)}"
AIRFLOW_GID="${AIRFLOW_GID:-0}"
: "${DLQ_DATA_DIR:?DLQ_DATA_DIR is not set (docker/compose.yaml sets it)}"
: "${AIRFLOW_ADMIN_USER:?AIRFLOW_ADMIN_USER is not set: set it in docker/.env}"
: "${AIRFLOW_ADMIN_PASSWORD:?AIRFLOW_ADMIN_PASSWORD is not set: set it in docker/.env}"
: "${DLQ_CONN_PULSAR_DEFAULT:?DLQ_CONN_PULSAR_DEFAULT is not set (docker/compose.yaml sets it)}"
: "${DLQ_CONN_SPARK_DEFAULT:?DLQ_CONN_SPARK_DEFAULT is not set (docker/compose.yaml sets it)}"

AUTH_FILE="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:?not set (docker/compose.yaml sets it)}"
LOGS_DIR="${AIRFLOW__LOGGING__BASE_LOG_FOLDER:-/opt/airflow/logs}"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log "1/6 shared volumes: ${DLQ_DATA_DIR}, ${LOGS_DIR}, $(dirname "${AUTH_FILE}")"
mkdir -p "${DLQ_DATA_DIR}" "${LOGS_DIR}" "$(dirname "${AUTH_FILE}")"
chown "${AIRFLOW_UID}:${AIRFLOW_GID}" "${DLQ_DATA_DIR}" "$(dirname "${AUTH_FILE}")"
chmod g+rwx "${DLQ_DATA_DIR}"
chown -R "${AIRFLOW_UID}:${AIRFLOW_GID}" "${LOGS_DIR}"

log "2/6 airflow db migrate"
airflow db migrate

log "3/6 API server login for user '${AIRFLOW_ADMIN_USER}' (password from docker/.env, not logged)"
python - "${AUTH_FILE}" <<'PY'
import json, os, sys
path = sys.argv[1]
with open(path, "w", encoding="utf-8") as f:
    json.dump({os.environ["AIRFLOW_ADMIN_USER"]: os.environ["AIRFLOW_ADMIN_PASSWORD"]}, f)
PY
chown "${AIRFLOW_UID}:${AIRFLOW_GID}" "${AUTH_FILE}"
chmod 0640 "${AUTH_FILE}"

log "4/6 Airflow connections pulsar_default, spark_default (created if missing, existing ones kept)"
# One `airflow connections import` (one CLI start) instead of get/add per connection. The file can
# hold a token: private to root, removed on exit.
CONN_FILE="$(mktemp --suffix=.json)"
trap 'rm -f "${CONN_FILE}"' EXIT
chmod 0600 "${CONN_FILE}"
python - "${CONN_FILE}" <<'PY'
import json, os, sys
conns = {}
for conn_id, var in (("pulsar_default", "DLQ_CONN_PULSAR_DEFAULT"), ("spark_default", "DLQ_CONN_SPARK_DEFAULT")):
    try:
        conn = json.loads(os.environ[var])
    except json.JSONDecodeError as exc:
        sys.exit(f"[airflow-init] ERROR: {var} is not valid JSON ({exc}); fix it in docker/compose.yaml")
    if isinstance(conn.get("extra"), dict):
        conn["extra"] = json.dumps(conn["extra"])
    conns[conn_id] = conn
with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump(conns, f)
PY
airflow connections import "${CONN_FILE}" | sed 's/^/[airflow-init] /' \
    || die "could not import the connections: check DLQ_CONN_* in docker/compose.yaml"

log "5/6 Airflow pool dlq_replay (one slot: nightly replay and backfill never run at once)"
airflow pools set "${DLQ_REPLAY_POOL:-dlq_replay}" 1 "one DLQ replay at a time (dlq_nightly_replay, dlq_backfill)" \
    | sed 's/^/[airflow-init] /' || die "could not create the Airflow pool dlq_replay"

log "6/6 Pulsar DLQ namespaces, deduplication and replayer subscriptions"
python "${SCRIPT_DIR}/init_pulsar.py"

# Files written as root above (logs of the CLI calls) must stay writable for UID 50000.
chown -R "${AIRFLOW_UID}:${AIRFLOW_GID}" "${LOGS_DIR}"
log "done"

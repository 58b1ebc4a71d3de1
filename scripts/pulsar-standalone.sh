#!/usr/bin/env bash
# Apache Pulsar standalone from a shell: scripts/pulsar-standalone.sh start|stop|status|classpath [...]
# (python -m pulsar_standalone --help). Bootstraps the venv first, like the other scripts.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec python -m pulsar_standalone "$@"

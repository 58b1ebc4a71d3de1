"""spark-submit entry point of the DLQ replay app (``--help`` lists every option).

spark-submit --py-files dlq_replay.zip spark_apps/dlq_replay_main.py --run-id R --service-url URL ...
"""

from __future__ import annotations

import os
import sys

from spark_apps.pyspark_imports import prefer_compiled

prefer_compiled()  # before anything imports PySpark: the compiled copy a local run has, if any

from spark_apps.dlq_replay.cli import main  # noqa: E402

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # pulsar-client can abort the interpreter's shutdown (a finished run would exit 134): no finalisers.
    os._exit(code)

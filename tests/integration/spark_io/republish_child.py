"""The sends of one republish task, in a process of its own that a test can SIGKILL at any point.

``python republish_child.py SPEC_JSON`` sends the rows :func:`task_rows` makes from the spec with
:func:`~spark_apps.dlq_replay.pulsar_io.republish.republish_batches`, in input batches of
``batch_rows``, as a send task does, and writes every result row to ``spec["results"]`` (JSON lines) once
all are in. Every attempt sends the same rows in the same order, as a resumed wave does.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

#: Payload size of the rows the spec names in ``too_big``: above the broker's 5 MiB maximum.
TOO_BIG = 6 * 1024 * 1024


def replay_id(producer: int, seq: int) -> str:
    return f"p{producer}-s{seq}"


def task_rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """``spec["producers"]`` producers of ``spec["per_producer"]`` rows each, interleaved as a decide
    file holds them; payload sizes vary with the sequence id (so batches are also cut by size), and the
    rows ``spec["too_big"]`` (``[producer, seq]`` pairs) are larger than the broker takes."""
    too_big = {tuple(pair) for pair in spec.get("too_big", [])}
    rows = []
    for seq in range(spec["per_producer"]):
        for p in range(spec["producers"]):
            size = TOO_BIG if (p, seq) in too_big else 20 + (seq * 37) % 400
            rid = replay_id(p, seq)
            rows.append(
                {
                    "replay_id": rid,
                    "target_topic": spec["target"],
                    "producer_name": f"{spec['name']}-{p}",
                    "sequence_id": seq,
                    "value": rid.encode().ljust(size, b"."),
                    "key": f"k{seq % 11}",
                    "ordering_key": None,
                    "event_time": None,
                    "properties": [("REPLAY_ID", rid)],
                    "row": len(rows),
                }
            )
    return rows


def main(spec: dict[str, Any]) -> None:
    import pyarrow as pa

    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
    from spark_apps.dlq_replay.pulsar_io.republish import REPUBLISH_INPUT_SCHEMA, republish_batches
    from spark_apps.dlq_replay.pulsar_io.source import ddl_struct
    from spark_apps.dlq_replay.schemas import arrow_schema

    logging.basicConfig(level=logging.WARNING)
    schema = arrow_schema(ddl_struct(REPUBLISH_INPUT_SCHEMA))
    table = pa.Table.from_pylist(task_rows(spec), schema=schema)
    batches = table.to_batches(max_chunksize=spec["batch_rows"])
    conf = PulsarConf(spec["service_url"])
    print("sending", flush=True)
    results = republish_batches(iter(batches), conf=conf, rate_limit_per_s=spec.get("rate"))
    rows = [row for batch in results for row in batch.to_pylist()]
    with open(spec["results"], "w", encoding="utf-8") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    print("done", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

"""The per-message columns written without a dictionary are columns the run's datasets really have."""

from __future__ import annotations

from spark_apps.dlq_replay.pulsar_io.republish import REPUBLISH_RESULT_SCHEMA
from spark_apps.dlq_replay.schemas import DECIDED_SCHEMA, LEDGER_SCHEMA, SNAPSHOT_SCHEMA
from spark_apps.dlq_replay.task_parquet import PER_MESSAGE_COLUMNS

#: Columns of the archive that no schema constant names (built in ``archive_files.archive_batch``).
ARCHIVE_ONLY = {"payload", "payload_sha256"}


def test_every_column_path_names_a_column_of_a_written_dataset():
    schemas = [SNAPSHOT_SCHEMA, DECIDED_SCHEMA, LEDGER_SCHEMA]
    fields = {field.name: field.dataType.typeName() for schema in schemas for field in schema.fields}
    for column in REPUBLISH_RESULT_SCHEMA.split(","):
        name, kind = column.split()
        fields[name] = kind
    for path in PER_MESSAGE_COLUMNS:
        root, _, rest = path.partition(".")
        assert root in fields or root in ARCHIVE_ONLY, path
        if rest:
            assert fields[root] == "map", path
            assert rest == "key_value.value", path

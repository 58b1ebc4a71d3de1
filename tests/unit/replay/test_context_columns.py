"""The batch kernels give exactly what the scalar functions give, row by row, on generated and hostile
input: the error context (context_columns, both engines of the one convention table), templates and
signatures, and the lineage properties."""

from __future__ import annotations

import hashlib
import random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulsar_dlq_consumer import context
from pulsar_dlq_consumer import conventions as C
from spark_apps.dlq_replay.context_columns import (
    ORIGIN_CONFLICT,
    REPLAY_COUNT,
    REPLAY_ID,
    UNDECODABLE,
    context_columns,
)
from spark_apps.dlq_replay.lineage import LINEAGE_KEYS, lineage_maps, previous_replay_count
from spark_apps.dlq_replay.normalize import (
    INT_LIMITS,
    normalize_columns,
    origin_of,
    replay_ids,
    row_replay_id,
)
from spark_apps.dlq_replay.pulsar_io.source import UNDECODABLE_PROPERTY
from spark_apps.dlq_replay.signatures import (
    error_signatures,
    message_template,
    message_templates,
)


def error_signature(cls: str | None, template: str, origin_topic: str | None, reason: str | None) -> str:
    """The signature's definition, one row at a time: the reference for the batch signatures."""
    material = (
        cls or "",
        template,
        context.base_topic(origin_topic) if origin_topic else "",
        reason or C.REASON_UNKNOWN,
    )
    return hashlib.sha256("\x1f".join(material).encode("utf-8", "replace")).hexdigest()[:16]


PROPS = pa.map_(pa.string(), pa.string())
SCHEMA = pa.schema([("topic", pa.string()), ("message_id_str", pa.string()), ("properties", PROPS)])

# ------------------------------------------------------------------------- a corpus generated from the table


def _kinds() -> dict[str, str]:
    """What kind of value each key of the convention table holds, read off the table's readers."""
    kinds = dict.fromkeys(C.PROPERTY_KEYS, "text")

    def walk(reader: C.Reader, text: str) -> None:
        if isinstance(reader, C.First):
            for each in reader.readers:
                walk(each, text)
        elif isinstance(reader, (C.Number, C.Position)):
            kinds.update(dict.fromkeys(reader.keys, "number"))
        elif isinstance(reader, C.Choice):
            kinds[reader.key] = "choice"
        elif isinstance(reader, C.Text):
            kinds[reader.key] = text

    for convention in C.CONVENTIONS:
        for reader in convention.fields.values():
            walk(reader, "text")
    for claim in C.ORIGIN_CLAIMS:
        walk(claim.message_id, "id")
        kinds[claim.topic_key] = "topic"
    return kinds


KINDS = _kinds()
TOPICS = [
    "persistent://public/default/orders", "orders", "orders-partition-2", "persistent://t/n/orders-partition-0",
    "other", "bad topic", "", "x" * 310, "persistent://evil/ns/orders", "a/b", "non-persistent://p/d/q",
]  # fmt: skip
HOSTILE_NUMBERS = [
    "-1", " 3", "3 ", "+4", "١٢", "", "x", "2147483648", "1234567890123456789", "9999999999999999999",
    "99999999999999999999", "5\n", "0x10", "1.5", "\x00\x00\x00\x05", "\x00\x00\x00\x00\x00\x00\x01\x00",
    "\x00\x01",
]  # fmt: skip
IDS = ["(1,2,-1,-1)", "1:2:-1", "1:2:3:4", "1:2", "( 1 , 2 , 3 )", "01:2:3", "junk", "", "7:0:-1:0", "1,2,3"]
#: Texts at and beyond the byte bounds, in one- to three-byte characters and control characters.
HUGE = st.builds(
    lambda ch, n: ch * n, st.sampled_from(["x", "é", "日", "\x01", "\t"]), st.integers(1360, 17_000)
)
PLAIN = {
    "number": st.integers(0, 10**18 - 1).map(str),  # what int64 holds: the kernels settle it
    "topic": st.sampled_from(TOPICS[:5]),
    "id": st.sampled_from(["(1,2,-1,-1)", "1:2:-1", "1:2:3:4", "7:0:-1:0"]),
    "choice": st.sampled_from(sorted(C.REASONS)),
    "text": st.text(st.characters(codec="utf-8"), max_size=20),
}
HOSTILE = {
    "number": st.sampled_from(HOSTILE_NUMBERS) | st.text(max_size=4),
    "topic": st.sampled_from(TOPICS) | st.text(max_size=12),
    "id": st.sampled_from(IDS) | st.text(max_size=8),
    "choice": st.sampled_from(["bogus", "", "TERM"]) | st.text(max_size=6),
    "text": HUGE | st.text(max_size=40),
}
NOISE_KEYS = [
    "app", "tenant", "__dlq.errors.other", "__connect.errors.stage", "kafka_dlt-original-timestamp",
    "REPLAY_COUNT", UNDECODABLE_PROPERTY,
]  # fmt: skip


def _kind(key: str) -> str:
    return "number" if key == "REPLAY_COUNT" else KINDS.get(key, "text")


def _hostile(key: str) -> st.SearchStrategy[str | None]:
    return HOSTILE[_kind(key)] | st.none()  # None: the key is there with a null value


@st.composite
def messages(draw: st.DrawFn, convention: C.Convention | None = None, hostile: bool = True) -> list:
    """One message's properties as (key, value) pairs: keys of ``convention`` (else of any) with plain
    values, every topic the same origin; when ``hostile``, about a third of the values hostile, keys of
    other conventions (conflicts), noise and repeated keys too, in any order."""
    convention = convention or draw(st.sampled_from(C.CONVENTIONS))
    keys = draw(st.lists(st.sampled_from(convention.keys), min_size=1, unique=True))
    keys += sorted(convention.requires)
    topic = draw(PLAIN["topic"])
    props = [(key, topic if _kind(key) == "topic" else draw(PLAIN[_kind(key)])) for key in keys]
    if not hostile:
        return props
    props += [(key, topic) for key in draw(st.lists(st.sampled_from(C.ORIGIN_TOPIC_KEYS), max_size=2))]
    others = draw(
        st.lists(st.sampled_from([*C.PROPERTY_KEYS, *NOISE_KEYS]) | st.text(max_size=6), max_size=4)
    )
    props += [(key, draw(_hostile(key))) for key in others]
    props = [(key, draw(_hostile(key)) if draw(RARELY) else value) for key, value in props]
    return draw(st.permutations(props))


RARELY = st.sampled_from([False, False, True])


def rows_of(draw: st.DrawFn, properties: list) -> list[dict[str, object]]:
    """Snapshot rows around generated properties (some with no map at all, as Spark can hand them)."""
    return [
        {
            "topic": draw(st.sampled_from(["persistent://public/default/d-DLQ", None])),
            "message_id_str": draw(st.sampled_from([f"{i}:0:-1:-1", None])),
            "properties": props,
        }
        for i, props in enumerate(properties)
    ]


@st.composite
def batches(draw: st.DrawFn) -> list[dict[str, object]]:
    properties = draw(st.lists(messages(), min_size=1, max_size=40))
    return rows_of(draw, [None if draw(st.integers(0, 9)) == 0 else props for props in properties])


def scalar_row(row: dict[str, object]) -> dict[str, object]:
    """What the scalar parser and helpers give for one row (as normalize did row by row)."""
    props = dict(row["properties"] or [])  # type: ignore[call-overload]
    values = context.error_context_values(props, dlq_topic=row["topic"], dlq_message_id=row["message_id_str"])
    fields = dict(zip(context.CONTEXT_FIELDS, values, strict=True))
    for name, limit in INT_LIMITS.items():
        if fields[name] is not None and fields[name] > limit:
            fields[name] = None
    claim, conflict = origin_of(props)
    fields[REPLAY_ID] = row_replay_id(row["topic"], row["message_id_str"], claim)  # type: ignore[arg-type]
    fields[REPLAY_COUNT] = previous_replay_count(props)
    fields[ORIGIN_CONFLICT] = conflict
    fields[UNDECODABLE] = UNDECODABLE_PROPERTY in props
    return fields


#: Deterministic (CI reruns the same corpus) and small: each example is a whole batch of messages.
CORPUS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def assert_both_engines_agree(rows: list[dict[str, object]], start: int = 0) -> None:
    """The rows the kernels settle are the scalar parse, normalize gives the scalar parse of every row,
    and the ids from the origin properties alone are the same ids."""
    sliced = [rows[0]] * start + rows  # a slice, as Spark hands them
    batch = pa.RecordBatch.from_pylist(sliced, schema=SCHEMA).slice(start)
    columns, settled = context_columns(batch, UNDECODABLE_PROPERTY)
    normalized = normalize_columns(batch)
    kernel_lists = {name: column.to_pylist() for name, column in columns.items()}
    lists = {name: column.to_pylist() for name, column in normalized.items()}
    for i, (row, kernels_settled) in enumerate(zip(rows, settled.to_pylist(), strict=True)):
        expected = scalar_row(row)
        assert {name: lists[name][i] for name in expected} == expected, row
        if kernels_settled:
            assert {name: kernel_lists[name][i] for name in expected} == expected, row
        template = message_template(expected["error_message"])  # type: ignore[arg-type]
        assert lists["error_template"][i] == template
        material = (expected["error_class"], template, expected["origin_topic"], expected["reason"])
        assert lists["signature"][i] == error_signature(*material)  # type: ignore[arg-type]
    assert replay_ids(batch) == lists[REPLAY_ID]


@CORPUS
@given(batches(), st.integers(0, 3))
def test_both_engines_agree_on_hostile_batches(rows, start):
    """Every convention of the table mixed with others, hostile values, noise and repeated keys."""
    assert_both_engines_agree(rows, start)


@pytest.mark.parametrize("convention", C.CONVENTIONS, ids=lambda c: c.format.value)
@settings(CORPUS, max_examples=12)
@given(data=st.data())
def test_both_engines_agree_on_each_key_made_hostile(convention, data):
    """Messages with every key of one convention, plain values but one hostile (every key in turn, three
    times): the kernels settle a row only when they give what the scalar parser gives."""
    rnd = data.draw(st.randoms(use_true_random=False))  # the plain values: many, cheaper than draws
    plain = {
        "number": lambda: str(rnd.randrange(10**18)),
        "topic": lambda: rnd.choice(TOPICS[:5]),
        "id": lambda: rnd.choice(["(1,2,-1,-1)", "1:2:-1", "1:2:3:4"]),
        "choice": lambda: rnd.choice(sorted(C.REASONS)),
        "text": lambda: rnd.choice(["boom", "é ü", "amount '0,00' is bad", "日本 12"]),
    }
    properties = []
    for key in convention.keys * 3:
        topic = plain["topic"]()
        props = [
            (k, topic if _kind(k) == "topic" else plain[_kind(k)]()) for k in convention.keys if k != key
        ]
        properties.append([*props, (key, data.draw(_hostile(key)))])
    assert_both_engines_agree(rows_of(data.draw, properties))


@pytest.mark.parametrize("convention", C.CONVENTIONS, ids=lambda c: c.format.value)
@CORPUS
@given(data=st.data())
def test_plain_messages_of_every_convention_are_settled_by_the_kernels(convention, data):
    plain = data.draw(st.lists(messages(convention, hostile=False), min_size=1, max_size=8))
    rows = rows_of(data.draw, plain)
    columns, settled = context_columns(pa.RecordBatch.from_pylist(rows, schema=SCHEMA), UNDECODABLE_PROPERTY)
    assert settled.to_pylist() == [True] * len(rows)
    formats = columns["context_format"].to_pylist()
    for i, row in enumerate(rows):
        expected = scalar_row(row)
        assert {name: columns[name][i].as_py() for name in expected} == expected, row
        assert formats[i] == context.detect_format(dict(row["properties"]))  # type: ignore[arg-type]


WRONG_TYPES = st.one_of(
    st.integers(), st.binary(max_size=4), st.floats(), st.lists(st.integers(), max_size=2)
)


@CORPUS
@given(
    messages(), st.lists(st.tuples(st.sampled_from(C.PROPERTY_KEYS), WRONG_TYPES), max_size=3), WRONG_TYPES
)
def test_values_of_the_wrong_type_are_absent_values(props, wrong, key):
    """The scalar parser never raises on values or keys of the wrong type: a wrong value reads as a null
    one (the key is there, its value is not), a wrong key is no key; Arrow holds the same as nulls."""
    mixed = dict(props) | dict(wrong) | {key if not isinstance(key, list) else 0: "x"}
    as_arrow = [(k, v if isinstance(v, str) else None) for k, v in mixed.items() if isinstance(k, str)]
    rows = [{"topic": "t", "message_id_str": "1:1:-1:-1", "properties": as_arrow}]
    expected = dict(
        zip(
            context.CONTEXT_FIELDS,
            context.error_context_values(mixed, dlq_topic="t", dlq_message_id="1:1:-1:-1"),
            strict=True,
        )
    )
    got = normalize_columns(pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
    assert {name: got[name][0].as_py() for name in expected} == {
        name: None if name in INT_LIMITS and value is not None and value > INT_LIMITS[name] else value
        for name, value in expected.items()
    }


def test_the_table_names_what_the_parser_and_the_library_know():
    """Every field a reader fills is a context field; the bookkeeping keys a republish strips include the
    Pulsar standard keys; the origin keys are the claims' keys."""
    for convention in C.CONVENTIONS:
        assert set(convention.fields) <= set(context.CONTEXT_FIELDS[2:-1]), convention.format
    assert {f.value for f in C.ContextFormat} == {c.format.value for c in C.CONVENTIONS} | {"none"}
    assert set(C.PULSAR_STANDARD_KEYS) <= C.BOOKKEEPING_KEYS
    assert all(context.is_bookkeeping_property(key) for key in C.PROPERTY_KEYS)
    assert C.ORIGIN_TOPIC_KEYS == (C.KEY_TOPIC, C.CONNECT_TOPIC, C.SPRING_ORIGINAL_TOPIC, C.REAL_TOPIC)


FRAGMENTS = [
    "amount", "'0,00'", '"x y"', "`q`", "a@b.co", "john.doe+x@mail.example.org",
    "550e8400-e29b-41d4-a716-446655440000", "0x1F", "0XdeadBEEF", "deadbeef", "deadbeef12", "12345678",
    "abcdef12345", "ORD-000123", "user_42", "cust:17", "A12345", "utf-8", "v1.2.3", "42", "-7", "+3.5",
    "1,000.25", "x1", "a-1", "--3", "(1)(2)", "12-3", "\t", "\n", "\x1c", "  ", "é", "ü12", "日本", "\x01",
    "\x02", "#99", "/a/b/12", ".5", "5.", "a.b.c12d", "0xZZ", "ffffffff", "FFFFFFFF1", "g12345678",
    "12345678g", "_12", "a__12", "x:y:12", "'unterminated", "it's", "e-mail@", "1e10", "abc123def456abc1",
]  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2])
def test_templates_by_re2_are_the_python_templates(seed):
    rnd = random.Random(seed)
    separators = [" ", "", ",", ": ", "(", ")", "-", "/", "="]
    messages: list[str | None] = [None, "", " ", "x" * 3000 + " 12", "1 " * 1500, "\u00e9 12 0x1f"]
    for _ in range(3000):
        parts = rnd.randint(1, 12)
        messages.append("".join(rnd.choice(FRAGMENTS) + rnd.choice(separators) for _ in range(parts)))
    got = message_templates(pa.array(messages, pa.string())).to_pylist()
    assert got == [message_template(m) for m in messages]


def test_signatures_by_batch_are_the_scalar_signatures():
    rows = [
        ("E", "t <num>", "persistent://p/d/orders-partition-3", "term"),
        (None, "", None, None),
        ("E", "t <num>", "persistent://p/d/orders", "term"),
        ("E", "t\x1f<num>", "", ""),
    ]
    columns = [pa.array(list(column), pa.string()) for column in zip(*rows, strict=True)]
    assert error_signatures(*columns).to_pylist() == [error_signature(*row) for row in rows]


KEYS_FOR_LINEAGE = [
    "tenant", "schema", "REAL_TOPIC", "__dlq.errors.x", "REPLAY_ID", "REPLAY_COUNT", "a", "b", "kafka_dlt-q",
    "__connect.errors.y", "ORIGIN_MESSAGE_ID", "REPLAY_FIX", "z",
]  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lineage_maps_keep_the_other_properties_then_set_the_lineage(seed):
    rnd = random.Random(seed)
    for trial in range(60):
        n = rnd.randint(0, 30)
        picked = [rnd.sample(KEYS_FOR_LINEAGE, rnd.randint(0, 8)) for _ in range(n)]
        props = [None if rnd.random() < 0.1 else [(k, f"v{k}") for k in keys] for keys in picked]
        chosen = [rnd.random() < 0.7 for _ in range(n)]
        counts = [rnd.randint(0, 5) for _ in range(n)]
        fixes = [rnd.choice(["", "m:f@1"]) for _ in range(n)]
        start = 2 if trial % 3 == 1 and n > 3 else 0  # sliced columns too
        column = pa.array(props, PROPS).slice(start)
        got = lineage_maps(
            column,
            pa.array(chosen[start:], pa.bool_()),
            pa.array([f"r{i}" for i in range(start, n)], pa.string()),
            "run-1",
            pa.array(counts[start:], pa.int32()),
            pa.array([f"t{i % 3}" for i in range(start, n)], pa.string()),
            pa.array(fixes[start:], pa.string()),
        ).to_pylist()
        for j, i in enumerate(range(start, n)):
            if not chosen[i]:
                assert got[j] is None
                continue
            kept = [
                (k, v)
                for k, v in props[i] or []
                if not context.is_bookkeeping_property(k) and k not in LINEAGE_KEYS
            ]
            lineage = [f"r{i}", "run-1", str(counts[i] + 1), f"t{i % 3}", fixes[i]]
            assert got[j] == kept + list(zip(LINEAGE_KEYS, lineage, strict=True))

"""Edge and special values of every type, as the decoder yields them, land in ClickHouse and read back equal
(issue 12, "Must hold": the value round-trip into ClickHouse, beside tests/integration/test_copy_values.py and
test_postgres_sink.py for Postgres, tests/unit/test_debezium_edge_values.py for the decoder itself).

The only differences allowed are the ClickHouse casts docs/clickhouse.md documents: a NULL array lands as ``[]``,
and dates and timestamps (also inside arrays) ``infinity`` / ``-infinity`` land at ClickHouse's ends (9999-12-31,
0000-01-01). Dates and timestamps are compared as days / microseconds since 1970, since Python's dates cannot hold
ClickHouse's year 0. One row per value and column (the others NULL), so a value that does not land names itself;
then hypothesis mixes them into rows of many values at once.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.types import parse_pg_type
from cdcsync.core.temporal import (
    DATE_NEGATIVE_INFINITY,
    DATE_POSITIVE_INFINITY,
    TIMESTAMP_NEGATIVE_INFINITY,
    TIMESTAMP_POSITIVE_INFINITY,
    days_from_civil,
)
from cdcsync.sinks.clickhouse import ClickHouseTableSink
from cdcsync.sinks.clickhouse_values import MAX_DAYS, MAX_MICROS, MIN_DAYS, MIN_MICROS
from cdcsync.sources.debezium.spec import DecodeSpec, output_arrow_schema
from tests.conftest import ClickHouseDatabase
from tests.integration.test_clickhouse_sink import _migrate

pytestmark = pytest.mark.integration

DAY_US = 86_400_000_000
F32_MAX = 3.4028234663852886e38
TEXTS = ["", "\\.", "\\N", "NULL", "a\tb", "a\rb", "a\nb", '"', ",", "\\", " lead", "zoë ✓ 𝄞", "'", "a\\nb"]

# column -> (Postgres type, [(value as the decoder yields it, value read back; same when omitted)])
EDGES: dict[str, tuple[str, list[Any]]] = {
    "i2": ("smallint", [-32768, 32767, 0]),
    "i4": ("integer", [-2147483648, 2147483647]),
    "i8": ("bigint", [-(2**63), 2**63 - 1]),
    "f4": (
        "real",
        [F32_MAX, -F32_MAX, 1.401298464324817e-45, 1.1754943508222875e-38, math.nan, math.inf, -math.inf, -0.0],
    ),
    "f8": (
        "double precision",
        [
            1.7976931348623157e308,
            -1.7976931348623157e308,
            5e-324,
            2.2250738585072014e-308,
            math.nan,
            math.inf,
            -math.inf,
            -0.0,
        ],
    ),
    "money": ("numeric(12,2)", [Decimal("9999999999.99"), Decimal("-9999999999.99"), Decimal("0.00")]),
    "n38": ("numeric(38,0)", [Decimal("9" * 38), Decimal("-" + "9" * 38)]),
    "n50": ("numeric(50,20)", ["999999999999999999999999999999.99999999999999999999", "-0.00000000000000000001"]),
    "nfree": ("numeric", ["NaN", "Infinity", "-Infinity", "9" * 1000, "-" + "9" * 1000, "0.000", "-1.5"]),
    "flag": ("boolean", [True, False]),
    "txt": ("text", TEXTS),
    "vc": ("varchar(5)", ["", "abcde"]),
    "bin": ("bytea", [b"", b"\x00\xff\\\n\r\"'", bytes(range(256))]),
    "d": (
        "date",
        [
            (DATE_POSITIVE_INFINITY, MAX_DAYS),
            (DATE_NEGATIVE_INFINITY, MIN_DAYS),
            days_from_civil(1, 1, 1),
            days_from_civil(9999, 12, 31),
            0,
            -1,
        ],
    ),
    "ts": (
        "timestamp",
        [
            (TIMESTAMP_POSITIVE_INFINITY, MAX_MICROS),
            (TIMESTAMP_NEGATIVE_INFINITY, MIN_MICROS),
            days_from_civil(1, 1, 1) * DAY_US,
            MAX_MICROS,
            -1,
        ],
    ),
    "tstz": ("timestamptz", [(TIMESTAMP_POSITIVE_INFINITY, MAX_MICROS), (TIMESTAMP_NEGATIVE_INFINITY, MIN_MICROS), -1]),
    "t": ("time", ["00:00:00", "23:59:59.999999", "24:00:00"]),
    "ttz": ("timetz", ["00:00:00Z", "23:59:59.999999Z"]),
    "iv": ("interval", ["P0D", "P1M2DT3H4M5.678901S", "-P3Y2M"]),
    "u": ("uuid", ["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"]),
    "js": ("json", ["{}", "[]", '"x"', "null", '{"a": 1.50e10, "b": [true, null]}']),
    "jsb": ("jsonb", ["{}", "[]", '"x"', "null", '{"a": 1.50e10}']),
    "b3": ("bit(3)", ["000", "111"]),
    "vb": ("varbit(10)", ["", "1", "1000000001"]),
    "ints": ("integer[]", [[], [None], [None, None], [1, None, -2147483648], (None, [])]),
    "texts": ("text[]", [[], [""], [None], ["NULL", "a,b", "{}", '"q"', "\\", *TEXTS]]),
    "reals": ("real[]", [[math.nan, math.inf, -math.inf, F32_MAX, -0.0]]),
    "decs": ("numeric(10,2)[]", [[], [None, Decimal("1.50"), Decimal("-99999999.99")]]),
    "days": ("date[]", [([DATE_POSITIVE_INFINITY, None, 0, DATE_NEGATIVE_INFINITY], [MAX_DAYS, None, 0, MIN_DAYS])]),
    "stamps": ("timestamptz[]", [([TIMESTAMP_NEGATIVE_INFINITY, -1, None], [MIN_MICROS, -1, None])]),
}
COLUMNS = {"id": "bigint", **{name: pg for name, (pg, _) in EDGES.items()}}
READ_AS = {
    "d": "toInt32(d)",
    "ts": "toUnixTimestamp64Micro(ts)",
    "tstz": "toUnixTimestamp64Micro(tstz)",
    "days": "arrayMap(x -> toInt32(x), days)",
    "stamps": "arrayMap(x -> toUnixTimestamp64Micro(x), stamps)",
}
"""Dates and timestamps as days / microseconds since 1970 (Python has no year 0)."""
BATCHES = itertools.count(1)


def sent_and_read(value: Any) -> tuple[Any, Any]:
    return value if isinstance(value, tuple) else (value, value)


def same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN and -0.0 told from 0.0."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b


@pytest.fixture
def sink(clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str) -> ClickHouseTableSink:
    raw = {
        "name": f"it_{uuid.uuid4().hex[:10]}",
        "sources": {
            "edges": {
                "type": "kafka",
                "topic": "t.edges",
                "primary_key": "id",
                "columns": COLUMNS,
                "untoasted_columns": ["reals", "decs", "stamps"],  # arrays without a TOAST placeholder
            }
        },
        "sinks": {
            "ch": {"type": "clickhouse", "from": "edges", "database": clickhouse_database.database, "table": "edges"}
        },
    }
    pipeline = validate_pipeline_dict(raw)
    _migrate(clickhouse_database.client(), pipeline, tmp_path)
    return ClickHouseTableSink(pipeline, "ch", pipeline.clickhouse_sinks()["ch"], postgres_dsn, clickhouse_database.url)


def land_and_read(
    sink: ClickHouseTableSink, client: Any, batch_id: int, rows: list[dict[str, Any]]
) -> dict[int, dict[str, Any]]:
    """Stage ``rows`` (decoded values by column, ``id`` set) as the decoder's output, then read them back."""
    import pyarrow as pa

    spec = DecodeSpec("edges", tuple((name, parse_pg_type(pg)) for name, pg in COLUMNS.items()), ("id",))
    schema = output_arrow_schema(spec, dead_letters=False)
    n = len(rows)
    values: dict[str, Any] = {name: [row.get(name) for row in rows] for name in COLUMNS}
    for name in ("d", "days"):
        values[name] = pa.array(values[name], pa.int32() if name == "d" else pa.list_(pa.int32()))
    for name in ("ts", "tstz", "stamps"):
        values[name] = pa.array(values[name], pa.int64() if name != "stamps" else pa.list_(pa.int64()))
    metadata = {
        "_cdc_op": ["c"] * n,
        "_cdc_version": [batch_id * 1000 + i for i in range(n)],
        "_cdc_ts": [dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)] * n,
        "_cdc_topic": ["t.edges"] * n,
        "_cdc_partition": [0] * n,
        "_cdc_offset": [batch_id * 1000 + i for i in range(n)],
    }
    arrays = []
    for field in schema:
        column = {**values, **metadata}[field.name]
        arrays.append(column.cast(field.type) if isinstance(column, pa.Array) else pa.array(column, field.type))
    assert sink.stage_writer(batch_id, "c").stage(pa.Table.from_arrays(arrays, schema=schema)) == n
    select = ", ".join(READ_AS.get(name, f"`{name}`") for name in COLUMNS)
    result = client.query(
        f"SELECT {select} FROM edges FINAL WHERE NOT _is_deleted",
        query_formats={"UUID": "string"},
        column_formats={"bin": "bytes"},
    )
    return {row[0]: dict(zip(COLUMNS, row, strict=True)) for row in result.result_rows}


def test_every_edge_value_lands_in_clickhouse(
    sink: ClickHouseTableSink, clickhouse_database: ClickHouseDatabase
) -> None:
    client = clickhouse_database.client()
    rows, expected = [], {}
    for name, (_, edges) in EDGES.items():
        for value in edges:
            sent, read = sent_and_read(value)
            key = len(rows) + 1
            rows.append({"id": key, name: sent})
            expected[key] = (name, read)
    stored = land_and_read(sink, client, 0, rows)
    wrong = [
        (name, read, stored[key][name]) for key, (name, read) in expected.items() if not same(stored[key][name], read)
    ]
    assert wrong == []
    # The other columns of each row are NULL: NULL scalars stay NULL, NULL arrays land as [].
    arrays = {name for name, (pg, _) in EDGES.items() if pg.endswith("[]")}
    others = {(name, stored[1][name] == ([] if name in arrays else None)) for name in EDGES if name != "i2"}
    assert all(ok for _, ok in others)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_rows_mixing_edge_values_land_in_clickhouse(
    sink: ClickHouseTableSink, clickhouse_database: ClickHouseDatabase, data: st.DataObject
) -> None:
    client = clickhouse_database.client()
    batch_id = next(BATCHES)  # each example a batch of its own (the same batch would be deduplicated)
    row_strategy = st.fixed_dictionaries({name: st.sampled_from([*edges, None]) for name, (_, edges) in EDGES.items()})
    drawn = data.draw(st.lists(row_strategy, min_size=1, max_size=5))
    rows = [{"id": i, **{name: sent_and_read(v)[0] for name, v in row.items()}} for i, row in enumerate(drawn)]
    stored = land_and_read(sink, client, batch_id, rows)
    for i, row in enumerate(drawn):
        for name, value in row.items():
            read = sent_and_read(value)[1] if value is not None else ([] if EDGES[name][0].endswith("[]") else None)
            assert same(stored[i][name], read), (name, value, stored[i][name])

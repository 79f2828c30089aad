"""Every type's edge and special values, serialized as Debezium's Postgres connector writes them (JSON with schemas,
bare JSON, Avro through the schema registry), through the runtime's decode step and the real ClickHouse writer:
read back with ``FINAL``, each equals the value sent (issue 12, "Must hold").

The values are the catalogue of tests/e2e/test_debezium_edge_values.py (Postgres literals, one column per type, one
row per value) and a few types it leaves out (:data:`MORE`), and so is the comparison: a Postgres table holds the
values sent; the rows ClickHouse holds are read back into a Postgres table of the same types, and the two must be
equal by ``EXCEPT`` both ways after only the casts docs/types.md documents (that test's ``differences``), plus
those docs/clickhouse.md adds: a NULL array lands as ``[]``, dates and timestamps ``infinity`` / ``-infinity`` land
at ClickHouse's ends. A value ClickHouse's ``Date32`` / ``DateTime64`` cannot hold stops the batch before anything
is inserted, naming the column and the value: each is tried alone.

The messages are built here from the values as Postgres holds them, the way Debezium 3.x encodes each type in the
connector's default modes (``decimal.handling.mode=precise``, ``time.precision.mode=adaptive``,
``interval.handling.mode=numeric``) and in the string modes; the e2e tests check the decoder against the real
connector. No Spark: the executors' decode step (:class:`~cdcsync.sources.kafka.DecodeTask`, as
``on_decode_error: fail`` runs it) hands its rows to the sink's writer as
:class:`~cdcsync.engine.batch.StageTask` does; each format's messages are one task of the same batch.
"""

from __future__ import annotations

import base64
import re
import uuid
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from cdcsync.config.types import parse_pg_type
from cdcsync.core.reports import ReportedFailure
from cdcsync.core.temporal import civil_from_days, date_text, timestamp_text
from cdcsync.sinks.clickhouse import ClickHouseTableSink
from cdcsync.sinks.clickhouse_values import MAX_DAYS, MAX_MICROS, MIN_DAYS, MIN_MICROS
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.kafka import DecodeTask
from tests.conftest import ClickHouseDatabase
from tests.e2e.test_debezium_edge_values import BIG_DOC, EDGES, TABLE, describe, differences, render_column
from tests.integration.test_apicurio_registry import change as avro_change
from tests.integration.test_apicurio_registry import envelope, serialize, serializer
from tests.integration.test_clickhouse_sink import _things_sink
from tests.unit.test_debezium_decode import change, dumps, kafka_batch, wrapped

pytestmark = pytest.mark.integration

MORE: dict[str, tuple[str, list[str]]] = {
    "days": ("date[]", ["{infinity,NULL,1970-01-01,-infinity}", "{0001-01-01,9999-12-31}"]),
    "stamps": ("timestamptz[]", ['{infinity,NULL,"1969-12-31 23:59:59.999999+00",-infinity}']),
    "tss": ("timestamp[]", ['{"0001-01-01 00:00:00","9999-12-31 23:59:59.999999",NULL,infinity}']),
    "uuids": ("uuid[]", ["{00000000-0000-0000-0000-000000000000,NULL,ffffffff-ffff-ffff-ffff-ffffffffffff}"]),
    "blobs": ("bytea[]", ['{"\\\\x00ff5c",NULL,"\\\\x"}']),
    "bools": ("boolean[]", ["{t,NULL,f}"]),
    "i8s": ("bigint[]", ["{-9223372036854775808,NULL,9223372036854775807}"]),
    "f8s": ("double precision[]", ["{NaN,-0,Infinity,1.7976931348623157e308,5e-324}"]),
    "t3": ("time(3)", ["00:00:00", "23:59:59.999", "24:00:00"]),
    "ts3": ("timestamp(3)", ["infinity", "-infinity", "1969-12-31 23:59:59.999", "0001-01-01 00:00:00"]),
    "b1": ("bit(1)", ["0", "1"]),
    "hs": ("hstore", ["", '"a"=>"x", "n"=>NULL', '""=>"", "k,=>\\"q"=>"v\\\\"']),
}
"""Types the e2e catalogue leaves out: arrays of the other element types (dates and timestamps with their
infinities inside), millisecond times and timestamps (``adaptive`` mode's Time / Timestamp), ``bit(1)`` (a
boolean in Debezium), ``hstore`` (Debezium's default ``hstore.handling.mode=json``)."""
CATALOGUE = {**EDGES, **MORE}
FORMATS: dict[str, tuple[str, dict[str, str]]] = {
    "json_schemas": ("json", {}),
    "json_bare": ("json", {"decimal.handling.mode": "string", "interval.handling.mode": "string"}),
    "avro": ("avro", {"interval.handling.mode": "string"}),
}
"""Format -> (value format, the connector's modes that differ from its defaults); each lands every value."""
SHIFTS = (0, 10_000, 20_000)
"""Each format's rows land under its own ids: the catalogue's plus this."""
COLUMNS = {"id": "bigint", **{name: pg_type for name, (pg_type, _) in CATALOGUE.items()}, BIG_DOC: "jsonb"}
DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE = "io.debezium.data.VariableScaleDecimal"
DATE_INFINITY = {"infinity": -2_147_472_692, "-infinity": -2_147_472_691}
"""Debezium's Date for ``±infinity``: pgjdbc's sentinels as epoch days (docs/types.md)."""
TIMESTAMP_INFINITY = {"infinity": 9_223_372_036_825_200_000, "-infinity": -9_223_372_036_832_400_000}
SPECIAL_FLOATS = {"NaN", "Infinity", "-Infinity"}
"""Jackson writes these as strings (``QUOTE_NON_NUMERIC_NUMBERS``)."""
STRING_MODE_NUMERICS = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY"}
TEMPORAL = ("date", "timestamp without time zone", "timestamp with time zone")
READ_AS = {
    "date": "toInt32({})",
    "timestamp": "toUnixTimestamp64Micro({})",
    "timestamptz": "toUnixTimestamp64Micro({})",
    "timestamp(3)": "toUnixTimestamp64Micro({})",
    "date[]": "arrayMap(x -> toInt32(x), {})",
    "timestamp[]": "arrayMap(x -> toUnixTimestamp64Micro(x), {})",
    "timestamptz[]": "arrayMap(x -> toUnixTimestamp64Micro(x), {})",
}
"""ClickHouse columns read as days / microseconds since 1970 (Python's dates have no year 0)."""


class Raw(str):
    """A JSON number written as this text (Java's float digits, ``-0.0``), not as Python prints the float."""


def json_bytes(built: bytes) -> bytes:
    """JSON text with the numbers :func:`with_raw_numbers` marked written as their text."""
    return re.sub(rb'"\\u0000raw:([^"]*)"', rb"\1", built)


def with_raw_numbers(value: Any) -> Any:
    """``value`` with :class:`Raw` numbers marked for :func:`json_bytes` (json.dumps writes str subclasses as text)."""
    if isinstance(value, Raw):
        return f"\x00raw:{value}"
    if isinstance(value, list):
        return [with_raw_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: with_raw_numbers(v) for k, v in value.items()}
    return value


# ---- the values as Postgres holds them, and as Debezium encodes them ---------------------------------------------


def fact_sql(name: str, pg_type: str) -> sql.Composable:
    """What the encoder needs of a value beyond its text: epoch days / microseconds, Debezium's MicroDuration,
    an interval's fields (Debezium's Interval string), the UTC time of a timetz, or the value itself."""
    column = sql.Identifier(name)
    parsed = parse_pg_type(pg_type)
    if parsed.element is not None and parsed.element.name in TEMPORAL:  # each element's fact, else its text
        element = temporal_fact(parsed.element.name, sql.SQL("x"))
        return sql.SQL(
            "(SELECT array_agg(coalesce({}, x::text) ORDER BY o) FROM unnest({}) WITH ORDINALITY AS u(x, o))::text"
        ).format(element, column)
    if parsed.name in TEMPORAL:
        return temporal_fact(parsed.name, column)
    if parsed.name == "time without time zone":
        return sql.SQL("(extract(epoch from {0}) * 1000000)::numeric(30,0)::text").format(column)
    if pg_type == "timetz":
        return sql.SQL("({} AT TIME ZONE 'UTC')::text").format(column)
    if pg_type == "hstore":
        return sql.SQL("hstore_to_json({})::text").format(column)
    if pg_type == "interval":
        fields = sql.SQL(", ").join(
            sql.SQL("extract({} from {})::int::text").format(sql.SQL(part), column)
            for part in ("year", "month", "day", "hour", "minute")
        )
        # The MicroDuration as the e2e test computes it; NULL (written '-') where it overflows 64 bits.
        return sql.SQL("concat_ws(' ', coalesce({}, '-'), {}, trim_scale(extract(second from {}))::text)").format(
            render_column(name, "interval", "numeric", "precise"), fields, column
        )
    return sql.SQL("NULL::text")


def temporal_fact(name: str, column: sql.Composable) -> sql.Composable:
    """Epoch days of a date, microseconds of a timestamp; NULL for the infinities."""
    if name == "date":
        return sql.SQL("CASE WHEN isfinite({0}) THEN ({0} - date '1970-01-01')::text END").format(column)
    return sql.SQL("CASE WHEN isfinite({0}) THEN (extract(epoch from {0}) * 1000000)::numeric(30,0)::text END").format(
        column
    )


def native(pg_type: str) -> bool:
    """Values psycopg reads as Python values the encoder takes as they are (bytes, arrays)."""
    parsed = parse_pg_type(pg_type)
    return pg_type == "bytea" or (parsed.element is not None and parsed.element.name not in TEMPORAL)


def parse_text_array(text: str | None) -> list[str | None]:
    """A one-dimensional ``text[]`` of facts (numbers, ``infinity``) back into its elements."""
    assert text is not None and text.startswith("{") and text.endswith("}")
    return [None if e == "NULL" else e for e in text[1:-1].split(",")] if text != "{}" else []


def unscaled_b64(value: Decimal, scale: int) -> str:
    with localcontext(prec=2000):  # the default 28 digits would round the largest numerics
        unscaled = int(value.scaleb(scale))
    length = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def java_float(text: str) -> Any:
    """A float as Jackson writes Java's: the special values as strings, finite ones with a point or exponent."""
    if text in SPECIAL_FLOATS:
        return text
    return Raw(text if any(c in text for c in ".eE") else text + ".0")


def float_text(value: float, *, single: bool) -> Any:
    """An array element of ``real[]`` (``single``) or ``double precision[]`` as Jackson writes it."""
    if np.isnan(value):
        return "NaN"
    if np.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return java_float(str(np.float32(value)) if single else repr(value))


def zoned_timestamp(micros: int) -> str:
    """Debezium's ZonedTimestamp: ISO 8601 in UTC, proleptic years (+ above 9999), no trailing fraction zeros."""
    days, of_day = divmod(micros, 86_400_000_000)
    year, month, day = civil_from_days(days)
    seconds, fraction = divmod(of_day, 1_000_000)
    year_text = f"+{year}" if year > 9999 else f"-{-year:04d}" if year < 0 else f"{year:04d}"
    clock = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    digits = f".{fraction:06d}".rstrip("0") if fraction else ""
    return f"{year_text}-{month:02d}-{day:02d}T{clock}{digits}Z"


def connect_schema(pg_type: str, modes: dict[str, str]) -> dict[str, Any]:
    """The Connect schema Debezium gives a column of ``pg_type`` (without ``field`` and ``optional``)."""
    decimal_mode = modes.get("decimal.handling.mode", "precise")
    parsed = parse_pg_type(pg_type)
    if parsed.element is not None:
        return {"type": "array", "items": {**connect_schema(parsed.element.sql, modes), "optional": True}}
    name = parsed.name
    simple = {
        "smallint": "int16",
        "integer": "int32",
        "bigint": "int64",
        "real": "float",
        "double precision": "double",
        "boolean": "boolean",
        "text": "string",
        "character varying": "string",
        "character": "string",
        "bytea": "bytes",
    }
    if name in simple:
        return {"type": simple[name]}
    if name == "numeric":
        if decimal_mode == "string":
            return {"type": "string"}
        if not parsed.args:
            return {
                "type": "struct",
                "name": VARIABLE_SCALE,
                "version": 1,
                "fields": [
                    {"type": "int32", "optional": False, "field": "scale"},
                    {"type": "bytes", "optional": False, "field": "value"},
                ],
            }
        precision, scale = parsed.args[0], parsed.args[1] if len(parsed.args) > 1 else 0
        parameters = {"scale": str(scale), "connect.decimal.precision": str(precision)}
        return {"type": "bytes", "name": DECIMAL, "version": 1, "parameters": parameters}
    logical = {
        "date": ("int32", "io.debezium.time.Date"),
        "timestamp without time zone": ("int64", "io.debezium.time.MicroTimestamp"),
        "timestamp with time zone": ("string", "io.debezium.time.ZonedTimestamp"),
        "time without time zone": ("int64", "io.debezium.time.MicroTime"),
        "time with time zone": ("string", "io.debezium.time.ZonedTime"),
        "json": ("string", "io.debezium.data.Json"),
        "jsonb": ("string", "io.debezium.data.Json"),
        "uuid": ("string", "io.debezium.data.Uuid"),
        "hstore": ("string", "io.debezium.data.Json"),
    }
    if name == "interval":
        if modes.get("interval.handling.mode", "numeric") == "string":
            return {"type": "string", "name": "io.debezium.time.Interval", "version": 1}
        return {"type": "int64", "name": "io.debezium.time.MicroDuration", "version": 1}
    if name in ("bit", "bit varying") and parsed.args == (1,):
        return {"type": "boolean"}
    if name in ("bit", "bit varying"):
        length = str(parsed.args[0] if parsed.args else 1)
        return {"type": "bytes", "name": "io.debezium.data.Bits", "version": 1, "parameters": {"length": length}}
    if parsed.args and parsed.args[0] <= 3 and name in ("time without time zone", "timestamp without time zone"):
        # adaptive mode: precision 0-3 in milliseconds
        if name == "time without time zone":
            return {"type": "int32", "name": "io.debezium.time.Time", "version": 1}
        return {"type": "int64", "name": "io.debezium.time.Timestamp", "version": 1}
    kind, logical_name = logical[name]
    return {"type": kind, "name": logical_name, "version": 1}


def encode(pg_type: str, text: str, fact: str | None, value: Any, modes: dict[str, str]) -> Any:
    """The JSON value Debezium writes for one value (``text``: Postgres' text of it; ``fact``: :func:`fact_sql`;
    ``value``: psycopg's Python value where :func:`native`)."""
    decimal_mode = modes.get("decimal.handling.mode", "precise")
    parsed = parse_pg_type(pg_type)
    name = parsed.name
    if parsed.element is not None:
        elements = value if value is not None else parse_text_array(fact)
        return [None if v is None else encode_element(parsed.element.sql, v, modes) for v in elements]
    milliseconds = bool(parsed.args) and parsed.args[0] <= 3  # adaptive mode's Time / Timestamp
    if name in ("smallint", "integer", "bigint"):
        return int(text)
    if name in ("real", "double precision"):
        return java_float(text)
    if name == "numeric":
        if decimal_mode == "string":
            return STRING_MODE_NUMERICS.get(text, text)
        if text in STRING_MODE_NUMERICS:
            return None  # VariableScaleDecimal cannot carry NaN or the infinities: Debezium sends NULL
        number = Decimal(text)
        if not parsed.args:
            if "." in text:  # Debezium drops trailing fractional zeros
                number = Decimal(text.rstrip("0").rstrip(".") or "0")
            scale = max(0, -number.as_tuple().exponent)  # type: ignore[operator]
            return {"scale": scale, "value": unscaled_b64(number, scale)}
        return unscaled_b64(number, parsed.args[1] if len(parsed.args) > 1 else 0)
    if name == "boolean":
        return text == "true"
    if name == "character":
        return text.ljust(parsed.args[0] if parsed.args else 1)  # pgoutput sends bpchar padded
    if name == "bytea":
        return base64.b64encode(value).decode()
    if name == "date":
        return DATE_INFINITY[text] if fact is None else int(fact)
    if name == "timestamp without time zone":
        return TIMESTAMP_INFINITY[text] if fact is None else int(fact) // (1000 if milliseconds else 1)
    if name == "timestamp with time zone":
        return text if fact is None else zoned_timestamp(int(fact))
    if name == "time without time zone":
        return int(fact or 0) // (1000 if milliseconds else 1)
    if name == "time with time zone":
        assert fact is not None and fact.endswith("+00")
        clock, _, fraction = fact[:-3].partition(".")
        return clock + ("." + fraction.rstrip("0") if fraction.rstrip("0") else "") + "Z"
    if name == "interval":
        assert fact is not None
        micro_duration, *fields = fact.split(" ")
        if modes.get("interval.handling.mode", "numeric") == "numeric":
            # Beyond 64-bit microseconds Debezium overflows (docs/types.md); the comparison leaves such values out.
            return None if micro_duration == "-" else int(micro_duration)
        years, months, days, hours, minutes, seconds = fields
        return f"P{years}Y{months}M{days}DT{hours}H{minutes}M{seconds}S"
    if name in ("bit", "bit varying") and parsed.args == (1,):
        return text == "1"
    if name in ("bit", "bit varying"):
        number = int(text, 2) if text else 0
        return base64.b64encode(number.to_bytes((number.bit_length() + 7) // 8, "little")).decode()
    if name == "hstore":
        return fact  # the map as JSON text
    return text  # text, varchar, json, jsonb, uuid


def encode_element(pg_type: str, value: Any, modes: dict[str, str]) -> Any:
    """An array element, from psycopg's Python value (dates and timestamps: their fact, or the infinity's text)."""
    if parse_pg_type(pg_type).name in TEMPORAL:
        infinite = value in ("infinity", "-infinity")
        return encode(pg_type, value, None if infinite else value, None, modes)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, float):
        return float_text(value, single=pg_type == "real")
    if isinstance(value, Decimal):
        return encode(pg_type, str(value), None, None, modes)
    return value


# ---- Avro, as Connect's AvroConverter maps the same schema and value ---------------------------------------------


def avro_type(connect: dict[str, Any], defined: set[str]) -> Any:
    kind = connect["type"]
    if kind == "array":
        return {"type": "array", "items": ["null", avro_type(connect["items"], defined)]}
    if kind == "struct":
        name = connect["name"]
        if name in defined:
            return name
        defined.add(name)
        fields = [{"name": f["field"], "type": avro_type(f, defined)} for f in connect["fields"]]
        return {"type": "record", "name": name.rsplit(".", 1)[1], "namespace": name.rsplit(".", 1)[0],
                "fields": fields, "connect.name": name, "connect.version": 1}  # fmt: skip
    base = {"int16": "int", "int32": "int", "int64": "long"}.get(kind, kind)
    annotated: dict[str, Any] = {"type": base}
    if kind == "int16":
        annotated["connect.type"] = "int16"
    if "name" in connect:
        annotated.update({"connect.name": connect["name"], "connect.version": connect.get("version", 1)})
    if "parameters" in connect:
        annotated["connect.parameters"] = connect["parameters"]
    if connect.get("name") == DECIMAL:
        parameters = connect["parameters"]
        annotated.update(
            logicalType="decimal",
            precision=int(parameters["connect.decimal.precision"]),
            scale=int(parameters["scale"]),
        )
    return annotated if len(annotated) > 1 else base


def avro_value(connect: dict[str, Any], value: Any) -> Any:
    if value is None:
        return None
    kind = connect["type"]
    if kind == "array":
        return [avro_value(connect["items"], v) for v in value]
    if kind == "struct":
        return {f["field"]: avro_value(f, value[f["field"]]) for f in connect["fields"]}
    if kind == "bytes":
        return base64.b64decode(value)
    if kind in ("float", "double"):
        return float(value)
    return value


# ---- the test ----------------------------------------------------------------------------------------------------


@pytest.fixture
def sink(clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str) -> ClickHouseTableSink:
    """Into ClickHouse table ``things``; arrays Debezium has no TOAST placeholder for are declared small."""
    untoasted = ["reals", "decs", "stamps", "tss", "bools", "f8s"]
    return _things_sink(clickhouse_database, tmp_path, postgres_dsn, COLUMNS, untoasted_columns=untoasted)


def source_table(dsn: str) -> tuple[dict[int, str], dict[int, tuple[str, str, str | None, Any]]]:
    """The catalogue in ``public.edges``, one value a row; (labels, (column, text, fact, Python value) by id)."""
    ddl = sql.SQL(", ").join(sql.SQL("{} " + t).format(sql.Identifier(n)) for n, (t, _) in CATALOGUE.items())
    rows = [(name, value) for name, (_, values) in CATALOGUE.items() for value in values]
    facts: dict[int, tuple[str, str, str | None, Any]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute("CREATE EXTENSION IF NOT EXISTS hstore")
        conn.execute(
            sql.SQL("CREATE TABLE public.{} (id bigint PRIMARY KEY, {}, {} jsonb)").format(
                sql.Identifier(TABLE), ddl, sql.Identifier(BIG_DOC)
            )
        )
        for key, (name, value) in enumerate(rows, start=1):
            conn.execute(
                sql.SQL("INSERT INTO {} (id, {}) VALUES (%s, %s::" + CATALOGUE[name][0] + ")").format(
                    sql.Identifier(TABLE), sql.Identifier(name)
                ),
                (key, value),
            )
        for name, (pg_type, _) in CATALOGUE.items():
            column = sql.Identifier(name)
            value = column if native(pg_type) else sql.SQL("NULL")
            query = sql.SQL("SELECT id, {0}::text, {1}, {2} FROM {3} WHERE {0} IS NOT NULL").format(
                column, fact_sql(name, pg_type), value, sql.Identifier(TABLE)
            )
            for key, text, fact, python in conn.execute(query):
                facts[key] = (name, text, fact, python)
    labels = {key: f"{name} = {value[:40]!r}" for key, (name, value) in enumerate(rows, start=1)}
    return labels, facts


def outside_clickhouse(pg_type: str, fact: str | None) -> bool:
    """A finite date or timestamp ClickHouse cannot hold (docs/clickhouse.md#types)."""
    name = parse_pg_type(pg_type).name
    if fact is None or name not in TEMPORAL:
        return False
    low, high = (MIN_DAYS, MAX_DAYS) if name == "date" else (MIN_MICROS, MAX_MICROS)
    return not low <= int(fact) <= high


def messages(
    facts: dict[int, tuple[str, str, str | None, Any]], keys: list[int], mode: str, url: str
) -> list[tuple[bytes | None, bytes | None]]:
    """One create per key, holding its value, as Debezium serializes it in ``mode`` (:data:`FORMATS`)."""
    value_format, modes = FORMATS[mode]
    schemas = {name: connect_schema(pg_type, modes) for name, pg_type in COLUMNS.items() if name != "id"}
    out: list[tuple[bytes | None, bytes | None]] = []
    if value_format == "avro":
        defined: set[str] = set()
        fields = [{"name": "id", "type": "long"}] + [
            {"name": name, "type": ["null", avro_type(schema, defined)], "default": None}
            for name, schema in schemas.items()
        ]
        topic = f"shop.public.edges_{uuid.uuid4().hex[:10]}"
        write = serializer(url, envelope(fields, name="edges"))
    for key in keys:
        name, text, fact, python = facts[key]
        value = encode(COLUMNS[name], text, fact, python, modes)
        row = {"id": key, **dict.fromkeys(schemas), name: value}
        if value_format == "avro":
            avro_row = {"id": key, **{n: avro_value(schemas[n], v) for n, v in row.items() if n != "id"}}
            out.append((None, serialize(write, topic, avro_change("c", avro_row, lsn=1000 + key))))
            continue
        payload = change("c", after=row, lsn=1000 + key)
        if mode == "json_bare":
            out.append((None, json_bytes(dumps(with_raw_numbers(payload)))))
        else:
            row_fields = [{"type": "int64", "optional": False, "field": "id"}] + [
                {**schema, "optional": True, "field": n} for n, schema in schemas.items()
            ]
            out.append((None, json_bytes(wrapped(with_raw_numbers(payload), row_fields))))
    return out


def decode_task(value_format: str, url: str) -> DecodeTask:
    spec = DecodeSpec(
        "edges",
        tuple((name, parse_pg_type(pg)) for name, pg in COLUMNS.items()),
        ("id",),
        format=value_format,
        schema_registry=SchemaRegistryAccess(url) if value_format == "avro" else None,
    )
    return DecodeTask(spec=spec, dead_letters=None)  # on_decode_error: fail: a value that does not decode stops


def land(sink: ClickHouseTableSink, batch_id: int, parts: list[tuple[DecodeTask, list[Any], int]]) -> int:
    """Decode each part (one Kafka partition's messages, ids shifted by its offset) and insert them all as one
    task's rows, the way StageTask hands a decoded partition to the writer."""
    tables = []
    for task, raw, shift in parts:
        decoded = pa.Table.from_batches(list(task(iter([kafka_batch(raw)]))))
        ids = pa.array([i + shift for i in decoded.column("id").to_pylist()], pa.int64())
        tables.append(decoded.set_column(decoded.schema.get_field_index("id"), "id", ids))
    return sink.stage_writer(batch_id, "cp").stage(pa.concat_tables(tables))


def ch_text(name: str, value: int) -> str:
    """Postgres' text of a date (days) or timestamp (microseconds) as ClickHouse holds it (``name``: the type's)."""
    if name == "date":
        return date_text(value)
    return timestamp_text(value, with_time_zone=name == "timestamp with time zone")


def ch_ends(name: str) -> tuple[str, str]:
    """ClickHouse's first and last date or timestamp, where ``-infinity`` and ``infinity`` land."""
    low, high = (MIN_DAYS, MAX_DAYS) if name == "date" else (MIN_MICROS, MAX_MICROS)
    return ch_text(name, low), ch_text(name, high)


def from_clickhouse(pg_type: str, value: Any) -> Any:
    """A value read from ClickHouse as a parameter Postgres casts to ``pg_type``."""
    parsed = parse_pg_type(pg_type)
    if value is None:
        return None
    if parsed.element is not None:
        return pg_array([from_clickhouse(parsed.element.sql, v) for v in value])
    if parsed.name in TEMPORAL:
        return ch_text(parsed.name, value)
    return value


def pg_array(values: list[Any]) -> str:
    def element(value: Any) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, float) and not np.isfinite(value):
            return "NaN" if np.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        text = "\\x" + value.hex() if isinstance(value, bytes) else str(value)
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "{" + ",".join(element(v) for v in values) + "}"


def read_back(client: Any, conn: psycopg.Connection[Any], schema: str, shift: int) -> None:
    """The rows ClickHouse holds with ids ``shift`` + n (``FINAL``, live) as ``<schema>.edges`` in Postgres."""
    names = list(COLUMNS)
    select = ", ".join(READ_AS.get(COLUMNS[n], "{}").format(f"`{n}`") for n in names)
    result = client.query(
        f"SELECT {select} FROM things FINAL WHERE NOT _is_deleted AND id > {shift} AND id < {shift + 10_000}",
        query_formats={"UUID": "string"},
        column_formats={n: "bytes" for n, t in COLUMNS.items() if t.startswith("bytea")},
    )
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(
        sql.SQL("CREATE TABLE {} (LIKE public.{})").format(sql.Identifier(schema, TABLE), sql.Identifier(TABLE))
    )
    insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(schema, TABLE),
        sql.SQL(", ").join(map(sql.Identifier, names)),
        sql.SQL(", ").join(sql.SQL("%s::" + COLUMNS[n]) for n in names),
    )
    for row in result.result_rows:
        values = []
        for name, value in zip(names, row, strict=True):
            pg_type = COLUMNS[name]
            values.append(value - shift if name == "id" else from_clickhouse(pg_type, value))
        conn.execute(insert, values)


def test_every_edge_value_lands_in_clickhouse_through_the_decoders(
    sink: ClickHouseTableSink, clickhouse_database: ClickHouseDatabase, postgres_dsn: str, schema_registry_url: str
) -> None:
    labels, facts = source_table(postgres_dsn)
    outside = [key for key, (name, _, fact, _) in facts.items() if outside_clickhouse(COLUMNS[name], fact)]
    inside = [key for key in sorted(facts) if key not in outside]
    parts = [
        (decode_task(value_format, schema_registry_url), messages(facts, inside, mode, schema_registry_url), shift)
        for shift, (mode, (value_format, _)) in zip(SHIFTS, FORMATS.items(), strict=True)
    ]
    assert land(sink, 1, parts) == len(inside) * len(FORMATS)

    # Each value ClickHouse cannot hold stops its batch before anything is inserted, naming column and value.
    json_task = decode_task("json", schema_registry_url)
    for key in outside:
        name = facts[key][0]
        with pytest.raises(ReportedFailure) as stopped:
            land(sink, 2, [(json_task, messages(facts, [key], "json_schemas", schema_registry_url), 90_000)])
        assert f"column '{name}' holds " in str(stopped.value) and "outside what ClickHouse" in str(stopped.value)

    client = clickhouse_database.client()
    assert client.command("SELECT count() FROM things WHERE id >= 90000") == 0
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        # What docs/clickhouse.md says lands instead: the infinities at ClickHouse's ends, NULL arrays as [].
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(sql.Identifier(TABLE)), (outside,))
        for name, (pg_type, _) in CATALOGUE.items():
            update = sql.SQL("UPDATE {} SET {} = ").format(sql.Identifier(TABLE), sql.Identifier(name))
            parsed = parse_pg_type(pg_type)
            if parsed.name in TEMPORAL:
                ends = sql.SQL("CASE WHEN {0} > 'epoch' THEN %s ELSE %s END::" + pg_type + " WHERE NOT isfinite({0})")
                conn.execute(update + ends.format(sql.Identifier(name)), ch_ends(parsed.name)[::-1])
            if parsed.element is not None and parsed.element.name in TEMPORAL:
                low, high = ch_ends(parsed.element.name)
                ends = sql.SQL("array_replace(array_replace({0}, 'infinity', %s), '-infinity', %s)")
                conn.execute(update + ends.format(sql.Identifier(name)), (high, low))
            if parsed.element is not None:
                conn.execute(update + sql.SQL("'{{}}' WHERE {} IS NULL").format(sql.Identifier(name)))
        for shift, mode in zip(SHIFTS, FORMATS, strict=True):
            read_back(client, conn, mode, shift)
    for mode, (_, modes) in FORMATS.items():
        missing, extra = differences(postgres_dsn, postgres_dsn, modes, schema=mode, edges=CATALOGUE)
        assert not missing and not extra, f"{mode}: {describe(missing, extra, labels, CATALOGUE)}"

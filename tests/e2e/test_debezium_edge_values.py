"""Edge and special values of every type, through the real Debezium connector, must land exactly (issue 12).

A source table has one column per type cdcsync maps; each row holds ONE edge value in one column (the others
NULL), so a value that does not land names itself. Rows are published as snapshot reads and as streamed inserts,
then some are updated to another edge value of the same column and some deleted; a large jsonb value is left
untouched by an update, so its TOAST placeholder is exercised too. ``cdcsync run --available-now`` mirrors the
table with ``on_decode_error: fail`` (a value the decoder refuses fails the run, naming it), and the mirror must
equal the source by ``EXCEPT`` both ways after only the casts docs/types.md documents:

* ``timetz`` at UTC (Debezium's ZonedTime sends the instant, not the offset);
* unconstrained ``numeric`` without trailing fractional zeros (VariableScaleDecimal drops the display scale);
* ``bit varying`` without leading zeros (Debezium's Bits bytes drop them);
* ``interval`` in the default ``interval.handling.mode=numeric`` (MicroDuration) as Debezium's approximation:
  a month counts 30.4375 days, and intervals beyond 64-bit microseconds (``iv_wide``) are not carried at all;
  with ``interval.handling.mode=string`` the comparison is exact;
* unconstrained ``numeric`` NaN and ±Infinity as NULL in ``decimal.handling.mode=precise`` (Debezium's
  VariableScaleDecimal cannot carry them and sends NULL).

Left out, because nothing downstream of Debezium can carry them (docs/types.md): ``NaN`` in ``numeric(p,s)``
(Debezium sends NULL in precise mode; Spark's decimal has none, so in string mode it is a dead letter naming the
way out) and timestamps after 294247-01-10 (64-bit microseconds since 1970).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from tests.conftest import DebeziumSource
from tests.e2e.conftest import Project

TABLE = "edges"

# column -> (Postgres type, edge values as Postgres literals)
EDGES: dict[str, tuple[str, list[str]]] = {
    "i2": ("smallint", ["-32768", "32767", "0"]),
    "i4": ("integer", ["-2147483648", "2147483647"]),
    "i8": ("bigint", ["-9223372036854775808", "9223372036854775807"]),
    "f4": (
        "real",
        ["3.4028235e38", "-3.4028235e38", "1.4e-45", "1.17549435e-38", "NaN", "Infinity", "-Infinity", "-0", "0.1"],
    ),
    "f8": (
        "double precision",
        [
            "1.7976931348623157e308",
            "-1.7976931348623157e308",
            "4.9e-324",
            "2.2250738585072014e-308",
            "NaN",
            "Infinity",
            "-Infinity",
            "-0",
            "0.1",
        ],
    ),
    "money_like": ("numeric(12,2)", ["9999999999.99", "-9999999999.99", "0.00"]),
    "n38": ("numeric(38,0)", ["99999999999999999999999999999999999999", "-99999999999999999999999999999999999999"]),
    "n50": ("numeric(50,20)", ["999999999999999999999999999999.99999999999999999999", "-0.00000000000000000001"]),
    "nfree": (
        "numeric",
        ["NaN", "Infinity", "-Infinity", "9" * 1000, "-" + "9" * 1000, "1e-1000", "0.000", "-1.5"],
    ),
    "flag": ("boolean", ["true", "false"]),
    "txt": (
        "text",
        ["", "\\.", "\\N", "NULL", "a\tb", "a\rb", "a\nb", '"', ",", "\\", " lead", "zoë ✓ 𝄞", "'", "a\\nb"],
    ),
    "vc": ("varchar(5)", ["", "abcde"]),
    "ch": ("char(3)", ["a", "abc"]),
    "bin": ("bytea", ["\\x", "\\x00ff5c0a0d22"]),
    "d": (
        "date",
        ["infinity", "-infinity", "4713-01-01 BC", "5874897-12-31", "0001-01-01", "9999-12-31", "1970-01-01"],
    ),
    "ts": (
        "timestamp",
        [
            "infinity",
            "-infinity",
            "4713-01-01 00:00:00 BC",
            "294247-01-09 23:59:59.999999",
            "0001-01-01 00:00:00",
            "1969-12-31 23:59:59.999999",
        ],
    ),
    "tstz": (
        "timestamptz",
        [
            "infinity",
            "-infinity",
            "4713-01-01 00:00:00+00 BC",
            "294247-01-09 23:59:59.999999+00",
            "1969-12-31 23:59:59.999999+00",
        ],
    ),
    "t": ("time", ["00:00:00", "23:59:59.999999", "24:00:00"]),
    "ttz": ("timetz", ["00:00:00+00", "23:59:59.999999+00"]),
    "iv": ("interval", ["0", "1 mon 2 days 03:04:05.678901", "-1 days +01:00", "-3 years -2 mons"]),
    "iv_wide": ("interval", ["178000000 years", "-178000000 years"]),
    "js": ("json", ["{}", "[]", '"x"', "null", '{"a": 1.50e10, "b": [true, null]}']),
    "jsb": ("jsonb", ["{}", "[]", '"x"', "null", '{"a": 1.50e10}']),
    "u": ("uuid", ["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"]),
    "b3": ("bit(3)", ["000", "111"]),
    "vb": ("varbit(10)", ["", "1", "1000000001"]),
    "ints": ("integer[]", ["{}", "{NULL}", "{NULL,NULL}", "{1,NULL,-2147483648}"]),
    "texts": ("text[]", ["{}", '{""}', "{NULL}", '{"NULL","a,b","{}","\\"q\\"","\\\\"}']),
    "reals": ("real[]", ["{NaN,Infinity,-Infinity,3.4028235e38}"]),
    "decs": ("numeric(10,2)[]", ["{}", "{NULL,1.50}"]),
}
BIG_DOC = "big_doc"  # jsonb, TOASTed and left untouched by an update: its placeholder must not land


def render_column(name: str, pg_type: str, interval_mode: str, decimal_mode: str) -> sql.Composable:
    column = sql.Identifier(name)
    if name == "iv_wide" and interval_mode == "numeric":
        return sql.SQL("NULL::text")
    if pg_type == "timetz":
        return sql.SQL("({} AT TIME ZONE 'UTC')::text").format(column)
    if pg_type == "numeric":
        special = sql.SQL("NULL" if decimal_mode == "precise" else "{}::text").format(column)
        return sql.SQL(
            "(CASE WHEN {0} IN ('NaN', 'Infinity', '-Infinity') THEN {1} ELSE trim_scale({0})::text END)"
        ).format(column, special)
    if pg_type.startswith("varbit"):
        return sql.SQL("ltrim({}::text, '0')").format(column)
    if pg_type == "interval" and interval_mode == "numeric":
        # MicroDuration: years and months at 30.4375 days a month, then days and time, in microseconds
        return sql.SQL(
            "((extract(year from {0}) * 12 + extract(month from {0})) * 30.4375 * 86400000000"
            " + extract(day from {0}) * 86400000000"
            " + extract(epoch from ({0} - date_trunc('day', {0}))) * 1000000)::numeric(30,0)::text"
        ).format(column)
    return sql.SQL("{}::text").format(column)


def rendered(
    schema: str, interval_mode: str, decimal_mode: str, edges: dict[str, tuple[str, list[str]]] = EDGES
) -> sql.Composable:
    columns = [sql.SQL("id::text")] + [render_column(n, t, interval_mode, decimal_mode) for n, (t, _) in edges.items()]
    columns.append(sql.SQL("md5({}::text)").format(sql.Identifier(BIG_DOC)))
    return sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(columns), sql.Identifier(schema, TABLE))


def differences(
    source_dsn: str,
    mirror_dsn: str,
    modes: dict[str, str],
    schema: str = "app",
    edges: dict[str, tuple[str, list[str]]] = EDGES,
) -> tuple[list[Any], list[Any]]:
    """(source rows not in the mirror, mirror rows not in the source) of the ``edges`` columns, after the casts."""
    interval_mode = modes.get("interval.handling.mode", "numeric")
    decimal_mode = modes.get("decimal.handling.mode", "precise")
    with psycopg.connect(mirror_dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        mirror = conn.execute(rendered(schema, interval_mode, decimal_mode, edges)).fetchall()
    width = len(edges) + 2
    with psycopg.connect(source_dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute(
            sql.SQL("CREATE TEMP TABLE mirror_rows ({})").format(
                sql.SQL(", ").join(sql.SQL("{} text").format(sql.Identifier(f"c{i}")) for i in range(width))
            )
        )
        with conn.cursor().copy("COPY mirror_rows FROM STDIN") as copy:
            for row in mirror:
                copy.write_row(row)
        source = rendered("public", interval_mode, decimal_mode, edges)
        missing = conn.execute(sql.SQL("{} EXCEPT SELECT * FROM mirror_rows").format(source)).fetchall()
        extra = conn.execute(sql.SQL("SELECT * FROM mirror_rows EXCEPT {}").format(source)).fetchall()
    return missing, extra


def describe(
    missing: list[Any], extra: list[Any], labels: dict[int, str], edges: dict[str, tuple[str, list[str]]] = EDGES
) -> str:
    names = ["id", *edges, BIG_DOC]
    ours, theirs = {int(r[0]): r for r in missing}, {int(r[0]): r for r in extra}
    lines = [f"{len(missing)} source rows not in the mirror, {len(extra)} mirror rows not in the source"]
    for key in sorted(ours.keys() | theirs.keys())[:40]:
        source_row, mirror_row = ours.get(key), theirs.get(key)
        if source_row and mirror_row:
            for name, a, b in zip(names, source_row, mirror_row, strict=True):
                if a != b:
                    lines.append(
                        f"row {key} ({labels.get(key)}): {name} source {str(a)[:60]!r} != mirror {str(b)[:60]!r}"
                    )
        else:
            lines.append(f"row {key} ({labels.get(key)}): only in the {'source' if source_row else 'mirror'}")
    return "\n".join(lines)


def publish(source: DebeziumSource, modes: dict[str, tuple[str, dict[str, str]]]) -> dict[int, str]:
    """Creates and fills the table around the start of the connectors (one per entry of ``modes``: value format
    and connector settings, named by the key); returns what each row holds, for messages."""
    ddl = sql.SQL(", ").join(sql.SQL("{} " + t).format(sql.Identifier(n)) for n, (t, _) in EDGES.items())
    rows = [(name, value) for name, (_, values) in EDGES.items() for value in values]
    labels = {key: f"{name} = {value[:40]!r}" for key, (name, value) in enumerate(rows, start=1)}
    rng = random.Random(12)

    def insert(conn: psycopg.Connection[Any], key: int) -> None:
        name, value = rows[key - 1]
        conn.execute(
            sql.SQL("INSERT INTO {} (id, {}) VALUES (%s, %s::" + EDGES[name][0] + ")").format(
                sql.Identifier(TABLE), sql.Identifier(name)
            ),
            (key, value),
        )

    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE public.{} (id bigint PRIMARY KEY, {}, {} jsonb)").format(
                sql.Identifier(TABLE), ddl, sql.Identifier(BIG_DOC)
            )
        )
        half = len(rows) // 2
        for key in range(1, half + 1):  # published as snapshot reads
            insert(conn, key)
        for mode, (value_format, overrides) in modes.items():
            source.capture(
                f"public.{TABLE}",
                overrides={"skipped.operations": "none", **overrides},
                value_format=value_format,
                connector=mode,
            )
        for key in range(half + 1, len(rows) + 1):
            insert(conn, key)
        for key, (name, _) in enumerate(rows, start=1):  # an update to another edge value of the column
            if key % 3 == 0:
                pg_type, values = EDGES[name]
                value = rng.choice(values)
                conn.execute(
                    sql.SQL("UPDATE {} SET {} = %s::" + pg_type + " WHERE id = %s").format(
                        sql.Identifier(TABLE), sql.Identifier(name)
                    ),
                    (value, key),
                )
                labels[key] += f", then {value[:40]!r}"
        for key in range(7, len(rows) + 1, 11):
            conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(sql.Identifier(TABLE)), (key,))
        big_key = len(rows) + 1
        big = {"blob": random.Random(5).randbytes(8000).hex(), "n": 1}
        conn.execute(
            sql.SQL("INSERT INTO {} (id, {}, i4) VALUES (%s, %s, 1)").format(
                sql.Identifier(TABLE), sql.Identifier(BIG_DOC)
            ),
            (big_key, psycopg.types.json.Jsonb(big)),
        )
        conn.execute(sql.SQL("UPDATE {} SET i4 = 2 WHERE id = %s").format(sql.Identifier(TABLE)), (big_key,))
        labels[big_key] = "a TOASTed jsonb left untouched by an update"
    source.wait_caught_up()
    return labels


MODES: dict[str, tuple[str, dict[str, str]]] = {
    "json_precise_adaptive_numeric": ("json", {}),
    "json_string_string": ("json", {"decimal.handling.mode": "string", "interval.handling.mode": "string"}),
    "json_bare_string_string": (
        "json",
        {
            "decimal.handling.mode": "string",
            "interval.handling.mode": "string",
            "key.converter.schemas.enable": "false",
            "value.converter.schemas.enable": "false",
        },
    ),
    "avro_precise_adaptive_numeric": ("avro", {}),
    "avro_precise_adaptive_string": ("avro", {"interval.handling.mode": "string"}),
}
"""Connector modes (value format, connector settings), each captured by a connector of its own from the same
source table and changes, and mirrored by one ``cdcsync run`` into a schema of its own."""


def test_every_edge_value_lands_exactly(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    schema_registry_url: str,
    debezium_source: DebeziumSource,
) -> None:
    labels = publish(debezium_source, MODES)
    columns = {"id": "bigint", **{name: pg_type for name, (pg_type, _) in EDGES.items()}, BIG_DOC: "jsonb"}
    sources, sinks = {}, {}
    for mode, (value_format, _) in MODES.items():
        sources[mode] = {
            "type": "kafka",
            "topic": debezium_source.topic(f"public.{TABLE}", mode),
            "format": value_format,
            "primary_key": "id",
            "columns": columns,
            "on_decode_error": "fail",
            "untoasted_columns": ["reals", "decs"],  # small arrays Debezium has no TOAST placeholder for
        }
        sinks[f"mirror_{mode}"] = {"type": "postgres", "from": mode, "schema": mode, "table": TABLE}
    project = make_project({"name": "edges", "sources": sources, "sinks": sinks})
    project.env["CDCSYNC__SCHEMA_REGISTRY__URL"] = schema_registry_url
    project.prepare()
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    for mode, (_, overrides) in MODES.items():
        missing, extra = differences(debezium_source.dsn, postgres_dsn, overrides, schema=mode)
        assert not missing and not extra, f"{mode}: {describe(missing, extra, labels)}"

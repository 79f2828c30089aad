"""Golden tests on the DDL the templates render, identifier quoting, and a parse of every statement with sqlglot.

The expected SQL lives in ``tests/unit/golden/*.sql``. After an intended change to a template, regenerate it and
review the diff::

    CDCSYNC_UPDATE_GOLDEN=1 /tmp/venv/bin/pytest tests/unit/test_templates.py
    git diff tests/unit/golden
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jinja2
import pytest
import sqlglot
from sqlglot import exp

import cdcsync
from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.core import names
from cdcsync.core.errors import ConfigError
from cdcsync.migrations import POSTGRES
from cdcsync.sql.render import (
    comment_text,
    quote_columns,
    quote_ident,
    quote_literal,
    quote_path,
    quote_qualified,
    render,
    templates_dir,
)

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("CDCSYNC_UPDATE_GOLDEN") == "1"
WEIRD_NAMES = ["order", "select", "User Table", 'we"ird', "Mixed", "ünïcode", "a.b", "x'y", "back\\slash", "new\nline"]


def small_pipeline() -> Pipeline:
    return validate_pipeline_dict(
        {
            "name": "shop",
            "sources": {
                "orders": {
                    "type": "kafka",
                    "topic": "shop.public.orders",
                    "primary_key": "id",
                    "columns": {"id": "bigint", "customer_id": "int8", "amount": "numeric(12, 2)", "note": "text"},
                }
            },
            "sinks": {
                "orders_mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"},
                "orders_soft": {
                    "type": "postgres",
                    "from": "orders",
                    "schema": "app",
                    "table": "orders_soft",
                    "delete_mode": "soft",
                },
            },
        }
    )


def weird_pipeline() -> Pipeline:
    return validate_pipeline_dict(
        {
            "name": "Weird-1",
            "sources": {
                "src": {
                    "type": "kafka",
                    "topic": "t",
                    "primary_key": ["order", 'we"ird'],
                    "columns": {
                        "order": "bigint",
                        'we"ird': "text",
                        "select": "varchar(10)",
                        "User Table": "timestamptz",
                        "x'y": "jsonb",
                        "back\\slash": "uuid",
                    },
                }
            },
            "sinks": {
                'Sink "A"': {"type": "postgres", "from": "src", "schema": "User Table", "table": 'we"ird'},
                "select": {
                    "type": "postgres",
                    "from": "src",
                    "schema": "order",
                    "table": "select",
                    "delete_mode": "soft",
                },
            },
        }
    )


def sink_values(pipeline: Pipeline, sink_id: str) -> dict[str, Any]:
    state = POSTGRES.desired_state(pipeline)
    return {
        "pipeline": pipeline.name,
        "sink_id": sink_id,
        "internal_schema": state["internal_schema"],
        "sink": state["sinks"][sink_id],
    }


def check_golden(name: str, actual: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8", newline="\n")
    assert path.exists(), f"{path} is missing; regenerate with CDCSYNC_UPDATE_GOLDEN=1"
    assert actual == path.read_text(encoding="utf-8"), f"{name} differs from the golden file (see module docstring)"


def parse_postgres(sql: str) -> list[exp.Expr]:
    """Every statement of ``sql``, parsed strictly: sqlglot must understand each one (no Command fallback), except
    PL/pgSQL functions, DO blocks and SET LOCAL ROLE, which sqlglot does not parse (the integration tests run them on a real
    Postgres)."""
    statements = [statement for statement in sqlglot.parse(sql, read="postgres") if statement is not None]
    assert statements, "no statements"
    for statement in statements:
        if isinstance(statement, exp.Command):
            assert statement.sql(comments=False).startswith(
                ("CREATE OR REPLACE FUNCTION", "DO $cdcsync$", "SET LOCAL ROLE")
            ), f"sqlglot could not parse: {statement.sql()[:200]}"
    return statements


# ---- golden files ------------------------------------------------------------------------------------------------


def test_internal_schema_golden() -> None:
    sql = render("postgres/internal_schema.sql.j2", schema=names.INTERNAL_SCHEMA)
    check_golden("internal_schema.sql", sql)
    kinds = [type(s).__name__ for s in parse_postgres(sql)]
    tables = ["Create", "Comment"] * 7  # schema_migrations ... source_positions, key_moves, dynamic_table_changes
    assert kinds == ["Create", *tables, "Command"], "the schema, each table with its comment, the trigger function"


def test_mirror_table_hard_golden() -> None:
    sql = render("postgres/mirror_table.sql.j2", **sink_values(small_pipeline(), "orders_mirror"))
    check_golden("mirror_table_hard.sql", sql)
    tables = [s.find(exp.Table) for s in parse_postgres(sql) if isinstance(s, exp.Create) and s.kind == "TABLE"]
    assert [(t.db, t.name) for t in tables if t] == [
        ("app", "orders"),
        ("cdcsync", "shop__orders_mirror__stage"),
        ("cdcsync", "shop__orders_mirror__tombstones"),
    ]


def test_mirror_table_soft_golden() -> None:
    sql = render("postgres/mirror_table.sql.j2", **sink_values(small_pipeline(), "orders_soft"))
    check_golden("mirror_table_soft.sql", sql)
    assert '"_cdc_deleted" boolean NOT NULL DEFAULT false' in sql
    assert "tombstones" not in sql
    parse_postgres(sql)


def test_add_columns_golden() -> None:
    values = sink_values(small_pipeline(), "orders_mirror")
    columns = [{"name": "shipped_at", "type": "timestamptz"}, {"name": "Region", "type": "varchar(8)"}]
    sql = render("postgres/add_columns.sql.j2", columns=columns, **values)
    check_golden("add_columns.sql", sql)
    statements = parse_postgres(sql)
    assert [type(s).__name__ for s in statements] == ["Alter", "Alter"]


def test_init_migration_file_golden(tmp_path: Path) -> None:
    (planned,) = migrations.plan(POSTGRES, small_pipeline(), tmp_path)
    assert planned.filename == "0001_init.sql"
    # The generator version is normalised so that a release does not churn the golden file.
    text = planned.text.replace(f"cdcsync {cdcsync.__version__}", "cdcsync VERSION")
    check_golden("0001_init.sql", text)
    kinds = {type(s).__name__ for s in parse_postgres(planned.text)}
    assert kinds == {"Create", "Comment", "Insert", "Command", "Grant"}


# ---- the rendered DDL has the shape the design asks for ------------------------------------------------------


def test_mirror_columns_and_nullability() -> None:
    sql = render("postgres/mirror_table.sql.j2", **sink_values(small_pipeline(), "orders_mirror"))
    create_mirror = parse_postgres(sql)[1]
    assert isinstance(create_mirror, exp.Create)
    defs = {c.name: c for c in create_mirror.find_all(exp.ColumnDef)}
    assert list(defs) == ["id", "customer_id", "amount", "note", "_cdc_version", "_cdc_ts"]
    not_null = {name for name, c in defs.items() if c.find(exp.NotNullColumnConstraint)}
    assert not_null == {"id", "_cdc_version"}
    assert 'COMMENT ON TABLE "app"."orders" IS' in sql and "pipeline ''shop'', sink ''orders_mirror''" in sql
    assert 'CREATE UNLOGGED TABLE IF NOT EXISTS "cdcsync"."shop__orders_mirror__stage"' in sql


def test_stage_and_tombstone_columns_match_names_module() -> None:
    pipeline = small_pipeline()
    sql = render("postgres/mirror_table.sql.j2", **sink_values(pipeline, "orders_mirror"))
    creates = [s for s in parse_postgres(sql) if isinstance(s, exp.Create) and s.kind == "TABLE"]
    mirror, stage, tombstones = ([c.name for c in s.find_all(exp.ColumnDef)] for s in creates)
    business = list(pipeline.sources["orders"].columns)
    assert mirror == names.mirror_columns(business, "hard")
    assert stage == names.stage_columns(business)
    assert tombstones == names.tombstone_columns(["id"])
    assert not creates[1].find(exp.PrimaryKey), "the staging table has no constraints"


def test_every_create_is_idempotent() -> None:
    for sink_id in ("orders_mirror", "orders_soft"):
        sql = render("postgres/mirror_table.sql.j2", **sink_values(small_pipeline(), sink_id))
        for statement in parse_postgres(sql):
            if isinstance(statement, exp.Create):
                assert statement.args.get("exists"), statement.sql()


# ---- identifier quoting -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "quoted"),
    [
        ("orders", '"orders"'),
        ("order", '"order"'),
        ("select", '"select"'),
        ("User Table", '"User Table"'),
        ('we"ird', '"we""ird"'),
        ('""', '""""""'),
        ("Mixed", '"Mixed"'),
    ],
)
def test_quote_ident(name: str, quoted: str) -> None:
    assert quote_ident(name) == quoted


@pytest.mark.parametrize("bad", ["", "nul\x00byte", "x" * 64, "é" * 32])
def test_quote_ident_refuses(bad: str) -> None:
    with pytest.raises(ConfigError):
        quote_ident(bad)


def test_quote_helpers() -> None:
    assert quote_qualified("User Table", 'we"ird') == '"User Table"."we""ird"'
    assert quote_path(("app", "orders")) == '"app"."orders"'
    assert quote_columns(["order", "select", 'we"ird']) == '"order", "select", "we""ird"'
    with pytest.raises(TypeError):
        quote_columns("id")  # a single string is a bug, not a list of one-letter columns
    assert quote_literal("it's") == "'it''s'"
    assert quote_literal("back\\slash 'q'") == "E'back\\\\slash ''q'''"
    with pytest.raises(ConfigError):
        quote_literal("nul\x00")
    assert comment_text("a\nDROP TABLE x;\r\u2028") == "a\\nDROP TABLE x;\\r\\u2028"


@pytest.mark.parametrize("name", WEIRD_NAMES)
def test_weird_identifiers_round_trip_through_sqlglot(name: str) -> None:
    sql = render(
        "postgres/add_columns.sql.j2",
        internal_schema=name,
        sink={"schema": name, "table": name, "stage_table": name},
        columns=[{"name": name, "type": "text"}],
    )
    for statement in parse_postgres(sql):
        table = statement.find(exp.Table)
        assert table is not None and (table.db, table.name) == (name, name)
        assert all(identifier.quoted for identifier in statement.find_all(exp.Identifier))
        column = statement.find(exp.ColumnDef)
        assert column is not None and column.name == name


def test_weird_pipeline_renders_valid_sql(tmp_path: Path) -> None:
    pipeline = weird_pipeline()
    (planned,) = migrations.plan(POSTGRES, pipeline, tmp_path)
    statements = parse_postgres(planned.text)
    assert {type(s).__name__ for s in statements} == {"Create", "Comment", "Insert", "Command", "Grant"}
    tables = {
        (t.db, t.name)
        for s in statements
        if isinstance(s, exp.Create) and s.kind == "TABLE"
        for t in [s.find(exp.Table)]
        if t is not None
    }
    assert ("User Table", 'we"ird') in tables
    assert ("order", "select") in tables
    assert ("cdcsync", 'Weird-1__Sink "A"__stage') in tables
    assert ("cdcsync", 'Weird-1__Sink "A"__tombstones') in tables
    # Every identifier in the file is quoted: nothing from the YAML reached SQL bare.
    for statement in statements:
        for identifier in statement.find_all(exp.Identifier):
            assert identifier.quoted, f"unquoted identifier {identifier.name!r} in {statement.sql()[:120]}"


def test_names_cannot_escape_comments_or_literals(tmp_path: Path) -> None:
    evil = "x'; DROP TABLE victims; --"
    pipeline = validate_pipeline_dict(
        {
            "name": "p",
            "sources": {"s": {"type": "kafka", "topic": "t", "primary_key": "id", "columns": {"id": "bigint"}}},
            "sinks": {evil: {"type": "postgres", "from": "s", "schema": "app", "table": 't"; DROP TABLE v; --'}},
        }
    )
    (planned,) = migrations.plan(POSTGRES, pipeline, tmp_path)
    statements = parse_postgres(planned.text)
    assert not any(isinstance(s, exp.Drop) for s in statements)
    parsed = migrations.parse_migration(planned.text)
    assert all(line.startswith("--") for line in parsed.header.splitlines())
    assert parsed.checksum == parsed.declared_checksum


def test_control_characters_in_names_are_refused_before_rendering() -> None:
    with pytest.raises(ConfigError, match="control characters"):
        validate_pipeline_dict(
            {
                "name": "p",
                "sources": {"s": {"type": "kafka", "topic": "t", "primary_key": "id", "columns": {"id": "bigint"}}},
                "sinks": {"x\n; DROP TABLE victims; --": {"type": "postgres", "from": "s", "table": "t"}},
            }
        )


# ---- the environment ------------------------------------------------------------------------------------------------


def test_templates_dir_is_the_repository_directory() -> None:
    assert (templates_dir() / "postgres" / "mirror_table.sql.j2").is_file()


def test_strict_undefined() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render("postgres/internal_schema.sql.j2")


def test_unknown_type_is_refused() -> None:
    values = sink_values(small_pipeline(), "orders_mirror")
    with pytest.raises(ConfigError):
        render(
            "postgres/add_columns.sql.j2",
            columns=[{"name": "x", "type": "text; DROP TABLE t"}],
            **values,
        )


def test_bounded_postgres_reads_golden() -> None:
    """A bounded Postgres source's plan and range reads: every name quoted, every bound a parameter cast to the
    key column's type, bytea as hex, an array as a JSON list of its elements' text forms."""
    key = [("Re gion", "text"), ('we"ird', "bigint")]
    bounds = render("postgres/bounded/key_bounds.sql.j2", schema="My App", table="select", key=[n for n, _ in key])
    reads = [
        render(
            "postgres/bounded/read_range.sql.j2",
            schema="My App",
            table="select",
            columns=[*key, ("blob", "bytea"), ("at", "timestamp with time zone"), ("Tags", "bytea[]")],
            key=key,
            lower=lower,
            upper=upper,
        )
        for lower, upper in ((True, True), (False, True), (True, False), (False, False))
    ]
    check_golden("bounded_postgres.sql", "\n".join([bounds, *reads]))
    assert '"We""ird"' not in bounds and '"we""ird"' in bounds
    assert reads[0].count("%(lo") == 2 and reads[0].count("%(hi") == 2 and "%(" not in reads[3]
    assert 'array_to_json("Tags"::text[])' in reads[0]


def test_bounded_clickhouse_reads_golden() -> None:
    """A bounded ClickHouse source's plan and range reads: names quoted, bounds server-side parameters cast to the
    key's ClickHouse type, FINAL only when asked."""
    bounds = render(
        "clickhouse/bounded/key_bounds.sql.j2", database="my db", table="select", key=["Re gion", "we`ird"], final=True
    )
    reads = [
        render(
            "clickhouse/bounded/read_range.sql.j2",
            database="my db",
            table="select",
            final=False,
            columns=[("Re gion", "text"), ("we`ird", "bigint"), ("blob", "bytea")],
            key=[("Re gion", "String"), ("we`ird", "DateTime64(6, 'UTC')")],
            lower=lower,
            upper=upper,
        )
        for lower, upper in ((True, True), (False, False))
    ]
    check_golden("bounded_clickhouse.sql", "\n".join([bounds, *reads]))
    assert " FINAL" in bounds and " FINAL" not in reads[0] and "{lo1:String}" in reads[0] and "{" not in reads[1]


# ---- '%' in names: psycopg reads '%' as the start of a placeholder in a statement run with parameters ----------------

PERCENT_COLUMNS = {
    "id%": "bigint",
    "note%s": "text",
    "discount_%": "numeric(12,2)",
    "blob%(x)s": "bytea",
    "at%(batch_id)s": "text",  # spells the merge's own placeholder
}


def percent_pipeline(delete_mode: str = "hard") -> Pipeline:
    """Names holding '%' wherever a sink takes names (Postgres allows any character in a quoted name)."""
    return validate_pipeline_dict(
        {
            "name": "pct",
            "sources": {"s%": {"type": "kafka", "topic": "t", "primary_key": "id%", "columns": PERCENT_COLUMNS}},
            "sinks": {
                "m%": {
                    "type": "postgres",
                    "from": "s%",
                    "schema": "My App%",
                    "table": "sel%ect",
                    "delete_mode": delete_mode,
                }
            },
        }
    )


def sent(statement: str, params: dict[str, Any] | None, *, copy: bool = False) -> str:
    """The text psycopg sends for ``statement`` run with ``params``, from its client-side parse (no server needed):
    ``execute`` turns placeholders into ``$1``... (and ``%%`` into ``%``) when given parameters, ``copy`` merges
    them into the text when given any, and either sends the statement as it is without."""
    from psycopg._queries import PostgresClientQuery, PostgresQuery
    from psycopg.adapt import Transformer

    if params is None or (copy and not params):
        return statement
    query = (PostgresClientQuery if copy else PostgresQuery)(Transformer())
    query.convert(statement, params)
    return query.query.decode()


def without_percent_names(text: str, names: list[str]) -> str:
    """``text`` without the names (quoted, or as string literals) it may hold: what is left holds no '%'."""
    for name in names:
        text = text.replace(quote_ident(name), "").replace(quote_literal(name), "")
    return text


@pytest.mark.parametrize("delete_mode", ["hard", "soft"])
def test_percent_in_names_reaches_postgres_as_written_in_every_statement_of_a_sink(delete_mode: str) -> None:
    """The Postgres sink's statements, run as the sink runs them (with parameters or without), send every name as
    written: a '%' of a name is neither read as a placeholder nor sent doubled, and a name that spells the merge's
    own placeholder does not make its statement one run with parameters."""
    from cdcsync.sinks.postgres import PostgresUpsertSink

    pipeline = percent_pipeline(delete_mode)
    sink = PostgresUpsertSink(pipeline, "m%", pipeline.sinks["m%"], "postgresql://unused")
    batch = {"batch_id": 7}
    create, lone_copy, lone_select = sink._lone_sql
    runs = [
        (sink._copy_sql, None, True),
        (create, None, False),
        (lone_copy, None, True),
        (lone_select, None, False),
        (sink._stage_any_sql, {"keep": [6]}, False),
        (sink._stage_clear_sql, {"keep": [6]}, False),
        (sink._truncate_sql, None, False),
        (sink._count_sql, batch, False),
        (sink._position_check_sql, batch, False),
        (sink._collapse_sql, batch, False),
        *((statement.sql, batch if statement.with_batch_id else None, False) for statement in sink._merge_statements),
        (sink._position_record_sql, batch, False),
        (sink._delete_batch_sql, batch, False),
    ]
    assert any(statement.with_batch_id for statement in sink._merge_statements)  # the key moves' statements
    assert any("%(batch_id)s" in statement.sql and not statement.with_batch_id for statement in sink._merge_statements)
    assert [statement.rows_out for statement in sink._merge_statements].count(True) >= 1
    names = [*PERCENT_COLUMNS, "_next_id%", "My App%", "sel%ect", "m%", "pct__m%__stage", "pct__m%__tombstones"]
    for statement, params, copy in runs:
        text = sent(statement, params, copy=copy)
        assert any(quote_ident(name) in text or quote_literal(name) in text for name in names), text
        assert "%" not in without_percent_names(text, names), text
    # The stage's name as a string (the literal of its quoted name), in a statement run with parameters.
    assert quote_literal('"cdcsync"."pct__m%__stage"') in sent(sink._stage_any_sql, {"keep": []})


def test_percent_in_names_of_a_bounded_postgres_read() -> None:
    """The plan (parameter step, and a '%' operator of its own) and the COPY of each range (parameters only for the
    bound ends: psycopg merges them into the text)."""
    from cdcsync.sources.bounded import bound_parameters, range_statements, which_bounds

    key = [("id%", "bigint")]
    columns = [*key, ("note%s", "text"), ("blob%(x)s", "bytea")]
    names = ["My App%", "sel%ect", *(name for name, _ in columns)]
    plan = render("postgres/bounded/key_bounds.sql.j2", schema="My App%", table="sel%ect", key=["id%"])
    text = sent(plan, {"step": 10})
    assert '"id%"' in text and "%" not in without_percent_names(text, names).replace("% $1", "")
    reads = range_statements(
        "postgres/bounded/read_range.sql.j2", schema="My App%", table="sel%ect", columns=columns, key=key
    )
    for lower, upper in ((["1"], ["9"]), (None, ["9"]), (["1"], None), (None, None)):
        text = sent(reads[which_bounds(lower, upper)], bound_parameters(lower, upper), copy=True)
        assert '"blob%(x)s"' in text and "%" not in without_percent_names(text, names), text


@pytest.mark.parametrize(
    ("template", "params"),
    [
        ("postgres/runtime/dynamic_keys_load.sql.j2", {"pipeline": "p", "checkpoint_id": "c", "batch_id": 1}),
        ("postgres/runtime/dynamic_keys_later.sql.j2", {"pipeline": "p", "checkpoint_id": "c", "batch_id": 1}),
        ("postgres/runtime/dynamic_keys_insert.sql.j2", {"pipeline": "p", "checkpoint_id": "c", "batch_id": 1}),
        ("postgres/runtime/dynamic_keys_temp.sql.j2", None),
        ("postgres/runtime/count_rows.sql.j2", None),
        ("postgres/runtime/position_mark.sql.j2", None),
        ("postgres/runtime/position_save.sql.j2", {"position": 1, "snapshot": None}),
    ],
)
def test_percent_in_names_of_other_runtime_statements(template: str, params: dict[str, Any] | None) -> None:
    names = ["app%", "keys%", "k%", "m%"]
    values = {
        "table": ("app%", "keys%"),
        "target": ("app%", "keys%"),
        "key_column": "k%",
        "key_type": "text",
        "integer": False,
        "internal_schema": names[0],
        "pipeline": "pct",
        "sink_id": "m%",
    }
    text = sent(render(template, **values), params)
    assert "%" not in without_percent_names(text, names), text


def test_percent_in_names_of_migrations_stays_single(tmp_path: Path) -> None:
    """Migration files run without parameters (and by hand with psql): their names are written as they are."""
    (planned,) = migrations.plan(POSTGRES, percent_pipeline(), tmp_path)
    assert '"discount_%"' in planned.text and '"My App%"."sel%ect"' in planned.text and "%%" not in planned.text
    assert quote_ident("a%") == '"a%"' and quote_literal("a%") == "'a%'"  # the helpers Python calls (messages)


def test_percent_in_names_of_clickhouse_statements_is_not_read_by_clickhouse_connect() -> None:
    """cdcsync's ClickHouse statements bind their values server-side (``{name:Type}``): clickhouse-connect then
    leaves the text alone. Only a statement without such a placeholder would go through Python's '%' formatting."""
    from clickhouse_connect.driver.binding import bind_query

    sql = render(
        "clickhouse/runtime/delete_keys.sql.j2",
        target=("db%", "t%(x)s"),
        primary_key=("id%",),
        key_types=("Int64",),
    )
    bound, params = bind_query(sql, {"keys": [(1,)], "versions": [2]})
    assert bound == sql.rstrip(";") and "`db%`.`t%(x)s`" in bound and "`id%`" in bound
    assert set(params) == {"param_keys", "param_versions"}


@pytest.mark.parametrize(
    ("statement", "holds"),
    [
        ("DELETE FROM t WHERE _cdc_batch = %(batch_id)s;\n", True),
        ('INSERT INTO "a%(batch_id)s" SELECT 1;\n', False),
        ('INSERT INTO "a""%(batch_id)s""" SELECT 1;\n', False),
        ("SELECT E'it''s %(batch_id)s \\\\';\n", False),
        ("-- the stage's rows\nDELETE FROM \"x'\" WHERE b = %(batch_id)s;\n", True),
        ("SELECT '%(batch_id)s' /* rows_out */, %(keep)s;\n", True),
    ],
)
def test_a_placeholder_counts_only_outside_quoted_names_literals_and_comments(statement: str, holds: bool) -> None:
    from cdcsync.sql.render import holds_placeholder, template_text

    assert holds_placeholder(statement) is holds
    assert "'" not in template_text(statement)

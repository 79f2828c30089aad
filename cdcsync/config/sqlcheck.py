"""The analysis half of compiling a SQL transform (see :mod:`cdcsync.config.compile`), with sqlglot in the Spark
dialect: parse one SELECT, refuse what cannot run statelessly over one micro-batch, find the one input and the
``dynamic_table_check`` calls, resolve every column against the input as Spark would, and infer the types of
computed columns. Every finding is a problem naming the YAML path of the SQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.schema import MappingSchema

from cdcsync.config.base import did_you_mean
from cdcsync.config.types import PgType, UnknownTypeError, parse_pg_type

DIALECT = "spark"
CHECK_FUNCTION = "dynamic_table_check"
ROW = "__cdc_row"
"""Alias of the input in every generated query; the user's alias and stream name are resolved to it."""

METADATA_TYPES: dict[str, PgType] = {
    "_cdc_op": PgType("text"),
    "_cdc_version": PgType("numeric", (38, 0)),
    "_cdc_ts": PgType("timestamp with time zone"),
    "_cdc_topic": PgType("text"),
    "_cdc_partition": PgType("integer"),
    "_cdc_offset": PgType("bigint"),
}
"""The ``_cdc_*`` columns of every node, in order (their Spark types are the decoder's ``CDC_COLUMNS``)."""

_GENERATORS = frozenset(
    {"explode", "explode_outer", "posexplode", "posexplode_outer", "inline", "inline_outer", "stack", "json_tuple"}
)
_GENERATOR_CLASSES: tuple[type[exp.Expr], ...] = (exp.Explode, exp.Posexplode, exp.Inline, exp.Unnest)
_NONDETERMINISTIC = frozenset({"monotonically_increasing_id", "spark_partition_id", "input_file_name"})
_NONDETERMINISTIC_CLASSES: tuple[type[exp.Expr], ...] = (exp.Rand, exp.Randn, exp.Uuid, exp.Shuffle)
_UNSUPPORTED_CLAUSES: tuple[tuple[str, str], ...] = (
    ("with_", "WITH (common table expressions): chain transforms instead, each reading the one before"),
    (
        "joins",
        "a join: a transform reads exactly one stream (joins between streams, comma joins included, need "
        "state across micro-batches); test keys with dynamic_table_check instead",
    ),
    ("group", "GROUP BY: aggregations need state across micro-batches; use a postgres_aggregate sink"),
    ("having", "HAVING: aggregations need state across micro-batches; use a postgres_aggregate sink"),
    ("qualify", "QUALIFY: window functions need state across micro-batches"),
    ("order", "ORDER BY: a transform yields one row per change; order is decided by the changes' versions"),
    ("sort", "SORT BY: a transform yields one row per change; order is decided by the changes' versions"),
    ("cluster", "CLUSTER BY: a transform yields one row per change"),
    ("distribute", "DISTRIBUTE BY: a transform yields one row per change"),
    ("limit", "LIMIT: a transform yields exactly one row per change"),
    ("offset", "OFFSET: a transform yields exactly one row per change"),
    ("distinct", "DISTINCT: a transform yields exactly one row per change"),
    ("laterals", "LATERAL VIEW: generators yield several rows per change; a transform yields exactly one"),
    ("hint", "query hints: cdcsync sets the hints of the queries it runs"),
)


Columns = dict[str, PgType]
"""A stream's business columns in order; its ``_cdc_*`` columns are implied."""


@dataclass
class Query:
    """One parsed SQL text (a transform's, or a dynamic table's fill) on its way to Spark SQL."""

    where: str
    """YAML path of the SQL, the prefix of its problems."""
    select: exp.Select
    input: str | None = None
    checks: list[exp.Anonymous] = field(default_factory=list)
    """``dynamic_table_check`` calls whose arguments are valid."""
    failed: bool = False


def short(node: exp.Expr, limit: int = 60) -> str:
    """``node`` as the user would write it (without the qualifier the rewrite adds), shortened for messages."""
    shown = node.copy()
    for column in list(shown.find_all(exp.Column)):
        if column.table == ROW:
            column.replace(exp.column(column.name))
    text = shown.sql(dialect=DIALECT)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------------------------
# Parsing and shape
# --------------------------------------------------------------------------------------------------------------


def parse_select(where: str, sql: str, problems: list[str]) -> exp.Select | None:
    try:
        statements = [s for s in sqlglot.parse(sql, read=DIALECT) if s is not None]
    except ParseError as error:
        first = error.errors[0] if error.errors else {}
        at = f" at line {first.get('line')}, column {first.get('col')}" if first.get("line") else ""
        problems.append(f"{where}: not valid Spark SQL{at}: {first.get('description') or error}")
        return None
    if len(statements) != 1:
        problems.append(f"{where}: must be exactly one SELECT statement, found {len(statements)}")
        return None
    statement = statements[0]
    if isinstance(statement, exp.SetOperation):
        kind = type(statement).__name__.upper()
        problems.append(
            f"{where}: {kind} combines several queries; a transform is one SELECT over one stream "
            "(write one transform per query and send each to the sink)"
        )
        return None
    if not isinstance(statement, exp.Select):
        problems.append(f"{where}: must be a SELECT statement, not {short(statement, 40)!r}")
        return None
    return statement


def check_shape(query: Query, problems: list[str]) -> None:
    """Refuse everything that is not a projection and a filter of one stream, naming the clause."""
    select, where = query.select, query.where
    before = len(problems)
    for key, message in _UNSUPPORTED_CLAUSES:
        if select.args.get(key):
            problems.append(f"{where}: {message}")
    source = select.args.get("from_")
    if source is not None and not isinstance(source.this, exp.Table):
        problems.append(f"{where}: FROM a subquery: chain transforms instead, each reading the one before")
    for node in select.find_all(exp.Query):
        if node is not select and not (source is not None and node.parent is source.this):
            problems.append(
                f"{where}: a subquery ({short(node)}): it would read a stream a second time; "
                "chain transforms or use dynamic_table_check"
            )
            break
    seen: set[str] = set()
    kinds: tuple[type[exp.Expr], ...] = (
        exp.AggFunc,
        exp.Window,
        *_GENERATOR_CLASSES,
        *_NONDETERMINISTIC_CLASSES,
        exp.Anonymous,
    )
    found: exp.Expr
    for found in select.find_all(*kinds):
        name = found.name.lower() if isinstance(found, exp.Anonymous) else ""
        if isinstance(found, exp.Window):
            message = f"window function {short(found)}: windows need state across micro-batches"
        elif isinstance(found, exp.AggFunc):
            message = (
                f"aggregate function {short(found)}: aggregations need state across micro-batches; use a "
                "postgres_aggregate sink"
            )
        elif isinstance(found, _GENERATOR_CLASSES) or name in _GENERATORS:
            message = f"generator {short(found)}: it yields several rows per change; a transform yields exactly one"
        elif isinstance(found, _NONDETERMINISTIC_CLASSES) or name in _NONDETERMINISTIC:
            message = (
                f"{short(found)} is nondeterministic: a replayed micro-batch must yield the same rows, and the "
                "rewrite evaluates the WHERE once per computed column"
            )
        else:
            continue
        if message not in seen:
            seen.add(message)
            problems.append(f"{where}: {message}")
    query.failed = len(problems) > before


def _table_name(table: exp.Table) -> str:
    return ".".join(part.name for part in table.parts)


def resolve_input(
    query: Query,
    streams: set[str],
    dynamic_tables: set[str],
    unavailable: set[str],
    problems: list[str],
) -> None:
    """Which node the FROM reads: a source or SQL transform id, dotted Streamling names included."""
    source = query.select.args.get("from_")
    if source is None:
        problems.append(f"{query.where}: has no FROM; it must read exactly one source or transform")
        query.failed = True
        return
    if not isinstance(source.this, exp.Table):
        return  # a subquery, already reported
    name = _table_name(source.this)
    matches = [node for node in (*streams, *dynamic_tables, *unavailable) if node == name]
    if not matches:
        matches = [node for node in (*streams, *dynamic_tables, *unavailable) if node.lower() == name.lower()]
    if len(matches) != 1:
        known = sorted(streams)
        problems.append(
            f"{query.where}: FROM '{name}' is not a source or transform{did_you_mean(name, known)}; "
            f"known: {', '.join(known) or 'none'}"
        )
        query.failed = True
        return
    node = matches[0]
    if node in dynamic_tables:
        problems.append(
            f"{query.where}: FROM '{node}' reads a dynamic table, which is not a stream; "
            f"test keys with {CHECK_FUNCTION}('{node}', expr) instead"
        )
        query.failed = True
    elif node in unavailable:
        query.failed = True  # its own problems are reported where it is defined
    else:
        query.input = node


def collect_checks(query: Query, dynamic_tables: set[str], others: set[str], problems: list[str]) -> None:
    for call in query.select.find_all(exp.Anonymous):
        if call.name.lower() != CHECK_FUNCTION:
            continue
        args = call.expressions
        text = short(call)
        if len(args) != 2:
            problems.append(
                f"{query.where}: {text}: {CHECK_FUNCTION} takes 2 arguments (the dynamic table's id as a string, "
                f"then the value to look up), got {len(args)}"
            )
            query.failed = True
            continue
        name_arg = args[0]
        if not (isinstance(name_arg, exp.Literal) and name_arg.is_string):
            problems.append(
                f"{query.where}: {text}: the first argument must be the dynamic table's id as a string literal, "
                f"such as '{sorted(dynamic_tables)[0] if dynamic_tables else 'vip_customers'}'"
            )
            query.failed = True
            continue
        table_id = name_arg.name
        if table_id not in dynamic_tables:
            kind = " is not a dynamic table" if table_id in others else " is not a dynamic table of this pipeline"
            problems.append(
                f"{query.where}: {text}: '{table_id}'{kind}{did_you_mean(table_id, dynamic_tables)}; "
                f"dynamic tables: {', '.join(sorted(dynamic_tables)) or 'none'}"
            )
            query.failed = True
            continue
        query.checks.append(call)


# --------------------------------------------------------------------------------------------------------------
# Columns and types
# --------------------------------------------------------------------------------------------------------------


def _qualifiers(table: exp.Table, input_id: str) -> set[str]:
    """Qualifiers that name the input, folded: its alias if it has one, else its name as written and its last part."""
    if table.alias:
        return {table.alias.lower()}
    return {_table_name(table).lower(), table.name.lower(), input_id.lower()}


def resolve_columns(query: Query, columns: dict[str, PgType], problems: list[str]) -> bool:
    """Expand ``*``, then point every column at ``ROW`` under its declared spelling; False on unknown names."""
    select, where = query.select, query.where
    table = select.args["from_"].this
    qualifiers = _qualifiers(table, query.input or "")
    all_columns = {**columns, **METADATA_TYPES}
    folded: dict[str, list[str]] = {}
    for name in all_columns:
        folded.setdefault(name.lower(), []).append(name)
    ok = True

    def qualifier_ok(node: exp.Column) -> bool:
        qualifier = ".".join(part.name for part in node.parts[:-1])
        if qualifier and qualifier.lower() not in qualifiers:
            problems.append(
                f"{where}: '{short(node)}': '{qualifier}' does not name the input "
                f"(use {' or '.join(sorted(repr(q) for q in qualifiers))}, or no qualifier)"
            )
            return False
        return True

    projections: list[exp.Expr] = []
    for projection in select.expressions:
        star = isinstance(projection, exp.Star) or (
            isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)
        )
        if not star:
            projections.append(projection)
        elif isinstance(projection, exp.Star) or qualifier_ok(projection):
            projections.extend(exp.column(name, table=ROW, quoted=True) for name in all_columns)
        else:
            ok = False
    select.set("expressions", projections)

    for node in list(select.find_all(exp.Column)):
        if isinstance(node.this, exp.Star) or node.table == ROW:
            continue
        if not qualifier_ok(node):
            ok = False
            continue
        candidates = folded.get(node.name.lower(), [])
        exact = [c for c in candidates if c == node.name]
        if len(candidates) > 1 and not exact:
            problems.append(f"{where}: column '{node.name}' is ambiguous: the input has {', '.join(candidates)}")
            ok = False
        elif not candidates:
            problems.append(
                f"{where}: column '{node.name}' is not in '{query.input}'"
                f"{did_you_mean(node.name, list(all_columns))}; its columns: {', '.join(all_columns)}"
            )
            ok = False
        else:
            node.replace(exp.column((exact or candidates)[0], table=ROW, quoted=True))
    return ok


def infer_types(expressions: list[exp.Expr], columns: dict[str, PgType]) -> list[PgType | None]:
    """Postgres types of computed expressions over the input's Spark types; None where sqlglot cannot tell."""
    spark_types = {name: pg.spark_type for name, pg in {**columns, **METADATA_TYPES}.items()}
    probe = exp.select(*(e.copy() for e in expressions)).from_(exp.to_table("__cdc_input").as_(ROW))
    schema = MappingSchema({"__cdc_input": spark_types}, dialect=DIALECT, normalize=False)
    annotate_types(probe, schema=schema, dialect=DIALECT)
    return [_pg_type_of(e.type) for e in probe.expressions]


_PG_BY_SQLGLOT: dict[Any, str] = {
    exp.DataType.Type.TINYINT: "smallint",
    exp.DataType.Type.SMALLINT: "smallint",
    exp.DataType.Type.INT: "integer",
    exp.DataType.Type.BIGINT: "bigint",
    exp.DataType.Type.FLOAT: "real",
    exp.DataType.Type.DOUBLE: "double precision",
    exp.DataType.Type.DECIMAL: "numeric",
    exp.DataType.Type.BOOLEAN: "boolean",
    exp.DataType.Type.VARCHAR: "text",
    exp.DataType.Type.TEXT: "text",
    exp.DataType.Type.CHAR: "text",
    exp.DataType.Type.NVARCHAR: "text",
    exp.DataType.Type.NCHAR: "text",
    exp.DataType.Type.DATE: "date",
    exp.DataType.Type.TIMESTAMP: "timestamp with time zone",
    exp.DataType.Type.TIMESTAMPTZ: "timestamp with time zone",
    exp.DataType.Type.TIMESTAMPLTZ: "timestamp with time zone",
    exp.DataType.Type.TIMESTAMPNTZ: "timestamp without time zone",
    exp.DataType.Type.BINARY: "bytea",
    exp.DataType.Type.VARBINARY: "bytea",
}
"""Spark result types back to Postgres. A computed decimal becomes unconstrained ``numeric``: sqlglot's precision
arithmetic is not Spark's, and a declared precision too small would fail the write."""


def _pg_type_of(data_type: exp.DataType | None) -> PgType | None:
    if data_type is None:
        return None
    if data_type.this == exp.DataType.Type.ARRAY:
        element = _pg_type_of(data_type.expressions[0]) if data_type.expressions else None
        return PgType("array", (), element) if element is not None and not element.is_array else None
    name = _PG_BY_SQLGLOT.get(data_type.this)
    return PgType(name) if name else None


def spark_type(pg: PgType) -> exp.DataType:
    return exp.DataType.build(pg.spark_type, dialect=DIALECT)


def parse_type(path: str, text: str, problems: list[str]) -> PgType | None:
    try:
        return parse_pg_type(text)
    except UnknownTypeError as error:
        problems.append(f"{path}: {error}")
        return None

"""From the ``transforms:`` YAML to the :class:`~cdcsync.config.plan.PipelinePlan`: parse each SQL with sqlglot
(Spark dialect), refuse what cannot run statelessly over one micro-batch, infer output types, and rewrite the SQL
into what the runtime executes, exactly as the contract in :mod:`cdcsync.config.plan` states.

Why the rewrite looks the way it does:

* Every column is resolved here, as Spark would (case-insensitively, against the one input), and written back
  fully qualified with the input's alias, so the joins the rewrite adds can never make a name ambiguous and the
  user's own alias or stream name keeps working as a qualifier.
* The WHERE clause does not drop rows: a change it rejects must reach the sinks as a delete of its key, or the
  target would keep the version of the row from before the change. So the WHERE becomes a condition on the
  ``_cdc_op`` column, and computed columns are evaluated only for kept rows (``CASE WHEN keep THEN ... END``), so an
  ANSI error (a failed cast, a division by zero) cannot fire on a row the user filtered out.
* ``dynamic_table_check`` becomes LEFT JOINs against the key views with a broadcast hint: one hash lookup per row
  inside Spark, never a call per row to Python or to Postgres.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.schema import MappingSchema

from cdcsync.config.plan import (
    POSITION_SQL,
    DynamicTableSpec,
    PipelinePlan,
    SideOutput,
    TransformStep,
    batch_keys_view,
    input_view,
    prior_keys_view,
)
from cdcsync.config.transforms import DynamicTable, SqlTransform, TransformModel
from cdcsync.config.types import PgType, UnknownTypeError, parse_pg_type

DIALECT = "spark"
CHECK_FUNCTION = "dynamic_table_check"
ROW = "__cdc_row"
"""Alias of the input in every generated query; the user's alias and stream name are resolved to it."""

METADATA_TYPES: dict[str, PgType] = {
    "_cdc_op": PgType("text"),
    "_cdc_version": PgType("bigint"),
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
class _Query:
    """One parsed SQL text (a transform's, or a dynamic table's fill) on its way to Spark SQL."""

    where: str
    """YAML path of the SQL, the prefix of its problems."""
    select: exp.Select
    input: str | None = None
    checks: list[exp.Anonymous] = field(default_factory=list)
    """``dynamic_table_check`` calls whose arguments are valid."""
    failed: bool = False


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _short(node: exp.Expr, limit: int = 60) -> str:
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


def _parse(where: str, sql: str, problems: list[str]) -> exp.Select | None:
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
        problems.append(f"{where}: must be a SELECT statement, not {_short(statement, 40)!r}")
        return None
    return statement


def _check_shape(query: _Query, problems: list[str]) -> None:
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
                f"{where}: a subquery ({_short(node)}): it would read a stream a second time; "
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
            message = f"window function {_short(found)}: windows need state across micro-batches"
        elif isinstance(found, exp.AggFunc):
            message = (
                f"aggregate function {_short(found)}: aggregations need state across micro-batches; use a "
                "postgres_aggregate sink"
            )
        elif isinstance(found, _GENERATOR_CLASSES) or name in _GENERATORS:
            message = f"generator {_short(found)}: it yields several rows per change; a transform yields exactly one"
        elif isinstance(found, _NONDETERMINISTIC_CLASSES) or name in _NONDETERMINISTIC:
            message = (
                f"{_short(found)} is nondeterministic: a replayed micro-batch must yield the same rows, and the "
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


def _resolve_input(
    query: _Query,
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
            f"{query.where}: FROM '{name}' is not a source or transform{_did_you_mean(name, known)}; "
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


def _collect_checks(query: _Query, dynamic_tables: set[str], others: set[str], problems: list[str]) -> None:
    for call in query.select.find_all(exp.Anonymous):
        if call.name.lower() != CHECK_FUNCTION:
            continue
        args = call.expressions
        text = _short(call)
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
                f"{query.where}: {text}: '{table_id}'{kind}{_did_you_mean(table_id, dynamic_tables)}; "
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


def _resolve_columns(query: _Query, columns: dict[str, PgType], problems: list[str]) -> bool:
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
                f"{where}: '{_short(node)}': '{qualifier}' does not name the input "
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
                f"{_did_you_mean(node.name, list(all_columns))}; its columns: {', '.join(all_columns)}"
            )
            ok = False
        else:
            node.replace(exp.column((exact or candidates)[0], table=ROW, quoted=True))
    return ok


def _infer_types(expressions: list[exp.Expr], columns: dict[str, PgType]) -> list[PgType | None]:
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


def _spark_type(pg: PgType) -> exp.DataType:
    return exp.DataType.build(pg.spark_type, dialect=DIALECT)


def _parse_type(path: str, text: str, problems: list[str]) -> PgType | None:
    try:
        return parse_pg_type(text)
    except UnknownTypeError as error:
        problems.append(f"{path}: {error}")
        return None


# --------------------------------------------------------------------------------------------------------------
# Rewrite
# --------------------------------------------------------------------------------------------------------------


def _position() -> exp.Expr:
    position = sqlglot.parse_one(POSITION_SQL, read=DIALECT)
    for column in list(position.find_all(exp.Column)):
        column.replace(exp.column(column.name, table=ROW, quoted=True))
    return position


def _key_expression(value: exp.Expr, value_type: PgType | None, key_type: PgType) -> exp.Expr:
    """``value`` as the key type; a value that cannot be one is NULL (so it is no key, never an error)."""
    if value_type is not None and value_type.spark_type == key_type.spark_type:
        return value
    return exp.TryCast(this=value, to=_spark_type(key_type), safe=True)


def _rewrite_checks(
    query: _Query, specs: dict[str, DynamicTableSpec], columns: dict[str, PgType]
) -> list[tuple[exp.Expr, exp.Expr]]:
    """Replace each ``dynamic_table_check`` by a condition on LEFT JOINed key views; return the joins."""
    joins: list[tuple[exp.Expr, exp.Expr]] = []
    conditions: dict[tuple[str, str], exp.Expr] = {}
    value_types = _infer_types([call.expressions[1] for call in query.checks], columns) if query.checks else []
    for call, value_type in zip(query.checks, value_types, strict=True):
        spec = specs[call.expressions[0].name]
        value = call.expressions[1]
        if isinstance(value, exp.Column):
            value_type = columns.get(value.name, METADATA_TYPES.get(value.name))
        memo = (spec.id, value.sql(dialect=DIALECT))
        if memo not in conditions:
            key = _key_expression(value.copy(), value_type, spec.key_type)
            prior = f"__cdc_p{len(joins)}"
            joins.append((exp.to_table(prior_keys_view(spec.id)).as_(prior), exp.column("key", prior).eq(key)))
            condition: exp.Expr = exp.column("key", prior).is_(exp.null()).not_()
            if spec.fill is not None:
                batch = f"__cdc_b{len(joins)}"
                joins.append(
                    (exp.to_table(batch_keys_view(spec.id)).as_(batch), exp.column("key", batch).eq(key.copy()))
                )
                earlier = exp.and_(
                    exp.column("key", batch).is_(exp.null()).not_(), exp.column("pos", batch) < _position()
                )
                condition = exp.or_(condition, earlier)
            conditions[memo] = exp.paren(condition)
        call.replace(conditions[memo].copy())
    return joins


def _with_joins(select: exp.Select, view: str, joins: list[tuple[exp.Expr, exp.Expr]]) -> exp.Select:
    select.set("from_", exp.From(this=exp.to_table(view).as_(ROW)))
    for table, on in joins:
        select = select.join(table, on=on, join_type="left", copy=False)
    if joins:
        hint = exp.Anonymous(this="BROADCAST", expressions=[exp.to_identifier(t.alias) for t, _ in joins])
        select.set("hint", exp.Hint(expressions=[hint]))
    return select


def _spark_sql(select: exp.Select) -> str:
    return select.sql(dialect=DIALECT, identify=True)


# --------------------------------------------------------------------------------------------------------------
# SQL transforms
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Output:
    name: str
    expression: exp.Expr
    """Without its alias."""
    plain: str | None
    """The input column it is, when it is just a column."""


def _outputs(query: _Query, problems: list[str]) -> list[_Output] | None:
    outputs: list[_Output] = []
    ok = True
    for projection in query.select.expressions:
        inner = projection.unalias()
        plain = inner.name if isinstance(inner, exp.Column) else None
        if isinstance(projection, exp.Alias):
            name = projection.alias
        elif plain is not None:
            name = plain
        else:
            problems.append(f"{query.where}: computed column {_short(projection)} needs a name: add AS <name>")
            ok = False
            continue
        outputs.append(_Output(name, inner, plain))
    return outputs if ok else None


def _compile_transform(
    transform_id: str,
    transform: SqlTransform,
    query: _Query,
    columns: Columns,
    specs: dict[str, DynamicTableSpec],
    problems: list[str],
) -> TransformStep | None:
    where = query.where
    prefix = f"transforms.{transform_id}"
    before = len(problems)
    if not _resolve_columns(query, columns, problems):
        return None
    joins = _rewrite_checks(query, specs, columns)
    outputs = _outputs(query, problems)
    if outputs is None:
        return None

    seen: dict[str, str] = {}
    for output in outputs:
        folded = output.name.lower()
        if folded in seen:
            problems.append(f"{where}: two output columns are named '{output.name}' (Spark names are case-insensitive)")
        seen[folded] = output.name
        if output.name.lower().startswith("_cdc_") and (
            output.name not in METADATA_TYPES or output.plain != output.name
        ):
            problems.append(
                f"{where}: output column '{output.name}' is {_short(output.expression)}: names starting with '_cdc_' "
                "are reserved, and the _cdc_* columns must pass through unchanged"
            )
    names = {output.name for output in outputs}
    missing = [name for name in METADATA_TYPES if name not in names]
    if missing:
        problems.append(
            f"{where}: drops {', '.join(missing)}: every change's metadata must pass through the transform; "
            "list them in the SELECT or select *"
        )
    business = [o for o in outputs if o.name not in METADATA_TYPES]
    by_name = {o.name: o for o in business}
    for key in transform.primary_key:
        keyed = by_name.get(key)
        if keyed is None:
            problems.append(
                f"{prefix}.primary_key: '{key}' is not an output column of the sql"
                f"{_did_you_mean(key, list(by_name))}; output columns: {', '.join(by_name)}"
            )
        elif keyed.plain is None:
            problems.append(
                f"{prefix}.primary_key: '{key}' is computed ({_short(keyed.expression)}); a key column must be a "
                "plain column of the input, so that a change the WHERE rejects can still delete its key downstream"
            )
    if len(set(transform.primary_key)) != len(transform.primary_key):
        problems.append(f"{prefix}.primary_key: a column is listed twice")

    overrides: dict[str, PgType] = {}
    for name, type_text in transform.columns.items():
        path = f"{prefix}.columns.{name}"
        if name not in by_name:
            problems.append(f"{path}: not an output column of the sql{_did_you_mean(name, list(by_name))}")
        elif (declared := _parse_type(path, type_text, problems)) is not None:
            output = by_name[name]
            if name in transform.primary_key and output.plain and declared != columns.get(output.plain):
                problems.append(f"{path}: a key column keeps its input type ({columns[output.plain].sql})")
            overrides[name] = declared

    computed = [o for o in business if o.plain is None and o.name not in overrides]
    inferred = dict(
        zip((o.name for o in computed), _infer_types([o.expression for o in computed], columns), strict=True)
    )
    types: dict[str, PgType] = {}
    for output in business:
        pg = overrides.get(output.name) or (columns[output.plain] if output.plain else inferred[output.name])
        if pg is None:
            problems.append(
                f"{where}: cannot infer the type of column '{output.name}' ({_short(output.expression)}); "
                f"declare it under transforms.{transform_id}.columns, e.g. {output.name}: text"
            )
        else:
            types[output.name] = pg
    if len(problems) > before:
        return None

    condition = query.select.args.get("where")
    keep = condition.this if condition is not None else None
    projections: list[exp.Expr] = []
    for output in business:
        pg = types[output.name]
        expression = output.expression
        if output.plain is None or pg != columns[output.plain]:
            expression = exp.cast(expression, _spark_type(pg))
            if keep is not None:
                expression = exp.Case().when(keep.copy(), expression)
        projections.append(expression.as_(output.name, quoted=True))
    for name in METADATA_TYPES:
        column: exp.Expr = exp.column(name, table=ROW, quoted=True)
        if name == "_cdc_op" and keep is not None:
            truncate = exp.column(name, table=ROW, quoted=True).eq(exp.Literal.string("t"))
            column = exp.Case().when(exp.or_(keep.copy(), truncate), column).else_(exp.Literal.string("d"))
        projections.append(column.as_(name, quoted=True))
    select = exp.Select(expressions=projections)
    select = _with_joins(select, input_view(query.input or ""), joins)
    return TransformStep(
        id=transform_id,
        input=query.input or "",
        spark_sql=_spark_sql(select),
        primary_key=tuple(transform.primary_key),
        columns=tuple((o.name, types[o.name]) for o in business),
        dynamic_tables=tuple(sorted({call.expressions[0].name for call in query.checks})),
    )


# --------------------------------------------------------------------------------------------------------------
# Dynamic tables
# --------------------------------------------------------------------------------------------------------------

_UNKEYABLE = ("json",)
"""Types Postgres has no equality for, so they cannot be a primary key."""


def _key_type(path: str, pg: PgType, problems: list[str]) -> bool:
    if pg.is_array or pg.name in _UNKEYABLE:
        problems.append(f"{path}: a dynamic table's key must be a scalar type with equality, not {pg.sql}")
        return False
    return True


def _compile_dynamic_table(
    table_id: str,
    table: DynamicTable,
    query: _Query | None,
    columns: Columns | None,
    problems: list[str],
) -> DynamicTableSpec | None:
    prefix = f"transforms.{table_id}"
    declared = _parse_type(f"{prefix}.key_type", table.key_type, problems) if table.key_type else None
    if table.key_type and declared is None:
        return None
    if declared is not None and not _key_type(f"{prefix}.key_type", declared, problems):
        return None
    if query is None:
        return DynamicTableSpec(
            id=table_id,
            backend=table.backend_type,
            schema=table.schema_,
            table=table.backend_entity_name,
            key_column=table.key_column or "key",
            key_type=declared or PgType("text"),
        )
    assert columns is not None
    where = query.where
    if not _resolve_columns(query, columns, problems):
        return None
    projections = query.select.expressions
    if len(projections) != 1:
        problems.append(
            f"{where}: must select exactly one column, the key, got {len(projections)}"
            f"{' (* selects every column)' if len(projections) > 1 else ''}"
        )
        return None
    inner = projections[0].unalias()
    plain = inner.name if isinstance(inner, exp.Column) else None
    name = projections[0].alias or plain or "key"
    value_type = columns.get(plain, METADATA_TYPES.get(plain or "")) if plain else None
    if plain is None:
        value_type = _infer_types([inner], columns)[0]
    key_type = declared or value_type
    if key_type is None:
        problems.append(f"{where}: cannot infer the type of the key ({_short(inner)}); declare it as {prefix}.key_type")
        return None
    if declared is None and not _key_type(where, key_type, problems):
        return None
    key = _key_expression(inner, value_type, key_type)
    condition = query.select.args.get("where")
    not_null = key.copy().is_(exp.null()).not_()
    select = exp.Select(expressions=[key.as_("key", quoted=True), _position().as_("pos", quoted=True)])
    select = _with_joins(select, input_view(query.input or ""), [])
    select.set("where", exp.Where(this=exp.and_(condition.this, not_null) if condition is not None else not_null))
    return DynamicTableSpec(
        id=table_id,
        backend=table.backend_type,
        schema=table.schema_,
        table=table.backend_entity_name,
        key_column=table.key_column or name,
        key_type=key_type,
        fill=SideOutput(input=query.input or "", spark_sql=_spark_sql(select)),
    )


# --------------------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------------------


def _order(edges: dict[str, list[str]], problems: list[str]) -> list[str]:
    """Transform ids, each after everything it depends on; cycles are reported and left out."""
    order: list[str] = []
    state: dict[str, str] = {}
    reported: set[frozenset[str]] = set()

    def visit(node: str, path: list[str]) -> bool:
        if state.get(node) == "done":
            return True
        if state.get(node) == "failed":
            return False
        if state.get(node) == "active":
            cycle = [*path[path.index(node) :], node]
            if frozenset(cycle) not in reported:
                reported.add(frozenset(cycle))
                problems.append(f"transforms.{node}: a cycle: {' -> '.join(cycle)} (each reads or checks the next)")
            return False
        state[node] = "active"
        ok = all([visit(dep, [*path, node]) for dep in edges.get(node, []) if dep in edges])
        state[node] = "done"
        if ok:
            order.append(node)
        else:
            state[node] = "failed"
        return ok

    for node in sorted(edges):
        visit(node, [])
    return [n for n in order if state.get(n) == "done"]


def build_plan(
    sources: dict[str, Columns],
    transforms: dict[str, TransformModel],
    unavailable: set[str] = frozenset(),  # type: ignore[assignment]
) -> tuple[PipelinePlan, list[str]]:
    """The plan of ``transforms`` over ``sources``, and every problem found (``yaml.path: message``).

    ``unavailable`` names declared nodes whose own definition is invalid: reading them is not reported again.
    """
    problems: list[str] = []
    sql_ids = {tid for tid, t in transforms.items() if isinstance(t, SqlTransform)}
    table_ids = {tid for tid, t in transforms.items() if isinstance(t, DynamicTable)}
    streams = set(sources) | sql_ids

    queries: dict[str, _Query] = {}
    for transform_id, transform in transforms.items():
        if transform.sql is None:
            continue
        where = f"transforms.{transform_id}.sql"
        select = _parse(where, transform.sql, problems)
        if select is None:
            unavailable = unavailable | {transform_id}
            continue
        parsed = _Query(where, select)
        _check_shape(parsed, problems)
        _resolve_input(parsed, streams, table_ids, set(unavailable), problems)
        if isinstance(transform, SqlTransform):
            _collect_checks(parsed, table_ids, streams, problems)
        elif any(call.name.lower() == CHECK_FUNCTION for call in select.find_all(exp.Anonymous)):
            problems.append(f"{where}: {CHECK_FUNCTION} cannot be used in a dynamic table's own sql")
            parsed.failed = True
        declared_from = transform.from_ if isinstance(transform, SqlTransform) else None
        if declared_from is not None and parsed.input is not None and declared_from != [parsed.input]:
            problems.append(
                f"transforms.{transform_id}.from: {', '.join(declared_from)} does not match the sql, which "
                f"reads '{parsed.input}'"
            )
        queries[transform_id] = parsed

    edges: dict[str, list[str]] = {tid: [] for tid in transforms}
    for transform_id, parsed in queries.items():
        if parsed.input is not None:
            edges[transform_id].append(parsed.input)
        edges[transform_id].extend(call.expressions[0].name for call in parsed.checks)

    root: dict[str, str] = {source_id: source_id for source_id in sources}
    nodes: dict[str, Columns] = dict(sources)
    steps: list[TransformStep] = []
    specs: dict[str, DynamicTableSpec] = {}
    for transform_id in _order(edges, problems):
        transform = transforms[transform_id]
        query = queries.get(transform_id)
        if transform.sql is not None and (query is None or query.failed or query.input not in nodes):
            continue  # reported where the problem is
        if isinstance(transform, DynamicTable):
            spec = _compile_dynamic_table(
                transform_id, transform, query, nodes.get(query.input or "") if query else None, problems
            )
            if spec is not None:
                specs[transform_id] = spec
            continue
        assert query is not None and query.input is not None
        checked = [call.expressions[0].name for call in query.checks]
        if any(name not in specs for name in checked):
            continue
        mismatched = False
        for name in dict.fromkeys(checked):
            fill = specs[name].fill
            if fill is not None and root[fill.input] != root[query.input]:
                problems.append(
                    f"{query.where}: dynamic table '{name}' is filled from '{root[fill.input]}', but this transform "
                    f"reads '{root[query.input]}'; a table filled by its sql can only be checked by transforms of "
                    "the same source, whose changes it sees in the same micro-batch"
                )
                mismatched = True
        if mismatched:
            continue
        step = _compile_transform(transform_id, transform, query, nodes[query.input], specs, problems)
        if step is None:
            continue
        steps.append(step)
        root[transform_id] = root[query.input]
        nodes[transform_id] = dict(step.columns)
    plan = PipelinePlan(steps=tuple(steps), dynamic_tables=specs, source_of_node=root)
    return plan, problems

"""From the ``transforms:`` YAML to the :class:`~cdcsync.config.plan.PipelinePlan`: parse each SQL with sqlglot
(Spark dialect), refuse what cannot run statelessly over one micro-batch, infer output types, and rewrite the SQL
into what the runtime executes, exactly as the contract in :mod:`cdcsync.config.plan` states. The analysis (parse,
shape, inputs, columns, types) is :mod:`cdcsync.config.sqlcheck`; this module rewrites and assembles the plan.

Why the rewrite looks the way it does:

* Every column is resolved here, as Spark would (case-insensitively, against the one input), and written back
  fully qualified with the input's alias, so the joins the rewrite adds can never make a name ambiguous and the
  user's own alias or stream name keeps working as a qualifier.
* The WHERE clause does not drop rows: a change it rejects must reach the sinks as a delete of its key, or the
  target would keep the version of the row from before the change. So the WHERE becomes a condition on the
  ``_cdc_op`` column, and computed columns are evaluated only for kept rows (``CASE WHEN keep THEN ... END``), so an
  ANSI error (a failed cast, a division by zero) cannot fire on a row the user filtered out.
* ``dynamic_table_check`` becomes LEFT JOINs against the key views with a broadcast hint: one hash lookup per row
  inside Spark, never a call per row to Python or to Postgres. The integer keys of a Postgres table are tested
  by a function instead (:attr:`~cdcsync.config.plan.DynamicTableSpec.checked_by_function`), vectorised: one
  call per Arrow batch of rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from cdcsync.config.base import did_you_mean
from cdcsync.config.plan import (
    POSITION_SQL,
    DynamicTableSpec,
    PipelinePlan,
    SideOutput,
    TransformStep,
    batch_keys_view,
    input_view,
    key_check_function,
    prior_keys_view,
)
from cdcsync.config.sqlcheck import (
    CHECK_FUNCTION,
    DIALECT,
    METADATA_TYPES,
    ROW,
    Columns,
    Query,
    check_shape,
    collect_checks,
    infer_types,
    parse_select,
    parse_type,
    resolve_columns,
    resolve_input,
    short,
    spark_type,
)
from cdcsync.config.transforms import DynamicTable, SqlTransform, TransformModel
from cdcsync.config.types import PgType
from cdcsync.core.names import KEY_MOVE_OP

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
    return exp.TryCast(this=value, to=spark_type(key_type), safe=True)


def _rewrite_checks(
    query: Query, specs: dict[str, DynamicTableSpec], columns: dict[str, PgType]
) -> list[tuple[exp.Expr, exp.Expr]]:
    """Replace each ``dynamic_table_check`` by a condition on LEFT JOINed key views (or a key check function);
    return the joins."""
    joins: list[tuple[exp.Expr, exp.Expr]] = []
    conditions: dict[tuple[str, str], exp.Expr] = {}
    value_types = infer_types([call.expressions[1] for call in query.checks], columns) if query.checks else []
    for call, value_type in zip(query.checks, value_types, strict=True):
        spec = specs[call.expressions[0].name]
        value = call.expressions[1]
        if isinstance(value, exp.Column):
            value_type = columns.get(value.name, METADATA_TYPES.get(value.name))
        memo = (spec.id, value.sql(dialect=DIALECT))
        if memo not in conditions:
            key = _key_expression(value.copy(), value_type, spec.key_type)
            condition: exp.Expr
            if spec.checked_by_function:
                check = exp.Anonymous(this=key_check_function(spec.id), expressions=[key.copy()])
                condition = exp.Is(this=check, expression=exp.true())  # typed boolean for the type inference
            else:
                prior = f"__cdc_p{len(joins)}"
                joins.append((exp.to_table(prior_keys_view(spec.id)).as_(prior), exp.column("key", prior).eq(key)))
                condition = exp.column("key", prior).is_(exp.null()).not_()
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


def _outputs(query: Query, problems: list[str]) -> list[_Output] | None:
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
            problems.append(f"{query.where}: computed column {short(projection)} needs a name: add AS <name>")
            ok = False
            continue
        outputs.append(_Output(name, inner, plain))
    return outputs if ok else None


def _compile_transform(
    transform_id: str,
    transform: SqlTransform,
    query: Query,
    columns: Columns,
    specs: dict[str, DynamicTableSpec],
    problems: list[str],
    placeholders: dict[str, set[str]],
    source: str,
) -> TransformStep | None:
    """The step of one SQL transform; ``placeholders`` (node -> columns that may hold Debezium's TOAST
    placeholder) gains the transform's own such columns, those it passes through unchanged."""
    where = query.where
    prefix = f"transforms.{transform_id}"
    before = len(problems)
    if not resolve_columns(query, columns, problems):
        return None
    _check_placeholder_reads(query, placeholders, source, problems)
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
                f"{where}: output column '{output.name}' is {short(output.expression)}: names starting with '_cdc_' "
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
                f"{did_you_mean(key, list(by_name))}; output columns: {', '.join(by_name)}"
            )
        elif keyed.plain is None:
            problems.append(
                f"{prefix}.primary_key: '{key}' is computed ({short(keyed.expression)}); a key column must be a "
                "plain column of the input, so that a change the WHERE rejects can still delete its key downstream"
            )
    if len(set(transform.primary_key)) != len(transform.primary_key):
        problems.append(f"{prefix}.primary_key: a column is listed twice")

    overrides: dict[str, PgType] = {}
    for name, type_text in transform.columns.items():
        path = f"{prefix}.columns.{name}"
        if name not in by_name:
            problems.append(f"{path}: not an output column of the sql{did_you_mean(name, list(by_name))}")
        elif (declared := parse_type(path, type_text, problems)) is not None:
            output = by_name[name]
            if name in transform.primary_key and output.plain and declared != columns.get(output.plain):
                problems.append(f"{path}: a key column keeps its input type ({columns[output.plain].sql})")
            overrides[name] = declared

    computed = [o for o in business if o.plain is None and o.name not in overrides]
    inferred = dict(
        zip((o.name for o in computed), infer_types([o.expression for o in computed], columns), strict=True)
    )
    types: dict[str, PgType] = {}
    for output in business:
        pg = overrides.get(output.name) or (columns[output.plain] if output.plain else inferred[output.name])
        if pg is None:
            problems.append(
                f"{where}: cannot infer the type of column '{output.name}' ({short(output.expression)}); "
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
            expression = exp.cast(expression, spark_type(pg))
            if keep is not None:
                expression = exp.Case().when(keep.copy(), expression)
        projections.append(expression.as_(output.name, quoted=True))
    for name in METADATA_TYPES:
        column: exp.Expr = exp.column(name, table=ROW, quoted=True)
        if name == "_cdc_op" and keep is not None:
            # Truncates and key-move rows (KEY_MOVE_OP) are no changes of a row: they pass as they are.
            passes = exp.column(name, table=ROW, quoted=True).isin(
                exp.Literal.string("t"), exp.Literal.string(KEY_MOVE_OP)
            )
            column = exp.Case().when(exp.or_(keep.copy(), passes), column).else_(exp.Literal.string("d"))
        projections.append(column.as_(name, quoted=True))
    select = exp.Select(expressions=projections)
    select = _with_joins(select, input_view(query.input or ""), joins)
    may_hold = placeholders.get(query.input or "", set())
    placeholders[transform_id] = {o.name for o in business if o.plain in may_hold and o.name not in overrides}
    return TransformStep(
        id=transform_id,
        input=query.input or "",
        spark_sql=_spark_sql(select),
        primary_key=tuple(transform.primary_key),
        columns=tuple((o.name, types[o.name]) for o in business),
        dynamic_tables=tuple(sorted({call.expressions[0].name for call in query.checks})),
    )


def _check_placeholder_reads(
    query: Query, placeholders: dict[str, set[str]], source: str, problems: list[str], *, key: bool = False
) -> None:
    """Refuse a WHERE or computed column over a column that may hold Debezium's TOAST placeholder.

    An update that leaves a large value unchanged carries the placeholder instead of it: a filter over that column
    would turn the update into a delete (or keep a row it should drop), a computed column would land a wrong
    value. Passing the column through unchanged is fine: the sinks keep the stored value for a placeholder. There
    is no stored value a transform could read instead, so the source must send every value (REPLICA IDENTITY FULL)
    or declare that the column is never TOASTed. ``key``: the query selects a dynamic table's key, where even a
    plain column would add the placeholder as a key.
    """
    may_hold = placeholders.get(query.input or "", set())
    if not may_hold:
        return
    places: list[tuple[str, exp.Expr]] = []
    condition = query.select.args.get("where")
    if condition is not None:
        places.append(("its WHERE", condition))
    for projection in query.select.expressions:
        inner = projection.unalias()
        if key:
            places.append(("the key it selects", inner))
        elif not isinstance(inner, exp.Column):
            places.append((f"the computed column {short(projection)}", inner))
    for place, node in places:
        for name in dict.fromkeys(column.name for column in node.find_all(exp.Column)):
            if name in may_hold:
                problems.append(
                    f"{query.where}: reads '{name}' in {place}, but an update that leaves a large (TOASTed) value "
                    f"of '{name}' unchanged reaches Kafka with Debezium's placeholder instead of the value, and the "
                    f"transform would treat the placeholder as data. Set REPLICA IDENTITY FULL on the table of "
                    f"source '{source}' and declare `replica_identity: full` on it, or, if the values of '{name}' "
                    f"stay under 2 kB, list it in sources.{source}.untoasted_columns"
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
    query: Query | None,
    columns: Columns | None,
    problems: list[str],
    placeholders: dict[str, set[str]],
    source: str,
) -> DynamicTableSpec | None:
    prefix = f"transforms.{table_id}"
    declared = parse_type(f"{prefix}.key_type", table.key_type, problems) if table.key_type else None
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
    if not resolve_columns(query, columns, problems):
        return None
    _check_placeholder_reads(query, placeholders, source, problems, key=True)
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
        value_type = infer_types([inner], columns)[0]
    key_type = declared or value_type
    if key_type is None:
        problems.append(f"{where}: cannot infer the type of the key ({short(inner)}); declare it as {prefix}.key_type")
        return None
    if declared is None and not _key_type(where, key_type, problems):
        return None
    key = _key_expression(inner, value_type, key_type)
    condition = query.select.args.get("where")
    # A key-move row is no change of a row: it adds no key.
    not_move = exp.column("_cdc_op", table=ROW, quoted=True).neq(exp.Literal.string(KEY_MOVE_OP))
    not_null = exp.and_(key.copy().is_(exp.null()).not_(), not_move)
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
    placeholders: dict[str, set[str]] | None = None,
) -> tuple[PipelinePlan, list[str]]:
    """The plan of ``transforms`` over ``sources``, and every problem found (``yaml.path: message``).

    ``unavailable`` names declared nodes whose own definition is invalid: reading them is not reported again.
    ``placeholders``: source -> its columns that may hold Debezium's TOAST placeholder (see
    :func:`_check_placeholder_reads`).
    """
    problems: list[str] = []
    placeholders = {source_id: set(names) for source_id, names in (placeholders or {}).items()}
    sql_ids = {tid for tid, t in transforms.items() if isinstance(t, SqlTransform)}
    table_ids = {tid for tid, t in transforms.items() if isinstance(t, DynamicTable)}
    streams = set(sources) | sql_ids

    queries: dict[str, Query] = {}
    for transform_id, transform in transforms.items():
        if transform.sql is None:
            continue
        where = f"transforms.{transform_id}.sql"
        select = parse_select(where, transform.sql, problems)
        if select is None:
            unavailable = unavailable | {transform_id}
            continue
        parsed = Query(where, select)
        check_shape(parsed, problems)
        resolve_input(parsed, streams, table_ids, set(unavailable), problems)
        if isinstance(transform, SqlTransform):
            collect_checks(parsed, table_ids, streams, problems)
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
                transform_id,
                transform,
                query,
                nodes.get(query.input or "") if query else None,
                problems,
                placeholders,
                root.get(query.input or "", "") if query else "",
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
        step = _compile_transform(
            transform_id, transform, query, nodes[query.input], specs, problems, placeholders, root[query.input]
        )
        if step is None:
            continue
        steps.append(step)
        root[transform_id] = root[query.input]
        nodes[transform_id] = dict(step.columns)
    plan = PipelinePlan(steps=tuple(steps), dynamic_tables=specs, source_of_node=root)
    return plan, problems

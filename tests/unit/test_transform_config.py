"""SQL transforms and dynamic tables: what validation accepts, what it refuses (with the transform's YAML path), and
the plan it builds (inputs, output columns and types, dynamic table keys)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.config.sqlcheck import METADATA_TYPES
from cdcsync.config.types import PgType, parse_pg_type
from cdcsync.core.errors import ConfigError, exit_code_for
from cdcsync.sources.debezium.envelope import CDC_COLUMNS

pytestmark = pytest.mark.unit

ALL = "*"
META = "_cdc_op, _cdc_version, _cdc_ts, _cdc_topic, _cdc_partition, _cdc_offset"


def pipeline_doc(transforms: dict[str, Any], sink_from: str = "big_orders", **sink: Any) -> dict[str, Any]:
    return {
        "name": "shop",
        "sources": {
            "orders": {
                "type": "kafka",
                "topic": "shop.public.orders",
                "primary_key": "id",
                "columns": {"id": "bigint", "customer_id": "bigint", "amount": "numeric(12,2)", "Note": "text"},
                "untoasted_columns": ["Note"],
            },
            "raw.transactions": {
                "type": "kafka",
                "topic": "shop.public.transactions",
                "primary_key": "tx_id",
                "columns": {"tx_id": "text", "user_id": "bigint", "at": "timestamptz"},
            },
        },
        "transforms": transforms,
        "sinks": {"out": {"type": "postgres", "from": sink_from, "table": "out", **sink}},
    }


def sql_transform(sql: str, primary_key: Any = "id", **extra: Any) -> dict[str, Any]:
    return {"type": "sql", "sql": sql, "primary_key": primary_key, **extra}


VIP = {
    "type": "dynamic_table",
    "backend_type": "postgres",
    "backend_entity_name": "vip_customers",
    "key_type": "bigint",
}
SEEN = {
    "type": "dynamic_table",
    "backend_type": "Postgres",
    "backend_entity_name": "seen_users",
    "sql": "SELECT user_id FROM raw.transactions",
}


def valid(transforms: dict[str, Any], sink_from: str = "big_orders", **sink: Any) -> Pipeline:
    return validate_pipeline_dict(pipeline_doc(transforms, sink_from, **sink))


def problems_of(transforms: dict[str, Any], sink_from: str = "big_orders", **sink: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(pipeline_doc(transforms, sink_from, **sink))
    assert exit_code_for(caught.value) == 2
    return caught.value.problems


def problems_of_doc(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(doc)
    return caught.value.problems


def assert_problem(problems: list[str], prefix: str, *fragments: str) -> None:
    matching = [p for p in problems if p.startswith(prefix) and all(f in p for f in fragments)]
    assert matching, f"no problem starting with {prefix!r} containing {fragments}: {problems}"


# --------------------------------------------------------------------------------------------------------------
# Accepted
# --------------------------------------------------------------------------------------------------------------


def test_metadata_types_are_the_decoders() -> None:
    assert [(name, pg.spark_type) for name, pg in METADATA_TYPES.items()] == list(CDC_COLUMNS)


def test_filter_with_star_keeps_every_column_and_the_sink_reads_them() -> None:
    pipeline = valid({"big_orders": sql_transform("SELECT * FROM orders WHERE amount > 100")})
    assert list(pipeline.columns_of("big_orders")) == ["id", "customer_id", "amount", "Note"]
    assert pipeline.columns_of("big_orders")["amount"] == parse_pg_type("numeric(12,2)")
    assert pipeline.primary_key_of("big_orders") == ["id"]
    assert pipeline.sink_primary_key(pipeline.sinks["out"]) == ["id"]
    assert pipeline.source_of(pipeline.sinks["out"]) is pipeline.sources["orders"]
    assert list(pipeline.sinks_of("orders")) == ["out"] and pipeline.sinks_of("raw.transactions") == {}
    assert pipeline.plan.source_of_node == {
        "orders": "orders",
        "raw.transactions": "raw.transactions",
        "big_orders": "orders",
    }
    (step,) = pipeline.plan.steps
    assert step.input == "orders" and step.primary_key == ("id",) and step.dynamic_tables == ()


def test_output_types_are_inferred_and_overridable() -> None:
    sql = (
        f"SELECT id, customer_id * 2 AS doubled, upper(note) AS loud, amount + 1 AS more, id > 3 AS big, "
        f"date(_cdc_ts) AS day, customer_id AS customer, {META} FROM orders"
    )
    pipeline = valid({"big_orders": sql_transform(sql, columns={"more": "numeric(14,2)"})})
    types = {name: pg.sql for name, pg in pipeline.columns_of("big_orders").items()}
    assert types == {
        "id": "bigint",
        "doubled": "bigint",
        "loud": "text",
        "more": "numeric(14,2)",
        "big": "boolean",
        "day": "date",
        "customer": "bigint",
    }


def test_computed_decimals_are_unconstrained_numeric() -> None:
    # sqlglot's decimal precision arithmetic is not Spark's; a too small precision would fail the write.
    pipeline = valid({"big_orders": sql_transform(f"SELECT id, amount * 3 AS triple, {META} FROM orders")})
    assert pipeline.columns_of("big_orders")["triple"] == PgType("numeric")


def test_dotted_streamling_names_and_qualifiers() -> None:
    transforms = {
        "big_orders": sql_transform(
            f"SELECT tx_id, raw.transactions.user_id, transactions.at, {META} FROM raw.transactions "
            "WHERE raw.transactions.user_id > 0",
            primary_key="tx_id",
        )
    }
    pipeline = valid(transforms)
    assert list(pipeline.columns_of("big_orders")) == ["tx_id", "user_id", "at"]
    assert pipeline.plan.steps[0].input == "raw.transactions"


def test_alias_qualifies_and_columns_resolve_case_insensitively() -> None:
    pipeline = valid({"big_orders": sql_transform(f"SELECT o.ID, o.NOTE AS remark, {META} FROM orders AS o")})
    # Spark resolves names case-insensitively; a plain column keeps its declared name and type.
    assert pipeline.columns_of("big_orders") == {"id": PgType("bigint"), "remark": PgType("text")}
    pipeline = valid({"big_orders": sql_transform("SELECT O.* FROM orders AS o")})
    assert list(pipeline.columns_of("big_orders")) == ["id", "customer_id", "amount", "Note"]


def test_from_key_is_optional_and_must_agree() -> None:
    assert valid({"big_orders": sql_transform("SELECT * FROM orders", **{"from": "orders"})}).plan.steps
    assert_problem(
        problems_of({"big_orders": sql_transform("SELECT * FROM orders", **{"from": "raw.transactions"})}),
        "transforms.big_orders.from: raw.transactions does not match the sql, which reads 'orders'",
    )


def test_chained_transforms_and_fan_out() -> None:
    transforms = {
        "positive": sql_transform("SELECT * FROM orders WHERE amount > 0"),
        "big_orders": sql_transform(f"SELECT id, amount, {META} FROM positive WHERE amount > 100"),
    }
    doc = pipeline_doc(transforms)
    doc["sinks"]["all"] = {"type": "postgres", "from": "positive", "table": "positive"}
    doc["sinks"]["raw"] = {"type": "postgres", "from": "orders", "table": "orders"}
    pipeline = validate_pipeline_dict(doc)
    assert [step.id for step in pipeline.plan.steps] == ["positive", "big_orders"]
    assert pipeline.plan.source_of_node["big_orders"] == "orders"
    assert set(pipeline.sinks_of("orders")) == {"out", "all", "raw"}
    assert list(pipeline.columns_of("big_orders")) == ["id", "amount"]


def test_dynamic_tables_resolve_keys_and_spellings() -> None:
    transforms = {
        "vip": VIP,
        "memo": {"type": "dynamic_table", "backend_type": "in-memory", "backend_entity_name": "memo"},
        "InMem": {"type": "dynamic_table", "backend_type": "InMemory", "backend_entity_name": "x"},
        "seen": SEEN,
        "renamed": {**SEEN, "backend_entity_name": "r", "key_column": "uid", "key_type": "text"},
        "big_orders": sql_transform(
            "SELECT * FROM raw.transactions WHERE NOT dynamic_table_check('seen', user_id) "
            "AND dynamic_table_check('vip', user_id)",
            primary_key="tx_id",
        ),
    }
    pipeline = valid(transforms)
    tables = pipeline.plan.dynamic_tables
    assert (tables["vip"].backend, tables["vip"].key_column, tables["vip"].key_type) == (
        "postgres",
        "key",
        PgType("bigint"),
    )
    assert tables["vip"].schema == "public" and tables["vip"].table == "vip_customers" and tables["vip"].fill is None
    assert tables["memo"].backend == "in_memory" and tables["memo"].key_type == PgType("text")
    assert tables["InMem"].backend == "in_memory"
    assert (tables["seen"].key_column, tables["seen"].key_type) == ("user_id", PgType("bigint"))
    assert tables["seen"].fill is not None and tables["seen"].fill.input == "raw.transactions"
    assert (tables["renamed"].key_column, tables["renamed"].key_type) == ("uid", PgType("text"))
    assert pipeline.plan.steps[0].dynamic_tables == ("seen", "vip")
    assert pipeline.transforms["vip"].backend_type == "postgres"


def test_dynamic_table_key_type_inferred_from_a_computed_column() -> None:
    transforms = {
        "lowered": {
            "type": "dynamic_table",
            "backend_type": "postgres",
            "backend_entity_name": "lowered",
            "sql": "SELECT lower(note) AS email FROM orders WHERE amount > 0",
        },
        "big_orders": sql_transform("SELECT * FROM orders WHERE dynamic_table_check('lowered', lower(note))"),
    }
    spec = valid(transforms).plan.dynamic_tables["lowered"]
    assert (spec.key_column, spec.key_type) == ("email", PgType("text"))


def test_key_move_rows_pass_a_where_and_add_no_dynamic_table_key() -> None:
    """A key-move row (op 'n': the new key of a primary-key change, cdcsync.sinks.key_moves) is no change of a row:
    a transform's WHERE must not turn it into a delete of the new key, and a side output must not add its key."""
    transforms = {
        "lowered": {
            "type": "dynamic_table",
            "backend_type": "postgres",
            "backend_entity_name": "lowered",
            "sql": "SELECT id FROM orders WHERE amount > 0",
        },
        "big_orders": sql_transform("SELECT * FROM orders WHERE amount > 100"),
    }
    plan = valid(transforms).plan
    (step,) = plan.steps
    fill = plan.dynamic_tables["lowered"].fill
    assert fill is not None
    assert "IN ('t', 'n') THEN" in step.spark_sql and "ELSE 'd'" in step.spark_sql
    assert "<> 'n'" in fill.spark_sql


def test_a_filling_table_is_planned_before_the_transforms_that_check_it() -> None:
    transforms = {
        "a_checks": sql_transform("SELECT * FROM positive WHERE NOT dynamic_table_check('seen', id)"),
        "seen": {**SEEN, "sql": "SELECT id FROM positive"},
        "positive": sql_transform("SELECT * FROM orders WHERE amount > 0"),
        "big_orders": sql_transform("SELECT * FROM a_checks"),
    }
    pipeline = valid(transforms)
    order = [step.id for step in pipeline.plan.steps]
    assert order.index("positive") < order.index("a_checks") < order.index("big_orders")


def test_transforms_may_not_filter_or_compute_on_a_column_that_may_hold_the_toast_placeholder() -> None:
    """An unchanged large value arrives as Debezium's placeholder: a WHERE over it would delete the row downstream,
    a computed column would land a wrong value, a dynamic table would gain the placeholder as a key."""
    transforms = {
        "passes": sql_transform("SELECT id, customer_id, Note AS memo, " + META + " FROM orders"),
        "big_orders": sql_transform("SELECT *, upper(memo) AS loud FROM passes WHERE memo <> ''"),
        "noted": {**SEEN, "sql": "SELECT Note FROM orders"},
    }
    doc = pipeline_doc(transforms)
    del doc["sources"]["orders"]["untoasted_columns"]
    problems = problems_of_doc(doc)
    expected = (
        "transforms.big_orders.sql: reads 'memo' in its WHERE, but an update that leaves a large (TOASTed) value of "
        "'memo' unchanged reaches Kafka with Debezium's placeholder instead of the value, and the transform would "
        "treat the placeholder as data. Set REPLICA IDENTITY FULL on the table of source 'orders' and declare "
        "`replica_identity: full` on it, or, if the values of 'memo' stay under 2 kB, list it in "
        "sources.orders.untoasted_columns"
    )
    assert_problem(problems, expected)
    assert_problem(problems, "transforms.big_orders.sql: reads 'memo' in the computed column UPPER(memo) AS loud")
    assert_problem(problems, "transforms.noted.sql: reads 'Note' in the key it selects")
    assert not [p for p in problems if p.startswith("transforms.passes")]  # passing it through is fine
    assert len(problems) == 3

    doc["sources"]["orders"]["replica_identity"] = "full"  # Debezium then sends every value
    assert validate_pipeline_dict(doc).plan.steps


def test_arrays_without_a_debezium_placeholder_need_replica_identity_full_or_to_be_declared_small() -> None:
    doc = pipeline_doc({}, sink_from="orders")
    doc["sources"]["orders"]["columns"].update({"tags": "text[]", "ids": "uuid[]", "prices": "numeric(10,2)[]"})
    doc["sources"]["orders"]["columns"]["flags"] = "smallint[]"
    problems = problems_of_doc(doc)
    for name, pg in (("prices", "numeric(10,2)[]"), ("flags", "smallint[]")):
        assert_problem(
            problems,
            f"sources.orders.columns.{name}: Debezium has no placeholder for an unchanged large (TOASTed) {pg}: an "
            "update that leaves such a value unchanged arrives as NULL and would overwrite it. Set REPLICA IDENTITY "
            "FULL on the source table and declare `replica_identity: full` on the source, or, if the column's "
            f"values stay under 2 kB, list '{name}' in its untoasted_columns",
        )
    assert len(problems) == 2  # text[] and uuid[] have placeholders of their own type
    doc["sources"]["orders"]["untoasted_columns"] = ["Note", "prices", "flags", "nope"]
    assert problems_of_doc(doc) == ["sources.orders.untoasted_columns: 'nope' is not a column of the source"]
    del doc["sources"]["orders"]["untoasted_columns"]
    doc["sources"]["orders"]["replica_identity"] = "full"
    assert validate_pipeline_dict(doc).sources["orders"].placeholder_columns() == {}


# --------------------------------------------------------------------------------------------------------------
# Refused
# --------------------------------------------------------------------------------------------------------------

BAD_SQL: list[tuple[str, str, tuple[str, ...]]] = [
    ("SELECT * FROM orders WHERE (", "not valid Spark SQL", ()),
    ("SELECT * FROM orders; SELECT * FROM orders", "exactly one SELECT statement", ()),
    ("INSERT INTO x SELECT * FROM orders", "must be a SELECT", ()),
    ("SELECT * FROM orders UNION ALL SELECT * FROM orders", "UNION combines several queries", ()),
    ("SELECT 1 AS id", "has no FROM", ()),
    ("SELECT * FROM order", "FROM 'order' is not a source or transform (did you mean 'orders'?)", ()),
    (
        "SELECT * FROM orders o JOIN raw.transactions t ON o.customer_id = t.user_id",
        "a join",
        ("joins between streams",),
    ),
    ("SELECT * FROM orders, raw.transactions", "a join", ("comma joins",)),
    ("SELECT customer_id, count(*) AS n FROM orders GROUP BY customer_id", "GROUP BY", ()),
    ("SELECT * FROM orders HAVING amount > 1", "HAVING", ()),
    ("SELECT id, sum(amount) AS total FROM orders", "aggregate function SUM(amount)", ()),
    ("SELECT *, row_number() OVER (PARTITION BY customer_id ORDER BY id) AS n FROM orders", "window function", ()),
    ("SELECT * FROM orders ORDER BY id", "ORDER BY", ()),
    ("SELECT * FROM orders LIMIT 10", "LIMIT", ()),
    ("SELECT DISTINCT * FROM orders", "DISTINCT", ()),
    ("SELECT *, explode(array(1, 2)) AS x FROM orders", "generator", ()),
    ("SELECT * FROM orders LATERAL VIEW explode(array(1, 2)) t AS x", "LATERAL VIEW", ()),
    ("SELECT * FROM orders WHERE id IN (SELECT id FROM orders)", "a subquery", ()),
    ("SELECT * FROM orders WHERE rand() < 0.5", "RAND() is nondeterministic", ()),
    ("SELECT *, uuid() AS u FROM orders", "UUID() is nondeterministic", ()),
    ("SELECT * FROM (SELECT * FROM orders) o", "FROM a subquery", ()),
    ("WITH o AS (SELECT * FROM orders) SELECT * FROM o", "WITH", ()),
    ("SELECT /*+ REPARTITION(4) */ * FROM orders", "query hints", ()),
    ("SELECT *, amount * 2 FROM orders", "computed column amount * 2 needs a name", ()),
    ("SELECT *, nope AS n FROM orders", "column 'nope' is not in 'orders'", ()),
    ("SELECT *, amout AS n FROM orders", "column 'amout' is not in 'orders' (did you mean 'amount'?)", ()),
    ("SELECT *, x.id AS n FROM orders", "'x' does not name the input", ()),
    (
        "SELECT *, my_udf(id) AS n FROM orders",
        "cannot infer the type of column 'n'",
        ("transforms.big_orders.columns",),
    ),
    (f"SELECT id, amount, {META.replace('_cdc_ts, ', '')} FROM orders", "drops _cdc_ts", ()),
    (
        f"SELECT id, {META.replace('_cdc_version', '_cdc_offset AS _cdc_version')} FROM orders",
        "output column '_cdc_version'",
        (),
    ),
    (f"SELECT id, id AS _cdc_extra, {META} FROM orders", "output column '_cdc_extra'", ("reserved",)),
    (f"SELECT id, id AS ID, {META} FROM orders", "two output columns are named 'ID'", ()),
]


@pytest.mark.parametrize(("sql", "message", "more"), BAD_SQL)
def test_bad_sql_is_refused_with_the_transform_path(sql: str, message: str, more: tuple[str, ...]) -> None:
    assert_problem(problems_of({"big_orders": sql_transform(sql)}), "transforms.big_orders.sql: ", message, *more)


def test_every_problem_is_reported_at_once() -> None:
    problems = problems_of(
        {
            "a": sql_transform("SELECT customer_id, count(*) AS n FROM orders GROUP BY customer_id ORDER BY n"),
            "big_orders": sql_transform("SELECT * FROM orderz"),
        }
    )
    assert_problem(problems, "transforms.a.sql: GROUP BY")
    assert_problem(problems, "transforms.a.sql: ORDER BY")
    assert_problem(problems, "transforms.big_orders.sql: FROM 'orderz'")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            "dynamic_table_check('vip')",
            "takes 2 arguments (the dynamic table's id as a string, then the value to look up), got 1",
        ),
        ("dynamic_table_check('vip', id, id)", "got 3"),
        ("dynamic_table_check(vip, id)", "the first argument must be the dynamic table's id as a string literal"),
        ("dynamic_table_check('vips', id)", "'vips' is not a dynamic table of this pipeline (did you mean 'vip'?)"),
        ("dynamic_table_check('orders', id)", "'orders' is not a dynamic table"),
    ],
)
def test_bad_dynamic_table_checks(call: str, message: str) -> None:
    problems = problems_of({"vip": VIP, "big_orders": sql_transform(f"SELECT * FROM orders WHERE {call}")})
    assert_problem(problems, "transforms.big_orders.sql: ", message)


def test_check_of_a_table_filled_from_another_source_is_refused() -> None:
    problems = problems_of(
        {"seen": SEEN, "big_orders": sql_transform("SELECT * FROM orders WHERE dynamic_table_check('seen', id)")}
    )
    assert_problem(
        problems, "transforms.big_orders.sql: dynamic table 'seen' is filled from 'raw.transactions'", "reads 'orders'"
    )


def test_reading_a_dynamic_table_as_a_stream_is_refused() -> None:
    problems = problems_of({"vip": VIP, "big_orders": sql_transform("SELECT * FROM vip")})
    assert_problem(
        problems, "transforms.big_orders.sql: FROM 'vip' reads a dynamic table", "dynamic_table_check('vip', expr)"
    )
    problems = problems_of({"vip": VIP}, sink_from="vip")
    assert_problem(problems, "sinks.out.from: 'vip' is a dynamic table, not a stream")


def test_cycles_are_refused() -> None:
    problems = problems_of(
        {
            "a": sql_transform("SELECT * FROM big_orders"),
            "big_orders": sql_transform("SELECT * FROM a"),
        }
    )
    assert_problem(problems, "transforms.a: a cycle: a -> big_orders -> a")
    # A transform that checks a table filled from its own output.
    problems = problems_of(
        {
            "seen": {**SEEN, "sql": "SELECT id FROM big_orders"},
            "big_orders": sql_transform("SELECT * FROM orders WHERE NOT dynamic_table_check('seen', id)"),
        }
    )
    assert_problem(problems, "transforms.big_orders: a cycle: big_orders -> seen -> big_orders")


@pytest.mark.parametrize(
    ("sql", "primary_key", "prefix", "message"),
    [
        ("SELECT * FROM orders", "order_id", "transforms.big_orders.primary_key", "'order_id' is not an output column"),
        (
            f"SELECT customer_id, {META} FROM orders",
            "id",
            "transforms.big_orders.primary_key",
            "'id' is not an output column",
        ),
        (
            f"SELECT id + 1 AS id, {META} FROM orders",
            "id",
            "transforms.big_orders.primary_key",
            "'id' is computed (id + 1)",
        ),
        (
            f"SELECT CAST(id AS string) AS id, {META} FROM orders",
            "id",
            "transforms.big_orders.primary_key",
            "is computed",
        ),
        ("SELECT * FROM orders", ["id", "id"], "transforms.big_orders.primary_key", "listed twice"),
    ],
)
def test_primary_key_must_survive(sql: str, primary_key: Any, prefix: str, message: str) -> None:
    assert_problem(problems_of({"big_orders": sql_transform(sql, primary_key)}), prefix, message)


def test_renamed_key_is_a_plain_column() -> None:
    pipeline = valid({"big_orders": sql_transform(f"SELECT id AS order_id, {META} FROM orders", "order_id")})
    assert pipeline.sink_primary_key(pipeline.sinks["out"]) == ["order_id"]


def test_sink_primary_key_must_be_an_output_column() -> None:
    problems = problems_of({"big_orders": sql_transform(f"SELECT id, {META} FROM orders")}, primary_key="amount")
    assert_problem(problems, "sinks.out.primary_key: column 'amount' is not in transform 'big_orders'")


def test_columns_overrides_are_checked() -> None:
    problems = problems_of(
        {"big_orders": sql_transform("SELECT * FROM orders", columns={"nope": "text", "Note": "strange", "id": "text"})}
    )
    assert_problem(problems, "transforms.big_orders.columns.nope: not an output column")
    assert_problem(problems, "transforms.big_orders.columns.Note: 'strange' is not a Postgres type")
    assert_problem(problems, "transforms.big_orders.columns.id: a key column keeps its input type (bigint)")


@pytest.mark.parametrize(
    ("table", "prefix", "message"),
    [
        (
            {**SEEN, "sql": "SELECT user_id, tx_id FROM raw.transactions"},
            "transforms.seen.sql",
            "exactly one column, the key, got 2",
        ),
        ({**SEEN, "sql": "SELECT * FROM raw.transactions"}, "transforms.seen.sql", "(* selects every column)"),
        ({**SEEN, "sql": "SELECT user_id FROM raw.transactions GROUP BY user_id"}, "transforms.seen.sql", "GROUP BY"),
        ({**SEEN, "sql": "SELECT DISTINCT user_id FROM raw.transactions"}, "transforms.seen.sql", "DISTINCT"),
        (
            {**SEEN, "sql": "SELECT user_id FROM raw.transactions WHERE dynamic_table_check('seen', 1)"},
            "transforms.seen.sql",
            "cannot be used in a dynamic table's own sql",
        ),
        (
            {**SEEN, "sql": "SELECT my_udf(user_id) FROM raw.transactions"},
            "transforms.seen.sql",
            "declare it as transforms.seen.key_type",
        ),
        ({**SEEN, "key_type": "integer[]"}, "transforms.seen.key_type", "scalar type"),
        ({**SEEN, "key_type": "nonsense"}, "transforms.seen.key_type", "not a Postgres type"),
        (
            {**SEEN, "backend_type": "redis"},
            "transforms.seen.backend_type",
            "'redis' is not one of postgres, in_memory",
        ),
        ({**SEEN, "key_column": "_cdc_key"}, "transforms.seen.key_column", "reserved"),
        ({**SEEN, "backend_entity_name": "x" * 64}, "transforms.seen.backend_entity_name", "63-byte"),
        ({**SEEN, "tabel": "x"}, "transforms.seen.tabel", "unknown key"),
        (
            {key: value for key, value in SEEN.items() if key != "backend_entity_name"},
            "transforms.seen.backend_entity_name",
            "required",
        ),
    ],
)
def test_bad_dynamic_tables(table: dict[str, Any], prefix: str, message: str) -> None:
    problems = problems_of({"seen": table, "big_orders": sql_transform("SELECT * FROM orders")})
    assert_problem(problems, prefix, message)


def test_two_owners_of_one_table_are_refused() -> None:
    problems = problems_of(
        {"vip": VIP, "vip2": {**VIP, "key_type": "text"}, "big_orders": sql_transform("SELECT * FROM orders")}
    )
    assert_problem(
        problems,
        "transforms.vip2.backend_entity_name: public.vip_customers is already the table of dynamic table 'vip'",
    )
    doc = pipeline_doc({"vip": VIP, "big_orders": sql_transform("SELECT * FROM orders")}, table="vip_customers")
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(doc)
    assert_problem(
        caught.value.problems, "sinks.out.table: public.vip_customers is already the target of dynamic table 'vip'"
    )


def test_transform_ids_must_not_shadow_sources() -> None:
    doc = pipeline_doc({"orders": sql_transform("SELECT * FROM orders")}, sink_from="orders")
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(copy.deepcopy(doc))
    assert_problem(caught.value.problems, "transforms.orders: id is already used by a source")

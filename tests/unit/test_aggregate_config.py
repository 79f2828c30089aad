"""``postgres_aggregate`` sinks: what their YAML means (types, columns) and every way it can be wrong."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

import cdcsync
from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.core.errors import MigrationError
from cdcsync.migrations import POSTGRES
from tests.legacy_aggregates import first_trigger_revision, legacy_layout
from tests.unit.test_pipeline_config import problems_of, with_change
from tests.unit.test_templates import check_golden

pytestmark = pytest.mark.unit

VALID: dict[str, Any] = {
    "name": "shop",
    "sources": {
        "orders": {
            "type": "kafka",
            "topic": "shop.public.orders",
            "primary_key": "id",
            "columns": {
                "id": "bigint",
                "customer_id": "integer",
                "region": "varchar(8)",
                "amount": "numeric(12,2)",
                "qty": "integer",
                "price": "double precision",
                "paid": "boolean",
                "meta": "jsonb",
            },
        }
    },
    "sinks": {
        "revenue": {
            "type": "postgres_aggregate",
            "from": "orders",
            "schema": "app",
            "landing_table": "orders_state",
            "agg_table": "revenue_by_customer",
            "group_by": {"customer_id": {"type": "bigint"}, "region": None},
            "aggregate": {
                "revenue": {"from": "amount", "fn": "sum", "type": "numeric(18,2)"},
                "orders": {"fn": "count"},
                "units": {"from": "qty", "fn": "sum"},
                "avg_amount": {"from": "amount", "fn": "avg"},
                "avg_price": {"from": "price", "fn": "avg"},
                "smallest": {"from": "amount", "fn": "min"},
                "amount": {"fn": "max"},
            },
            "batch_size": 100,
            "batch_flush_interval": "1s",
        }
    },
}


def changed(path: str, value: Any) -> dict[str, Any]:
    return with_change(path, value, VALID)


def test_resolved_types_follow_postgres_own_aggregates() -> None:
    state = POSTGRES.desired_state(validate_pipeline_dict(VALID))["sinks"]["revenue"]
    assert (state["table"], state["delete_mode"], state["tombstone_table"]) == (
        "orders_state",
        "hard",
        "shop__revenue__tombstones",
    )
    aggregate = state["aggregate"]
    assert aggregate["group_by"] == [
        {"name": "customer_id", "source": "customer_id", "type": "bigint", "cast": True},
        {"name": "region", "source": "region", "type": "character varying(8)", "cast": False},
    ]
    types = {a["name"]: (a["type"], a["accumulator_type"]) for a in aggregate["aggregates"]}
    assert types == {
        "revenue": ("numeric(18,2)", "numeric(18,2)"),  # declared
        "orders": ("bigint", None),
        "units": ("bigint", "bigint"),  # sum(integer) is bigint, as in Postgres
        "avg_amount": ("numeric", "numeric"),
        "avg_price": ("double precision", "double precision"),
        "smallest": ("numeric(12,2)", None),
        "amount": ("numeric(12,2)", None),  # `from` defaults to the aggregate's own name
    }
    indexes = {a["index"] for a in aggregate["aggregates"] if a["index"]}
    assert indexes == {"revenue_by_customer__amount__minmax"}  # min and max of one column share an index


def test_global_aggregation_and_shorthands() -> None:
    doc = changed("sinks.revenue.group_by", ...)
    state = POSTGRES.desired_state(validate_pipeline_dict(doc))["sinks"]["revenue"]["aggregate"]
    assert state["group_by"] == []
    as_list = validate_pipeline_dict(changed("sinks.revenue.group_by", ["customer_id", "region"]))
    assert list(as_list.sinks["revenue"].group_by) == ["customer_id", "region"]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            "sinks.revenue.aggregate.orders.fn",
            "median",
            "sinks.revenue.aggregate.orders.fn: 'median' is not one of sum, count, avg, min, max",
        ),
        (
            "sinks.revenue.aggregate.revenue.from",
            "amt",
            "sinks.revenue.aggregate.revenue.from: column 'amt' is not in source 'orders'",
        ),
        (
            "sinks.revenue.aggregate.total",
            {"fn": "sum"},
            "sinks.revenue.aggregate.total: column 'total' is not in source 'orders' (its columns: id, customer_id,",
        ),
        (
            "sinks.revenue.aggregate.region_sum",
            {"fn": "sum", "from": "region"},
            "sinks.revenue.aggregate.region_sum.fn: sum needs a numeric column; 'region' is character varying(8)",
        ),
        (
            "sinks.revenue.aggregate.first_paid",
            {"fn": "min", "from": "paid"},
            "Postgres has no min for 'paid' (boolean)",
        ),
        (
            "sinks.revenue.aggregate.revenue.type",
            "numerik",
            "sinks.revenue.aggregate.revenue.type: 'numerik' is not a Postgres type",
        ),
        (
            "sinks.revenue.aggregate.orders.type",
            "text",
            "sinks.revenue.aggregate.orders.type: text cannot hold count(*)",
        ),
        (
            "sinks.revenue.aggregate.customer_id",
            {"fn": "max"},
            "sinks.revenue.aggregate.customer_id: 'customer_id' is already a group_by column of revenue_by_customer",
        ),
        (
            "sinks.revenue.aggregate.avg_amount_sum",
            {"fn": "sum", "from": "amount"},
            "'avg_amount_sum' is already an aggregate column of revenue_by_customer (from aggregate.avg_amount)",
        ),
        ("sinks.revenue.aggregate._cdc_rows", {"fn": "count"}, "names starting with '_cdc_' are reserved"),
        ("sinks.revenue.group_by.meta", None, "sinks.revenue.group_by.meta: jsonb columns cannot be grouped by"),
        (
            "sinks.revenue.group_by.region",
            {"type": "integer"},
            "sinks.revenue.group_by.region.type: integer cannot key",
        ),
        (
            "sinks.revenue.group_by.shop",
            {"from": "store"},
            "sinks.revenue.group_by.shop.from: column 'store' is not in",
        ),
        ("sinks.revenue.aggregate", {}, "sinks.revenue.aggregate:"),
        ("sinks.revenue.agg_table", "orders_state", "sinks.revenue.agg_table: must differ from landing_table"),
        ("sinks.revenue.empty_groups", "drop", "sinks.revenue.empty_groups: 'drop' is not one of delete, keep"),
        ("sinks.revenue.batch_size", 0, "sinks.revenue.batch_size: Input should be greater than 0"),
        ("sinks.revenue.landing_table", ..., "sinks.revenue.landing_table: required key is missing"),
    ],
)
def test_invalid_aggregate_sinks_name_the_yaml_path(path: str, value: Any, expected: str) -> None:
    problems = problems_of(changed(path, value))
    assert any(expected in problem for problem in problems), problems


def test_tables_of_two_sinks_may_not_collide() -> None:
    doc = copy.deepcopy(VALID)
    doc["sinks"]["mirror"] = {"type": "postgres", "from": "orders", "schema": "app", "table": "revenue_by_customer"}
    assert problems_of(doc) == ["sinks.mirror.table: app.revenue_by_customer is already the target of sink 'revenue'"]


def test_changing_an_aggregation_is_refused_as_destructive(tmp_path: Path) -> None:
    migrations.init(POSTGRES, validate_pipeline_dict(VALID), tmp_path)
    doc = changed("sinks.revenue.aggregate.orders.fn", "sum")
    doc["sinks"]["revenue"]["aggregate"]["orders"]["from"] = "qty"
    with pytest.raises(MigrationError) as caught:
        migrations.init(POSTGRES, validate_pipeline_dict(doc), tmp_path)
    assert "sink 'revenue': its aggregation (aggregates) changed" in str(caught.value)


def test_aggregate_migration_golden(tmp_path: Path) -> None:
    (planned,) = migrations.plan(POSTGRES, validate_pipeline_dict(VALID), tmp_path)
    text = planned.text.replace(f"cdcsync {cdcsync.__version__}", "cdcsync VERSION")
    check_golden("0001_init_aggregate.sql", text)
    assert text.count("CREATE OR REPLACE TRIGGER") == 3
    assert 'UNIQUE NULLS NOT DISTINCT ("customer_id", "region")' in text
    assert 'ON "app"."orders_state" ((("customer_id")::bigint), "region", "amount")' in text  # the min/max index


def test_declared_types_never_round_the_running_state() -> None:
    doc = copy.deepcopy(VALID)
    doc["sources"]["orders"]["columns"] |= {"fine": "numeric(12,4)", "raw": "numeric"}
    doc["sinks"]["revenue"]["aggregate"] |= {
        "fine_total": {"from": "fine", "fn": "sum", "type": "numeric(18,2)"},  # lower scale than the column
        "fine_avg_f": {"from": "fine", "fn": "avg", "type": "double precision"},
        "raw_int": {"from": "raw", "fn": "sum", "type": "bigint"},
        "raw_avg": {"from": "raw", "fn": "avg"},
        "raw_total": {"from": "raw", "fn": "sum"},
        "units_num": {"from": "qty", "fn": "sum", "type": "numeric(20,2)"},  # integers: nothing to round
        "price_real": {"from": "price", "fn": "sum", "type": "real"},
        "price_num": {"from": "price", "fn": "sum", "type": "numeric(12,2)"},
    }
    entries = {
        a["name"]: a
        for a in POSTGRES.desired_state(validate_pipeline_dict(doc))["sinks"]["revenue"]["aggregate"]["aggregates"]
    }
    accumulators = {name: entries[name]["accumulator_type"] for name in doc["sinks"]["revenue"]["aggregate"]}
    assert accumulators == {
        "revenue": "numeric(18,2)",  # numeric(12,2) adds up exactly in numeric(18,2): no hidden column
        "orders": None,
        "units": "bigint",
        "avg_amount": "numeric",
        "avg_price": "double precision",
        "smallest": None,
        "amount": None,
        "fine_total": "numeric",
        "fine_avg_f": "numeric",
        "raw_int": "numeric",
        "raw_avg": "numeric",
        "raw_total": "numeric",
        "units_num": "numeric(20,2)",
        "price_real": "double precision",  # summed in double precision, as Postgres' sum(double precision)
        "price_num": "double precision",
    }
    assert {name for name, entry in entries.items() if "scale_index" in entry} == {"raw_avg"}
    assert entries["raw_avg"]["scale_index"] == "revenue_by_customer__raw__scale"


def test_a_running_state_upgrade_is_an_additive_migration(tmp_path: Path) -> None:
    doc = copy.deepcopy(VALID)
    doc["sources"]["orders"]["columns"] |= {"fine": "numeric(12,4)", "raw": "numeric"}
    doc["sinks"]["revenue"]["aggregate"] |= {
        "fine_total": {"from": "fine", "fn": "sum", "type": "numeric(18,2)"},
        "fine_avg_f": {"from": "fine", "fn": "avg", "type": "double precision"},
        "raw_avg": {"from": "raw", "fn": "avg"},
    }
    with legacy_layout():
        migrations.init(POSTGRES, validate_pipeline_dict(doc), tmp_path)
    directory = tmp_path / "shop" / "postgres"
    first = (directory / "0001_init.sql").read_text()
    migrations.init(POSTGRES, validate_pipeline_dict(doc), tmp_path)
    assert (directory / "0001_init.sql").read_text() == first  # never rewritten
    upgrade = directory / "0002_upgrade_aggregate_revenue.sql"
    text = upgrade.read_text().replace(f"cdcsync {cdcsync.__version__}", "cdcsync VERSION")
    check_golden("upgrade_aggregate.sql", text)
    assert '"fine_total", "fine_avg_f", "raw_avg"' in text  # named in the header
    assert sorted(path.name for path in directory.iterdir()) == ["0001_init.sql", upgrade.name]
    migrations.init(POSTGRES, validate_pipeline_dict(doc), tmp_path)  # up to date now: nothing more
    assert sorted(path.name for path in directory.iterdir()) == ["0001_init.sql", upgrade.name]


def test_a_newer_trigger_revision_is_an_upgrade_of_the_functions_only(tmp_path: Path) -> None:
    with first_trigger_revision():
        migrations.init(POSTGRES, validate_pipeline_dict(VALID), tmp_path)
    directory = tmp_path / "shop" / "postgres"
    migrations.init(POSTGRES, validate_pipeline_dict(VALID), tmp_path)
    upgrade = directory / "0002_upgrade_aggregate_revenue.sql"
    text = upgrade.read_text()
    assert 'the trigger functions on "app"."orders_state"' in text and "revision 2" in text
    assert text.count("CREATE OR REPLACE FUNCTION") == 3 and "LOCK TABLE" not in text
    migrations.init(POSTGRES, validate_pipeline_dict(VALID), tmp_path)  # up to date now: nothing more
    assert sorted(path.name for path in directory.iterdir()) == ["0001_init.sql", upgrade.name]

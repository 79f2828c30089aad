"""Plugins: found through their entry points, named namespace.operator in YAML, options and inputs checked with
their YAML paths before Spark starts, and the runtime's checks of what a plugin transform returns."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdcsync.config import plugins
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.types import parse_pg_type
from cdcsync.core.errors import ConfigError
from cdcsync.core.reports import ReportedFailure
from cdcsync.transforms.plugins import run_step
from tests import basic_plugin

pytestmark = pytest.mark.unit


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for entry in basic_plugin.install(tmp_path):
        monkeypatch.syspath_prepend(str(entry))
    plugins.installed.cache_clear()
    yield
    plugins.installed.cache_clear()
    sys.modules.pop("basic_plugin", None)


SOURCE = {"type": "kafka", "topic": "t", "primary_key": "id", "columns": {"id": "bigint", "amount": "numeric(12,2)"}}


def doc(transforms: dict[str, Any] | None = None, **sink: Any) -> dict[str, Any]:
    return {
        "name": "p",
        "sources": {"orders": SOURCE},
        "transforms": transforms or {},
        "sinks": {"out": {"from": "orders", **sink}},
    }


def problems(pipeline: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(pipeline)
    return caught.value.problems


def test_the_example_plugin_is_listed(installed: None) -> None:
    registry = plugins.installed()
    assert {op_id: found.kind for op_id, found in registry.operators.items()} == {
        "basic_plugin.random_source": "sources",
        "basic_plugin.filter_transform": "transforms",
        "basic_plugin.print_sink": "sinks",
    }
    assert registry.operators["basic_plugin.print_sink"].distribution == "cdcsync-basic-plugin"
    assert not registry.problems


def test_a_plugin_chain_validates_and_plans(installed: None) -> None:
    pipeline = validate_pipeline_dict(
        doc(
            {
                "inserts": {"type": "basic_plugin.filter_transform", "from": "orders", "options": {"ops": ["c"]}},
                "again": {"type": "basic_plugin.filter_transform", "from": "inserts"},
            },
            type="basic_plugin.print_sink",
            options={"mode": "batch"},
        )
        | {"sinks": {"out": {"type": "postgres", "from": "again", "table": "t"}}}
    )
    assert [step.id for step in pipeline.plan.plugin_chain("again")] == ["inserts", "again"]
    assert pipeline.plan.view_of("again") == "orders"
    assert list(pipeline.columns_of("again")) == ["id", "amount"] and pipeline.primary_key_of("again") == ["id"]
    assert set(pipeline.sinks_of("orders")) == {"out"}


@pytest.mark.parametrize(
    ("pipeline", "expected"),
    [
        (
            doc(type="basic_plugin.print_snk"),
            "sinks.out.type: 'basic_plugin.print_snk' is not an installed plugin sink (did you mean 'basic_plugin.print_sink'?)",
        ),
        (
            doc(type="basic_plugin.filter_transform"),
            "sinks.out.type: 'basic_plugin.filter_transform' is a plugin transform, not a sink",
        ),
        (
            doc(type="basic_plugin.print_sink", options={"mode": "loud"}),
            "sinks.out.options.mode: 'loud' is not one of row, batch",
        ),
        (
            doc(type="basic_plugin.print_sink", options={"mod": "row"}),
            "sinks.out.options.mod: unknown key (did you mean 'mode'?)",
        ),
        (doc(type="basic_plugin.print_sink", option={}), "sinks.out.option: unknown key (did you mean 'options'?)"),
        (
            doc(
                {"f": {"type": "basic_plugin.filter_transform", "from": "order", "options": {"ops": []}}},
                type="blackhole",
            ),
            "transforms.f.options.ops: List should have at least 1 item",
        ),
        (
            doc({"f": {"type": "basic_plugin.filter_transform", "from": "order"}}, type="blackhole"),
            "transforms.f.from: 'order' is not a source or transform (did you mean 'orders'?)",
        ),
        (
            doc(
                {"f": {"type": "basic_plugin.filter_transform", "from": "orders", "primary_key": "nope"}},
                type="blackhole",
            ),
            "transforms.f.primary_key: column(s) nope not among its output columns",
        ),
        (
            doc(
                {
                    "f": {"type": "basic_plugin.filter_transform", "from": "orders"},
                    "s": {"type": "sql", "primary_key": "id", "sql": "SELECT * FROM f"},
                },
                type="blackhole",
            ),
            "transforms.s.sql: reads 'f', a plugin, handler or script operator",
        ),
        (
            {
                "name": "p",
                "sources": {"o": {"type": "basic_plugin.random_source"}},
                "sinks": {"x": {"type": "blackhole", "from": "o"}},
            },
            "sources.o.options.path: required key is missing",
        ),
        (
            {
                "name": "p",
                "sources": {"o": {"type": "basic_plugin.random_source", "options": {"path": "/x"}, "primary_key": "k"}},
                "sinks": {"x": {"type": "blackhole", "from": "o"}},
            },
            "sources.o.primary_key: column(s) k not among its columns; its columns: alphanumeric_field, num_field",
        ),
        (doc(type="nothere.sink"), "sinks.out.type: 'nothere.sink' is not an installed plugin sink"),
        (
            {
                "name": "p",
                "sources": {
                    "o": {"type": "basic_plugin.random_source", "options": {"path": "/x"}, "primary_key": "num_field"}
                },
                "sinks": {"x": {"type": "kafka", "from": "o", "topic": "out"}},
            },
            "sinks.x.from: a kafka sink reads Kafka sources (directly or through transforms), not plugin source 'o'",
        ),
    ],
)
def test_plugin_problems_name_their_yaml_path(installed: None, pipeline: dict[str, Any], expected: str) -> None:
    found = problems(pipeline)
    assert any(problem.startswith(expected) for problem in found), found


def _changes() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "amount": pa.array(["1.00", "2.00", None]),
            "_cdc_op": ["c", "u", "c"],
            "_cdc_version": pa.array([1, 2, 3], pa.decimal128(38, 0)),
            "_cdc_ts": pa.array([0, 0, 0], pa.timestamp("us", tz="UTC")),
            "_cdc_topic": ["t"] * 3,
            "_cdc_partition": pa.array([0] * 3, pa.int32()),
            "_cdc_offset": pa.array([0, 1, 2], pa.int64()),
        }
    )


def test_a_transform_runs_and_its_output_is_checked(installed: None) -> None:
    pipeline = validate_pipeline_dict(
        doc(
            {"f": {"type": "basic_plugin.filter_transform", "from": "orders", "options": {"ops": ["c"]}}},
            type="blackhole",
        )
    )
    (step,) = pipeline.plan.plugin_chain("f")
    out = run_step(step, _changes())
    assert out.column("id").to_pylist() == [1, 3]
    assert out.schema.field("amount").type == pa.decimal128(12, 2)  # cast to the declared type
    declares_more = dataclasses.replace(step, columns=(*step.columns, ("bonus", parse_pg_type("text"))))
    with pytest.raises(ReportedFailure, match="returned a batch without column 'bonus' it declares"):
        run_step(declares_more, _changes())


def test_a_broken_plugin_is_reported_not_fatal(
    installed: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken-site" / "broken_plugin-1.0.dist-info"
    broken.mkdir(parents=True)
    (broken / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (broken / "entry_points.txt").write_text("[cdcsync.plugins]\nbroken = no_such_module_here:plugin\n")
    monkeypatch.syspath_prepend(str(broken.parent))
    plugins.installed.cache_clear()
    registry = plugins.installed()
    assert "basic_plugin.print_sink" in registry.operators  # the others still load
    assert any("plugin 'broken'" in p and "cannot be loaded" in p for p in registry.problems)
    found = problems(doc(type="broken.sink"))
    assert any("no_such_module_here" in problem for problem in found), found


def test_a_plugin_source_feeds_transforms_and_sinks(installed: None) -> None:
    pipeline = validate_pipeline_dict(
        {
            "name": "p",
            "sources": {
                "orders": SOURCE,
                "generated": {"type": "basic_plugin.random_source", "options": {"path": "/tmp/x", "max_rows": "50"}},
            },
            "transforms": {"kept": {"type": "basic_plugin.filter_transform", "from": "generated"}},
            "sinks": {
                "mirror": {"type": "postgres", "from": "kept", "table": "generated"},
                "other": {"type": "blackhole", "from": "orders"},
            },
        }
    )
    assert set(pipeline.streams()) == {"orders"} and set(pipeline.plan.plugin_sources) == {"generated"}
    assert pipeline.primary_key_of("generated") == ["alphanumeric_field"]
    assert [str(t.sql) for t in pipeline.columns_of("kept").values()] == ["text", "bigint"]
    assert set(pipeline.sinks_of("generated")) == {"mirror"} and set(pipeline.sinks_of("orders")) == {"other"}
    assert pipeline.sink_primary_key(pipeline.sinks["mirror"]) == ["alphanumeric_field"]

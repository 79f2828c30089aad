"""Bounded and hybrid sources and job mode as validation sees them: Streamling's keys, every problem named by
its YAML path before Spark starts, and the chunk plan's ranges."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cdcsync.config.bounded import phase_version
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.settings import Settings
from cdcsync.core.errors import ConfigError
from cdcsync.sources.bounded import chunk_count, chunk_ranges

pytestmark = pytest.mark.unit

COLUMNS = {"id": "bigint", "name": "text"}


def hybrid(**extra: Any) -> dict[str, Any]:
    return {
        "type": "hybrid",
        "primary_key": "id",
        "columns": dict(COLUMNS),
        "bounded_sources": [{"source_type": "postgres", "table": "items", "chunk_size": 500, "parallelism": 2}],
        "unbounded_source": {"source_type": "kafka", "topic": "db.public.items", "start_at": "latest"},
        **extra,
    }


def pipeline(sources: dict[str, Any], **top: Any) -> dict[str, Any]:
    first = next(iter(sources))
    return {"name": "p", **top, "sources": sources, "sinks": {"m": {"type": "postgres", "from": first, "table": "m"}}}


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        validate_pipeline_dict(raw)
    return raised.value.problems


def test_a_hybrid_streams_its_kafka_phase_as_a_kafka_source_after_its_bounded_phases() -> None:
    loaded = validate_pipeline_dict(pipeline({"items": hybrid()}, job_mode=True))
    kafka = loaded.sources["items"]
    assert (kafka.topic, kafka.starting_offsets, kafka.primary_key) == ("db.public.items", "latest", ["id"])
    plan = loaded.bounded["items"]
    assert plan.streams and plan.primary_key == ("id",) and [n for n, _ in plan.columns] == ["id", "name"]
    assert (plan.phases[0].table, plan.phases[0].chunk_size, plan.phases[0].parallelism) == ("items", 500, 2)
    assert loaded.job_mode and loaded.sinks_of("items") == {"m": loaded.sinks["m"]}


def test_start_at_a_time_is_sparks_starting_timestamp() -> None:
    source = hybrid(unbounded_source={"source_type": "kafka", "topic": "t", "start_at": "2024-05-01T00:00:00Z"})
    assert validate_pipeline_dict(pipeline({"items": source})).sources["items"].options == {
        "startingTimestamp": "1714521600000"
    }


def test_a_bounded_source_alone_feeds_its_sinks_and_is_no_stream() -> None:
    alone = {"type": "postgres", "table": "old", "primary_key": "id", "columns": dict(COLUMNS)}
    loaded = validate_pipeline_dict(pipeline({"old": alone}))
    assert loaded.streams() == {} and not loaded.bounded["old"].streams
    assert list(loaded.columns_of("old")) == ["id", "name"] and loaded.primary_key_of("old") == ["id"]


def test_every_problem_is_named_by_its_yaml_path() -> None:
    found = problems(
        pipeline(
            {
                "items": hybrid(
                    bounded_sources=[{"source_type": "postgres", "table": "items", "columns": {"x": "int"}}],
                    unbounded_source={"source_type": "kafka", "topic": "t", "start_at": "yesterday"},
                ),
                "other": hybrid(bounded_sources=[{"source_type": "mysql", "table": "x"}]),
                "old": {"type": "postgres", "table": "old", "columns": {"id": "bigint", "tags": "text[]"}},
                "stream": {"type": "kafka", "topic": "t2", "primary_key": "id", "columns": {"id": "bigint"}},
            },
            job_mode=True,
        )
    )
    assert any(p.startswith("sources.items.unbounded_source.start_at: 'yesterday' is not earliest") for p in found)
    assert any(
        p.startswith("sources.other.bounded_sources: source_type: 'mysql' is not one of postgres") for p in found
    )
    assert "sources.old.primary_key: required key is missing for a bounded source" in found
    assert any(p.startswith("sources.stream.type: streams without end; job_mode: true needs") for p in found)


def test_hybrid_phase_keys_given_twice_and_types_a_chunk_cannot_carry() -> None:
    columns = {"id": "bigint", "tags": "text[]", "flags": "bit(3)", "attrs": "hstore", "blobs": "bytea[]"}
    phases = [
        {"source_type": "postgres", "table": "items", "primary_key": "id"},
        {"source_type": "clickhouse", "table_name": "items"},
        {"source_type": "postgres", "table": "items"},
    ]
    found = problems(pipeline({"items": hybrid(columns=columns, bounded_sources=phases)}))
    assert "sources.items.bounded_sources.0.primary_key: give it once, on the hybrid source" in found
    refused = sorted(re.findall(r"^(sources\.[\w.]+): column '(\w+)' \(\w+\) cannot be read", "\n".join(found), re.M))
    clickhouse = "sources.items.bounded_sources.1"
    assert refused == [(clickhouse, "attrs"), (clickhouse, "blobs"), (clickhouse, "flags"), (clickhouse, "tags")], (
        found  # a Postgres read carries every type; a ClickHouse read not these yet
    )


def test_sql_transforms_and_delta_sinks_read_bounded_and_hybrid_sources() -> None:
    raw = pipeline({"items": hybrid()})
    raw["sources"]["old"] = {"type": "postgres", "table": "old", "primary_key": "id", "columns": dict(COLUMNS)}
    raw["transforms"] = {
        "big": {"type": "sql", "from": "items", "primary_key": "id", "sql": "SELECT * FROM items WHERE id > 1"},
        "old_big": {
            "type": "sql",
            "from": "old",
            "primary_key": "id",
            "sql": "SELECT *, upper(name) AS shout FROM old",
        },
    }
    raw["sinks"] |= {
        "lake": {"type": "delta", "from": "items", "path": "/tmp/lake"},
        "old_lake": {"type": "delta", "from": "old_big", "path": "/tmp/old_lake", "mode": "history"},
        "big": {"type": "postgres", "from": "big", "table": "big"},
    }
    loaded = validate_pipeline_dict(raw)
    assert {step.id: step.input for step in loaded.plan.steps} == {"big": "items", "old_big": "old"}
    assert loaded.root_of("old_big") == "old" and set(loaded.sinks_of("old")) == {"old_lake"}
    assert set(loaded.sinks_of("items")) == {"m", "lake", "big"}
    assert list(loaded.columns_of("old_big")) == ["id", "name", "shout"]

    raw["transforms"]["old_big"]["sql"] = "SELECT *, missing FROM old"  # planned over the bounded columns
    assert any(p.startswith("transforms.old_big.sql:") and "missing" in p for p in problems(raw))


def test_job_mode_from_the_environment_is_checked_at_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from cdcsync.runtime.bounded import job_mode

    stream = {"type": "kafka", "topic": "t", "primary_key": "id", "columns": {"id": "bigint"}}
    loaded = validate_pipeline_dict(pipeline({"items": hybrid(), "stream": stream}))
    assert not job_mode(loaded, Settings())
    monkeypatch.setenv("CDCSYNC__JOB_MODE", "true")
    with pytest.raises(ConfigError) as raised:
        job_mode(loaded, Settings())
    assert raised.value.problems == [
        "sources.stream.type: streams without end; CDCSYNC__JOB_MODE=true needs every source bounded (postgres, clickhouse, delta) "
        "or hybrid"
    ]
    assert job_mode(validate_pipeline_dict(pipeline({"items": hybrid()})), Settings())


def test_chunks_group_parallelism_ranges_open_at_both_ends() -> None:
    bounds = [["1"], ["11"], ["21"], ["31"], ["41"]]
    assert chunk_count(bounds, 2) == 3 and chunk_count([], 2) == 1
    assert chunk_ranges(bounds, 2, 0) == [(None, ["11"]), (["11"], ["21"])]
    assert chunk_ranges(bounds, 2, 2) == [(["41"], None)]
    assert chunk_ranges([], 2, 0) == [(None, None)]
    assert chunk_ranges([["1"]], 2, 0) == [(None, None)]


def test_phase_versions_sit_below_every_debezium_position() -> None:
    """(0, phase): below the lowest streamed version (commit part 1) and a snapshot read at any real WAL position."""
    assert 0 < phase_version(1) < phase_version(2) < 2**32 < 2**64


def test_streamlings_clickhouse_source_alone_and_as_a_phase() -> None:
    archive = {"source_type": "clickhouse", "table_name": "orders_archive", "page_size": 1000}
    loaded = validate_pipeline_dict(
        pipeline(
            {
                "items": hybrid(bounded_sources=[archive, {"source_type": "postgres", "table": "items"}]),
                "ch": {"type": "clickhouse", "table": "old", "primary_key": "id", "columns": dict(COLUMNS)},
            }
        )
    )
    first, second = loaded.bounded["items"].phases
    assert (first.type, first.table, first.chunk_size, second.type) == (
        "clickhouse",
        "orders_archive",
        1000,
        "postgres",
    )
    assert loaded.bounded["ch"].phases[0].label == "clickhouse table default.old"


def test_reset_removes_the_backfill_progress_with_the_checkpoints(tmp_path: Any) -> None:
    from cdcsync.runtime.reset import plan_reset

    old = {"type": "postgres", "table": "old", "primary_key": "id", "columns": dict(COLUMNS)}
    raw = pipeline({"items": hybrid(), "old": old})
    raw["sinks"]["o"] = {"type": "postgres", "from": "old", "table": "o"}
    loaded = validate_pipeline_dict(raw)
    settings = Settings(state_dir=tmp_path)
    checkpoints = tmp_path.resolve() / "checkpoints" / "p"
    assert plan_reset(loaded, settings).checkpoints == [
        checkpoints / "items",
        checkpoints / "items.bounded",
        checkpoints / "old.bounded",
    ]
    assert plan_reset(loaded, settings, sink="o").checkpoints == [checkpoints / "old.bounded"]


def test_a_delta_source_reads_one_snapshot_or_a_change_feed() -> None:
    lake = {"source_type": "delta", "path": "/lake/items", "change_data_feed": True, "starting_version": 3}
    loaded = validate_pipeline_dict(pipeline({"items": hybrid(bounded_sources=[lake])}))
    phase = loaded.bounded["items"].phases[0]
    assert (phase.type, phase.label, phase.parallelism) == ("delta", "delta table /lake/items", 1)
    alone = {"type": "delta", "table": "db.items", "primary_key": "id", "columns": dict(COLUMNS)}
    found = problems(
        pipeline(
            {
                "a": {**alone, "path": "/lake/a"},
                "b": {**alone, "version": 1, "timestamp": "2026-01-01"},
                "c": {**alone, "change_data_feed": True},
                "d": {**alone, "starting_version": 2},
            }
        )
    )
    assert [p.split(":")[0] for p in found] == [
        "sources.a.path",
        "sources.b.timestamp",
        "sources.c.starting_version",
        "sources.d.starting_version",
    ]

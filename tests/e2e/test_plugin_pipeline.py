"""The example plugin package (examples/basic_plugin), installed into the run's environment, run from YAML through
the real ``cdcsync`` command: listed by ``cdcsync plugins``, its options checked by ``validate``, its transform and
sink run on the executors beside a built-in sink, and its source as a stream of its own into a mirror."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcsync.devstack import workload
from tests import basic_plugin
from tests.e2e.conftest import Project, assert_each_batch_once, mirror_rows, orders_pipeline

pytestmark = pytest.mark.e2e


def test_the_example_plugin_runs_from_yaml(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    topic_name: str,
    tmp_path: Path,
) -> None:
    load = workload.generate(1_500, 300, seed=7, tombstones=False)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    pipeline = orders_pipeline(topic_name, max_offsets_per_trigger=500)
    pipeline["transforms"] = {
        "inserts": {"type": "basic_plugin.filter_transform", "from": "orders", "options": {"ops": ["c"]}}
    }
    generated = tmp_path / "generated"
    pipeline["sources"]["generated"] = {
        "type": "basic_plugin.random_source",
        "options": {"path": str(generated), "max_rows": 300, "record_batch_size": 100, "seed": 5},
    }
    pipeline["sinks"] = {
        "shown": {"type": "basic_plugin.print_sink", "from": "inserts", "options": {"mode": "row"}, "batch_size": 50},
        "inserted": {"type": "postgres", "from": "inserts", "schema": "app", "table": "inserted"},
        "generated_rows": {"type": "postgres", "from": "generated", "schema": "app", "table": "generated"},
    }
    project = make_project(pipeline)
    paths = [str(path) for path in basic_plugin.install(tmp_path)]
    project.env["PYTHONPATH"] = os.pathsep.join([*paths, project.env.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    listed = project.cdcsync("plugins").stdout
    for op_id in ("basic_plugin.random_source", "basic_plugin.filter_transform", "basic_plugin.print_sink"):
        assert op_id in listed

    bad = tmp_path / "bad.yaml"
    pipeline_bad = json.loads(json.dumps(pipeline))
    pipeline_bad["transforms"]["inserts"]["options"] = {"ops": ["x"]}
    bad.write_text(yaml.safe_dump(pipeline_bad))
    refused = project.cdcsync("validate", str(bad), check=False)
    assert refused.returncode == 2 and "transforms.inserts.options.ops.0: 'x' is not one of" in refused.stderr

    project.prepare()
    result = project.cdcsync("run", str(project.pipeline_file), "--available-now")

    # The plugin sink wrote each insert once (a clean run replays nothing), each part under its own key.
    lines = [line.split(" ", 2) for line in result.stderr.splitlines() if line.startswith("basic_plugin ")]
    rows = [json.loads(text) for _, _, text in lines]
    assert len(rows) == load.counts["c"] and {row["_cdc_op"] for row in rows} == {"c"}
    assert all(key.startswith("e2e/shown/") for _, key, _ in lines)
    # The built-in sink behind the same plugin transform holds every key ever inserted.
    mirrored = mirror_rows(postgres_dsn, "app", "inserted", ["id"])
    assert set(mirrored) == {row["id"] for row in rows}
    # The plugin source: its rows, streamed one file per micro-batch, mirrored by their key.
    written = [json.loads(line) for part in sorted(generated.glob("*.json")) for line in part.read_text().splitlines()]
    assert len(written) == 300
    mirrored_rows = mirror_rows(postgres_dsn, "app", "generated", ["alphanumeric_field", "num_field"])
    assert mirrored_rows == {row["alphanumeric_field"]: row for row in written}
    batches = assert_each_batch_once(postgres_dsn, "e2e", ["shown", "inserted", "generated_rows"])
    assert len(batches["generated_rows"]) == 3

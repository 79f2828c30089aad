"""A sink added to a pipeline that has run: it would start at the source's current position and silently miss
the history. ``run`` refuses instead (exit 2, before Spark starts), naming the sink and ``cdcsync rewind
--to-ledger``, which makes the source read again from its start offsets; the new sink then holds the whole
history, and the sinks that had it re-apply it idempotently (or skip batches that read the same offsets)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from cdcsync.devstack import workload
from tests.e2e.conftest import Project, assert_each_batch_once
from tests.e2e.test_upsert_pipeline import assert_hard_mirror_equals
from tests.faults.test_target_restored import assert_revenue_equals, every_kind_pipeline


def test_a_sink_added_after_the_pipeline_ran_is_refused_then_backfilled(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    topic_name: str,
) -> None:
    load = workload.generate(6_000, 1_000, seed=59, wrapped=True)
    workload.produce(kafka_bootstrap, topic_name, load.events[:4_000])
    full = every_kind_pipeline(topic_name, None, max_offsets=2_000)
    project = make_project({**full, "sinks": {"mirror": full["sinks"]["mirror"]}})
    project.prepare()
    project.cdcsync("run", str(project.pipeline_file), "--available-now")

    # The aggregation is added to the running pipeline, and more changes arrive.
    project.pipeline_file.write_text(yaml.safe_dump(full, sort_keys=False))
    project.prepare()
    workload.produce(kafka_bootstrap, topic_name, load.events[4_000:])
    refused = project.cdcsync("run", str(project.pipeline_file), "--available-now", check=False)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "sink 'revenue' has none of them" in refused.stderr
    assert "a sink was added after the pipeline had run" in refused.stderr
    assert f"cdcsync rewind {project.pipeline_file} --to-ledger" in refused.stderr
    assert "starting Spark" not in refused.stderr

    rewound = project.cdcsync("rewind", str(project.pipeline_file), "--to-ledger").stdout
    assert "source orders: checkpoint rewound from batch" in rewound and "reads again from its start offsets" in rewound
    project.cdcsync("run", str(project.pipeline_file), "--available-now")

    assert_hard_mirror_equals(postgres_dsn, load.expected)
    assert_revenue_equals(postgres_dsn, load.expected)
    assert_each_batch_once(postgres_dsn, full["name"], ("mirror", "revenue"))

"""Running cdcsync as operations would: as the writer role, scraped by Prometheus, stopped by a pod's SIGTERM.

One streaming CLI run covers several claims, to keep ``make test`` lean: it connects as a login in the writer role
(no DDL rights), its ``/metrics`` hold the run's counts (changes in == changes produced; merged rows == what the
ledger recorded), ``/healthz`` answers 200 while it streams and 503 once it stops, and a SIGTERM while a batch is
stuck (its target table locked) ends the process within ``run.stop_timeout_s`` with exit 1, that batch left for the
next run, which lands everything exactly once.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import make_conninfo

from cdcsync.core import names
from cdcsync.devstack import workload
from tests.e2e.conftest import Project, assert_each_batch_once, orders_pipeline
from tests.e2e.test_upsert_pipeline import SINKS, assert_hard_mirror_equals
from tests.ports import free_port

STOP_TIMEOUT_S = 5


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _metrics(port: int) -> dict[tuple[str, str], float]:
    """(metric sample name, id label) -> value; lag summed over partitions."""
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(_get(port, "/metrics")[1]):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("id", ""))
            found[key] = found.get(key, 0.0) + sample.value
    return found


def _waiting_on_lock(dsn: str, user: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND wait_event_type = 'Lock'", (user,)
        ).fetchone()
    return bool(row and row[0])


def test_metrics_health_and_a_bounded_sigterm_as_the_writer_role(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, kafka_bootstrap: str, topic_name: str
) -> None:
    load = workload.generate(3_000, 400, seed=17)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    project = make_project(orders_pipeline(topic_name, max_offsets_per_trigger=1_000))
    project.prepare()  # as the test's superuser, as a DBA would
    login = f"cdcsync_e2e_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{login}" LOGIN IN ROLE "{names.WRITER_ROLE}"')
    try:
        project.env["CDCSYNC__POSTGRES__DSN"] = make_conninfo(postgres_dsn, user=login)
        project.env["CDCSYNC__RUN__STOP_TIMEOUT_S"] = str(STOP_TIMEOUT_S)
        port = free_port()
        process = project.start("run", str(project.pipeline_file), "--metrics-port", str(port))
        produced = len(load.events)
        deadline, found = time.monotonic() + 300, {}
        while time.monotonic() < deadline and process.poll() is None:
            try:
                found = _metrics(port)
            except (urllib.error.URLError, ConnectionError):
                found = {}
            if (
                found.get(("cdcsync_source_changes_in_total", "orders")) == produced
                and found.get(("cdcsync_source_lag", "orders")) == 0
            ):
                break
            time.sleep(0.5)
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert found[("cdcsync_source_changes_in_total", "orders")] == produced
        assert found[("cdcsync_source_lag", "orders")] == 0  # summed over the partitions
        assert found[("cdcsync_source_dead_letters_total", "orders")] == 0
        batches = found[("cdcsync_source_batches_total", "orders")]
        assert batches >= produced // 1_000
        with psycopg.connect(postgres_dsn) as conn:
            written = dict(
                conn.execute(
                    "SELECT sink, sum(rows_written) FROM cdcsync.batch_ledger WHERE pipeline = 'e2e' GROUP BY sink"
                ).fetchall()
            )
        for sink in SINKS:
            assert found[("cdcsync_sink_batches_total", sink)] == batches
            assert found[("cdcsync_sink_rows_merged_total", sink)] == written[sink]
            assert found[("cdcsync_sink_merge_duration_seconds_count", sink)] == batches
        assert found[("cdcsync_source_batch_duration_seconds_count", "orders")] == batches
        status, body = _get(port, "/healthz")
        assert status == 200 and json.loads(body)["status"] == "ok"
        assert_hard_mirror_equals(postgres_dsn, load.expected)

        # A batch stuck behind a lock on its target: SIGTERM ends the run within the bound, exit 1.
        upserts = workload.OpMix(insert=1, update=1, delete=0)  # no deletes: the expected states simply combine
        more = workload.generate(200, 50, seed=18, mix=upserts, start_lsn=load.last_lsn + 1_000)
        with psycopg.connect(postgres_dsn) as blocker:
            blocker.execute('LOCK TABLE app."Orders Mirror" IN ACCESS EXCLUSIVE MODE')
            workload.produce(kafka_bootstrap, topic_name, more.events)
            while time.monotonic() < deadline and not _waiting_on_lock(postgres_dsn, login):
                time.sleep(0.2)
            assert _waiting_on_lock(postgres_dsn, login), "the run never reached the locked table"
            process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            assert _get(port, "/healthz")[0] == 503
            _stdout, stderr = process.communicate(timeout=120)
            blocker.rollback()
        assert process.returncode == 1, stderr[-3000:]
        assert f"did not finish within {STOP_TIMEOUT_S}s" in stderr and "Traceback" not in stderr

        project.cdcsync("run", str(project.pipeline_file), "--available-now")
        assert_hard_mirror_equals(postgres_dsn, {**load.expected, **more.expected})
        assert_each_batch_once(postgres_dsn, "e2e", SINKS)
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP ROLE IF EXISTS "{login}"')

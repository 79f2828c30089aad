"""Pure pieces of the runtime: settings precedence, secrets, retries, executor errors, progress, collapse."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from cdcsync.config.settings import load_settings, redact_dsn
from cdcsync.core.errors import ConfigError, SinkError, UndecodableMessage, exit_code_for
from cdcsync.core.reports import Kind, ReportedFailure, undecodable, write_failed
from cdcsync.db.executor_errors import executor_error
from cdcsync.db.pgcopy import arrow_to_copy_csv
from cdcsync.db.retry import RetryBudget, with_retries
from cdcsync.runtime.checkpoint import committed_offsets
from cdcsync.runtime.progress import SourceStats, _lag, new_progress, record_progress
from cdcsync.runtime.replay import replay_batch_id
from cdcsync.runtime.stream import trigger_interval
from cdcsync.sinks import clickhouse_moves, tombstones
from cdcsync.sinks.postgres import newest_per_key


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("CDCSYNC"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def test_defaults_point_at_the_dev_stack() -> None:
    settings = load_settings()
    assert settings.bootstrap_servers == "127.0.0.1:19092"
    assert settings.postgres_dsn == "postgresql://cdcsync@127.0.0.1:54329/cdcsync"
    assert settings.migrations_dir == Path("migrations")


def test_precedence_defaults_file_env_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cdcsync.yaml").write_text(
        "kafka: {bootstrap_servers: 'file:9092'}\npostgres: {dsn: 'postgresql://file/db'}\nstate_dir: /from/file\n"
    )
    settings = load_settings()
    assert settings.bootstrap_servers == "file:9092" and settings.state_dir == Path("/from/file")
    monkeypatch.setenv("CDCSYNC__KAFKA__BOOTSTRAP_SERVERS", "env:9092")
    settings = load_settings()
    assert settings.bootstrap_servers == "env:9092"
    assert settings.postgres_dsn == "postgresql://file/db"
    settings = load_settings(kafka__bootstrap_servers="flag:9092", state_dir=None)
    assert settings.bootstrap_servers == "flag:9092" and settings.state_dir == Path("/from/file")


def test_native_kafka_options_nest_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDCSYNC__KAFKA__OPTIONS__SECURITY_PROTOCOL", "SASL_SSL")
    assert load_settings().kafka.options == {"security.protocol": "SASL_SSL"}


def test_spark_keys_from_env_keep_their_case_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Spark's keys are case-sensitive: a lowered spark.driver.extrajavaoptions would be ignored by Spark.
    (tmp_path / "cdcsync.yaml").write_text(
        "spark: {conf: {spark.driver.extraJavaOptions: '-Dfrom=file', spark.sql.shuffle.partitions: '8'}}\n"
    )
    monkeypatch.setenv("CDCSYNC__SPARK__CONF__spark.driver.extraJavaOptions", "-Dfrom=env")
    monkeypatch.setenv("CDCSYNC__SPARK__CONF__SPARK.HADOOP.FS.S3A.ENDPOINT", "http://minio:9000")
    assert load_settings().spark.conf == {
        "spark.driver.extraJavaOptions": "-Dfrom=env",
        "spark.sql.shuffle.partitions": "8",
        "spark.hadoop.fs.s3a.endpoint": "http://minio:9000",
    }


def test_dev_stack_ports_move_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDCSYNC__DEVSTACK__POSTGRES_PORT", "6000")
    assert ":6000/" in load_settings().postgres_dsn


def test_unknown_settings_are_refused(tmp_path: Path) -> None:
    (tmp_path / "cdcsync.yaml").write_text("kafak: {bootstrap_servers: x}\n")
    with pytest.raises(ConfigError, match="kafak"):
        load_settings()


def test_secrets_never_show() -> None:
    settings = load_settings(postgres__dsn="postgresql://me:hunter2@db/x")
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings.postgres)
    assert redact_dsn("postgresql://me:hunter2@db/x") == "postgresql://me:***@db/x"
    assert "hunter2" not in redact_dsn("host=db password=hunter2 user=me")
    assert redact_dsn("postgresql://me@db/x") == "postgresql://me@db/x"


def test_retries_only_transient_errors() -> None:
    calls: list[int] = []
    waits: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise SinkError("connection refused", retriable=True)
        return "done"

    assert with_retries(flaky, describe="x", sleep=waits.append) == "done"
    assert waits == [0.5, 1.0]

    def broken() -> None:
        calls.append(1)
        raise SinkError("syntax error")

    calls.clear()
    with pytest.raises(SinkError):
        with_retries(broken, describe="x", sleep=waits.append)
    assert len(calls) == 1


def test_retries_give_up_after_the_last_attempt() -> None:
    def down() -> None:
        raise SinkError("connection refused", retriable=True)

    with pytest.raises(SinkError):
        with_retries(down, describe="x", attempts=3, sleep=lambda _: None)


def test_retries_wait_out_an_outage_within_the_budget_and_say_so_once(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    calls: list[int] = []
    told: list[str | None] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def away_for_20s() -> str:
        calls.append(1)
        if now[0] < 20:
            raise SinkError("connection refused", retriable=True)
        return "back"

    budget = RetryBudget(seconds=60)
    with caplog.at_level("WARNING", logger="cdcsync.db.retry"):
        result = with_retries(
            away_for_20s, describe="batch 3", budget=budget, on_wait=told.append, sleep=sleep, clock=lambda: now[0]
        )
    assert result == "back" and len(calls) == 7  # waits 0.5, 1, 2, 4, 8, 15
    assert told == ["batch 3: connection refused", None]
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2, warnings  # when it started and when it ended, not per attempt
    assert "retrying with backoff for up to 60s" in warnings[0] and "succeeded again after 7 attempts" in warnings[1]

    now[0], told[:] = 0.0, []
    with pytest.raises(SinkError) as caught:
        with_retries(
            lambda: away_for_20s(),
            describe="batch 4",
            budget=RetryBudget(seconds=10),
            on_wait=told.append,
            sleep=sleep,
            clock=lambda: now[0],
        )
    assert "gave up after 5 attempt(s) over 8s (retry budget 10s" in str(caught.value), caught.value
    assert told == ["batch 4: connection refused", None]


def test_executor_errors_keep_their_classification() -> None:
    refused = ReportedFailure(write_failed("sink 'm': COPY failed: connection refused", retriable=True))
    wrapped = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "x.py", line 1\n'
        f"cdcsync.core.reports.ReportedFailure: {refused}\n\tat org.apache..."
    )
    error = executor_error(RuntimeError(wrapped), "staging batch 3")
    assert isinstance(error, SinkError) and error.retriable
    assert str(error) == "staging batch 3: sink 'm': COPY failed: connection refused"
    bad = ReportedFailure(undecodable("not JSON").located(topic="t", partition=0, offset=5))
    decode = executor_error(RuntimeError(f"PythonException: ReportedFailure: {bad}"), "x")
    assert isinstance(decode, UndecodableMessage) and exit_code_for(decode) == 1
    assert str(decode) == "message at t/0@5 could not be decoded: not JSON"
    crash = executor_error(RuntimeError(f"{wrapped[:60]}\nZeroDivisionError: division by zero\n"), "x")
    assert isinstance(crash, SinkError) and not crash.retriable and str(crash) == "x: division by zero"


def test_lag_per_partition_from_progress() -> None:
    progress = {"endOffset": json.dumps({"t": {"0": 10, "1": 5}}), "latestOffset": {"t": {"0": 15, "1": 5}}}
    assert _lag(progress) == {"t/0": 5, "t/1": 0}


def test_an_idle_trigger_does_not_hide_the_rows_of_the_batch_that_follows() -> None:
    """Spark reports idle triggers under the id of the batch still to come (seen in the compose stack: the
    changes-in counter stayed at the snapshot's 1000 after 11 more changes had landed)."""

    def event(batch: int, rows: int, end: int) -> dict[str, object]:
        durations = {"triggerExecution": 5, "latestOffset": 1, **({"addBatch": 40} if rows else {})}
        offsets = {"sources": [{"endOffset": {"t": {"0": end}}, "latestOffset": {"t": {"0": end}}}]}
        return {
            "batchId": batch,
            "numInputRows": rows,
            "processedRowsPerSecond": rows / 2,
            "durationMs": durations,
        } | offsets

    stats = SourceStats()
    history = [event(0, 1000, 1000), event(1, 0, 1000), event(1, 0, 1000)]
    record_progress(stats, history)
    assert (stats.rows_in, stats.progress_seen) == (1000, {0})
    record_progress(stats, [*history, event(1, 11, 1011), event(2, 0, 1011)])  # each poll sees the recent events
    assert (stats.rows_in, stats.progress_seen, stats.rows_per_second) == (1011, {0, 1}, 5.5)
    record_progress(stats, [event(1, 11, 1011), event(2, 0, 1011)])
    assert stats.rows_in == 1011 and stats.lag == {"t/0": 0}


class _JavaProgress:
    """What a progress event of the JVM's ``recentProgress`` array offers: its JSON."""

    def __init__(self, event: dict[str, object]) -> None:
        self.event = event
        self.reads = 0

    def json(self) -> str:
        self.reads += 1
        return json.dumps(self.event)


def test_each_poll_reads_only_the_progress_events_it_has_not_read() -> None:
    def event(batch: int, at: str) -> _JavaProgress:
        return _JavaProgress({"batchId": batch, "timestamp": at, "numInputRows": 1})

    stats = SourceStats()
    window = [event(0, "t0"), event(1, "t1"), event(1, "t2")]  # batch 1 twice: an idle trigger, then the batch
    assert [e["timestamp"] for e in new_progress(window, stats)] == ["t0", "t1", "t2"]
    assert new_progress(window, stats) == []
    assert [w.reads for w in window] == [1, 1, 2]  # the second poll stopped at the newest it had read
    window = [*window[1:], event(2, "t3"), event(3, "t4")]  # Spark dropped the oldest meanwhile
    assert [e["batchId"] for e in new_progress(window, stats)] == [2, 3]
    assert [w.reads for w in window] == [1, 3, 1, 1]


@pytest.mark.parametrize(
    ("seconds", "spark"), [(1.0, "1000 milliseconds"), (0.25, "250 milliseconds"), (0, "0 milliseconds")]
)
def test_the_trigger_interval_setting_is_spark_s_processing_time(seconds: float, spark: str) -> None:
    assert trigger_interval(load_settings(run__trigger_interval_s=seconds)) == spark
    assert trigger_interval(load_settings()) == "1000 milliseconds"


def test_committed_offsets_read_from_the_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    (tmp_path / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":3}}\n')
    (tmp_path / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":9}}\n')
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    assert committed_offsets(tmp_path) == {"t": {0: 3}}  # batch 1 is planned but not committed
    assert committed_offsets(tmp_path / "missing") == {}


def test_newest_per_key_keeps_the_highest_version_of_each_key() -> None:
    table = pa.table(
        {
            "a": [1, 1, 2, 1, 2, 3],
            "b": ["x", "x", "y", "z", "y", "x"],
            "_cdc_version": [5, 9, 1, 7, 3, 2],
            "v": ["a5", "a9", "b1", "c7", "b3", "d2"],
        }
    )
    single = newest_per_key(table, ("a",))
    assert sorted(zip(single["a"].to_pylist(), single["v"].to_pylist(), strict=True)) == [
        (1, "a9"),
        (2, "b3"),
        (3, "d2"),
    ]
    composite = newest_per_key(table, ("a", "b"))
    assert sorted(composite["v"].to_pylist()) == ["a9", "b3", "c7", "d2"]


def test_newest_per_key_keeps_truncates_and_carries_unchanged_toasted_values() -> None:
    placeholder = "__debezium_unavailable_value"
    table = pa.table(
        {
            "a": [1, 1, 1, None, 2, None, 2],
            "_cdc_version": [5, 9, 7, 20, 3, 30, 4],
            "body": ["old", placeholder, "set", None, placeholder, None, placeholder],
        }
    )
    rows = newest_per_key(table, ("a",), (("body", placeholder),)).to_pylist()
    by_version = {row["_cdc_version"]: (row["a"], row["body"]) for row in rows}
    # key 1: the newest change left body unchanged, so the value set earlier in the batch is carried; key 2: no
    # older value in the batch, so the placeholder stays (the merge keeps the stored value); truncates (null key)
    # are never dropped.
    assert by_version == {9: (1, "set"), 4: (2, placeholder), 20: (None, None), 30: (None, None)}


def test_newest_per_key_stages_what_a_primary_key_change_needs() -> None:
    """For the merge to pair a key change's delete and create (key_moves.sql.j2): the change before a delete (its
    placeholders carried) and an older create holding a placeholder stay beside each key's newest change."""
    placeholder = "__debezium_unavailable_value"
    table = pa.table(
        {
            "a": [1, 1, 1, 5, 5, 6],
            "_cdc_op": ["c", "u", "d", "c", "u", "c"],
            "_cdc_version": [10, 11, 20, 20, 21, 30],
            "body": ["big", placeholder, None, placeholder, placeholder, "small"],
        }
    )
    toastable = (("body", placeholder),)
    rows = newest_per_key(table, ("a",), toastable, keep_key_moves=True).to_pylist()
    assert sorted(((row["_cdc_version"], row["body"]) for row in rows), key=repr) == [
        (11, "big"),  # before 1's delete, carried from its insert
        (20, placeholder),  # the create of 5, the new key of 1: kept though 21 is newer
        (20, None),  # 1's delete
        (21, placeholder),
        (30, "small"),
    ]
    assert len(newest_per_key(table, ("a",), toastable)) == 3  # without: only the newest per key


def test_clickhouse_pairs_a_key_changes_create_with_the_delete_at_its_version() -> None:
    from cdcsync.sinks.clickhouse import ClickHouseWriter

    placeholder = "__debezium_unavailable_value"
    writer = ClickHouseWriter(
        url="",
        compression="",
        database="d",
        table="t",
        primary_key=("a",),
        columns=("a", "body", "n"),
        append_only=True,
        token_prefix="",
        delete_sql="",
        key_types=("Int64",),
        markers_sql="",
        batch_id=0,
        sink_label="",
        toastable=(("body", placeholder), ("n", placeholder)),
    )
    table = pa.table(
        {
            "a": [1, 1, 1, 7, 8],
            "_cdc_op": ["u", "u", "d", "c", "c"],
            "_cdc_version": [10, 11, 20, 20, 30],
            "body": ["set", placeholder, None, placeholder, placeholder],
            "n": [placeholder, placeholder, None, placeholder, "x"],
        }
    )
    moves = writer._key_moves(table, clickhouse_moves.creates_holding_placeholders(table, writer.toastable))
    # 7 is 1's new key: body from 1's change at 10 (the newest that set it), n from the stored row of 1;
    # 8's create has no delete at its version: an ordinary key, its stored row is looked up
    assert {key: (move.old, move.values) for key, move in moves.items()} == {(7,): ((1,), {"body": "set"})}


def test_toast_kinds_follow_debezium() -> None:
    from cdcsync.config import toast
    from cdcsync.config.types import parse_pg_type

    kinds = {t: toast.toast_kind(parse_pg_type(t)) for t in ("varchar(9)[]", "jsonb[]", "date[]", "uuid[]", "hstore")}
    assert kinds == {
        "varchar(9)[]": "text[]",
        "jsonb[]": "json[]",
        "date[]": "date[]",
        "uuid[]": "uuid[]",
        "hstore": "hstore",
    }
    lacking = [
        t
        for t in ("smallint[]", "numeric[]", "boolean[]", "timestamptz[]", "bigint[]", "text")
        if toast.lacks_placeholder(parse_pg_type(t))
    ]
    assert lacking == ["smallint[]", "numeric[]", "boolean[]", "timestamptz[]"]


def test_copy_csv_keeps_empty_strings_apart_from_nulls_and_hex_encodes_bytes() -> None:
    csv = arrow_to_copy_csv([pa.array(["", None, 'q"uote']), pa.array([b"\x00\x01", None, b""], pa.binary())])
    assert csv.decode().splitlines() == ['"","\\x0001"', ",", '"q""uote","\\x"']


def test_settings_file_syntax_errors_name_the_position(tmp_path: Path) -> None:
    (tmp_path / "cdcsync.yaml").write_text("kafka: {bootstrap_servers: x\n")
    with pytest.raises(ConfigError, match=r"cdcsync.yaml: not valid YAML at line \d+, column \d+"):
        load_settings()


def test_bad_environment_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDCSYNC__DEVSTACK__POSTGRES_PORT", "abc")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert any("CDCSYNC__DEVSTACK__POSTGRES_PORT" in problem for problem in caught.value.problems)


def test_task_failures_report_whether_a_retry_may_help() -> None:
    import psycopg

    from cdcsync.db.executor_errors import task_failure

    refused = task_failure("sink 'm': COPY failed", psycopg.OperationalError("connection refused"))
    assert refused.report == write_failed("sink 'm': COPY failed: connection refused", retriable=True)
    assert str(refused).startswith("sink 'm': COPY failed: connection refused [cdcsync-report:")
    bug = task_failure("sink 'm': COPY failed", psycopg.ProgrammingError("syntax error"))
    assert bug.report.fields["retriable"] is False
    assert executor_error(refused, "staging batch 1").retriable
    assert not executor_error(bug, "staging batch 1").retriable


def test_newest_per_key_carries_unchanged_toasted_arrays() -> None:
    """Debezium's placeholder for a text array is ``[placeholder]``, for an integer array its UTF-8 byte values."""
    placeholder = "__debezium_unavailable_value"
    codes = list(placeholder.encode())
    table = pa.table(
        {
            "a": [1, 1, 2],
            "_cdc_version": [5, 9, 3],
            "tags": [["x", None], [placeholder], [placeholder]],
            "ints": [[1, 2], codes, [3]],
        }
    )
    toastable = (("tags", (placeholder,)), ("ints", tuple(codes)))
    rows = {row["a"]: row for row in newest_per_key(table, ("a",), toastable).to_pylist()}
    assert (rows[1]["tags"], rows[1]["ints"]) == (["x", None], [1, 2])
    assert (rows[2]["tags"], rows[2]["ints"]) == ([placeholder], [3])


def test_merge_keeps_stored_arrays_for_their_placeholders() -> None:
    """Each array kind is compared with what Debezium sends for it (cdcsync.config.toast)."""
    from cdcsync.config.toast import PLACEHOLDER_UUID, TEMPLATE_VALUES
    from cdcsync.sql.render import render

    kinds = {"tags": "text[]", "ints": "integer[]", "docs": "json[]", "blobs": "bytea[]", "days": "date[]"}
    kinds["uids"] = "uuid[]"
    merge = render(
        "postgres/runtime/merge_hard.sql.j2",
        stage=("cdcsync", "s"),
        target=("app", "t"),
        tombstones=("cdcsync", "ts"),
        columns=("id", *kinds),
        primary_key=("id",),
        value_columns=tuple(kinds),
        toastable=kinds,
        toast_types=kinds,
        key_types={"id": "bigint"},
        internal_schema="cdcsync",
        pipeline="p",
        sink_id="s",
        delete_mode="hard",
        **TEMPLATE_VALUES,
    )
    assert "EXCLUDED.\"tags\"::text[] = ARRAY['__debezium_unavailable_value']::text[]" in merge
    assert 'EXCLUDED."ints"::bigint[] = \'{95,95,100,101,98,' in merge
    assert "EXCLUDED.\"docs\"::text[] = ARRAY[to_json('__debezium_unavailable_value'::text)::text]" in merge
    assert "EXCLUDED.\"blobs\" = ARRAY[convert_to('__debezium_unavailable_value', 'UTF8')]" in merge
    assert 'EXCLUDED."days" = \'{1970-04-06,1970-04-06,1970-04-11,' in merge
    assert f"EXCLUDED.\"uids\"::text[] = ARRAY['{PLACEHOLDER_UUID}']::text[]" in merge


def test_the_uuid_placeholder_is_javas_name_based_uuid_of_the_placeholder() -> None:
    """Debezium's uuid[] placeholder is ``UUID.nameUUIDFromBytes(placeholder bytes)`` (an MD5, version 3 UUID), checked with Java."""
    from cdcsync.config.toast import PLACEHOLDER_UUID

    assert PLACEHOLDER_UUID == "b68a35a7-17ad-35b3-af2a-ae46edb4545a"


def test_a_tombstone_ranks_with_its_keys_earlier_change_in_the_task_and_stays_unranked_alone() -> None:
    """Offsets, not row order, say what came before; a tie with the delete it follows goes to the later message."""
    table = pa.table(
        {
            "a": [1, 2, 1, 3, 3, 4, 4],
            "_cdc_op": ["d", "d", "u", "d", "c", "c", "d"],
            "_cdc_version": pa.array([None, None, 7, None, 30, 40, 50], pa.int64()),
            "_cdc_offset": [12, 10, 11, 20, 21, 30, 31],
        }
    )
    ranked = tombstones.rank_tombstones(table, ("a",))
    assert ranked["_cdc_version"].to_pylist() == [7, None, 7, None, 30, 40, 50]
    newest = {
        row["a"]: (row["_cdc_op"], row["_cdc_version"], row["_cdc_offset"])
        for row in newest_per_key(table, ("a",)).to_pylist()
    }
    # 1: the tombstone after the update deletes (tie at 7, later offset); 2: alone, ranked later against the target;
    # 3: a re-insert after the tombstone wins; 4: an ordinary delete.
    assert newest == {1: ("d", 7, 12), 2: ("d", None, 10), 3: ("c", 30, 21), 4: ("d", 50, 31)}


def test_lone_tombstones_take_the_stored_version_or_are_dropped() -> None:
    table = pa.table({"a": [1, 2, 3], "_cdc_version": pa.array([None, 5, None], pa.int64())})
    mask = tombstones.lone(table)
    assert mask is not None and tombstones.lone(table.filter(pa.array([False, True, False]))) is None
    seen: list[list[int]] = []

    def lookup(rows: pa.Table) -> list[tuple[int, int]]:
        seen.append(rows["a"].to_pylist())
        return [(0, 11)]  # key 1 is stored at version 10; key 3 is not stored

    ranked = tombstones.with_stored_versions(table, mask, lookup)
    assert seen == [[1, 3]] and ranked.to_pylist() == [{"a": 1, "_cdc_version": 11}, {"a": 2, "_cdc_version": 5}]


def test_a_replay_of_the_same_dead_letters_has_the_same_ledger_batch_id() -> None:
    assert replay_batch_id([3, 1, 2]) == replay_batch_id([1, 2, 3]) != replay_batch_id([1, 2])
    assert 0 <= replay_batch_id([1, 2, 3]) < 2**63


def test_a_failed_write_is_reported_as_data_not_raised() -> None:
    """A task whose write fails returns the report instead of failing: Spark then never kills the batch's other
    tasks halfway, and the driver raises the report (retriable) for the whole batch."""
    import pyarrow as pa

    from cdcsync.core.reports import Report
    from cdcsync.engine.batch import StageRowsTask, raise_reported

    class Away:
        def stage(self, table: pa.Table) -> int:
            raise ReportedFailure(write_failed("sink 'm': COPY into the staging table failed: refused", retriable=True))

    rows = pa.RecordBatch.from_pydict({"id": [1, 2]})
    (out,) = list(StageRowsTask(writers=(Away(),))(iter([rows])))
    assert out.column("sink").to_pylist() == [-1]
    (report,) = out.column("report").to_pylist()
    assert Report.decode(report).kind is Kind.WRITE_FAILED
    with pytest.raises(SinkError) as caught:
        raise_reported([report], "staging batch 5", "p.yaml")
    assert caught.value.retriable and "staging batch 5: sink 'm': COPY" in str(caught.value)


def test_the_live_view_shows_what_a_batch_is_retrying() -> None:
    from rich.console import Console

    from cdcsync.runtime.live import render_snapshot
    from cdcsync.runtime.progress import RunSnapshot, SourceStats

    stats = SourceStats(waiting="source 'orders' batch 4: sink 'mirror': connection refused")
    snapshot = RunSnapshot(pipeline="shop", sources={"orders": stats}, sinks={}, sink_targets={}, elapsed=3.0)
    console = Console(width=200, record=True)
    console.print(render_snapshot(snapshot))
    assert "orders: retrying source 'orders' batch 4: sink 'mirror': connection refused" in console.export_text()
    stats.waiting = None
    console.print(render_snapshot(snapshot))
    assert console.export_text().count("retrying") == 0


def test_the_checkpoint_writer_spark_is_told_to_use_is_in_this_pyspark() -> None:
    """A class Spark cannot load fails every query's start: a pyspark upgrade that moves it must fail here first."""
    import zipfile

    import pyspark

    from cdcsync.runtime.spark import DEFAULT_SPARK_CONF

    name = DEFAULT_SPARK_CONF["spark.sql.streaming.checkpointFileManagerClass"]
    entry = name.replace(".", "/") + ".class"
    jars = (Path(pyspark.__file__).parent / "jars").glob("spark-sql_*.jar")
    assert any(entry in zipfile.ZipFile(jar).namelist() for jar in jars), name


def test_the_driver_heap_is_fixed_at_its_setting_and_the_users_jvm_options_come_last() -> None:
    from cdcsync.runtime.spark import DEFAULT_SPARK_CONF, session_conf

    archive = "-XX:SharedArchiveFile=/cache/a.jsa -Xshare:auto"
    conf = session_conf(load_settings(), {"spark.jars": "kafka.jar"}, archive)
    options = conf["spark.driver.extraJavaOptions"].split()
    assert options[0].startswith("-Dlog4j.configurationFile=file:") and conf["spark.jars"] == "kafka.jar"
    memory = DEFAULT_SPARK_CONF["spark.driver.memory"]
    assert options[1:] == [*archive.split(), f"-Xms{memory}", "-XX:NewRatio=3"]
    assert not any("Xmx" in option for option in options)  # Spark refuses it there: spark.driver.memory sets it

    mine = {"spark.driver.memory": "768m", "spark.driver.extraJavaOptions": " -Xms256m  -Dmine=yes "}
    conf = session_conf(load_settings(spark__conf=mine), {}, "")
    assert conf["spark.driver.memory"] == "768m"
    assert conf["spark.driver.extraJavaOptions"].split()[1:] == ["-Xms768m", "-XX:NewRatio=3", "-Xms256m", "-Dmine=yes"]
    no_size = session_conf(load_settings(spark__conf={"spark.driver.memory": ""}), {}, "")
    assert no_size["spark.driver.extraJavaOptions"].split()[1:] == ["-XX:NewRatio=3"]


@pytest.mark.parametrize(
    ("extra", "initial_mib"), [("", 768), ("-Xms256m", 256)], ids=["ours: heap fixed", "theirs win"]
)
def test_the_jvm_takes_the_last_of_a_repeated_option(extra: str, initial_mib: int) -> None:
    """What the merge rule rests on, asked of the JVM the driver runs on, started as Spark starts it."""
    import subprocess

    from cdcsync.runtime.cds import java_executable
    from cdcsync.runtime.spark import session_conf

    conf = session_conf(
        load_settings(spark__conf={"spark.driver.memory": "768m", "spark.driver.extraJavaOptions": extra}), {}, ""
    )
    java = java_executable()
    assert java is not None, "Spark's driver needs Java"
    argv = [java, f"-Xmx{conf['spark.driver.memory']}", *conf["spark.driver.extraJavaOptions"].split()]
    flags = subprocess.run([*argv, "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True, check=True)
    sizes = {line.split()[1]: int(line.split()[3]) for line in flags.stdout.splitlines() if "HeapSize " in line}
    assert (sizes["InitialHeapSize"], sizes["MaxHeapSize"]) == (initial_mib << 20, 768 << 20)

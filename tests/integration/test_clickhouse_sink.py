"""ClickHouse migrations, the startup check and the sink's executor writer against a real ClickHouse engine.

No Spark here: the writer is called the way an executor task calls it, with a decoded partition in Arrow.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.core.errors import MigrationError
from cdcsync.migrations import CLICKHOUSE, POSTGRES
from cdcsync.migrations import clickhouse as ch_migrations
from cdcsync.sinks.clickhouse import ClickHouseTableSink, check_table
from tests.conftest import ClickHouseDatabase, run_env

pytestmark = pytest.mark.integration


def _pipeline(database: str, **sink: Any) -> Pipeline:
    raw = {
        "name": f"it_{uuid.uuid4().hex[:10]}",  # the ClickHouse migration ledger is shared by the session
        "sources": {
            "orders": {
                "type": "kafka",
                "topic": "t.orders",
                "primary_key": ["tenant", "id"],
                "columns": {"tenant": "text", "id": "bigint", "amount": "numeric(12,2)", "status": "text"},
            }
        },
        "sinks": {
            "orders_ch": {"type": "clickhouse", "from": "orders", "database": database, "table": "orders", **sink}
        },
    }
    return validate_pipeline_dict(raw)


def _migrate(client: Any, pipeline: Pipeline, migrations_dir: Path) -> list[str]:
    migrations.init(CLICKHOUSE, pipeline, migrations_dir)
    return [item.filename for item in migrations.apply_pending(CLICKHOUSE, client, pipeline.name, migrations_dir)]


def _migrate_postgres(dsn: str, pipeline: Pipeline, migrations_dir: Path) -> None:
    """cdcsync's Postgres objects: the ledger, and ``cdcsync.key_moves``, where key changes' links wait."""
    import psycopg

    migrations.init(POSTGRES, pipeline, migrations_dir)
    with psycopg.connect(dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, migrations_dir)


def key_move_links(dsn: str) -> list[tuple[Any, ...]]:
    """The key changes' links still waiting in ``cdcsync.key_moves`` (new key, version)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute('SELECT "key", "_cdc_version" FROM cdcsync.key_moves ORDER BY 2').fetchall()


def _changes(rows: list[tuple[str, int, str, int, str | None]]) -> Any:
    """A decoded partition: (tenant, id, op, version, status) per change, all from topic t.orders partition 0."""
    import pyarrow as pa

    n = len(rows)
    return pa.table(
        {
            "tenant": [r[0] for r in rows],
            "id": pa.array([r[1] for r in rows], pa.int64()),
            "amount": pa.array([Decimal("1.50")] * n, pa.decimal128(12, 2)),
            "status": [r[4] for r in rows],
            "_cdc_op": [r[2] for r in rows],
            "_cdc_version": pa.array([r[3] for r in rows], pa.decimal128(38, 0)),
            "_cdc_ts": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)] * n, pa.timestamp("us", tz="UTC")),
            "_cdc_topic": ["t.orders"] * n,
            "_cdc_partition": pa.array([0] * n, pa.int32()),
            "_cdc_offset": pa.array(range(100, 100 + n), pa.int64()),
        }
    )


def _things_sink(
    clickhouse_database: ClickHouseDatabase,
    migrations_dir: Path,
    postgres_dsn: str,
    columns: dict[str, str],
    **source: Any,
) -> ClickHouseTableSink:
    """A migrated ClickHouse sink ``ch`` of a source ``things`` keyed by ``id`` with ``columns``."""
    raw = {
        "name": f"it_{uuid.uuid4().hex[:10]}",
        "sources": {
            "things": {"type": "kafka", "topic": "t.things", "primary_key": "id", "columns": columns, **source}
        },
        "sinks": {
            "ch": {"type": "clickhouse", "from": "things", "database": clickhouse_database.database, "table": "things"}
        },
    }
    pipeline = validate_pipeline_dict(raw)
    _migrate(clickhouse_database.client(), pipeline, migrations_dir)
    _migrate_postgres(postgres_dsn, pipeline, migrations_dir)
    return ClickHouseTableSink(pipeline, "ch", pipeline.clickhouse_sinks()["ch"], postgres_dsn, clickhouse_database.url)


def _current(client: Any, database: str) -> list[tuple[Any, ...]]:
    return client.query(
        f"SELECT tenant, id, status, _version FROM `{database}`.orders FINAL WHERE NOT _is_deleted ORDER BY tenant, id"
    ).result_rows


def test_migrate_creates_the_table_records_the_ledger_and_passes_the_check(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path
) -> None:
    client = clickhouse_database.client()
    pipeline = _pipeline(clickhouse_database.database, low_cardinality="status", settings={"index_granularity": 1024})
    assert _migrate(client, pipeline, tmp_path) == ["0001_init.sql"]
    statuses = migrations.status(CLICKHOUSE, client, pipeline.name, tmp_path)
    assert [(s.filename, s.state) for s in statuses] == [("0001_init.sql", "applied")]
    assert migrations.check_ready(CLICKHOUSE, client, pipeline.name, tmp_path, pipeline=pipeline)
    state = ch_migrations.sink_state(pipeline, pipeline.clickhouse_sinks()["orders_ch"])
    check_table(client, "orders_ch", state)  # the table the migration made is what the pipeline needs
    engine = client.command(
        "SELECT engine_full FROM system.tables WHERE database = {d:String} AND name = 'orders'",
        parameters={"d": clickhouse_database.database},
    )
    assert "ReplacingMergeTree(_version, _is_deleted)" in engine
    assert "non_replicated_deduplication_window = 1000" in engine and "index_granularity = 1024" in engine

    # A file changed after it was applied is refused, naming it.
    path = tmp_path / pipeline.name / "clickhouse" / "0001_init.sql"
    path.write_text(path.read_text().replace("index_granularity = 1024", "index_granularity = 2048"))
    with pytest.raises(MigrationError, match=r"0001_init\.sql was altered"):
        migrations.check_ready(CLICKHOUSE, client, pipeline.name, tmp_path, pipeline=pipeline)


def test_new_source_column_becomes_an_add_columns_migration(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path
) -> None:
    client = clickhouse_database.client()
    pipeline = _pipeline(clickhouse_database.database)
    _migrate(client, pipeline, tmp_path)
    raw = pipeline.model_dump(by_alias=True, exclude={"path"})
    raw["sources"]["orders"]["columns"]["note"] = "varchar(20)"
    grown = validate_pipeline_dict(raw)
    with pytest.raises(MigrationError, match="changed since its last ClickHouse migration"):
        migrations.check_ready(CLICKHOUSE, client, grown.name, tmp_path, pipeline=grown)
    assert _migrate(client, grown, tmp_path) == ["0002_add_columns_orders_ch.sql"]
    check_table(client, "orders_ch", ch_migrations.sink_state(grown, grown.clickhouse_sinks()["orders_ch"]))

    raw["sources"]["orders"]["columns"]["amount"] = "double precision"
    with pytest.raises(MigrationError, match="column 'amount' changed type from Nullable"):
        migrations.plan(CLICKHOUSE, validate_pipeline_dict(raw), tmp_path)


@pytest.mark.parametrize(
    ("table_ddl", "expected"),
    [
        (
            "(tenant String, id Int64, amount Nullable(Decimal(12, 2)), status Nullable(String), _version UInt64, "
            "_is_deleted UInt8, _cdc_ts Nullable(DateTime64(6, 'UTC'))) "
            "ENGINE = ReplacingMergeTree(_version, _is_deleted) ORDER BY (id, tenant)",
            "it is ORDER BY (id, tenant), the pipeline's primary key is (tenant, id)",
        ),
        (
            "(tenant String, id Int64, amount Nullable(Decimal(12, 2)), _version UInt64, "
            "_is_deleted UInt8, _cdc_ts Nullable(DateTime64(6, 'UTC'))) "
            "ENGINE = ReplacingMergeTree(_version, _is_deleted) ORDER BY (tenant, id)",
            "it has no column status (the pipeline needs Nullable(String))",
        ),
        (
            "(tenant String, id Int64, amount Nullable(Float64), status Nullable(String), _version UInt64, "
            "_is_deleted UInt8, _cdc_ts Nullable(DateTime64(6, 'UTC'))) ENGINE = MergeTree ORDER BY (tenant, id)",
            "its column amount is Nullable(Float64), the pipeline needs Nullable(Decimal(12, 2))",
        ),
    ],
    ids=["order-by", "missing-column", "other-type"],
)
def test_run_refuses_a_pre_existing_table_that_differs(
    clickhouse_database: ClickHouseDatabase,
    tmp_path: Path,
    postgres_dsn: str,
    kafka_bootstrap: str,
    table_ddl: str,
    expected: str,
) -> None:
    """The migration's CREATE TABLE IF NOT EXISTS keeps a table someone made by hand; run must then refuse."""
    import subprocess
    import sys

    client = clickhouse_database.client()
    client.command(f"CREATE TABLE orders {table_ddl}")
    pipeline = _pipeline(clickhouse_database.database)
    pipeline_file = tmp_path / "pipeline.yaml"
    pipeline_file.write_text(yaml.safe_dump(pipeline.model_dump(by_alias=True, exclude={"path"}), sort_keys=False))
    env = run_env(
        postgres__dsn=postgres_dsn,
        kafka__bootstrap_servers=kafka_bootstrap,
        clickhouse__url=clickhouse_database.url,
        migrations_dir=tmp_path / "migrations",
        state_dir=tmp_path / "state",
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "cdcsync", *args, str(pipeline_file)]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    assert cli("init").returncode == 0
    assert cli("migrate").returncode == 0
    refused = cli("run", "--available-now")
    assert refused.returncode == 2, refused.stderr
    assert f"sink 'orders_ch': table {clickhouse_database.database}.orders does not match" in refused.stderr
    assert expected in refused.stderr
    assert "Traceback" not in refused.stderr and "starting Spark" not in refused.stderr


def test_run_refuses_a_pending_clickhouse_migration_naming_the_file(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str
) -> None:
    import psycopg

    from cdcsync.config.settings import load_settings
    from cdcsync.sinks.clickhouse import startup_check

    pipeline = _pipeline(clickhouse_database.database)
    migrations.init(POSTGRES, pipeline, tmp_path)
    migrations.init(CLICKHOUSE, pipeline, tmp_path)
    with psycopg.connect(postgres_dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, tmp_path)  # Postgres done, ClickHouse not
    settings = load_settings(migrations_dir=tmp_path)
    settings.clickhouse.url = type(settings.clickhouse.url)(clickhouse_database.url)  # type: ignore[misc,union-attr]
    with pytest.raises(MigrationError) as refused:
        startup_check(pipeline, settings)
    assert f"{tmp_path / pipeline.name / 'clickhouse' / '0001_init.sql'} has not been applied" in str(refused.value)
    assert "clickhouse-client --multiquery" in (refused.value.hint or "")


class LocalAccumulators:
    """Spark's accumulators without Spark, for the writer's source positions: the driver's value, merged with each
    task's update by the accumulator's parameter, as Spark merges them when a task succeeds."""

    def accumulator(self, value: Any, param: Any) -> Any:
        return LocalAccumulator(value, param)


class LocalAccumulator:
    def __init__(self, value: Any, param: Any) -> None:
        self.value, self.param = value, param

    def add(self, term: Any) -> None:
        self.value = self.param.addInPlace(self.value, term)


def test_a_snapshot_below_the_merged_positions_stops_the_run(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str
) -> None:
    """As for Postgres and Delta sinks (docs/operations.md#a-source-that-went-back): the sink keeps its mark in
    Postgres' cdcsync.source_positions, a task whose snapshot reads lie below it inserts nothing and stops the batch
    (through the engine's staging pass and report), and reads of the snapshot already seen never stop the run."""
    import psycopg

    from cdcsync.core.errors import SourceWentBack
    from cdcsync.engine.batch import StageRowsTask, raise_reported

    def position(commit: int, lsn: int) -> int:
        return (commit << 64) + lsn

    client = clickhouse_database.client()
    pipeline = _pipeline(clickhouse_database.database)
    migrations.init(POSTGRES, pipeline, tmp_path)
    with psycopg.connect(postgres_dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, tmp_path)
    _migrate(client, pipeline, tmp_path)
    sink = ClickHouseTableSink(
        pipeline, "orders_ch", pipeline.clickhouse_sinks()["orders_ch"], postgres_dsn, clickhouse_database.url
    )
    sink.spark_context = LocalAccumulators()

    def land(batch_id: int, rows: list[tuple[str, int, str, int, str | None]]) -> int | None:
        key = sink.ledger_key(batch_id, "cp")
        assert sink.prepare(key)
        task = StageRowsTask((sink.stage_writer(batch_id, "cp"),))
        (counts,) = list(task(iter(_changes(rows).to_batches())))
        raise_reported([r for r in counts.column("report").to_pylist() if r], f"staging batch {batch_id}", "p.yaml")
        return sink.merge(key, sum(counts.column("rows").to_pylist()))

    def mark() -> tuple[Any, ...] | None:
        with psycopg.connect(postgres_dsn) as conn:
            return conn.execute("SELECT position, snapshot FROM cdcsync.source_positions").fetchone()

    snapshot = 0x16_0000_0000
    land(0, [("a", 1, "r", snapshot, "read"), ("a", 2, "c", position(0x16_B374_D848, 0x16_B374_D900), "streamed")])
    assert mark() == (position(0x16_B374_D848, 0x16_B374_D900), snapshot)
    land(1, [("a", 3, "r", snapshot, "read of the same snapshot, in another partition, later")])
    land(2, [("a", 4, "r", 0x17_0000_0000, "a re-snapshot of the same source")])
    assert mark() == (position(0x16_B374_D848, 0x16_B374_D900), 0x17_0000_0000)
    with pytest.raises(SourceWentBack) as went_back:
        land(3, [("a", 5, "r", 0x3_0000_0000, "restored source"), ("a", 6, "r", 0x3_0000_0000, "restored too")])
    message = str(went_back.value)
    assert "sink 'orders_ch': 2 snapshot read(s) from topic 't.orders' at source position 3/0" in message
    assert "16/B374D848" in message
    assert went_back.value.hint is not None and "source_positions" in went_back.value.hint
    assert [row[1] for row in _current(client, clickhouse_database.database)] == [1, 2, 3, 4]  # nothing inserted
    assert land(3, [("a", 7, "c", position(0x17_0000_0100, 0x17_0000_0200), "retried")]) is not None
    assert [row[1] for row in _current(client, clickhouse_database.database)] == [1, 2, 3, 4, 7]
    assert mark() == (position(0x17_0000_0100, 0x17_0000_0200), 0x17_0000_0000)


def test_writer_inserts_versions_and_deletes_and_a_repeated_task_adds_nothing(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str
) -> None:
    client = clickhouse_database.client()
    pipeline = _pipeline(clickhouse_database.database, compression="zstd")
    _migrate(client, pipeline, tmp_path)
    client.command("SYSTEM STOP MERGES orders")
    sink = ClickHouseTableSink(
        pipeline, "orders_ch", pipeline.clickhouse_sinks()["orders_ch"], postgres_dsn, clickhouse_database.url
    )
    first = _changes([("a", 1, "c", 10, "new"), ("a", 1, "u", 11, "paid"), ("a", 2, "c", 12, "new")])
    writer = sink.stage_writer(0, "ckpt")
    assert writer.stage(first) == 2  # collapsed to the newest change per key
    assert writer.stage(first) == 2  # Spark retried the task: same rows, same token
    assert client.command("SELECT count() FROM orders") == 2
    assert _current(client, clickhouse_database.database) == [("a", 1, "paid", 11), ("a", 2, "new", 12)]

    second = _changes([("a", 2, "d", 20, None), ("b", 1, "c", 21, "new")])
    assert sink.stage_writer(1, "ckpt").stage(second) == 2
    assert _current(client, clickhouse_database.database) == [("a", 1, "paid", 11), ("b", 1, "new", 21)]
    deleted = client.query("SELECT _version, _is_deleted FROM orders WHERE tenant = 'a' AND id = 2 ORDER BY _version")
    assert deleted.result_rows == [(12, 0), (20, 1)]  # the delete is a row with the delete's version

    # A source TRUNCATE reaches sinks as a row without a key: not applied to ClickHouse, and not an error.
    truncate = _changes([("b", 2, "c", 30, "new"), (None, None, "t", 31, None)])  # type: ignore[list-item]
    assert sink.stage_writer(2, "ckpt").stage(truncate) == 1
    assert client.command("SELECT count() FROM orders") == 5


@pytest.mark.parametrize("append_only", [True, False], ids=["append-only", "lightweight-deletes"])
def test_partition_by_a_non_key_column_never_resurrects_a_deleted_or_moved_row(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str, append_only: bool
) -> None:
    """Deletes carry NULL in the partition column (REPLICA IDENTITY DEFAULT) and updates move rows between
    partitions; FINAL CLEANUP merges each partition alone, so every partition must end with the key's newest."""
    client = clickhouse_database.client()
    pipeline = _pipeline(
        clickhouse_database.database,
        partition_by="ifNull(status, 'none')",
        append_only_mode=append_only,
        settings={"allow_experimental_replacing_merge_with_cleanup": 1},
    )
    _migrate(client, pipeline, tmp_path)
    if append_only:  # (a lightweight DELETE waits for merges, so it would wait forever)
        client.command("SYSTEM STOP MERGES orders")  # every version stays in its own part until OPTIMIZE
    sink = ClickHouseTableSink(
        pipeline, "orders_ch", pipeline.clickhouse_sinks()["orders_ch"], postgres_dsn, clickhouse_database.url
    )
    batches = [
        [("a", 1, "c", 10, "new"), ("a", 2, "c", 11, "new"), ("a", 3, "c", 12, "new"), ("a", 4, "c", 13, "new")],
        [("a", 1, "u", 20, "paid"), ("a", 2, "d", 21, None), ("a", 3, "u", 22, "paid")],  # moves, a NULL delete
        [("a", 3, "d", 30, None), ("a", 4, "u", 31, "shipped"), ("a", 4, "u", 32, "new")],  # moved there and back
    ]
    for batch_id, changes in enumerate(batches):
        sink.stage_writer(batch_id, "ckpt").stage(_changes(changes))
    sink.stage_writer(1, "ckpt").stage(_changes(batches[1]))  # a replayed task: its markers again, harmless
    expected = [("a", 1, "paid", 20), ("a", 4, "new", 32)]
    assert _current(client, clickhouse_database.database) == expected

    client.command("SYSTEM START MERGES orders")
    client.command("OPTIMIZE TABLE orders FINAL CLEANUP")
    assert _current(client, clickhouse_database.database) == expected
    # Every partition kept only the key's newest row there, and CLEANUP removed deleted ones: one row per key left.
    raw = client.query("SELECT tenant, id, status, _version FROM orders ORDER BY tenant, id").result_rows
    assert raw == expected


@pytest.mark.parametrize("append_only", [True, False], ids=["append-only", "lightweight-deletes"])
def test_lone_tombstones_delete_the_stored_row_and_rank_just_above_it(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str, append_only: bool
) -> None:
    """A tombstone whose delete event compaction removed (null version) deletes what the table holds for its key,
    with a version one above it: a stale change replayed later stays hidden, a re-insert after it shows."""
    client = clickhouse_database.client()
    pipeline = _pipeline(
        clickhouse_database.database, append_only_mode=append_only, partition_by="ifNull(status, 'none')"
    )
    _migrate(client, pipeline, tmp_path)
    sink = ClickHouseTableSink(
        pipeline, "orders_ch", pipeline.clickhouse_sinks()["orders_ch"], postgres_dsn, clickhouse_database.url
    )
    sink.stage_writer(0, "c").stage(_changes([("a", 1, "c", 10, "new"), ("a", 2, "c", 11, "new")]))
    lone = [("a", 1, "d", None, None), ("a", 9, "d", None, None), ("a", 2, "d", None, None), ("a", 2, "c", 30, "x")]
    sink.stage_writer(1, "c").stage(_changes(lone))  # type: ignore[arg-type]
    assert _current(client, clickhouse_database.database) == [("a", 2, "x", 30)]
    if append_only:  # (lightweight deletes keep no delete row to outrank a stale change, tombstone or not)
        sink.stage_writer(2, "c").stage(_changes([("a", 1, "u", 10, "stale")]))
        assert _current(client, clickhouse_database.database) == [("a", 2, "x", 30)]
    client.command("OPTIMIZE TABLE orders FINAL")
    assert _current(client, clickhouse_database.database) == [("a", 2, "x", 30)]


def test_partition_markers_of_a_large_batch(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str
) -> None:
    """20,000 moved keys: their parameters travel in the request body (in the URL, HTTP 414 refused them)."""
    client = clickhouse_database.client()
    pipeline = _pipeline(clickhouse_database.database, partition_by="ifNull(status, 'none')")
    _migrate(client, pipeline, tmp_path)
    sink = ClickHouseTableSink(
        pipeline, "orders_ch", pipeline.clickhouse_sinks()["orders_ch"], postgres_dsn, clickhouse_database.url
    )
    keys = range(20_000)
    sink.stage_writer(0, "c").stage(_changes([("tenant-with-a-longer-name", k, "c", 10, "new") for k in keys]))
    sink.stage_writer(1, "c").stage(_changes([("tenant-with-a-longer-name", k, "u", 20, "paid") for k in keys]))
    markers = "SELECT count() FROM orders WHERE status = 'new' AND _is_deleted AND _version = 19"
    assert client.command(markers) == 20_000


def test_append_only_mode_false_deletes_keys_up_to_the_delete_version(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str
) -> None:
    client = clickhouse_database.client()
    pipeline = _pipeline(clickhouse_database.database, append_only_mode=False)
    _migrate(client, pipeline, tmp_path)
    sink = ClickHouseTableSink(
        pipeline, "orders_ch", pipeline.clickhouse_sinks()["orders_ch"], postgres_dsn, clickhouse_database.url
    )
    sink.stage_writer(0, "c").stage(_changes([("a", 1, "c", 10, "new"), ("a", 2, "c", 11, "new")]))
    # A newer row of a 1 already exists when a delete at version 15 arrives: only older rows go.
    sink.stage_writer(1, "c").stage(_changes([("a", 1, "u", 30, "paid")]))
    sink.stage_writer(2, "c").stage(_changes([("a", 1, "d", 15, None), ("a", 2, "d", 16, None)]))
    raw = client.query("SELECT tenant, id, _version, _is_deleted FROM orders ORDER BY id, _version").result_rows
    assert raw == [("a", 1, 30, 0)]  # no delete rows: the deleted key's rows are gone, the newer one stays


def test_arrays_timetz_and_bits_land_in_clickhouse(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str
) -> None:
    """Arrays become Array(Nullable(...)) (a NULL array lands as []), timetz and bit strings their Postgres text."""
    import pyarrow as pa

    client = clickhouse_database.client()
    sink = _things_sink(
        clickhouse_database,
        tmp_path,
        postgres_dsn,
        {
            "id": "bigint",
            "ints": "integer[]",
            "prices": "numeric(10,2)[]",
            "tz": "timetz",
            "b": "bit(3)",
        },
        untoasted_columns=["prices"],
    )  # prices: an array Debezium has no TOAST placeholder for
    changes = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "ints": pa.array([[1, None, 3], None], pa.list_(pa.int32())),
            "prices": pa.array([[Decimal("1.50")], []], pa.list_(pa.decimal128(10, 2))),
            "tz": ["23:00:00.5+00", None],
            "b": ["101", "000"],
            "_cdc_op": ["c", "c"],
            "_cdc_version": pa.array([10, 11], pa.decimal128(38, 0)),
            "_cdc_ts": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)] * 2, pa.timestamp("us", tz="UTC")),
            "_cdc_topic": ["t.things"] * 2,
            "_cdc_partition": pa.array([0, 0], pa.int32()),
            "_cdc_offset": pa.array([100, 101], pa.int64()),
        }
    )
    assert sink.stage_writer(0, "ckpt").stage(changes) == 2
    rows = client.query("SELECT id, ints, prices, tz, b FROM things FINAL ORDER BY id").result_rows
    assert rows == [(1, [1, None, 3], [Decimal("1.50")], "23:00:00.5+00", "101"), (2, [], [], None, "000")]


def test_unchanged_toasted_values_take_the_stored_value_before_the_insert(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str
) -> None:
    """Debezium's placeholder never lands in ClickHouse when a value to keep exists: the in-batch carry first, then
    one lookup of the stored current rows. Keys with nothing stored (never seen, or deleted) keep it, as a Postgres
    mirror does."""
    import pyarrow as pa

    from cdcsync.config.toast import PLACEHOLDER_BY_KIND

    client = clickhouse_database.client()
    columns = {
        "id": "bigint",
        "body": "text",
        "blob": "bytea",
        "doc": "jsonb",
        "tags": "text[]",
        "uids": "uuid[]",
        "days": "date[]",
        "nums": "bigint[]",
    }
    raw = {
        "name": f"it_{uuid.uuid4().hex[:10]}",
        "sources": {"docs": {"type": "kafka", "topic": "t.docs", "primary_key": "id", "columns": columns}},
        "sinks": {"ch": {"type": "clickhouse", "from": "docs", "database": clickhouse_database.database, "table": "d"}},
    }
    pipeline = validate_pipeline_dict(raw)
    _migrate(client, pipeline, tmp_path)
    _migrate_postgres(postgres_dsn, pipeline, tmp_path)
    sink = ClickHouseTableSink(pipeline, "ch", pipeline.clickhouse_sinks()["ch"], postgres_dsn, clickhouse_database.url)
    kinds = {"body": "text", "blob": "bytea", "doc": "jsonb", "tags": "text[]", "uids": "uuid[]", "days": "date[]"}
    kinds["nums"] = "integer[]"
    placeholder = {name: PLACEHOLDER_BY_KIND[kind] for name, kind in kinds.items()}
    day = dt.date(2024, 2, 29)
    uid = "0b6a2b52-46bc-4f34-a2d1-3c1a6f0f3c11"

    def full(n: int) -> dict[str, Any]:
        return {
            "body": f"body {n}" * 100,
            "blob": bytes([n, 0, 255]),
            "doc": f'{{"n": {n}}}',
            "tags": [f"t{n}", None],
            "uids": [uid],
            "days": [day],
            "nums": [n, -n],
        }

    def unchanged() -> dict[str, Any]:
        return {name: list(value) if isinstance(value, tuple) else value for name, value in placeholder.items()}

    def batch(rows: list[tuple[int, str, int, dict[str, Any] | None]], offset: int) -> pa.Table:
        values: dict[str, list[Any]] = {name: [] for name in kinds}
        for _, _, _, row in rows:
            for name in kinds:
                values[name].append(None if row is None else row[name])
        n = len(rows)
        types = {
            "body": pa.string(),
            "blob": pa.binary(),
            "doc": pa.string(),
            "tags": pa.list_(pa.string()),
            "uids": pa.list_(pa.string()),
            "days": pa.list_(pa.date32()),
            "nums": pa.list_(pa.int64()),
        }
        return pa.table(
            {
                "id": pa.array([r[0] for r in rows], pa.int64()),
                **{name: pa.array(values[name], types[name]) for name in kinds},
                "_cdc_op": [r[1] for r in rows],
                "_cdc_version": pa.array([r[2] for r in rows], pa.int64()),
                "_cdc_ts": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)] * n, pa.timestamp("us", "UTC")),
                "_cdc_topic": ["t.docs"] * n,
                "_cdc_partition": pa.array([0] * n, pa.int32()),
                "_cdc_offset": pa.array(range(offset, offset + n), pa.int64()),
            }
        )

    sink.stage_writer(0, "c").stage(batch([(1, "c", 10, full(1)), (2, "c", 11, full(2)), (4, "c", 12, full(4))], 0))
    sink.stage_writer(1, "c").stage(batch([(4, "d", 20, None)], 3))
    second = batch(
        [
            (1, "u", 30, unchanged()),  # the stored row's values
            (2, "u", 31, full(20)),  # set earlier in the batch: the carry keeps it
            (2, "u", 32, unchanged()),
            (3, "c", 33, unchanged()),  # never seen: nothing to keep
            (4, "c", 34, unchanged()),  # deleted: nothing to keep
        ],
        4,
    )
    writer = sink.stage_writer(2, "c")
    assert writer.stage(second) == 4
    assert writer.stage(second) == 4  # a retried task reads back its own rows: the same values
    names = ", ".join(kinds)

    def current_rows() -> dict[int, dict[str, Any]]:
        query = f"SELECT id, {names} FROM d FINAL WHERE NOT _is_deleted ORDER BY id"
        result = client.query(query, query_formats={"UUID": "string"}, column_formats={"blob": "bytes"})
        return {row[0]: dict(zip(kinds, row[1:], strict=True)) for row in result.result_rows}

    current = current_rows()
    assert current[1] == full(1)
    assert current[2] == full(20)
    assert current[3] == current[4] == {**unchanged(), "body": placeholder["body"]}
    assert client.command("SELECT count() FROM d WHERE _version >= 30") == 4

    # Primary-key changes (a delete of the old key and a create of the new one at the same version): 1 -> 7 takes
    # 1's stored values, 2 -> 8 the values 2 was given earlier in the batch.
    moves = [
        (1, "d", 40, None),
        (7, "c", 40, unchanged()),
        (2, "u", 41, full(21)),
        (2, "d", 42, None),
        (8, "c", 42, unchanged()),
    ]
    sink.stage_writer(3, "c").stage(batch(moves, 9))
    current = current_rows()
    assert set(current) == {3, 4, 7, 8}
    assert current[7] == full(1) and current[8] == full(21)

    # Key changes whose delete (with its key-move row 'n', naming the new key) and create are in different tasks
    # or batches: the delete row carries the values, the driver passes them on after the batch's tasks.
    def land(batch_id: int, *tasks: pa.Table) -> None:
        writer = sink.stage_writer(batch_id, "c")
        for task in tasks:
            writer.stage(task)
        sink.follow_key_moves("c", batch_id)

    # Delete first: 7 -> 9, the create a batch later.
    land(4, batch([(7, "d", 50, None), (9, "n", 50, None)], 20))
    sink.stage_writer(5, "c").stage(batch([(9, "c", 50, unchanged())], 22))
    assert current_rows()[9] == full(1)  # the create's task took them from the link: never the placeholder
    sink.follow_key_moves("c", 5)
    # Create first (its partition ran ahead), and its key changed again: 8 -> 10 lands holding the placeholder,
    # and the delete of 8 a batch later corrects it, with the value 8 was given just before the move.
    land(6, batch([(10, "c", 60, unchanged()), (10, "u", 61, unchanged())], 23))
    assert current_rows()[10]["body"] == placeholder["body"]
    land(7, batch([(8, "u", 55, full(22)), (8, "d", 60, None), (10, "n", 60, None)], 25))
    # One batch, two tasks (partitions), the delete's first: 9 -> 11.
    land(8, batch([(9, "d", 70, None), (11, "n", 70, None)], 28), batch([(11, "c", 70, unchanged())], 30))
    current = current_rows()
    assert set(current) == {3, 4, 10, 11}
    assert current[10] == full(22) and current[11] == full(1)
    land(8, batch([(11, "c", 70, unchanged())], 30))  # a replayed batch: nothing changes
    assert current_rows() == current
    # A chain, 10 -> 12 -> 13, whose first delete comes last: 12's create and delete in one task (only the delete
    # lands), 13 lands holding the placeholder; then 10's values go along the chain to 13, every type of them.
    land(9, batch([(12, "c", 80, unchanged()), (12, "d", 90, None), (13, "n", 90, None)], 31))
    land(10, batch([(13, "c", 90, unchanged())], 34))
    assert current_rows()[13]["body"] == placeholder["body"]
    land(11, batch([(10, "d", 80, None), (12, "n", 80, None)], 35))
    current = current_rows()
    assert set(current) == {3, 4, 11, 13}
    assert current[13] == full(22)
    assert key_move_links(postgres_dsn) == []


def test_dates_and_timestamps_land_over_clickhouses_whole_range_with_the_infinities_at_its_ends(
    clickhouse_database: ClickHouseDatabase, tmp_path: Path, postgres_dsn: str
) -> None:
    """ClickHouse would saturate or wrap a DateTime64 outside 0000-9999 without a word: such a value stops the
    batch; ``±infinity`` lands at the ends, so it still sorts after and before every other value."""
    import pyarrow as pa

    from cdcsync.core import temporal
    from cdcsync.core.reports import ReportedFailure
    from cdcsync.sinks.clickhouse_values import MAX_DAYS, MAX_MICROS, MIN_DAYS, MIN_MICROS

    client = clickhouse_database.client()
    sink = _things_sink(
        clickhouse_database,
        tmp_path,
        postgres_dsn,
        {"id": "bigint", "d": "date", "ts": "timestamptz", "days": "date[]"},
    )

    def changes(days: list[int], micros: list[int]) -> pa.Table:
        n = len(days)
        return pa.table(
            {
                "id": pa.array(range(1, n + 1), pa.int64()),
                "d": pa.array(days, pa.date32()),
                "ts": pa.array(micros, pa.timestamp("us", tz="UTC")),
                "days": pa.array([[day] for day in days], pa.list_(pa.date32())),
                "_cdc_op": ["c"] * n,
                "_cdc_version": pa.array(range(10, 10 + n), pa.decimal128(38, 0)),
                "_cdc_ts": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
                "_cdc_topic": ["t.things"] * n,
                "_cdc_partition": pa.array([0] * n, pa.int32()),
                "_cdc_offset": pa.array(range(100, 100 + n), pa.int64()),
            }
        )

    days = [temporal.DATE_NEGATIVE_INFINITY, MIN_DAYS, -1, 0, MAX_DAYS, temporal.DATE_POSITIVE_INFINITY]
    micros = [temporal.TIMESTAMP_NEGATIVE_INFINITY, MIN_MICROS, -1, 0, MAX_MICROS, temporal.TIMESTAMP_POSITIVE_INFINITY]
    assert sink.stage_writer(0, "ckpt").stage(changes(days, micros)) == 6
    rows = client.query(
        "SELECT toString(d), toUnixTimestamp64Micro(ts), arrayMap(x -> toString(x), days) FROM things FINAL ORDER BY id"
    ).result_rows
    assert rows == [
        ("0000-01-01", MIN_MICROS, ["0000-01-01"]),
        ("0000-01-01", MIN_MICROS, ["0000-01-01"]),
        ("1969-12-31", -1, ["1969-12-31"]),
        ("1970-01-01", 0, ["1970-01-01"]),
        ("9999-12-31", MAX_MICROS, ["9999-12-31"]),
        ("9999-12-31", MAX_MICROS, ["9999-12-31"]),
    ]
    with pytest.raises(ReportedFailure, match=r"sink 'ch': column 'ts' holds 10000-01-01 00:00:00.000000\+00"):
        sink.stage_writer(1, "ckpt").stage(changes([0], [MAX_MICROS + 1]))


def test_a_tasks_client_is_kept_for_the_next_task_and_dropped_after_a_failure(
    clickhouse_database: ClickHouseDatabase,
) -> None:
    """Each task of a ClickHouse sink takes its client from :func:`reused_client`: the client of an earlier task
    that ended well (no new client, so no settings query to the server), a new one after a task that raised."""
    from cdcsync.db.clickhouse import reused_client

    url = clickhouse_database.url
    with reused_client(url, compression="lz4") as first:
        assert first.command("SELECT 1") == 1
    with reused_client(url, compression="lz4") as second:
        assert second is first and second.command("SELECT 2") == 2
    with reused_client(url) as other_compression:
        assert other_compression is not first
    with pytest.raises(RuntimeError), reused_client(url, compression="lz4") as failing:
        assert failing is first
        raise RuntimeError("the task failed")
    with reused_client(url, compression="lz4") as after_failure:
        assert after_failure is not first and after_failure.command("SELECT 3") == 3

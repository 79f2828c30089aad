"""ClickHouse as cdcsync's code will use it, through clickhouse-connect only.

Against the dev stack these tests exercise the chDB-backed HTTP stand-in (``cdcsync.devstack.clickhouse``). They
are written to hold for a real clickhouse-server too (``CDCSYNC_TEST_STACK=containers`` or
``CDCSYNC_TEST_CLICKHOUSE_URL``): the stand-in must not be more lenient than the server. Tests named
``test_standin_*`` and the restart test run a stand-in of their own whatever the session's services are.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdcsync.devstack import clickhouse as devserver
from cdcsync.devstack.clickhouse_protocol import split_insert
from cdcsync.devstack.common import DevStackConfig, port_open, process_command_line
from tests.conftest import ClickHouseDatabase
from tests.ports import free_port

pytestmark = pytest.mark.integration

VERSIONED_TABLE = """
CREATE TABLE {name} (
    id UInt64,
    name LowCardinality(String),
    amount Nullable(Decimal(38, 10)),
    updated_at DateTime64(6, 'UTC'),
    uid UUID,
    note Nullable(String),
    _version UInt64,
    _is_deleted UInt8
)
ENGINE = ReplacingMergeTree(_version, _is_deleted)
ORDER BY id
"""
COLUMNS = ["id", "name", "amount", "updated_at", "uid", "note", "_version", "_is_deleted"]
UTC = dt.timezone.utc


def _row(id_: int, name: str, version: int, *, deleted: int = 0, note: str | None = None) -> list[Any]:
    return [
        id_,
        name,
        Decimal("12345678901234567890.0123456789") if id_ % 2 else None,
        dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
        uuid.UUID(int=id_ * 1000 + version),
        note,
        version,
        deleted,
    ]


def test_ping_and_server_version(clickhouse_database: ClickHouseDatabase) -> None:
    client = clickhouse_database.client()
    assert client.ping()
    assert re.match(r"^2\d\.\d+\.", client.server_version), client.server_version
    assert client.command("SELECT currentDatabase()") == clickhouse_database.database


def test_arrow_round_trip_keeps_types_and_values(clickhouse_database: ClickHouseDatabase) -> None:
    import pyarrow as pa

    client = clickhouse_database.client()
    client.command(VERSIONED_TABLE.format(name="versioned"))
    uids = [uuid.uuid4(), uuid.uuid4()]
    stamps = [dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC), dt.datetime(1999, 12, 31, 0, 0, tzinfo=UTC)]
    table = pa.table(
        {
            "id": pa.array([1, 2], pa.uint64()),
            "name": pa.array(["ä-unicode", "b"]),
            "amount": pa.array([Decimal("-12345678901234567890.0123456789"), None], pa.decimal128(38, 10)),
            "updated_at": pa.array(stamps, pa.timestamp("us", tz="UTC")),
            "uid": pa.array([str(u) for u in uids]),
            "note": pa.array([None, "n"]),
            "_version": pa.array([7, 7], pa.uint64()),
            "_is_deleted": pa.array([0, 0], pa.uint8()),
        }
    )
    summary = client.insert_arrow("versioned", table)
    assert summary.written_rows == 2

    result = client.query_arrow("SELECT * FROM versioned ORDER BY id")
    assert result.column_names == COLUMNS
    assert pa.types.is_decimal(result.schema.field("amount").type)
    assert result.schema.field("amount").type.scale == 10
    assert result.schema.field("updated_at").type == pa.timestamp("us", tz="UTC")
    rows = result.to_pylist()
    assert [r["amount"] for r in rows] == [Decimal("-12345678901234567890.0123456789"), None]
    assert [r["updated_at"] for r in rows] == stamps
    # Arrow's UUID representation differs between server versions (extension type vs 16 bytes): compare in SQL.
    assert client.query("SELECT toString(uid) FROM versioned ORDER BY id").result_columns[0] == [str(u) for u in uids]
    assert [r["name"] for r in rows] == ["ä-unicode", "b"]
    assert [r["note"] for r in rows] == [None, "n"]
    types = dict(client.query(f"SELECT name, type FROM system.columns WHERE database = '{clickhouse_database.database}' AND table = 'versioned'").result_rows)  # fmt: skip
    assert types["name"] == "LowCardinality(String)"
    assert types["updated_at"] == "DateTime64(6, 'UTC')"


def test_final_hides_older_versions_and_deleted_rows(clickhouse_database: ClickHouseDatabase) -> None:
    client = clickhouse_database.client()
    client.command(VERSIONED_TABLE.format(name="versioned"))
    # One insert per version: separate parts, so only FINAL (or a merge) can reconcile them.
    for batch in ([_row(1, "old", 1), _row(2, "gone", 1)], [_row(1, "new", 2)], [_row(2, "gone", 2, deleted=1)]):
        client.insert("versioned", batch, column_names=COLUMNS)

    assert client.query("SELECT count() FROM versioned").result_rows == [(4,)]
    final = client.query("SELECT id, name, _version FROM versioned FINAL ORDER BY id").result_rows
    assert final == [(1, "new", 2)]

    client.command("OPTIMIZE TABLE versioned FINAL")
    # A merge keeps the newest version of each key; the deleted key's tombstone stays until a CLEANUP merge.
    merged = client.query("SELECT id, _version, _is_deleted FROM versioned ORDER BY id").result_rows
    assert merged == [(1, 2, 0), (2, 2, 1)]


def test_insert_deduplication_token(clickhouse_database: ClickHouseDatabase) -> None:
    client = clickhouse_database.client()
    client.command(
        "CREATE TABLE dedup (id UInt64, v String) ENGINE = MergeTree ORDER BY id "
        "SETTINGS non_replicated_deduplication_window = 1000"
    )
    first = [[1, "a"], [2, "b"]]
    client.insert("dedup", first, settings={"insert_deduplication_token": "batch-1"})
    client.insert("dedup", first, settings={"insert_deduplication_token": "batch-1"})
    assert client.query("SELECT count() FROM dedup").result_rows == [(2,)]

    # The token, not the data, identifies the insert: other rows under the same token are dropped too ...
    client.insert("dedup", [[3, "c"]], settings={"insert_deduplication_token": "batch-1"})
    assert client.query("SELECT count() FROM dedup").result_rows == [(2,)]
    # ... and a token is for its own query only: the next insert without one must not inherit it.
    client.insert("dedup", [[3, "c"]])
    assert client.query("SELECT count() FROM dedup").result_rows == [(3,)]

    rows = client.query_arrow("SELECT toUInt64(number + 10) AS id, toString(number) AS v FROM numbers(5)")
    for _ in range(2):
        client.insert_arrow("dedup", rows, settings={"insert_deduplication_token": "arrow-1"})
    assert client.query("SELECT count() FROM dedup").result_rows == [(8,)]


def test_url_settings_reach_the_engine_for_one_query(clickhouse_database: ClickHouseDatabase) -> None:
    from clickhouse_connect.driver.exceptions import DatabaseError

    client = clickhouse_database.client()
    probe = "SELECT getSetting('max_block_size')"
    assert client.query(probe, settings={"max_block_size": 1234}).result_rows == [(1234,)]
    assert client.query(probe).result_rows != [(1234,)]
    # A session's own SET lasts; a query's URL setting overrides it for that query only.
    client.command("SET max_block_size = 4321")
    assert client.query(probe, settings={"max_block_size": 1234}).result_rows == [(1234,)]
    assert client.query(probe).result_rows == [(4321,)]
    with pytest.raises(DatabaseError) as raised:
        client.query("SELECT 1", settings={"no_such_setting_anywhere": 1})
    assert raised.value.code == 115


def test_session_keeps_temporary_tables_and_server_side_parameters(clickhouse_database: ClickHouseDatabase) -> None:
    client = clickhouse_database.client()
    client.command("CREATE TEMPORARY TABLE scratch (x String)")
    client.command("INSERT INTO scratch VALUES ('kept')")
    assert client.query("SELECT x FROM scratch").result_rows == [("kept",)]
    other = clickhouse_database.client()  # another session cannot see it
    with pytest.raises(Exception) as raised:
        other.query("SELECT x FROM scratch")
    assert getattr(raised.value, "code", None) == 60
    bound = client.query("SELECT {s:String}, {a:Array(UInt8)}", parameters={"s": "it's\ttabbed", "a": [1, 2]})
    assert bound.result_rows == [("it's\ttabbed", [1, 2])]


@pytest.mark.parametrize("compress", ["lz4", "zstd", "gzip", False])
def test_compression_variants(clickhouse_database: ClickHouseDatabase, compress: str | bool) -> None:
    import pyarrow as pa

    client = clickhouse_database.client(compress=compress)
    client.command(VERSIONED_TABLE.format(name="versioned"))
    # Enough rows for several compressed blocks/frames, and repetitive enough that compression matters.
    rows = [_row(i, f"name-{i % 7}", 1, note="x" * (i % 50)) for i in range(1, 20001)]
    assert client.insert("versioned", rows, column_names=COLUMNS).written_rows == len(rows)
    arrow = client.query_arrow("SELECT * FROM versioned WHERE id > 10000 ORDER BY id")
    assert arrow.num_rows == 10000
    new_keys = pa.array(arrow.column("id").to_numpy() + 100000, pa.uint64())
    arrow = arrow.set_column(0, "id", new_keys)  # same rows under new keys
    assert client.insert_arrow("versioned", arrow).written_rows == 10000
    result = client.query("SELECT id, name, amount, uid, note FROM versioned WHERE id IN (1, 2, 110001) ORDER BY id")
    assert result.result_rows == [
        (1, "name-1", Decimal("12345678901234567890.0123456789"), uuid.UUID(int=1001), "x"),
        (2, "name-2", None, uuid.UUID(int=2001), "xx"),
        (110001, "name-5", Decimal("12345678901234567890.0123456789"), uuid.UUID(int=10001001), "x"),
    ]
    assert client.query("SELECT count() FROM versioned").result_rows == [(30000,)]
    if compress:  # the server compressed its answer the way the client asked
        response = client.raw_stream(
            "SELECT id FROM versioned",
            settings={"enable_http_compression": 1},
            transport_settings={"Accept-Encoding": str(compress)},
        )
        try:
            assert response.headers.get("Content-Encoding") == compress
        finally:
            response.close()


def test_errors_carry_clickhouse_codes(clickhouse_database: ClickHouseDatabase) -> None:
    from clickhouse_connect.driver.exceptions import DatabaseError

    client = clickhouse_database.client()
    with pytest.raises(DatabaseError) as syntax:
        client.command("SELEC 1")
    assert syntax.value.code == 62
    assert "SYNTAX_ERROR" in str(syntax.value)
    with pytest.raises(DatabaseError) as missing:
        client.query("SELECT * FROM no_such_table")
    assert missing.value.code == 60
    with pytest.raises(DatabaseError) as missing_insert:
        client.insert("no_such_table", [[1]], column_names=["x"], column_type_names=["UInt8"])
    assert missing_insert.value.code == 60
    # The failed requests left the session usable.
    assert client.command("SELECT 41 + 1") == 42


def test_system_tables_describe_the_schema(clickhouse_database: ClickHouseDatabase) -> None:
    client = clickhouse_database.client()
    client.command(
        "CREATE TABLE keyed (tenant String, id UInt64, v Nullable(Float64), _version UInt64, _is_deleted UInt8) "
        "ENGINE = ReplacingMergeTree(_version, _is_deleted) ORDER BY (tenant, id)"
    )
    db = clickhouse_database.database
    tables = client.query(
        "SELECT name, engine, sorting_key, primary_key FROM system.tables WHERE database = {db:String}",
        parameters={"db": db},
    ).result_rows
    assert tables == [("keyed", "ReplacingMergeTree", "tenant, id", "tenant, id")]
    columns = client.query(
        "SELECT name, type, is_in_sorting_key FROM system.columns WHERE database = {db:String} AND table = 'keyed' "
        "ORDER BY position",
        parameters={"db": db},
    ).result_rows
    assert columns == [
        ("tenant", "String", 1),
        ("id", "UInt64", 1),
        ("v", "Nullable(Float64)", 0),
        ("_version", "UInt64", 0),
        ("_is_deleted", "UInt8", 0),
    ]


@pytest.mark.parametrize(
    ("raw", "statement", "fmt", "data"),
    [
        (b"INSERT INTO t FORMAT Native\n\x02\x01", "INSERT INTO t", "Native", b"\x02\x01"),
        # A Native block of 9, 10 or 13 columns starts with a whitespace byte: only the first newline separates.
        (b"INSERT INTO t FORMAT Native\n\t\x00", "INSERT INTO t", "Native", b"\t\x00"),
        (b"INSERT INTO t FORMAT Native\n\n\x00", "INSERT INTO t", "Native", b"\n\x00"),
        (b"INSERT INTO t FORMAT Native\n\r\x00", "INSERT INTO t", "Native", b"\r\x00"),
        (b"insert into `format` (`format`) format TSV  \r\n1\n", "insert into `format` (`format`)", "TSV", b"1\n"),
        (b"/* c */ INSERT INTO t (format) SETTINGS a='FORMAT x' FORMAT CSV 1,2", None, "CSV", b"1,2"),
        (b"INSERT INTO t FORMAT Values (1), (2)", "INSERT INTO t", "Values", b"(1), (2)"),
        (b"INSERT INTO t VALUES (1)", None, None, None),
        (b"INSERT INTO t SELECT 1 FORMAT Native", None, None, None),
        (b"SELECT 1 FORMAT Native", None, None, None),
    ],
)
def test_insert_data_starts_where_clickhouse_says(
    raw: bytes, statement: str | None, fmt: str | None, data: bytes | None
) -> None:
    split = split_insert(raw)
    if fmt is None:
        assert split is None
        return
    assert split is not None
    assert (split.fmt, split.data) == (fmt, data)
    assert split.statement == (statement or raw[: raw.rindex(b" FORMAT ")].decode())


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStackConfig]:
    """A dev server of this module's own, for what only the stand-in does (whatever services the session uses)."""
    cfg = DevStackConfig(state_dir=tmp_path_factory.mktemp("standin"), clickhouse_port=free_port())
    server = devserver.ClickHouse(cfg)
    server.start()
    try:
        server.wait_ready(60)
        yield cfg
    finally:
        server.stop()


def test_standin_accepts_only_the_default_user(standin: DevStackConfig) -> None:
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import DatabaseError

    port = standin.clickhouse_port
    client = clickhouse_connect.get_client(host="127.0.0.1", port=port, username="default", password="any thing")
    assert client.command("SELECT currentUser()") == "default"
    with pytest.raises(DatabaseError) as refused:
        clickhouse_connect.get_client(host="127.0.0.1", port=port, username="alice", password="secret")
    assert refused.value.code == 516
    assert "only has the user 'default'" in str(refused.value)


def test_standin_refuses_multi_statements_and_concurrent_use_of_a_session(standin: DevStackConfig) -> None:
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import DatabaseError

    dsn = devserver.url(standin)
    client = clickhouse_connect.get_client(dsn=dsn)
    with pytest.raises(DatabaseError) as multi:
        client.command("SELECT 1; SELECT 2")
    assert multi.value.code == 62

    # Two clients sharing one session id, as two processes might: the second query must not run inside the first.
    first = clickhouse_connect.get_client(dsn=dsn, session_id="shared-session")
    second = clickhouse_connect.get_client(dsn=dsn, session_id="shared-session")
    slow = threading.Thread(target=first.command, args=("SELECT sleep(2)",))
    slow.start()
    try:
        time.sleep(0.5)
        with pytest.raises(DatabaseError) as locked:
            second.command("SELECT 1")
        assert locked.value.code == 373
    finally:
        slow.join()
    assert second.command("SELECT 1") == 1


def test_data_survives_a_server_restart(tmp_path: Path) -> None:
    """Stop and start the dev server process itself (not the session's shared one) and find the table again."""
    import clickhouse_connect

    cfg = DevStackConfig(state_dir=tmp_path, clickhouse_port=free_port(), startup_timeout_s=60)
    server = devserver.ClickHouse(cfg)
    try:
        first = server.start()
        server.wait_ready()
        assert server.status().running
        client = clickhouse_connect.get_client(dsn=devserver.url(cfg))
        client.command(VERSIONED_TABLE.format(name="default.kept"))
        client.insert("default.kept", [_row(1, "a", 1), _row(2, "b", 1)], column_names=COLUMNS)
        client.close()

        stopped = server.stop()
        assert stopped.detail == "stopped"  # a clean SIGTERM shutdown, not a kill
        assert first.pid is not None and process_command_line(first.pid) is None
        assert not port_open(cfg.clickhouse_port)
        assert server.status().state == "stopped"

        second = server.start()
        server.wait_ready()
        assert second.pid != first.pid
        client = clickhouse_connect.get_client(dsn=devserver.url(cfg))
        assert client.query("SELECT id, name FROM default.kept FINAL ORDER BY id").result_rows == [(1, "a"), (2, "b")]
        client.close()
    finally:
        server.stop()
    assert (devserver.data_dir(cfg) / "metadata").is_dir()

"""The pure parts of ``benchmarks/peer_jdbc_sink.py``: its arguments, the states a target may end in, the row
comparison, and the JDBC sink's connector settings. Nothing is started."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

import pytest

from benchmarks import jdbc_sink
from benchmarks.peer_jdbc_sink import RowDiff, arrival_order_state, change_row, diff_rows, parse_args
from cdcsync.devstack import workload


def test_arguments_defaults_and_small_values() -> None:
    args = parse_args([])
    assert (args.changes, args.keys, args.replays, args.batch_size) == (1_000_000, 200_000, 0, 10_000)
    assert args.connect_port not in (18083, 28083)  # neither `cdcsync dev up`'s Connect nor the tests'
    sizes = ["--changes", "20_000", "--keys", "4000", "--replays", "50", "--connect-port", "28483"]
    args = parse_args([*sizes, "--sink-option", "dialect.postgres.unnest.insert.enabled=true", "--only", "jdbc"])
    assert (args.changes, args.keys, args.replays, args.connect_port) == (20_000, 4000, 50, 28483)
    assert args.sink_option == [("dialect.postgres.unnest.insert.enabled", "true")]
    assert args.only == "jdbc"


@pytest.mark.parametrize(
    "argv", [["--changes", "0"], ["--replays", "-1"], ["--sink-option", "no-equals-sign"], ["--only", "kafka"]]
)
def test_arguments_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_change_row_reads_what_the_workload_wrote() -> None:
    load = workload.generate(300, 40, seed=3, wrapped=True)
    last: dict[int, tuple[str, object]] = {}
    for event in load.events:
        if event.value is not None:
            last[event.id] = change_row(event.value)
    # The last change of every key, decoded, is the expected state: live rows equal, deleted keys are deletes.
    assert {key: row for key, (_, row) in last.items() if row is not None} == load.expected
    assert all(op == "d" for key, (op, row) in last.items() if row is None)
    some = next(iter(load.expected.values()))
    assert isinstance(some["updated_at"], datetime) and some["updated_at"].tzinfo is not None


def test_arrival_order_state_applies_replays_over_the_source_state() -> None:
    load = workload.generate(2_000, 100, seed=5, wrapped=True)
    replays = workload.stale_replays(load, 60, seed=2)
    assert replays
    before = {key: dict(row) for key, row in load.expected.items()}
    state = arrival_order_state(load.expected, replays)
    assert state != load.expected
    assert load.expected == before  # not modified in place
    # Each key ends as its last replay left it: an old row back, or gone after an old delete.
    for event in replays:
        op, row = change_row(event.value or b"")
        last_for_key = [e for e in replays if e.id == event.id][-1]
        if event is last_for_key:
            assert state.get(event.id) == row
            assert (row is None) == (op == "d")
    untouched = set(load.expected) - {e.id for e in replays}
    assert all(state[key] == load.expected[key] for key in untouched)
    assert arrival_order_state(load.expected, []) == load.expected


def test_diff_rows_counts_missing_extra_and_differing() -> None:
    when = datetime(2024, 1, 1, tzinfo=timezone.utc)
    expected = {1: {"a": Decimal("1.50"), "t": when}, 2: {"a": None, "t": when}, 3: {"a": Decimal("2"), "t": when}}
    actual = {
        1: {"a": Decimal("1.5"), "t": when.astimezone(timezone.max)},  # the same values, other spellings
        3: {"a": Decimal("2.01"), "t": when},
        4: {"a": None, "t": when},
    }
    diff = diff_rows(actual, expected)
    assert diff == RowDiff(missing=1, extra=1, differing=1)
    assert not diff.equal and diff.describe() == "1 missing, 1 extra, 1 differing"
    assert diff_rows(expected, expected).equal and diff_rows({}, {}).describe() == "equal"


def test_jdbc_sink_connector_settings() -> None:
    config = jdbc_sink.connector_config(
        topic="t",
        jdbc_url=jdbc_sink.jdbc_url({"host": "127.0.0.1", "port": "54329", "dbname": "peer"}),
        user="cdcsync",
        password=None,
        table="orders",
        batch_size=20_000,
        overrides={"use.reduction.buffer": "false"},
    )
    assert config["connection.url"] == "jdbc:postgresql://127.0.0.1:54329/peer"
    assert (config["insert.mode"], config["delete.enabled"], config["primary.key.mode"]) == (
        "upsert",
        "true",
        "record_key",
    )
    assert config["tasks.max"] == "4"
    assert config["batch.size"] == config["consumer.override.max.poll.records"] == "20000"
    assert config["value.converter.schemas.enable"] == "true"
    assert config["use.reduction.buffer"] == "false"  # overrides win
    assert "connection.password" not in config
    assert jdbc_sink.WORKER_OVERRIDES["connector.client.config.override.policy"] == "All"

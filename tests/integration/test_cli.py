"""The command line against a real Postgres: exit codes, messages, and the migration check before ``run``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cdcsync.cli import app

PIPELINE = {
    "name": "clitest",
    "sources": {
        "orders": {
            "type": "kafka",
            "topic": "cli.public.orders",
            "primary_key": "id",
            "columns": {"id": "bigint", "Total Amount": "numeric(12,2)"},
        }
    },
    "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": "Select", "table": "order"}},
}


@pytest.fixture()
def project(tmp_path: Path, postgres_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CDCSYNC__POSTGRES__DSN", postgres_dsn)
    monkeypatch.setenv("CDCSYNC__MIGRATIONS_DIR", str(tmp_path / "migrations"))
    monkeypatch.setenv("CDCSYNC__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CDCSYNC__KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")  # never reached by these tests
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(PIPELINE))
    return path


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_version() -> None:
    code, out, _ = invoke("--version")
    assert code == 0 and out.startswith("cdcsync ")


def test_validate_reports_paths_and_exits_2(tmp_path: Path) -> None:
    bad = dict(PIPELINE, sinks={"mirror": {"type": "postgres", "from": "orders", "table": "t", "primary_key": "idd"}})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    code, _, err = invoke("validate", str(path))
    assert code == 2
    assert "sinks.mirror.primary_key: column 'idd' is not in source 'orders'" in err
    assert "Traceback" not in err


def test_init_migrate_then_run_refuses_an_altered_file(project: Path, postgres_dsn: str) -> None:
    code, out, err = invoke("run", str(project), "--available-now")
    assert code == 2 and "cdcsync init" in err, err  # no migrations at all yet

    code, out, err = invoke("init", str(project))
    assert code == 0 and "0001_init.sql" in out
    assert "skipped.operations=none" in " ".join(err.split())  # truncates need the connector's consent
    code, out, err = invoke("run", str(project), "--available-now")
    assert code == 2 and "0001_init.sql" in err and "pending" in err, err

    code, out, _ = invoke("migrate", str(project))
    assert code == 0 and "applied" in out
    code, out, _ = invoke("migrate", str(project), "--status")
    assert code == 0 and "applied" in out

    migration = next(project.parent.glob("migrations/clitest/postgres/0001_*.sql"))
    migration.write_text(migration.read_text().replace("CREATE TABLE", "CREATE  TABLE", 1))
    code, _, err = invoke("run", str(project), "--available-now")
    assert code == 2, err
    assert migration.name in err and "altered" in err
    assert "Traceback" not in err


def test_second_init_after_adding_a_sink_writes_only_the_next_file(project: Path) -> None:
    assert invoke("init", str(project))[0] == 0
    code, out, _ = invoke("init", str(project))
    assert code == 0 and "up to date" in out
    doc = yaml.safe_load(project.read_text())
    doc["sinks"]["copy"] = {"type": "postgres", "from": "orders", "schema": "app", "table": "orders_copy"}
    project.write_text(yaml.safe_dump(doc))
    code, out, _ = invoke("init", str(project))
    assert code == 0
    files = sorted(p.name for p in project.parent.glob("migrations/clitest/postgres/*.sql"))
    assert files[0].startswith("0001_") and files[1].startswith("0002_") and len(files) == 2
    assert "0002_" in out


def test_unreachable_postgres_is_a_clean_runtime_error(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDCSYNC__POSTGRES__DSN", "postgresql://cdcsync:s3cret@127.0.0.1:1/nowhere")
    code, _, err = invoke("migrate", str(project))
    assert code == 1
    assert "connecting to Postgres" in err and "s3cret" not in err and "Traceback" not in err


def test_reset_asks_first_then_removes_the_checkpoints_and_ledger_rows(project: Path, postgres_dsn: str) -> None:
    import psycopg

    assert invoke("init", str(project))[0] == 0 and invoke("migrate", str(project))[0] == 0
    checkpoint = project.parent / "state" / "checkpoints" / "clitest" / "orders"
    (checkpoint / "commits").mkdir(parents=True)
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute(
            "INSERT INTO cdcsync.batch_ledger (pipeline, sink, checkpoint_id, batch_id, rows_written) "
            "VALUES ('clitest', 'mirror', 'cp', 0, 3), ('other', 'mirror', 'cp', 0, 3)"
        )
    code, _, err = invoke("reset", str(project))  # no terminal to ask on
    assert code == 2 and "--yes" in err and checkpoint.exists(), err
    code, _, err = invoke("reset", str(project), "--sink", "nope", "--yes")
    assert code == 2 and "has no sink 'nope'" in err, err
    code, out, err = invoke("reset", str(project), "--sink", "mirror", "--yes")
    assert code == 0, err
    assert "1 checkpoint(s) and 1 ledger row(s) removed" in out and "checkpoint of source 'orders'" in err
    assert not checkpoint.exists()
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT pipeline FROM cdcsync.batch_ledger").fetchall() == [("other",)]

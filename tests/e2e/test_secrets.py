"""Secrets never reach what cdcsync prints: a run that fails (its schema registry is unreachable while decoding an
Avro message) with a password in the Postgres DSN, the ClickHouse URL and the registry URL, and the read-only
commands around it (status, status --json, dead-letters list, validate), are searched for each password in every
byte they write (stdout, stderr, the state directory)."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo

from cdcsync.devstack.workload import ChangeEvent, produce
from tests.e2e.conftest import Project, orders_pipeline
from tests.ports import free_port


def _written(root: Path) -> str:
    """Every file under ``root``, as text."""
    return "\n".join(path.read_bytes().decode("utf-8", "replace") for path in sorted(root.rglob("*")) if path.is_file())


def test_no_password_in_any_output_of_a_failing_run(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, kafka_bootstrap: str, topic_name: str
) -> None:
    secrets = {name: f"{name}-S3CRET-{uuid.uuid4().hex[:8]}" for name in ("pg", "ch", "registry")}
    # an Avro message (magic byte, writer schema id) whose schema the registry must be asked for
    message = ChangeEvent(key=b'{"id": 1}', value=b"\x00" + struct.pack(">I", 4242) + b"\x02", id=1, op="c", lsn=1)
    produce(kafka_bootstrap, topic_name, [message], partitions=1)
    project = make_project(orders_pipeline(topic_name, format="avro"))
    project.prepare()  # with the session's settings, as a DBA would

    project.env.update(
        {
            "CDCSYNC__POSTGRES__DSN": make_conninfo(postgres_dsn, password=secrets["pg"]),  # trust: not checked
            "CDCSYNC__CLICKHOUSE__URL": f"http://default:{secrets['ch']}@127.0.0.1:{free_port()}",
            "CDCSYNC__SCHEMA_REGISTRY__URL": f"http://cdcsync:{secrets['registry']}@127.0.0.1:{free_port()}/apis/ccompat/v7",
            "CDCSYNC__SCHEMA_REGISTRY__RETRY_TIMEOUT_S": "1",
            "CDCSYNC__RETRY__BUDGET_S": "2",  # the registry stays away: fail soon
        }
    )
    pipeline = str(project.pipeline_file)
    failed = project.cdcsync("run", pipeline, "--available-now", check=False)
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr
    outputs = [failed.stdout, failed.stderr]
    for args in (("status", pipeline, "--json"), ("status", pipeline), ("dead-letters", "list", pipeline)):
        result = project.cdcsync(*args)
        outputs += [result.stdout, result.stderr]
    assert '"lag"' in outputs[2]  # status --json answered
    outputs.append(_written(project.root / "state"))
    for name, secret in secrets.items():
        leaks = [index for index, text in enumerate(outputs) if secret in text]
        assert leaks == [], f"the {name} password is in output(s) {leaks}"

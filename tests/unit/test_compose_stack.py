"""The compose stack's parts agree with each other and with cdcsync: the pipeline validates, Debezium's connector
writes the topic the pipeline reads, cdcsync's environment holds real settings, and every file a service mounts
exists. (`make compose-check` validates the file itself against the Compose specification.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.settings import load_settings

pytestmark = pytest.mark.unit

COMPOSE = Path(__file__).resolve().parents[2] / "compose"


def _compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def test_the_pipeline_validates_and_reads_the_connectors_topic() -> None:
    pipeline = validate_pipeline_dict(yaml.safe_load((COMPOSE / "pipelines" / "shop.yaml").read_text()))
    connector = json.loads((COMPOSE / "debezium" / "shop.json").read_text())
    (table,) = connector["table.include.list"].split(",")
    topics = {source.topic for source in pipeline.sources.values()}
    assert topics == {f"{connector['topic.prefix']}.{table}"}
    assert connector["skipped.operations"] == "none"  # the pipeline's sinks apply truncates


def test_cdcsync_services_get_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    compose = _compose()
    for name in ("cdcsync", "cdcsync-migrate"):
        environment = compose["services"][name]["environment"]
        for key, value in environment.items():
            monkeypatch.setenv(key, value)
        settings = load_settings()
        assert settings.postgres_dsn.startswith("postgresql://") and "@postgres:5432/" in settings.postgres_dsn
        assert settings.kafka.bootstrap_servers == "kafka:9092"
        assert str(settings.state_dir).startswith("/var/lib/cdcsync/")


def test_every_mounted_file_exists() -> None:
    for name, service in _compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE / source).exists(), f"service {name} mounts {source}, which does not exist"

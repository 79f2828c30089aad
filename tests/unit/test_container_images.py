"""The locally built images (``containers/``, ``make container-images``) fit the tests and the compose stack: the
tests' public defaults are the compose file's pins, ``containers/build.py --env`` names the variables the tests read,
and the Kafka image's entrypoint turns the tests' ``KAFKA_*`` settings into the broker properties they mean."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.conftest import PUBLIC_IMAGES, kafka_container_environment

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
KAFKA_ENTRYPOINT = ROOT / "containers" / "kafka" / "kafka" / "bin" / "entrypoint.sh"


def _build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("containers_build", ROOT / "containers" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_tests_default_images_are_the_compose_stacks_pins() -> None:
    services = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())["services"]
    for service, image in PUBLIC_IMAGES.items():
        default = re.fullmatch(r"\$\{CDCSYNC_\w+_IMAGE:-(.+)\}", services[service.replace("_", "-")]["image"])
        assert default is not None and default.group(1) == image, service


def test_build_env_names_a_local_image_for_every_service_the_tests_run(capsys: pytest.CaptureFixture[str]) -> None:
    build = _build_module()
    assert build.main(["--env"]) == 0
    names = dict(pair.split("=", 1) for pair in capsys.readouterr().out.split())
    assert set(names) == {f"CDCSYNC_TEST_{service.upper()}_IMAGE" for service in PUBLIC_IMAGES}
    tags = {image.tag for image in build.images()}
    assert set(names.values()) <= tags
    assert "chdb" in names["CDCSYNC_TEST_CLICKHOUSE_IMAGE"]  # the stand-in is never passed off as clickhouse-server


def test_kafka_entrypoint_writes_the_properties_the_tests_ask_for(tmp_path: Path) -> None:
    """The entrypoint, with a stand-in ``java`` that records its arguments instead of starting a broker."""
    (tmp_path / "bin").mkdir()
    fake_java = tmp_path / "bin" / "java"
    fake_java.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/java.calls\n')
    fake_java.chmod(0o755)
    config = tmp_path / "server.properties"
    env = {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "KAFKA_CONFIG_FILE": str(config),
        "KAFKA_LOG_DIRS": str(tmp_path / "data"),
        "KAFKA_HEAP_OPTS": "-Xmx64m",
        "KAFKA_LOG_CLEANER_DEDUPE_BUFFER__SIZE": "1",  # "__" stands for "_" in a property name
        **kafka_container_environment(31234),
    }
    subprocess.run(["bash", str(KAFKA_ENTRYPOINT)], env=env, check=True, timeout=30)
    lines = config.read_text().splitlines()
    properties = dict(line.split("=", 1) for line in lines)
    assert len(properties) == len(lines)
    assert properties["advertised.listeners"] == "PLAINTEXT://127.0.0.1:31234,BROKER://localhost:9094"
    assert properties["inter.broker.listener.name"] == "BROKER"
    assert properties["num.partitions"] == "4"
    assert properties["log.dirs"] == str(tmp_path / "data")
    assert properties["log.cleaner.dedupe.buffer_size"] == "1"
    assert "heap.opts" not in properties and "config.file" not in properties
    format_call, broker_call = (tmp_path / "java.calls").read_text().splitlines()
    assert "kafka.tools.StorageTool format" in format_call and "-Xmx64m" in format_call
    assert broker_call.endswith(f"kafka.Kafka {config}")

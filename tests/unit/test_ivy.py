"""What cdcsync asks Apache Ivy for, and what it keeps so that a warm cache needs neither Java nor the network.

Ivy itself resolving from Maven Central is exercised by ``make jars`` and every test that starts the dev stack.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from cdcsync.core.errors import DependencyError
from cdcsync.runtime import ivy, jars
from cdcsync.runtime.ivy import Artifact


def test_a_plugin_tarball_is_asked_for_by_classifier_and_extension_without_its_dependencies() -> None:
    xml = ivy.module_xml([jars.DEBEZIUM_POSTGRES_PLUGIN, Artifact.parse("org.a:b:1.0")], ["org.slf4j:*", "*:guava"])
    assert (
        '<dependency org="io.debezium" name="debezium-connector-postgres" rev="3.5.0.Final" conf="default->master" '
        'transitive="false"><artifact name="debezium-connector-postgres" type="tar.gz" ext="tar.gz" '
        'm:classifier="plugin"/></dependency>'
    ) in xml
    assert '<dependency org="org.a" name="b" rev="1.0" conf="default->default"/>' in xml
    assert '<exclude org="org.slf4j" module="*"/>' in xml and '<exclude org="*" module="guava"/>' in xml


def test_settings_name_one_repository_and_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ivy.REPOSITORY_URL_ENV, "https://mirror.test/m2")
    path = ivy.write_settings(tmp_path)
    text = path.read_text()
    assert 'root="https://mirror.test/m2/"' in text and f'defaultCacheDir="{tmp_path / "cache"}"' in text
    monkeypatch.delenv(ivy.REPOSITORY_URL_ENV)
    other = ivy.write_settings(tmp_path)
    assert other != path and path.read_text() == text  # another URL: another file, the first one untouched
    assert 'root="https://repo1.maven.org/maven2/"' in other.read_text()


def test_a_warm_request_starts_no_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jar = tmp_path / "a-1.0.jar"
    jar.write_bytes(b"")

    def no_java(*args: object, **kwargs: object) -> object:
        raise AssertionError("Ivy was started although the cache holds the answer")

    calls: list[list[str]] = []

    def fake_ivy(argv: list[str], **kwargs: object) -> object:
        calls.append(argv)
        Path(argv[argv.index("-cachepath") + 1]).write_text(str(jar))
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(ivy, "ivy_jar", lambda: tmp_path / "ivy.jar")
    monkeypatch.setattr(ivy.subprocess, "run", fake_ivy)
    request = [Artifact.parse("org.a:a:1.0")]
    assert ivy.resolve(request, home=tmp_path / "home") == [jar]
    assert len(calls) == 1 and "-settings" in calls[0]
    monkeypatch.setattr(ivy.subprocess, "run", no_java)
    assert ivy.resolve(request, home=tmp_path / "home") == [jar]
    jar.unlink()  # a file gone from the cache: Ivy is asked again
    monkeypatch.setattr(ivy.subprocess, "run", fake_ivy)
    ivy.resolve(request, home=tmp_path / "home")
    assert len(calls) == 2


def test_a_tarball_is_unpacked_once(tmp_path: Path) -> None:
    tarball = tmp_path / "app-1.0-all.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        data = b"runner"
        info = tarfile.TarInfo("app-1.0-runner.jar")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    target = ivy.unpacked(tarball, tmp_path / "unpacked")
    assert target == tmp_path / "unpacked" / "app-1.0-all"
    assert (target / "app-1.0-runner.jar").read_bytes() == b"runner"
    (target / "app-1.0-runner.jar").write_bytes(b"kept")
    assert ivy.unpacked(tarball, tmp_path / "unpacked") == target
    assert (target / "app-1.0-runner.jar").read_bytes() == b"kept"  # not extracted again


def test_without_extraction_filters_only_files_inside_the_target_are_extracted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python before 3.11.4 (Debian bookworm's 3.11.2, the local cdcsync image's) has no ``filter=``."""
    monkeypatch.delattr(tarfile, "data_filter", raising=False)

    def tarball(name: str, member: str) -> Path:
        path = tmp_path / name
        with tarfile.open(path, "w:gz") as archive:
            info = tarfile.TarInfo(member)
            info.size = 3
            archive.addfile(info, io.BytesIO(b"jar"))
        return path

    target = ivy.unpacked(tarball("ok-1.0.tar.gz", "lib/ok.jar"), tmp_path / "unpacked")
    assert (target / "lib" / "ok.jar").read_bytes() == b"jar"
    with pytest.raises(DependencyError, match="refusing to extract"):
        ivy.unpacked(tarball("evil-1.0.tar.gz", "../evil.jar"), tmp_path / "unpacked")
    assert not (tmp_path / "evil.jar").exists()


def test_spark_gets_the_connector_and_delta_as_local_jars_from_the_cdcsync_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolved: list[tuple[list[Artifact], list[str], Path]] = []

    def fake_resolve(artifacts: list[Artifact], exclusions: list[str], *, home: Path) -> list[Path]:
        resolved.append((artifacts, exclusions, home))
        return [home / "a.jar", home / "b.jar"]

    monkeypatch.setattr(jars, "resolve", fake_resolve)
    conf = jars.spark_jars_conf(tmp_path)
    home = tmp_path / "spark-ivy"
    assert conf == {"spark.jars": f"{home / 'a.jar'},{home / 'b.jar'}"}
    ((artifacts, exclusions, resolved_home),) = resolved
    expected = [Artifact.parse(jars.spark_kafka_connector_coordinate()), Artifact.parse(jars.DELTA_COORDINATE)]
    assert artifacts == expected and resolved_home == home
    assert jars.DELTA_COORDINATE == "io.delta:delta-spark_2.13:4.4.0"
    assert "*:hadoop-client-runtime" in exclusions and "*:spark-core_2.13" in exclusions  # pyspark ships them

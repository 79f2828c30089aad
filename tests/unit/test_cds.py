"""The class-data-sharing archive is used only when it is enabled and built, and one archive never serves another
pyspark installation or Java runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcsync.runtime import cds


def test_runs_map_the_archive_only_when_it_is_enabled_and_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cds, "java_executable", lambda: "/usr/bin/java")
    archive = cds.archive_path(tmp_path)
    assert archive is not None and archive.parent == tmp_path / "cds"
    assert cds.driver_java_options(True, tmp_path) == ""  # not built yet: Spark starts as before
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"")
    assert cds.driver_java_options(True, tmp_path) == f"-XX:SharedArchiveFile={archive} -Xshare:auto"
    assert cds.driver_java_options(False, tmp_path) == ""


def test_each_java_runtime_has_an_archive_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cds, "java_executable", lambda: str(tmp_path / "jdk17" / "java"))
    first = cds.archive_path(tmp_path)
    monkeypatch.setattr(cds, "java_executable", lambda: str(tmp_path / "jdk21" / "java"))
    assert cds.archive_path(tmp_path) != first
    monkeypatch.setattr(cds, "java_executable", lambda: None)
    assert cds.archive_path(tmp_path) is None and cds.driver_java_options(True, tmp_path) == ""

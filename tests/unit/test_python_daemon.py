"""The zip importer of cdcsync's Spark daemon: an archive's directory is read again only when the file changed."""

from __future__ import annotations

import importlib
import os
import sys
import zipfile
import zipimport
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdcsync.runtime.python_daemon import UnchangedZipImporter, install_unchanged_zip_importer


@pytest.fixture
def directory_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The archives whose directory a zip importer read again (``invalidate_caches``), in order."""
    reads: list[str] = []
    plain = zipimport.zipimporter.invalidate_caches

    def counted(self: zipimport.zipimporter) -> None:
        reads.append(self.archive)
        plain(self)

    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", counted)
    return reads


def _archive(path: Path, modules: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, source in modules.items():
            archive.writestr(f"{name}.py", source)
    return path


def test_an_unchanged_archive_is_not_read_again(tmp_path: Path, directory_reads: list[str]) -> None:
    archive = _archive(tmp_path / "lib.zip", {"alpha": "VALUE = 1\n"})
    importer = UnchangedZipImporter(str(archive))
    for _ in range(3):
        importer.invalidate_caches()
    assert directory_reads == []
    assert importer.find_spec("alpha") is not None


def test_a_changed_archive_is_read_again_and_its_new_modules_found(tmp_path: Path, directory_reads: list[str]) -> None:
    archive = _archive(tmp_path / "lib.zip", {"alpha": "VALUE = 1\n"})
    importer = UnchangedZipImporter(str(archive))
    assert importer.find_spec("beta") is None
    _archive(archive, {"alpha": "VALUE = 1\n", "beta": "VALUE = 2\n"})
    stamp = archive.stat()
    os.utime(archive, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000_000))  # even within the clock's tick
    importer.invalidate_caches()
    assert directory_reads == [str(archive)]
    assert importer.find_spec("beta") is not None
    importer.invalidate_caches()
    assert directory_reads == [str(archive)]


def test_a_removed_archive_is_read_again(tmp_path: Path, directory_reads: list[str]) -> None:
    archive = _archive(tmp_path / "lib.zip", {"alpha": "VALUE = 1\n"})
    importer = UnchangedZipImporter(str(archive))
    archive.unlink()
    importer.invalidate_caches()
    assert directory_reads == [str(archive)]
    assert importer.find_spec("alpha") is None


@pytest.fixture
def restored_import_state() -> Iterator[None]:
    hooks, cache, path = list(sys.path_hooks), dict(sys.path_importer_cache), list(sys.path)
    yield
    sys.path_hooks[:], sys.path[:] = hooks, path
    sys.path_importer_cache.clear()
    sys.path_importer_cache.update(cache)
    for name in [name for name in sys.modules if name.startswith("cdcsync_zip_")]:
        del sys.modules[name]


@pytest.mark.usefixtures("restored_import_state")
def test_installed_it_replaces_the_zip_importers_made_before_and_after(tmp_path: Path) -> None:
    early = _archive(tmp_path / "early.zip", {"cdcsync_zip_early": "VALUE = 1\n"})
    late = _archive(tmp_path / "late.zip", {"cdcsync_zip_late": "VALUE = 2\n"})
    sys.path.insert(0, str(early))
    assert importlib.import_module("cdcsync_zip_early").VALUE == 1
    assert type(sys.path_importer_cache[str(early)]) is zipimport.zipimporter

    install_unchanged_zip_importer()
    sys.path.insert(0, str(late))
    importlib.invalidate_caches()
    assert importlib.import_module("cdcsync_zip_late").VALUE == 2
    assert type(sys.path_importer_cache[str(late)]) is UnchangedZipImporter
    importlib.reload(sys.modules["cdcsync_zip_early"])
    assert type(sys.path_importer_cache[str(early)]) is UnchangedZipImporter

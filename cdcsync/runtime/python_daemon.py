"""Spark's Python daemon (``spark.python.daemon.module``), with the zip archives on its path read once, not once
per task.

Spark starts its Python workers from ``pyspark.zip`` and py4j's zip (they come first on the workers' path), and
every task begins with ``importlib.invalidate_caches()`` (``pyspark.worker_util.setup_spark_files``). Python
answers that by reading the whole directory of every zip archive it imports from again, once for each package
directory inside it: 120-200 ms of CPU per task in a worker, with pyspark's 1,377 files, about 4% of the workers'
time in ``make bench-clickhouse``. Those archives do not change while a worker lives, so this daemon installs a zip
importer that reads an archive's directory again only when the file has changed (its size or modification time),
and then runs pyspark's own daemon unchanged. Importing stays as it was: the same archives, in the same order.

Nothing is imported here before the fork beyond the standard library: pyspark's daemon forks its workers and
relies on no thread having been started (pandas and pyarrow start some when imported).
"""

from __future__ import annotations

import os
import sys
import zipimport


def _stamp(archive: str) -> tuple[int, int] | None:
    try:
        status = os.stat(archive)
    except OSError:
        return None
    return status.st_size, status.st_mtime_ns


class UnchangedZipImporter(zipimport.zipimporter):
    """A zip importer whose ``invalidate_caches`` reads the archive's directory again only if the file changed."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._read_at = _stamp(self.archive)

    def invalidate_caches(self) -> None:
        now = _stamp(self.archive)
        if now is None or now != self._read_at:
            super().invalidate_caches()
            self._read_at = now


def install_unchanged_zip_importer() -> None:
    """Put :class:`UnchangedZipImporter` in the place of Python's zip importer, for the archives imported from
    from now on and for those already imported from (their importers are made again on their next use)."""
    sys.path_hooks[:] = [UnchangedZipImporter if hook is zipimport.zipimporter else hook for hook in sys.path_hooks]
    for path, finder in list(sys.path_importer_cache.items()):
        if type(finder) is zipimport.zipimporter:
            del sys.path_importer_cache[path]


def main() -> None:
    install_unchanged_zip_importer()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()

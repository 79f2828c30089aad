"""The session's start-up check of its executors: they import the driver's cdcsync, or the run is refused
before any batch. Local mode's Python workers are processes of their own that import cdcsync afresh, like a
cluster's executors."""

from __future__ import annotations

from typing import Any

import pytest

import cdcsync
from cdcsync.core.errors import DependencyError
from cdcsync.runtime.spark import _start_python_workers

pytestmark = pytest.mark.integration


def test_executors_running_the_drivers_cdcsync_pass(spark: Any) -> None:
    _start_python_workers(spark)


def test_executors_of_another_version_are_refused(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cdcsync, "__version__", "0.0.0-driver")
    with pytest.raises(DependencyError, match=r"executors run cdcsync .*, the driver 0\.0\.0-driver"):
        _start_python_workers(spark)


def _zip_importers(batches: Any) -> Any:
    import importlib
    import sys

    import pyarrow as pa

    for batch in batches:
        importlib.invalidate_caches()  # what every task already does: must leave the archives' importers in place
        names = sorted({type(finder).__name__ for finder in sys.path_importer_cache.values() if finder is not None})
        yield pa.RecordBatch.from_pydict({"importers": [",".join(names)] * batch.num_rows})


def test_workers_read_sparks_zip_archives_through_the_importer_that_skips_unchanged_ones(spark: Any) -> None:
    """The workers come from cdcsync's daemon (spark.python.daemon.module): pyspark.zip, which every worker imports
    from, is held by :class:`UnchangedZipImporter`, and no plain zip importer is left to read it at each task."""
    rows = spark.range(4, numPartitions=2).mapInArrow(_zip_importers, "importers string").collect()
    for row in rows:
        assert "UnchangedZipImporter" in row.importers.split(",")
        assert "zipimporter" not in row.importers.split(",")

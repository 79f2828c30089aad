"""The SparkSession cdcsync runs on: the Kafka connector and Delta Lake on the classpath, UTC, quiet logs, small
shuffles.

The connector is resolved with Ivy into the cdcsync cache before Spark starts and handed to Spark as local jars
(:func:`cdcsync.runtime.jars.spark_jars_conf`), so after the first run (or ``make jars``) no network is needed
and Spark does not resolve anything itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cdcsync.config.settings import Settings
from cdcsync.core.errors import DependencyError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_LOG4J_PROPERTIES = Path(__file__).with_name("log4j2.properties")

DEFAULT_SPARK_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # The driver JVM's heap, held at this size (heap_options): see docs/pipeline-reference.md, "the driver's memory".
    "spark.driver.memory": "1g",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "20000",
    # Batches are bounded by the record count above. Any other byte limit makes Spark size every row it writes
    # to Arrow (about 7% of the executors' JVM time on schema-wrapped JSON); Int.MaxValue turns that off.
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    # Every micro-batch writes two checkpoint files (offsets/N, commits/N). Spark's default writer goes through
    # Hadoop's FileContext, which on a local disk without Hadoop's native library starts a process for every
    # `readlink` and `chmod` it needs: about 20 per batch, some 60 ms of CPU and more of the stream thread's wall
    # time on a small machine. The FileSystem writer makes the same files (temporary file, checksum, rename, and
    # the same refusal to overwrite a batch's entry) with 4. cdcsync's checkpoints are always local paths
    # (settings.state_dir), where the rename is atomic either way.
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
    "spark.python.worker.reuse": "true",
    # pyspark's daemon behind a zip importer that does not read pyspark.zip's directory again at every task
    # (cdcsync.runtime.python_daemon).
    "spark.python.daemon.module": "cdcsync.runtime.python_daemon",
    "spark.sql.adaptive.enabled": "false",
    # Kafka source: consumers live across batches; keep fetches large.
    "spark.kafka.consumer.cache.capacity": "64",
}


DELTA_SPARK_CONF: dict[str, str] = {
    # Delta Lake's SQL (MERGE, DESCRIBE HISTORY, CREATE TABLE delta.`path`) and its catalog, for ``type: delta``
    # sinks; its jars are on the classpath beside the Kafka connector (cdcsync.runtime.jars).
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Delta rebuilds a table's state from its log in this many tasks (default 50): small, like the shuffles above;
    # a table of many thousands of files may want more (CDCSYNC__SPARK__CONF__...).
    "spark.databricks.delta.snapshotPartitions": "4",
}


def build_spark_session(settings: Settings, app_name: str) -> SparkSession:
    """Start (or reuse) the SparkSession with the Kafka connector on the classpath."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as error:  # pragma: no cover - pyspark is a hard dependency
        raise DependencyError("pyspark is not installed", hint="pip install cdcsync (it depends on pyspark)") from error

    from cdcsync.runtime.cds import driver_java_options
    from cdcsync.runtime.jars import spark_jars_conf

    # Resolves into the cdcsync cache unless already there (then no Java is started): a connector that cannot be
    # had fails here with the repository named, not as a Java gateway that exited while starting Spark.
    builder = SparkSession.builder.master(settings.spark.master).appName(app_name)
    conf = session_conf(settings, spark_jars_conf(), driver_java_options(settings.spark.class_data_sharing))
    for key, value in conf.items():
        builder = builder.config(key, value)
    os.environ.setdefault("PYSPARK_PYTHON", _current_python())
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _start_python_workers(spark)
    return spark


def session_conf(settings: Settings, jars_conf: Mapping[str, str], archive_options: str) -> dict[str, str]:
    """Spark's conf for a run: cdcsync's defaults, the jars and Delta Lake's, the user's ``spark.conf`` over them,
    and the driver JVM's options: cdcsync's (quiet logs, the class-data-sharing archive, :func:`heap_options`)
    merged with the user's own ``spark.driver.extraJavaOptions`` by :func:`merge_java_options`."""
    conf = {**DEFAULT_SPARK_CONF, **jars_conf, **DELTA_SPARK_CONF, **settings.spark.conf}
    ours = [f"-Dlog4j.configurationFile=file:{_LOG4J_PROPERTIES}", archive_options, *heap_options(conf)]
    conf["spark.driver.extraJavaOptions"] = merge_java_options(ours, conf.get("spark.driver.extraJavaOptions", ""))
    return conf


def heap_options(conf: Mapping[str, str]) -> list[str]:
    """The driver JVM's heap held at the size ``spark.driver.memory`` gives it (Spark passes that as ``-Xmx`` and
    refuses ``-Xmx`` in ``extraJavaOptions``; ``-Xms`` it lets through), with a young generation of a quarter of it.

    G1 otherwise starts with a small heap and grows it whenever collections take more than its time target, and
    sizes the young generation (where Kafka's records and Spark's rows live and die) up to 60% of the heap: how far
    it had grown, and so the JVM's resident memory, depended on how long a run went on and how loaded the machine
    was (947 MiB after a 1M-change backlog, 1,295 MiB after 5M), not on the settings. A heap that never grows and
    a young generation of fixed size touch the same memory in a short run as in a long one: the JVM's memory is
    bounded by configuration alone. The live heap after a collection is 100-200 MiB (docs/benchmarks.md, session
    11), so a quarter of 1g is room enough for a micro-batch's garbage between collections.
    """
    memory = conf.get("spark.driver.memory", "").strip()
    return [*([f"-Xms{memory}"] if memory else []), "-XX:NewRatio=3"]


def merge_java_options(ours: Sequence[str], theirs: str) -> str:
    """cdcsync's JVM options first, the user's ``spark.driver.extraJavaOptions`` after them, nothing dropped.

    The JVM takes the last of an option given twice (``-Xms``, ``-XX:GCTimeRatio=``, ``-XX:+/-Flag``,
    ``-Dkey=``), so a user's option wins over cdcsync's of the same name and every other one of ours stays.
    """
    return " ".join(option.strip() for option in (*ours, theirs) if option.strip())


def _start_python_workers(spark: SparkSession) -> None:
    """Start the executors' Python workers, import the decoder and sink modules in them now, and check that they
    run the driver's cdcsync.

    Workers are reused across tasks (``spark.python.worker.reuse``), so this moves their start-up (several
    seconds on a small machine: pyarrow, psycopg, the decoder) out of the first micro-batch, whose latency is the
    one a restarted pipeline is judged by. On a cluster the executors' cdcsync comes from their own hosts; one
    that is missing or of another version would fail (or, worse, decode differently) in the first batch, so it
    is refused here, before any batch runs.
    """
    import cdcsync

    parallelism = spark.sparkContext.defaultParallelism
    try:
        rows = (
            spark.range(0, parallelism, numPartitions=parallelism)
            .mapInArrow(_import_executor_modules, "version string")
            .collect()
        )
    except Exception as error:  # a Py4J or PySpark error wrapping the executor's ImportError
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DependencyError(
            f"the Spark executors ({spark.sparkContext.master}) could not import cdcsync: {first_line}",
            hint=f"install cdcsync {cdcsync.__version__} on every executor host (the driver's image or venv), "
            "or point spark.pyspark.python at an interpreter that has it",
        ) from None
    versions = sorted({row.version for row in rows})
    if versions != [cdcsync.__version__]:
        raise DependencyError(
            f"the Spark executors run cdcsync {', '.join(versions)}, the driver {cdcsync.__version__}",
            hint="install the same cdcsync version on the driver and every executor host",
        )


def _import_executor_modules(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    # What the decode and staging tasks import lazily (the CLI's import path stays light).
    import psycopg  # noqa: F401
    import pyarrow as pa
    import pyarrow.compute
    import pyarrow.csv

    import cdcsync
    import cdcsync.engine.batch
    from cdcsync.core.worker_heap import freeze_long_lived

    freeze_long_lived()  # what was just imported lives as long as the worker: keep it out of every task's collection
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"version": [cdcsync.__version__] * batch.num_rows})


def _current_python() -> str:
    import sys

    return sys.executable

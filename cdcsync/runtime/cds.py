"""A class-data-sharing (AppCDS) archive of the classes a cdcsync Spark driver loads.

Every ``cdcsync run`` starts a JVM that reads, parses and verifies some 15,000 classes out of pyspark's ~250 jars
before the first batch; on a small machine that is most of Spark's start. The JVM can instead map them from an
archive made once (``java -Xshare:dump``). The archive is built by ``make jars`` (``python -m
cdcsync.runtime.jars``), or by :func:`build_archive`, into the cdcsync cache, keyed by the pyspark installation and
the Java runtime; a run uses it when it is there and ``spark.class_data_sharing`` is on (the default).

Nothing here can change what Spark does: the JVM checks the archive against its own version and against the jars
on the classpath (paths, sizes, modification times), and silently loads classes the ordinary way when anything
differs. Classes that Spark loads from ``spark.jars`` (the Kafka connector) are not archived; they load as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cdcsync.core.errors import DependencyError
from cdcsync.runtime.ivy import cache_root
from cdcsync.runtime.spark import DEFAULT_SPARK_CONF

_DUMP_TIMEOUT_S = 1200.0

# What the class list is recorded from: a Spark session like a run's, its Python workers and one SQL job, in a
# JVM of its own (the list is complete only once that JVM has exited).
_RECORDER = """
import json, sys
from cdcsync.config.settings import Settings
from cdcsync.runtime.spark import build_spark_session

settings = Settings(spark={"conf": {"spark.driver.extraJavaOptions": sys.argv[1]}, "class_data_sharing": False})
spark = build_spark_session(settings, app_name="cdcsync-cds")
spark.range(0, 1000, numPartitions=2).selectExpr("id % 7 AS k", "id").groupBy("k").count().collect()
print(json.dumps(spark.sparkContext._jvm.System.getProperty("java.class.path")))
spark.stop()
"""


def java_executable() -> str | None:
    """The ``java`` spark-submit starts: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def archive_path(cache_dir: Path | None = None) -> Path | None:
    """Where the archive of this pyspark installation and Java runtime lives (None without Java). One cache
    serves several virtualenvs, so each installation has an archive of its own."""
    import pyspark

    java = java_executable()
    if java is None:
        return None
    jars = Path(pyspark.__file__).parent.resolve() / "jars"
    # The jars folder's own time changes when pyspark is installed again: the JVM would refuse the old archive
    # (it checks every jar's time), so a new one is built instead of keeping a useless one.
    installed = jars.stat().st_mtime_ns if jars.is_dir() else 0
    key = "\n".join([str(jars), str(installed), pyspark.__version__, str(Path(java).resolve())])
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return (cache_dir or cache_root()) / "cds" / f"spark-{pyspark.__version__}-{digest}.jsa"


def driver_java_options(enabled: bool, cache_dir: Path | None = None) -> str:
    """The driver JVM's options that map the archive, when it is enabled and has been built; else none."""
    path = archive_path(cache_dir) if enabled else None
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} -Xshare:auto"


def _run(what: str, argv: list[str], produces: Path) -> str:
    """Run a step of the build; its stdout, or a :class:`DependencyError` naming the step."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_DUMP_TIMEOUT_S)
    if done.returncode != 0 or not produces.is_file():
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise DependencyError(
            f"{what} for Spark's class-data-sharing archive failed: {last[:300]}",
            hint="Spark itself must start (check that `cdcsync run` does); the archive is optional: "
            "CDCSYNC__SPARK__CLASS_DATA_SHARING=false",
        )
    return done.stdout


def build_archive(cache_dir: Path | None = None, *, force: bool = False) -> Path | None:
    """Record the classes a Spark session loads, then dump them into the archive (about a minute, once).

    Returns the archive, or None when there is no Java (Spark cannot run either; nothing to speed up)."""
    path = archive_path(cache_dir)
    if path is None:
        return None
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix="build-") as work:
        class_list = Path(work) / "classes.lst"
        recorder = [sys.executable, "-c", _RECORDER, f"-XX:DumpLoadedClassList={class_list}"]
        output = _run("recording the classes a Spark session loads", recorder, class_list)
        classpath = json.loads(output.strip().splitlines()[-1])
        scratch = Path(work) / "spark.jsa"
        java = java_executable() or "java"
        heap = f"-Xmx{DEFAULT_SPARK_CONF['spark.driver.memory']}"  # the runs' heap: their object layout
        dump = [java, heap, "-Xshare:dump", f"-XX:SharedClassListFile={class_list}", f"-XX:SharedArchiveFile={scratch}"]
        _run("dumping the class-data-sharing archive", [*dump, "-cp", classpath], scratch)
        os.replace(scratch, path)  # atomic: a run never maps a half-written archive
    return path

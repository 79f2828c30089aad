"""Maven artifacts through Apache Ivy: the resolver Spark itself uses for ``spark.jars.packages``.

pyspark ships Ivy's jar, so the JVM services of the dev stack (Kafka broker, Kafka Connect, Debezium, Apicurio
Registry) are resolved by the same tool, with the same settings, as Spark's own Kafka connector: one generated
``ivysettings.xml`` with a single Maven 2 repository (Maven Central, or ``CDCSYNC__MAVEN__REPOSITORY_URL``) and a
cache under ``~/.cache/cdcsync``. Ivy reuses a cached module without asking the repository again, so once
resolved, everything works with the network unplugged.

Running Ivy costs a JVM start and a pass over the cached POMs (a few seconds), so the classpath of each request
is also remembered in a small text file keyed by the request; a warm request whose files are all still there
does not start Java at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

from cdcsync.core.errors import DependencyError

DEFAULT_REPOSITORY_URL = "https://repo1.maven.org/maven2/"
REPOSITORY_URL_ENV = "CDCSYNC__MAVEN__REPOSITORY_URL"
_IVY_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Artifact:
    """One Maven module, and which of its files: the jar (default) or e.g. a ``plugin`` ``tar.gz``."""

    org: str
    name: str
    rev: str
    classifier: str | None = None
    ext: str = "jar"
    transitive: bool = True

    @classmethod
    def parse(cls, coordinate: str) -> Artifact:
        org, name, rev = coordinate.split(":")
        return cls(org, name, rev)

    def dependency_xml(self) -> str:
        attrs = f"org={quoteattr(self.org)} name={quoteattr(self.name)} rev={quoteattr(self.rev)}"
        transitive = "" if self.transitive else ' transitive="false"'
        if self.classifier is None and self.ext == "jar":
            return f'    <dependency {attrs} conf="default->default"{transitive}/>\n'
        classifier = f" m:classifier={quoteattr(self.classifier)}" if self.classifier else ""
        kind = quoteattr(self.ext)
        artifact = f"<artifact name={quoteattr(self.name)} type={kind} ext={kind}{classifier}/>"
        return f'    <dependency {attrs} conf="default->master"{transitive}>{artifact}</dependency>\n'


def cache_root() -> Path:
    """Shared across projects and virtualenvs on purpose: the artifacts are large and immutable."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "cdcsync"


def repository_url() -> str:
    url = os.environ.get(REPOSITORY_URL_ENV, "").strip() or DEFAULT_REPOSITORY_URL
    return url.rstrip("/") + "/"


def ivy_jar() -> Path:
    """The Ivy that pyspark ships (its ``--packages`` uses it), so no extra download is needed."""
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))
    if not jars:
        raise DependencyError("pyspark's jars/ has no Ivy jar", hint="reinstall pyspark (pip install cdcsync)")
    return jars[-1]


def settings_xml(cache_dir: Path) -> str:
    """One repository, nothing from ``~/.m2`` or ``~/.ivy2``: resolution depends only on the cache and the URL."""
    return (
        "<ivysettings>\n"
        '  <settings defaultResolver="central"/>\n'
        f'  <caches defaultCacheDir={quoteattr(str(cache_dir))} lockStrategy="artifact-lock-nio"/>\n'
        "  <resolvers>\n"
        f'    <ibiblio name="central" m2compatible="true" root={quoteattr(repository_url())}/>\n'
        "  </resolvers>\n"
        "</ivysettings>\n"
    )


def write_settings(home: Path) -> Path:
    """The settings file for the Ivy home ``home`` (cache in ``home/cache``). Named after its content, so runs with
    different repository URLs sharing one cache never rewrite each other's file."""
    text = settings_xml(home / "cache")
    path = home / f"ivysettings-{hashlib.sha1(text.encode()).hexdigest()[:12]}.xml"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # Spark's start writes it outside our lock
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def module_xml(artifacts: Sequence[Artifact], excludes: Sequence[str]) -> str:
    """An ``ivy.xml`` asking for ``artifacts``; ``excludes`` (``org:module``, either may be ``*``) apply to the whole
    tree."""
    lines = [
        '<ivy-module version="2.0" xmlns:m="http://ant.apache.org/ivy/maven">\n',
        '  <info organisation="cdcsync" module="resolve"/>\n',
        '  <configurations><conf name="default"/></configurations>\n',
        "  <dependencies>\n",
        *(artifact.dependency_xml() for artifact in artifacts),
    ]
    for exclude in sorted(set(excludes)):
        org, _, module = exclude.partition(":")
        lines.append(f"    <exclude org={quoteattr(org or '*')} module={quoteattr(module or '*')}/>\n")
    lines.append("  </dependencies>\n</ivy-module>\n")
    return "".join(lines)


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """Concurrent dev stacks and test sessions share the cache; one resolution at a time is plenty."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def java_executable(purpose: str = "Apache Ivy") -> str:
    """``$JAVA_HOME/bin/java``, else ``java`` on PATH; ``purpose`` names what needs it in the error."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK):
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise DependencyError(
            f"no Java runtime found (needed for {purpose})",
            hint="install a JDK/JRE 17 or newer and put `java` on PATH (or set JAVA_HOME)",
        )
    return found


def resolve(artifacts: Sequence[Artifact], excludes: Sequence[str] = (), *, home: Path | None = None) -> list[Path]:
    """The cached files of ``artifacts`` and their runtime dependencies (minus ``excludes``), downloading once."""
    home = home or cache_root() / "ivy"
    request = module_xml(artifacts, excludes)
    key = hashlib.sha1((request + settings_xml(home / "cache")).encode()).hexdigest()[:16]
    memo = home / "classpaths" / f"{key}.txt"
    cached = _read_memo(memo)
    if cached is not None:
        return cached
    with _locked(home):
        cached = _read_memo(memo)
        if cached is not None:
            return cached
        settings = write_settings(home)
        module = home / "requests" / f"{key}.xml"
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(request)
        out = module.with_suffix(".classpath")
        out.unlink(missing_ok=True)
        argv = [java_executable("resolving JVM dependencies"), "-jar", str(ivy_jar()), "-settings", str(settings)]
        argv += ["-ivy", str(module), "-confs", "default", "-cachepath", str(out), "-warn"]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=_IVY_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            raise DependencyError(f"running Apache Ivy failed: {exc}", hint="is Java 17+ installed?") from exc
        if result.returncode != 0 or not out.is_file():
            names = ", ".join(f"{a.org}:{a.name}:{a.rev}" for a in artifacts)
            detail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise DependencyError(
                f"resolving {names} with Apache Ivy failed (exit {result.returncode}):\n{detail}",
                hint=f"check network access to {repository_url()}, or set {REPOSITORY_URL_ENV} to a reachable mirror",
            )
        paths = [Path(p) for p in out.read_text().strip().split(os.pathsep) if p]
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(memo.name + ".tmp")
        tmp.write_text("".join(f"{p}\n" for p in paths))
        os.replace(tmp, memo)
        return paths


def _read_memo(memo: Path) -> list[Path] | None:
    try:
        paths = [Path(line) for line in memo.read_text().splitlines() if line]
    except OSError:
        return None
    return paths if all(p.is_file() for p in paths) else None


def _extract_data(archive: tarfile.TarFile, into: Path) -> None:
    """Extraction filters came with Python 3.11.4 (3.10.12); Debian bookworm's python3 is 3.11.2. Without them,
    only plain files and directories that stay inside ``into`` are extracted, which is all a Maven tarball has."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(into, filter="data")
        return
    root = into.resolve()
    members = []
    for member in archive.getmembers():
        target = (root / member.name).resolve()
        if not (member.isfile() or member.isdir()) or not target.is_relative_to(root):
            raise DependencyError(
                f"refusing to extract {member.name!r}: not a plain file or folder inside {into}",
                hint="remove the tarball from the cdcsync cache so that it is downloaded again",
            )
        members.append(member)
    archive.extractall(into, members=members)


def unpacked(tarball: Path, into: Path) -> Path:
    """``tarball`` extracted once under ``into`` (named after it), atomically: a half-done extraction never counts."""
    name = tarball.name.removesuffix(".tar.gz").removesuffix(".tgz")
    target = into / name
    if (target / ".complete").is_file():
        return target
    into.mkdir(parents=True, exist_ok=True)
    with _locked(into):
        if (target / ".complete").is_file():
            return target
        scratch = into / f".{name}.partial"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        with tarfile.open(tarball) as archive:
            _extract_data(archive, scratch)
        (scratch / ".complete").touch()
        shutil.rmtree(target, ignore_errors=True)
        os.replace(scratch, target)
    return target

"""A small Maven Central resolver: coordinates in, local jar paths out.

Spark's ``--packages`` relies on Ivy and a writable ``~/.ivy2``; the Kafka broker we run for the dev stack is
not distributed as a Python wheel at all. Both need the same thing: a handful of jars plus their transitive
dependencies, fetched once, verified, and then available with no network. This module does exactly that and
nothing more (no plugins, no profiles, no snapshots), so it stays small enough to reason about.

Resolution follows Maven's rules where they matter for runtime classpaths:

* effective POM = parent chain merged (properties, ``dependencyManagement``, inherited ``dependencies``,
  groupId/version), then ``${...}`` interpolated in the child's context, then ``scope=import`` BOMs merged;
* transitive dependencies of scope compile and runtime only; optional, test, provided and system are skipped;
* ``<exclusions>`` (with ``*`` wildcards) apply to the whole subtree below the dependency that declares them;
* the ``dependencyManagement`` of each requested coordinate governs versions, scopes and exclusions of its
  transitive dependencies (like ``mvn dependency:get`` would), so Spark's connector resolves the versions
  Spark itself was built and tested with;
* conflicts are decided nearest-wins: breadth first, the first version seen for a group:artifact wins.

Everything lands in a Maven-repository-shaped cache, verified against the ``.sha1`` the repository publishes,
written atomically. A resolved request is also remembered in a small JSON file so that a warm run does no XML
parsing and no network I/O at all.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.client
import json
import os
import re
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cdcsync.core.errors import DependencyError, ServiceError

DEFAULT_REPOSITORY_URL = "https://repo1.maven.org/maven2"
REPOSITORY_URL_ENV = "CDCSYNC__MAVEN__REPOSITORY_URL"

# Bump when the resolution rules change so that cached resolved lists from older rules are ignored.
_RESOLVER_FORMAT = 1
_HTTP_TIMEOUT_S = 60.0
_HTTP_ATTEMPTS = 3
_USER_AGENT = "cdcsync-maven-resolver/1"

Fetch = Callable[[str], "bytes | None"]
"""Fetch a URL. Returns the body, ``None`` when the resource does not exist, raises ServiceError otherwise."""

# Dependency types whose file is a jar (with the classifier the type implies).
_JAR_TYPES: dict[str, str] = {"jar": "", "bundle": "", "maven-plugin": "", "ejb": "", "test-jar": "tests"}
_INCLUDED_SCOPES = frozenset({"compile", "runtime"})


# --------------------------------------------------------------------------------------------------------------
# Data model
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Coordinate:
    """One artifact file in a repository: group:artifact[:extension[:classifier]]:version."""

    group: str
    artifact: str
    version: str
    classifier: str = ""
    extension: str = "jar"

    @classmethod
    def parse(cls, text: str) -> Coordinate:
        parts = text.strip().split(":")
        if len(parts) == 3:
            g, a, v = parts
            ext, cls_ = "jar", ""
        elif len(parts) == 4:
            g, a, ext, v = parts
            cls_ = ""
        elif len(parts) == 5:
            g, a, ext, cls_, v = parts
        else:
            raise DependencyError(
                f"invalid Maven coordinate {text!r}",
                hint="use group:artifact:version, e.g. org.apache.kafka:kafka-clients:3.9.2",
            )
        if not all((g, a, v, ext)):
            raise DependencyError(f"invalid Maven coordinate {text!r}: empty part")
        return cls(g, a, v, cls_, ext)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Identity for conflict resolution: everything but the version."""
        return (self.group, self.artifact, self.classifier, self.extension)

    def directory(self) -> str:
        return f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}"

    def file_name(self) -> str:
        suffix = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{suffix}.{self.extension}"

    def path(self) -> str:
        return f"{self.directory()}/{self.file_name()}"

    def pom(self) -> Coordinate:
        return Coordinate(self.group, self.artifact, self.version, "", "pom")

    def describe(self) -> str:
        """For messages: the g:a:v people search for, plus which file of it was involved."""
        what = f"{self.group}:{self.artifact}:{self.version}"
        if self.extension == "pom":
            return f"{what} (pom)"
        if self.classifier or self.extension != "jar":
            return f"{what} ({self.classifier or ''} {self.extension})".replace("( ", "(")
        return what

    def __str__(self) -> str:
        text = f"{self.group}:{self.artifact}"
        if self.extension != "jar" or self.classifier:
            text += f":{self.extension}"
        if self.classifier:
            text += f":{self.classifier}"
        return f"{text}:{self.version}"


@dataclass(frozen=True)
class Dependency:
    """A ``<dependency>`` after interpolation; ``version`` may still be None before management is applied."""

    group: str
    artifact: str
    version: str | None
    type: str = "jar"
    classifier: str = ""
    scope: str = ""
    optional: bool = False
    exclusions: frozenset[tuple[str, str]] = frozenset()

    @property
    def management_key(self) -> tuple[str, str, str, str]:
        return (self.group, self.artifact, self.type, self.classifier)


@dataclass
class Model:
    """The effective POM: what we need of it, fully inherited and interpolated."""

    group: str
    artifact: str
    version: str
    packaging: str
    properties: dict[str, str]
    dependencies: list[Dependency]
    managed: dict[tuple[str, str, str, str], Dependency]
    relocation: tuple[str, str, str] | None = None


@dataclass(frozen=True)
class ResolvedArtifact:
    """One entry of a resolved classpath; ``depth`` 0 is a requested coordinate."""

    coordinate: Coordinate
    path: Path
    scope: str
    depth: int


@dataclass
class _RawDependency:
    group: str
    artifact: str
    version: str | None
    type: str | None
    classifier: str | None
    scope: str | None
    optional: str | None
    exclusions: list[tuple[str, str]]


@dataclass
class _RawPom:
    group: str | None
    artifact: str
    version: str | None
    packaging: str | None
    parent: tuple[str, str, str] | None
    properties: dict[str, str]
    dependencies: list[_RawDependency]
    managed: list[_RawDependency]
    relocation: dict[str, str] | None = None
    source: str = ""


@dataclass
class _Node:
    dependency: Dependency
    version: str
    depth: int
    exclusions: frozenset[tuple[str, str]]
    managed: Mapping[tuple[str, str, str, str], Dependency]
    trail: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    # Loading the system trust store costs ~40 ms; once per process rather than once per file.
    return ssl.create_default_context()


_connections = threading.local()


def _drop_connection(key: tuple[str, str]) -> None:
    pool: dict[tuple[str, str], http.client.HTTPConnection] = getattr(_connections, "pool", {})
    conn = pool.pop(key, None)
    if conn is not None:
        conn.close()


def _keepalive_get(parsed: urllib.parse.ParseResult) -> tuple[int, str, bytes, str | None]:
    """GET over a per-thread persistent connection.

    A cold resolve is a few hundred small requests; a new TCP+TLS connection (and DNS lookup) for each one
    dominated the run time, so connections to the repository host are reused.
    """
    pool: dict[tuple[str, str], http.client.HTTPConnection] = getattr(_connections, "pool", None) or {}
    _connections.pool = pool
    key = (parsed.scheme, parsed.netloc)
    target = parsed.path + (f"?{parsed.query}" if parsed.query else "")
    headers = {"User-Agent": _USER_AGENT, "Connection": "keep-alive"}
    reused = key in pool
    for _ in range(2):
        conn = pool.get(key)
        if conn is None:
            host = parsed.hostname or ""
            if parsed.scheme == "https":
                conn = http.client.HTTPSConnection(host, parsed.port, timeout=_HTTP_TIMEOUT_S, context=_ssl_context())
            else:
                conn = http.client.HTTPConnection(host, parsed.port, timeout=_HTTP_TIMEOUT_S)
            pool[key] = conn
        try:
            conn.request("GET", target, headers=headers)
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            _drop_connection(key)
            if reused:  # the server closed an idle keep-alive connection: one more try on a fresh one
                reused = False
                continue
            raise
        if response.will_close:
            _drop_connection(key)
        return response.status, response.reason, body, response.getheader("Location")
    raise AssertionError("unreachable")


def _urlopen_get(url: str) -> tuple[int, str, bytes, str | None]:
    """Through urllib, which honours proxy settings and follows redirects."""
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S, context=_ssl_context()) as response:
            return int(response.status), str(response.reason), response.read(), None
    except urllib.error.HTTPError as exc:
        return exc.code, str(exc.reason), b"", None


def _uses_proxy(parsed: urllib.parse.ParseResult) -> bool:
    proxies = urllib.request.getproxies()
    return parsed.scheme in proxies and not urllib.request.proxy_bypass(parsed.hostname or "")


def urllib_fetch(url: str) -> bytes | None:
    """Default fetcher: http(s) with a few retries for transient failures, and file:// for local mirrors.

    Only "the resource is not there" maps to None; every other failure raises so that a flaky network never
    looks like a missing artifact.
    """
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        local = Path(urllib.request.url2pathname(parsed.path))
        try:
            return local.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ServiceError(f"reading {url}: {exc}") from exc
    if parsed.scheme not in ("http", "https"):
        raise DependencyError(f"unsupported repository URL scheme in {url}", hint=f"check {REPOSITORY_URL_ENV}")
    last: str = ""
    for attempt in range(_HTTP_ATTEMPTS):
        if attempt:
            time.sleep(0.5 * 2**attempt)
        try:
            if _uses_proxy(parsed):
                status, reason, body, location = _urlopen_get(url)
            else:
                status, reason, body, location = _keepalive_get(parsed)
                if 300 <= status < 400 and location:
                    status, reason, body, location = _urlopen_get(urllib.parse.urljoin(url, location))
        except (OSError, http.client.HTTPException) as exc:
            last = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
            continue
        if status == 200:
            return body
        if status in (404, 410):
            return None
        if status == 429 or status >= 500:
            last = f"HTTP {status} {reason}"
            continue
        raise ServiceError(f"GET {url}: HTTP {status} {reason}", retriable=False)
    raise ServiceError(
        f"GET {url}: {last}",
        retriable=True,
        hint=f"check network access to the Maven repository, or point {REPOSITORY_URL_ENV} at a reachable mirror",
    )


def default_cache_dir() -> Path:
    """Shared across projects and virtualenvs on purpose: the jars are large and immutable."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "cdcsync" / "maven"


def repository_url() -> str:
    return os.environ.get(REPOSITORY_URL_ENV, "").strip() or DEFAULT_REPOSITORY_URL


def _atomic_write(path: Path, data: bytes) -> None:
    """Readers (another resolver, a running JVM) must never see a half-written jar."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache is shared like any Maven repository
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------------------------
# POM parsing and interpolation
# --------------------------------------------------------------------------------------------------------------

_PROPERTY = re.compile(r"\$\{([^}]+)\}")
_UNDECLARED_ENTITY = re.compile(r"&(?!(?:amp|lt|gt|quot|apos|#\d+|#x[0-9a-fA-F]+);)[A-Za-z][\w.-]*;")


def _strip_namespaces(root: ET.Element) -> None:
    for element in root.iter():
        if isinstance(element.tag, str) and "}" in element.tag:
            element.tag = element.tag.split("}", 1)[1]


def _text(element: ET.Element | None, name: str) -> str | None:
    if element is None:
        return None
    child = element.find(name)
    if child is None or child.text is None:
        return None
    value = child.text.strip()
    return value or None


def _parse_dependency(element: ET.Element) -> _RawDependency | None:
    group, artifact = _text(element, "groupId"), _text(element, "artifactId")
    if not group or not artifact:
        return None
    exclusions = [
        (_text(ex, "groupId") or "*", _text(ex, "artifactId") or "*") for ex in element.findall("exclusions/exclusion")
    ]
    return _RawDependency(
        group=group,
        artifact=artifact,
        version=_text(element, "version"),
        type=_text(element, "type"),
        classifier=_text(element, "classifier"),
        scope=_text(element, "scope"),
        optional=_text(element, "optional"),
        exclusions=exclusions,
    )


def parse_pom(data: bytes, source: str = "") -> _RawPom:
    """Parse the parts of a POM that affect a runtime classpath; profiles and build sections are ignored."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError:
        # Some old POMs use HTML entities (&oslash;) in descriptions that no DTD declares. They never matter to
        # resolution, so drop them rather than fail.
        text = data.decode("utf-8", errors="replace")
        text = re.sub(r"^<\?xml[^>]*\?>", "", text.lstrip("\ufeff").lstrip())
        try:
            root = ET.fromstring(_UNDECLARED_ENTITY.sub("", text))
        except ET.ParseError as exc:
            raise DependencyError(f"cannot parse POM {source}: {exc}") from exc
    _strip_namespaces(root)
    if root.tag != "project":
        raise DependencyError(f"{source} is not a POM (root element <{root.tag}>)")
    parent_el = root.find("parent")
    parent: tuple[str, str, str] | None = None
    if parent_el is not None:
        pg, pa, pv = _text(parent_el, "groupId"), _text(parent_el, "artifactId"), _text(parent_el, "version")
        if pg and pa and pv:
            parent = (pg, pa, pv)
    properties: dict[str, str] = {}
    props_el = root.find("properties")
    if props_el is not None:
        for prop in props_el:
            if isinstance(prop.tag, str):
                properties[prop.tag] = (prop.text or "").strip()
    dependencies = [d for el in root.findall("dependencies/dependency") if (d := _parse_dependency(el))]
    managed = [d for el in root.findall("dependencyManagement/dependencies/dependency") if (d := _parse_dependency(el))]
    relocation: dict[str, str] | None = None
    reloc_el = root.find("distributionManagement/relocation")
    if reloc_el is not None:
        relocation = {k: v for k in ("groupId", "artifactId", "version") if (v := _text(reloc_el, k))}
    return _RawPom(
        group=_text(root, "groupId"),
        artifact=_text(root, "artifactId") or "",
        version=_text(root, "version"),
        packaging=_text(root, "packaging"),
        parent=parent,
        properties=properties,
        dependencies=dependencies,
        managed=managed,
        relocation=relocation,
        source=source,
    )


def interpolate(value: str, properties: Mapping[str, str], _depth: int = 0) -> str:
    """Expand ``${name}`` recursively; unknown names are left as they are, like Maven does."""
    if "${" not in value or _depth > 20:
        return value

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in properties:
            return interpolate(properties[name], properties, _depth + 1)
        if name.startswith("env."):
            return os.environ.get(name[4:], match.group(0))
        return match.group(0)

    return _PROPERTY.sub(replace, value)


def _matches(patterns: Iterable[tuple[str, str]], group: str, artifact: str) -> bool:
    return any((g in ("*", group)) and (a in ("*", artifact)) for g, a in patterns)


# --------------------------------------------------------------------------------------------------------------
# Version ranges (rare on Central, but a hard failure without them)
# --------------------------------------------------------------------------------------------------------------

_QUALIFIER_ORDER = {"alpha": 1, "a": 1, "beta": 2, "b": 2, "milestone": 3, "m": 3, "rc": 4, "cr": 4, "snapshot": 5}


def _version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """A simplified ComparableVersion: numbers compare numerically, known qualifiers sort before a release."""
    items: list[tuple[int, int | str]] = []
    for token in re.findall(r"\d+|[A-Za-z]+", version):
        if token.isdigit():
            items.append((3, int(token)))
        else:
            lowered = token.lower()
            if lowered in ("ga", "final", "release"):
                continue
            if lowered in _QUALIFIER_ORDER:
                items.append((1, _QUALIFIER_ORDER[lowered]))
            else:
                items.append((2, lowered))
    while items and items[-1] == (3, 0):
        items.pop()
    items.append((2, ""))  # terminator so that "1.0" > "1.0-rc1" (qualifier kind 1 < 2)
    return tuple(items)


def _in_range(version: str, spec: str) -> bool:
    key = _version_key(version)
    for low_inc, low, high, high_inc in re.findall(r"([\[(])([^,\])]*),?([^\])]*)([\])])", spec):
        if "," not in spec and low_inc == "[":
            if key == _version_key(low):
                return True
            continue
        if low and (key < _version_key(low) or (low_inc == "(" and key == _version_key(low))):
            continue
        if high and (key > _version_key(high) or (high_inc == ")" and key == _version_key(high))):
            continue
        return True
    return False


# --------------------------------------------------------------------------------------------------------------
# The resolver
# --------------------------------------------------------------------------------------------------------------


class MavenResolver:
    """Resolves coordinates against one repository with a local cache; ``fetch`` is injectable for tests."""

    def __init__(
        self,
        cache_dir: Path | None = None,
        *,
        repository: str | None = None,
        fetch: Fetch | None = None,
        verify_checksums: bool = True,
    ) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.repository = (repository or repository_url()).rstrip("/")
        self.fetch: Fetch = fetch or urllib_fetch
        self.verify_checksums = verify_checksums
        self._raw: dict[tuple[str, str, str], _RawPom] = {}
        self._models: dict[tuple[str, str, str], Model] = {}

    # ---- files -------------------------------------------------------------------------------------------------

    def _get(self, url: str, what: str) -> bytes | None:
        try:
            return self.fetch(url)
        except ServiceError as exc:
            raise exc.add_context(f"downloading {what}") from None

    def artifact_file(self, coordinate: Coordinate, *, required: bool = True) -> Path | None:
        """Return the cached file, downloading and verifying it first if needed. Cached files are trusted."""
        target = self.cache_dir / coordinate.path()
        if target.is_file():
            return target
        url = f"{self.repository}/{coordinate.path()}"
        data = self._get(url, coordinate.describe())
        if data is None:
            if not required:
                return None
            raise DependencyError(
                f"{coordinate.describe()} not found at {url}",
                hint=f"check the coordinate, or set {REPOSITORY_URL_ENV} to a repository that has it",
            )
        if self.verify_checksums:
            self._verify(coordinate, url, data)
        _atomic_write(target, data)
        return target

    def _verify(self, coordinate: Coordinate, url: str, data: bytes) -> None:
        published = self._get(url + ".sha1", f"{coordinate.describe()} checksum")
        if published is None:
            raise DependencyError(
                f"{coordinate.describe()}: no checksum published at {url}.sha1; refusing an unverifiable download",
                hint="use a repository that publishes .sha1 files",
            )
        tokens = published.decode("ascii", errors="replace").split()
        expected = tokens[0].lower() if tokens else ""
        actual = hashlib.sha1(data, usedforsecurity=False).hexdigest()
        if expected != actual:
            raise DependencyError(
                f"{coordinate.describe()}: checksum mismatch for {url} "
                f"(expected sha1 {expected or '<empty>'}, got {actual})",
                hint="the download was corrupted or the mirror is inconsistent; retry, or use another mirror",
            )

    # ---- POMs --------------------------------------------------------------------------------------------------

    def _raw_pom(self, group: str, artifact: str, version: str) -> _RawPom:
        key = (group, artifact, version)
        if key not in self._raw:
            coordinate = Coordinate(group, artifact, version, "", "pom")
            path = self.artifact_file(coordinate)
            assert path is not None
            self._raw[key] = parse_pom(path.read_bytes(), source=f"{coordinate.describe()} at {path}")
        return self._raw[key]

    def model(self, group: str, artifact: str, version: str, _chain: tuple[str, ...] = ()) -> Model:
        """The effective model of one POM; memoised, since BOMs and parents are shared widely."""
        key = (group, artifact, version)
        if key in self._models:
            return self._models[key]
        label = f"{group}:{artifact}:{version}"
        if label in _chain:
            raise DependencyError(f"cycle in POM parents/imports: {' -> '.join([*_chain, label])}")
        chain = (*_chain, label)

        lineage: list[_RawPom] = []
        visited: list[str] = []
        current: tuple[str, str, str] | None = key
        while current is not None:
            step = ":".join(current)
            if step in visited:
                raise DependencyError(f"cycle in POM parents: {' -> '.join([*visited, step])}")
            visited.append(step)
            raw = self._raw_pom(*current)
            lineage.append(raw)
            current = raw.parent

        child = lineage[0]
        parent = child.parent
        properties: dict[str, str] = {}
        for raw in reversed(lineage):
            properties.update(raw.properties)
        eff_group = interpolate(child.group or (parent[0] if parent else group), properties)
        eff_version = interpolate(child.version or (parent[2] if parent else version), properties)
        packaging = interpolate(child.packaging or "jar", properties)
        builtins = {
            "project.groupId": eff_group,
            "project.artifactId": child.artifact or artifact,
            "project.version": eff_version,
            "project.packaging": packaging,
        }
        if parent:
            builtins |= {
                "project.parent.groupId": parent[0],
                "project.parent.artifactId": parent[1],
                "project.parent.version": parent[2],
            }
        for name, value in list(builtins.items()):
            builtins["pom." + name.removeprefix("project.")] = value
        legacy = {"groupId": eff_group, "artifactId": child.artifact or artifact, "version": eff_version}
        scope_props: dict[str, str] = {**legacy, **properties, **builtins}

        def expand(value: str | None) -> str | None:
            return None if value is None else interpolate(value, scope_props)

        def finish(raw_dep: _RawDependency) -> Dependency:
            return Dependency(
                group=expand(raw_dep.group) or raw_dep.group,
                artifact=expand(raw_dep.artifact) or raw_dep.artifact,
                version=expand(raw_dep.version),
                type=expand(raw_dep.type) or "jar",
                classifier=expand(raw_dep.classifier) or "",
                scope=expand(raw_dep.scope) or "",
                optional=(expand(raw_dep.optional) or "false").lower() == "true",
                exclusions=frozenset((expand(g) or g, expand(a) or a) for g, a in raw_dep.exclusions),
            )

        # Child entries come first so that "first wins" gives the child precedence over its ancestors.
        managed: dict[tuple[str, str, str, str], Dependency] = {}
        imports: list[Dependency] = []
        for raw in lineage:
            for raw_dep in raw.managed:
                dep = finish(raw_dep)
                if dep.scope == "import" and dep.type == "pom":
                    imports.append(dep)
                else:
                    managed.setdefault(dep.management_key, dep)
        for bom in imports:
            if not bom.version or "${" in bom.version:
                raise DependencyError(
                    f"{label}: cannot resolve version of imported BOM {bom.group}:{bom.artifact} ({bom.version})"
                )
            bom_model = self.model(bom.group, bom.artifact, bom.version, chain)
            for mkey, mdep in bom_model.managed.items():
                managed.setdefault(mkey, mdep)

        dependencies: list[Dependency] = []
        seen: set[tuple[str, str, str, str]] = set()
        for raw in lineage:
            for raw_dep in raw.dependencies:
                dep = finish(raw_dep)
                if dep.management_key in seen:
                    continue
                seen.add(dep.management_key)
                dependencies.append(_apply_management(dep, managed.get(dep.management_key), inject_only=True))

        relocation: tuple[str, str, str] | None = None
        if child.relocation:
            relocation = (
                expand(child.relocation.get("groupId")) or eff_group,
                expand(child.relocation.get("artifactId")) or (child.artifact or artifact),
                expand(child.relocation.get("version")) or eff_version,
            )
            if relocation == (eff_group, child.artifact or artifact, eff_version):
                relocation = None

        model = Model(
            group=eff_group,
            artifact=child.artifact or artifact,
            version=eff_version,
            packaging=packaging,
            properties={k: interpolate(v, scope_props) for k, v in properties.items()},
            dependencies=dependencies,
            managed=managed,
            relocation=relocation,
        )
        self._models[key] = model
        return model

    def _pick_version(self, group: str, artifact: str, spec: str, trail: tuple[str, ...]) -> str:
        """Version ranges need the repository's version list; it is cached like any other file."""
        if not spec.startswith(("[", "(")):
            return spec
        exact = re.fullmatch(r"\[([^,\]]+)\]", spec)
        if exact:
            return exact.group(1).strip()
        rel = f"{group.replace('.', '/')}/{artifact}/maven-metadata.xml"
        target = self.cache_dir / rel
        if not target.is_file():
            url = f"{self.repository}/{rel}"
            data = self._get(url, f"{group}:{artifact} version list")
            if data is None:
                raise DependencyError(f"{group}:{artifact}:{spec}: no version list at {url} ({_via(trail)})")
            _atomic_write(target, data)
        root = ET.fromstring(target.read_bytes())
        _strip_namespaces(root)
        versions = [v.text.strip() for v in root.findall("versioning/versions/version") if v.text]
        matching = [v for v in versions if _in_range(v, spec) and not v.endswith("-SNAPSHOT")]
        if not matching:
            raise DependencyError(f"{group}:{artifact}: no published version matches {spec} ({_via(trail)})")
        return max(matching, key=_version_key)

    # ---- resolution --------------------------------------------------------------------------------------------

    def resolve_artifacts(
        self, coordinates: Iterable[str], exclude_artifacts: Iterable[str] = ()
    ) -> list[ResolvedArtifact]:
        """Breadth-first walk with nearest-wins; see the module docstring for the rules."""
        roots = [Coordinate.parse(c) for c in coordinates]
        excluded = {_split_ga(e) for e in exclude_artifacts}
        cached = self._load_resolved(roots, excluded)
        if cached is not None:
            return cached

        queue: deque[_Node] = deque()
        chosen: dict[tuple[str, str, str, str], str] = {}
        for root in roots:
            dep_type = "jar" if root.extension == "jar" else root.extension
            root_key = (root.group, root.artifact, root.classifier, dep_type)
            if _matches(excluded, root.group, root.artifact) or root_key in chosen:
                continue
            chosen[root_key] = root.version
            dep = Dependency(root.group, root.artifact, root.version, dep_type, root.classifier, "compile")
            queue.append(_Node(dep, root.version, 0, frozenset(), {}, ()))

        result: list[ResolvedArtifact] = []
        while queue:
            node = queue.popleft()
            dep = node.dependency
            version = self._pick_version(dep.group, dep.artifact, node.version, node.trail)
            label = f"{dep.group}:{dep.artifact}:{version}"
            try:
                model = self.model(dep.group, dep.artifact, version)
                hops = 0
                while model.relocation is not None and hops < 5:
                    model = self.model(*model.relocation)
                    hops += 1
            except DependencyError as exc:
                if node.trail:
                    exc.add_context(f"resolving {label} ({_via(node.trail)})")
                raise
            if node.depth == 0 and not node.managed:
                # A requested coordinate governs its own subtree, as the root of a Maven build would.
                node.managed = model.managed
            key = (model.group, model.artifact, dep.classifier, dep.type)
            if key != (dep.group, dep.artifact, dep.classifier, dep.type):
                # Relocated: nearest wins applies to the relocation target, too.
                if key in chosen:
                    continue
                chosen[key] = model.version
            coordinate = _file_coordinate(model, dep)
            if coordinate is not None:
                path = self.artifact_file(coordinate)
                assert path is not None
                result.append(ResolvedArtifact(coordinate, path, dep.scope or "compile", node.depth))
            trail = (*node.trail, f"{model.group}:{model.artifact}:{model.version}")
            for child in model.dependencies:
                if node.depth >= 1:
                    child = _apply_management(child, node.managed.get(child.management_key), inject_only=False)
                scope = child.scope or "compile"
                if scope not in _INCLUDED_SCOPES or child.optional:
                    continue
                if (dep.scope or "compile") == "runtime":
                    scope = "runtime"  # Maven's scope table: anything below a runtime dependency is runtime
                child = dataclasses.replace(child, scope=scope)
                if _matches(node.exclusions, child.group, child.artifact) or _matches(
                    excluded, child.group, child.artifact
                ):
                    continue
                child_key = (child.group, child.artifact, child.classifier, child.type)
                if child_key in chosen:
                    continue
                if not child.version or "${" in child.version:
                    raise DependencyError(
                        f"cannot determine the version of {child.group}:{child.artifact} "
                        f"(got {child.version!r}) ({_via(trail)})",
                    )
                chosen[child_key] = child.version
                queue.append(
                    _Node(
                        dependency=child,
                        version=child.version,
                        depth=node.depth + 1,
                        exclusions=node.exclusions | child.exclusions,
                        managed=node.managed,
                        trail=trail,
                    )
                )

        self._save_resolved(roots, excluded, result)
        return result

    def resolve(self, coordinates: Iterable[str], exclude_artifacts: Iterable[str] = ()) -> list[Path]:
        return [a.path for a in self.resolve_artifacts(coordinates, exclude_artifacts)]

    # ---- resolved-list cache -----------------------------------------------------------------------------------

    def _request_file(self, roots: list[Coordinate], excluded: set[tuple[str, str]]) -> Path:
        request = {
            "format": _RESOLVER_FORMAT,
            "coordinates": [str(r) for r in roots],
            "exclude": sorted(f"{g}:{a}" for g, a in excluded),
        }
        digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:24]
        return self.cache_dir / ".resolved" / f"{digest}.json"

    def _load_resolved(self, roots: list[Coordinate], excluded: set[tuple[str, str]]) -> list[ResolvedArtifact] | None:
        path = self._request_file(roots, excluded)
        try:
            document = json.loads(path.read_text())
            artifacts = [
                ResolvedArtifact(
                    Coordinate(**entry["coordinate"]),
                    self.cache_dir / entry["path"],
                    entry["scope"],
                    int(entry["depth"]),
                )
                for entry in document["artifacts"]
            ]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not all(a.path.is_file() for a in artifacts):
            return None
        return artifacts

    def _save_resolved(
        self, roots: list[Coordinate], excluded: set[tuple[str, str]], artifacts: list[ResolvedArtifact]
    ) -> None:
        document = {
            "coordinates": [str(r) for r in roots],
            "exclude": sorted(f"{g}:{a}" for g, a in excluded),
            "artifacts": [
                {
                    "coordinate": {
                        "group": a.coordinate.group,
                        "artifact": a.coordinate.artifact,
                        "version": a.coordinate.version,
                        "classifier": a.coordinate.classifier,
                        "extension": a.coordinate.extension,
                    },
                    "path": a.path.relative_to(self.cache_dir).as_posix(),
                    "scope": a.scope,
                    "depth": a.depth,
                }
                for a in artifacts
            ],
        }
        _atomic_write(self._request_file(roots, excluded), json.dumps(document, indent=1).encode())


def _split_ga(text: str) -> tuple[str, str]:
    parts = text.split(":")
    if len(parts) != 2 or not all(parts):
        raise DependencyError(f"invalid exclude {text!r}: expected group:artifact (either may be '*')")
    return parts[0], parts[1]


def _via(trail: tuple[str, ...]) -> str:
    return "requested directly" if not trail else "via " + " -> ".join(trail)


def _apply_management(dep: Dependency, managed: Dependency | None, *, inject_only: bool) -> Dependency:
    """Inject (fill gaps) within a POM; override (version, scope) when a root manages a transitive dependency."""
    if managed is None:
        return dep
    version = dep.version if inject_only and dep.version else (managed.version or dep.version)
    scope = dep.scope if inject_only and dep.scope else (managed.scope or dep.scope)
    exclusions = dep.exclusions | managed.exclusions if not inject_only or not dep.exclusions else dep.exclusions
    return Dependency(
        dep.group, dep.artifact, version, dep.type, dep.classifier, scope, dep.optional, frozenset(exclusions)
    )


def _file_coordinate(model: Model, dep: Dependency) -> Coordinate | None:
    """Which file a dependency contributes to a classpath: a jar, or nothing for POM-only artifacts."""
    if dep.type == "pom" or model.packaging == "pom":
        return None
    if dep.type not in _JAR_TYPES:
        return None
    classifier = dep.classifier or _JAR_TYPES[dep.type]
    return Coordinate(model.group, model.artifact, model.version, classifier, "jar")


def resolve(
    coordinates: list[str],
    cache_dir: Path | None = None,
    *,
    exclude_artifacts: Iterable[str] = (),
    repository: str | None = None,
    fetch: Fetch | None = None,
) -> list[Path]:
    """Resolve ``group:artifact:version`` coordinates to local jars, transitive runtime dependencies included.

    The first call downloads into the cache; later calls with the same request touch no network at all.
    ``exclude_artifacts`` (``group:artifact``, ``*`` allowed) prunes what a classpath already provides.
    """
    resolver = MavenResolver(cache_dir, repository=repository, fetch=fetch)
    return resolver.resolve(coordinates, exclude_artifacts)


def resolve_artifacts(
    coordinates: list[str],
    cache_dir: Path | None = None,
    *,
    exclude_artifacts: Iterable[str] = (),
    repository: str | None = None,
    fetch: Fetch | None = None,
) -> list[ResolvedArtifact]:
    """Like :func:`resolve`, keeping the coordinates (callers that filter by artifact id need them)."""
    resolver = MavenResolver(cache_dir, repository=repository, fetch=fetch)
    return resolver.resolve_artifacts(coordinates, exclude_artifacts)

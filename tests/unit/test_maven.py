"""The POM logic of the Maven resolver, against small in-memory repositories (no network)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from cdcsync.core.errors import DependencyError, ServiceError
from cdcsync.runtime.jars import shipped_exclusions
from cdcsync.runtime.maven import Coordinate, MavenResolver, interpolate, resolve

pytestmark = pytest.mark.unit

REPO = "https://repo.test/maven2"


class FakeRepo:
    """A Maven repository in a dict, publishing .sha1 files like Central does, counting requests."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.offline = False

    def add(self, path: str, data: bytes, *, sha1: str | None = None) -> None:
        self.files[path] = data
        self.files[path + ".sha1"] = (sha1 or hashlib.sha1(data).hexdigest()).encode() + b"  " + path.encode()

    def pom(
        self,
        gav: str,
        body: str = "",
        *,
        packaging: str = "jar",
        parent: str | None = None,
        jar: bool = True,
        omit: tuple[str, ...] = (),
    ) -> None:
        g, a, v = gav.split(":")
        parent_xml = ""
        if parent:
            pg, pa, pv = parent.split(":")
            parent_xml = f"<parent><groupId>{pg}</groupId><artifactId>{pa}</artifactId><version>{pv}</version></parent>"
        ident = "".join(
            f"<{tag}>{value}</{tag}>"
            for tag, value in (("groupId", g), ("artifactId", a), ("version", v))
            if tag not in omit
        )
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<project xmlns="http://maven.apache.org/POM/4.0.0">'
            f"<modelVersion>4.0.0</modelVersion>{parent_xml}{ident}<packaging>{packaging}</packaging>{body}</project>"
        )
        base = f"{g.replace('.', '/')}/{a}/{v}/{a}-{v}"
        self.add(base + ".pom", xml.encode())
        if jar and packaging != "pom":
            self.add(base + ".jar", f"jar of {gav}".encode())

    def fetch(self, url: str) -> bytes | None:
        if self.offline:
            raise AssertionError(f"network used while offline: {url}")
        self.requests.append(url)
        assert url.startswith(REPO + "/")
        return self.files.get(url[len(REPO) + 1 :])


def dep(gav: str, extra: str = "") -> str:
    g, a, *rest = gav.split(":")
    version = f"<version>{rest[0]}</version>" if rest else ""
    return f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>{version}{extra}</dependency>"


def deps(*items: str) -> str:
    return "<dependencies>" + "".join(items) + "</dependencies>"


def managed(*items: str) -> str:
    return "<dependencyManagement>" + deps(*items) + "</dependencyManagement>"


def excl(*pairs: str) -> str:
    inner = "".join(
        f"<exclusion><groupId>{p.split(':')[0]}</groupId><artifactId>{p.split(':')[1]}</artifactId></exclusion>"
        for p in pairs
    )
    return f"<exclusions>{inner}</exclusions>"


@pytest.fixture
def repo() -> FakeRepo:
    return FakeRepo()


def run(repo: FakeRepo, tmp_path: Path, *coords: str, exclude: tuple[str, ...] = ()) -> list[str]:
    resolver = MavenResolver(tmp_path / "cache", repository=REPO, fetch=repo.fetch)
    return [str(a.coordinate) for a in resolver.resolve_artifacts(list(coords), exclude)]


def test_interpolation_is_recursive_and_leaves_unknown_names() -> None:
    props = {"a": "${b}-x", "b": "1.${c}", "c": "2"}
    assert interpolate("v${a}", props) == "v1.2-x"
    assert interpolate("${nope}", props) == "${nope}"
    assert interpolate("${self}", {"self": "${self}"}) == "${self}"  # no infinite loop


def test_properties_and_project_version(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom(
        "org.x:app:1.0",
        "<properties><lib.version>2.${minor}</lib.version><minor>5</minor></properties>"
        + deps(dep("org.x:lib:${lib.version}"), dep("org.x:sibling:${project.version}"), dep("${project.groupId}:g:1")),
    )
    repo.pom("org.x:lib:2.5")
    repo.pom("org.x:sibling:1.0")
    repo.pom("org.x:g:1")
    assert run(repo, tmp_path, "org.x:app:1.0") == ["org.x:app:1.0", "org.x:lib:2.5", "org.x:sibling:1.0", "org.x:g:1"]


def test_parent_inheritance(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom(
        "org.p:parent:3",
        "<properties><dep.version>1.1</dep.version><shared>9</shared></properties>"
        + managed(dep("org.m:managed:${dep.version}"), dep("org.m:sib:${project.version}"))
        + deps(dep("org.m:inherited:${shared}")),
        packaging="pom",
    )
    # The child inherits groupId and version, overrides one property, and relies on managed versions.
    repo.pom(
        "org.p:child:3",
        "<properties><dep.version>1.2</dep.version></properties>" + deps(dep("org.m:managed"), dep("org.m:sib")),
        parent="org.p:parent:3",
        omit=("groupId", "version"),
    )
    for gav in ("org.m:managed:1.2", "org.m:sib:3", "org.m:inherited:9"):
        repo.pom(gav)
    assert run(repo, tmp_path, "org.p:child:3") == [
        "org.p:child:3",
        "org.m:managed:1.2",
        "org.m:sib:3",
        "org.m:inherited:9",
    ]


def test_import_bom_and_root_management_governs_transitive_versions(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom("org.b:bom:1", managed(dep("org.t:deep:7"), dep("org.t:direct:2")), packaging="pom")
    repo.pom(
        "org.r:root:1",
        managed(dep("org.b:bom:1", "<type>pom</type><scope>import</scope>")) + deps(dep("org.t:direct")),
    )
    repo.pom("org.t:direct:2", deps(dep("org.t:deep:1")))
    repo.pom("org.t:deep:7")
    assert run(repo, tmp_path, "org.r:root:1") == ["org.r:root:1", "org.t:direct:2", "org.t:deep:7"]


def test_scopes_optional_and_exclusions(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom(
        "org.a:a:1",
        deps(
            dep("org.s:test:1", "<scope>test</scope>"),
            dep("org.s:provided:1", "<scope>provided</scope>"),
            dep("org.s:system:1", "<scope>system</scope>"),
            dep("org.s:opt:1", "<optional>true</optional>"),
            dep("org.s:rt:1", "<scope>runtime</scope>"),
            dep("org.s:b:1", excl("org.s:gone", "*:wild")),
        ),
    )
    repo.pom("org.s:rt:1")
    repo.pom("org.s:b:1", deps(dep("org.s:c:1"), dep("org.s:gone:1"), dep("org.other:wild:1")))
    # The exclusion applies to the whole subtree, not just b's direct dependencies.
    repo.pom("org.s:c:1", deps(dep("org.s:gone:1"), dep("org.s:kept:1")))
    repo.pom("org.s:kept:1")
    result = run(repo, tmp_path, "org.a:a:1")
    assert result == ["org.a:a:1", "org.s:rt:1", "org.s:b:1", "org.s:c:1", "org.s:kept:1"]
    assert not any(f"/org/s/{name}/" in url for url in repo.requests for name in ("test", "provided", "opt"))


def test_nearest_wins_then_first_declared(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom("org.n:root:1", deps(dep("org.n:x:1"), dep("org.n:y:1"), dep("org.n:z:1")))
    repo.pom("org.n:x:1", deps(dep("org.n:mid:1")))
    repo.pom("org.n:mid:1", deps(dep("org.n:common:3")))  # depth 3: loses
    repo.pom("org.n:y:1", deps(dep("org.n:common:2")))  # depth 2, declared first: wins
    repo.pom("org.n:z:1", deps(dep("org.n:common:1")))  # depth 2, declared later: loses
    repo.pom("org.n:common:2")
    result = run(repo, tmp_path, "org.n:root:1")
    assert [c for c in result if "common" in c] == ["org.n:common:2"]
    assert not any("common/3" in url or "common/1" in url for url in repo.requests)


def test_pom_packaging_contributes_dependencies_but_no_jar(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom("org.a:app:1", deps(dep("org.a:aggregate:1", "<type>pom</type>"), dep("org.a:pomonly:1")))
    repo.pom("org.a:aggregate:1", deps(dep("org.a:inner:1")), packaging="pom")
    repo.pom("org.a:pomonly:1", packaging="pom")
    repo.pom("org.a:inner:1")
    assert run(repo, tmp_path, "org.a:app:1") == ["org.a:app:1", "org.a:inner:1"]


def test_exclude_artifacts_prunes_subtree(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom("org.a:app:1", deps(dep("org.a:onpath:1"), dep("org.a:other:1")))
    repo.pom("org.a:onpath:1", deps(dep("org.a:below:1")))
    repo.pom("org.a:below:1")
    repo.pom("org.a:other:1")
    assert run(repo, tmp_path, "org.a:app:1", exclude=("org.a:onpath",)) == ["org.a:app:1", "org.a:other:1"]
    assert run(repo, tmp_path, "org.a:app:1", exclude=("*:other",)) == [
        "org.a:app:1",
        "org.a:onpath:1",
        "org.a:below:1",
    ]


def test_relocation_and_version_range(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom(
        "org.old:lib:1",
        "<distributionManagement><relocation><groupId>org.new</groupId></relocation></distributionManagement>",
        jar=False,
    )
    repo.pom("org.new:lib:1")
    repo.pom("org.a:app:1", deps(dep("org.old:lib:1"), dep("org.r:ranged:[1.0,2.0)")))
    repo.add(
        "org/r/ranged/maven-metadata.xml",
        b"<metadata><versioning><versions><version>0.9</version><version>1.4</version><version>1.10</version>"
        b"<version>2.0</version></versions></versioning></metadata>",
    )
    repo.pom("org.r:ranged:1.10")
    assert run(repo, tmp_path, "org.a:app:1") == ["org.a:app:1", "org.new:lib:1", "org.r:ranged:1.10"]


def test_second_run_is_offline(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom("org.a:app:1", deps(dep("org.a:lib:1")))
    repo.pom("org.a:lib:1")
    first = run(repo, tmp_path, "org.a:app:1")
    repo.offline = True
    assert run(repo, tmp_path, "org.a:app:1") == first
    # Without the resolved-list file, the cached POMs and jars are enough as well.
    for cached in (tmp_path / "cache" / ".resolved").iterdir():
        cached.unlink()
    assert run(repo, tmp_path, "org.a:app:1") == first
    jar = tmp_path / "cache" / "org/a/lib/1/lib-1.jar"
    assert jar.read_bytes() == b"jar of org.a:lib:1"
    assert not [p for p in jar.parent.iterdir() if p.name.endswith(".part")]


def test_checksum_mismatch_names_coordinate_and_url(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom("org.a:app:1", jar=False)
    repo.add("org/a/app/1/app-1.jar", b"tampered", sha1="0" * 40)
    with pytest.raises(DependencyError) as info:
        run(repo, tmp_path, "org.a:app:1")
    message = str(info.value)
    assert "org.a:app:1" in message
    assert f"{REPO}/org/a/app/1/app-1.jar" in message
    assert not (tmp_path / "cache" / "org/a/app/1/app-1.jar").exists()


def test_missing_artifact_names_path(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom("org.a:app:1", deps(dep("org.a:ghost:1")))
    with pytest.raises(DependencyError) as info:
        run(repo, tmp_path, "org.a:app:1")
    message = str(info.value)
    assert "org.a:ghost" in message
    assert f"{REPO}/org/a/ghost/1/ghost-1.pom" in message
    assert "via org.a:app:1" in message


def test_network_failure_is_retriable_service_error(tmp_path: Path) -> None:
    def broken(url: str) -> bytes | None:
        raise ServiceError(f"GET {url}: connection refused", retriable=True)

    with pytest.raises(ServiceError) as info:
        resolve(["org.a:app:1"], tmp_path, repository=REPO, fetch=broken)
    assert info.value.retriable
    assert "org.a:app:1" in str(info.value)
    assert f"{REPO}/org/a/app/1/app-1.pom" in str(info.value)


def test_default_fetch_with_file_url(repo: FakeRepo, tmp_path: Path) -> None:
    repo.pom("org.a:app:1", deps(dep("org.a:lib:1")))
    repo.pom("org.a:lib:1")
    mirror = tmp_path / "mirror"
    for rel, data in repo.files.items():
        (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        (mirror / rel).write_bytes(data)
    paths = resolve(["org.a:app:1"], tmp_path / "cache", repository=mirror.as_uri())
    assert [p.name for p in paths] == ["app-1.jar", "lib-1.jar"]
    assert all(p.is_relative_to(tmp_path / "cache") for p in paths)


def test_repository_url_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CDCSYNC__MAVEN__REPOSITORY_URL", "https://mirror.test/m2/")
    assert MavenResolver(tmp_path).repository == "https://mirror.test/m2"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert MavenResolver().cache_dir == tmp_path / "xdg" / "cdcsync" / "maven"


def test_coordinate_parsing() -> None:
    assert Coordinate.parse("g:a:1").path() == "g/a/1/a-1.jar"
    assert Coordinate.parse("o.g:a:jar:tests:1").file_name() == "a-1-tests.jar"
    with pytest.raises(DependencyError):
        Coordinate.parse("just-a-name")


def test_shipped_exclusions_match_artifact_ids_with_digits(tmp_path: Path) -> None:
    for name in ("scala-library-2.13.18.jar", "zstd-jni-1.5.7-7.jar", "spark-sql-kafka-0-10_2.13-4.2.0.jar"):
        (tmp_path / name).write_bytes(b"")
    found = shipped_exclusions(tmp_path)
    assert {"*:scala-library", "*:zstd-jni", "*:spark-sql-kafka-0-10_2.13"} <= found
    assert "*:commons-pool2" not in found

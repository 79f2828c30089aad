"""Builds the container images of cdcsync's stack locally, for machines that reach no image registry.

``make container-images`` runs this with the project's virtualenv (the JVM jars come from cdcsync's own resolver,
:mod:`cdcsync.runtime.jars`, and its cache). Each image is built on the one before it:

    base             Debian bookworm, debootstrap --variant=minbase, imported with ``docker import``
    jre              + Debian's OpenJDK 17 (headless)
    postgres         base + Debian's Postgres 15, logical decoding on, the official image's entrypoint contract
    kafka            jre + the dev stack's Kafka broker jars (KRaft, one node), configured by KAFKA_* variables
    schema-registry  jre + the dev stack's Apicurio Registry application, in-memory storage
    cdcsync          the repository's Dockerfile with BASE=jre (Debian's python3 in a virtualenv)
    clickhouse       base + python3 + chDB and the dev stack's ClickHouse HTTP server (NOT clickhouse-server)
    connect          jre + Kafka Connect and Debezium's Postgres connector (compose only)
    curl             base + curl (compose only)
    prometheus       base + Debian's Prometheus 2.42, prom/prometheus's entrypoint and flags (compose only)

Idempotent: every image carries the label ``org.cdcsync.build-hash``, a hash of everything it is made from (its
directory here, the files copied in, the build arguments, the parent image's id); an image whose label matches is
reused, so a second run builds nothing and takes seconds. A changed input rebuilds that image and the ones on it.
Dangling images left by rebuilds are pruned, because the vfs storage driver keeps every layer as a full copy.

    python containers/build.py [--list | --env] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HASH_LABEL = "org.cdcsync.build-hash"
PREFIX = os.environ.get("CDCSYNC_IMAGE_PREFIX", "cdcsync-local")
SUITE = "bookworm"
MIRROR = os.environ.get("CDCSYNC_DEBIAN_MIRROR", "http://deb.debian.org/debian")
NICE = ["nice", "-n", "10"]
ROOTFS_CLEANUP = (
    "rm -rf usr/share/doc/* usr/share/man/* usr/share/info/* usr/share/locale/* var/lib/apt/lists/* "
    "var/cache/apt/archives/*.deb var/cache/apt/*.bin var/log/*.log && "
    # Package scripts (update-alternatives for java, postgres) link their manuals there and fail without them.
    "mkdir -p usr/share/man/man1 usr/share/man/man5 usr/share/man/man7 usr/share/man/man8"
)
"""What the base image leaves out of the debootstrapped tree (nodoc.dpkg.cfg keeps it out of later installs)."""
TEST_IMAGES = ("postgres", "kafka", "schema-registry", "clickhouse")
"""The images tests/conftest.py runs with CDCSYNC_TEST_STACK=containers (CDCSYNC_TEST_<KEY>_IMAGE)."""


def _versions() -> tuple[str, str, str, str]:
    """Kafka's, Apicurio Registry's, chDB's and Debezium's versions, for the tags."""
    from importlib.metadata import version

    from cdcsync.runtime.jars import APICURIO_VERSION, DEBEZIUM_VERSION, KAFKA_VERSION

    final = ".Final"
    return (
        KAFKA_VERSION,
        APICURIO_VERSION.removesuffix(final),
        version("chdb-core"),
        DEBEZIUM_VERSION.removesuffix(final),
    )


@dataclass
class Image:
    key: str
    tag: str
    directory: Path
    parent: str | None = None
    """The key of the image this one is built on (its tag becomes the build argument ``parent_arg``)."""
    parent_arg: str = "BASE"
    files: Callable[[], dict[str, Path]] = dict
    """Files and directories to put into the build context, by their path there."""
    dockerfile: Path | None = None
    context: Path | None = None
    """A build context of its own (the repository, for cdcsync); otherwise one is assembled from ``directory``."""
    context_files: Callable[[], list[Path]] = list
    """For an own context: the files whose contents the image depends on."""
    build_args: dict[str, str] = field(default_factory=dict)


def _extra_ca_files() -> dict[str, Path]:
    """The machine's own certificate authorities, which builds behind its TLS-intercepting proxy need."""
    folder = Path(os.environ.get("CDCSYNC_EXTRA_CA_DIR", "/usr/local/share/ca-certificates"))
    return {f"ca-certificates/{cert.name}": cert for cert in sorted(folder.glob("*.crt"))}


def _kafka_files() -> dict[str, Path]:
    from cdcsync.runtime.jars import kafka_broker_jars

    return {f"kafka/libs/{jar.name}": jar for jar in kafka_broker_jars()}


def _apicurio_files() -> dict[str, Path]:
    from cdcsync.runtime.jars import apicurio_registry_runner

    return {"apicurio": apicurio_registry_runner().parent}


def _repository_files() -> list[Path]:
    """What the Dockerfile copies (see .dockerignore), plus the Dockerfile and .dockerignore themselves."""
    paths = [REPO / "Dockerfile", REPO / ".dockerignore", REPO / "pyproject.toml", REPO / "README.md"]
    for folder in ("cdcsync", "templates"):
        paths += [p for p in sorted((REPO / folder).rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    return paths


def _connect_files() -> dict[str, Path]:
    from cdcsync.runtime.jars import debezium_postgres_plugin_jars, kafka_connect_jars

    plugin = "connect/plugins/debezium-connector-postgres"
    return {
        **{f"connect/libs/{jar.name}": jar for jar in kafka_connect_jars()},
        **{f"{plugin}/{jar.name}": jar for jar in debezium_postgres_plugin_jars()},
    }


CLICKHOUSE_SERVER_DISTRIBUTIONS = ("chdb-core", "pydantic", "pydantic-settings", "lz4", "backports.zstd")
"""What ``python -m cdcsync.devstack.clickhouse_server`` imports beyond the standard library (with their own
dependencies: pandas, pyarrow, python-dotenv)."""


def _clickhouse_files() -> dict[str, Path]:
    """cdcsync's source, the machine's certificate authorities, and the server's requirements at the versions
    the project's environment has (cdcsync's own pins)."""
    from importlib.metadata import version

    requirements = cache_dir() / "clickhouse-requirements.txt"
    requirements.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{name}=={version(name)}\n" for name in CLICKHOUSE_SERVER_DISTRIBUTIONS)
    if not requirements.is_file() or requirements.read_text() != text:
        requirements.write_text(text)
    return {
        "src/cdcsync": REPO / "cdcsync",
        "requirements.txt": requirements,
        "ca-certificates/README": HERE / "jre" / "ca-certificates" / "README",
        **_extra_ca_files(),
    }


def cache_dir() -> Path:
    from cdcsync.runtime.ivy import cache_root

    return cache_root() / "containers"


def images() -> list[Image]:
    kafka_version, apicurio_version, chdb_version, debezium_version = _versions()
    return [
        Image("base", f"{PREFIX}/debian:{SUITE}", HERE / "base"),
        Image("jre", f"{PREFIX}/jre:17", HERE / "jre", parent="base", files=_extra_ca_files),
        Image("postgres", f"{PREFIX}/postgres:15", HERE / "postgres", parent="base"),
        Image("kafka", f"{PREFIX}/kafka:{kafka_version}", HERE / "kafka", "jre", "JRE", _kafka_files),
        Image(
            "schema-registry",
            f"{PREFIX}/apicurio-registry:{apicurio_version}",
            HERE / "schema-registry",
            "jre",
            "JRE",
            _apicurio_files,
        ),
        Image(
            "cdcsync",
            "cdcsync:local",
            REPO,
            parent="jre",
            dockerfile=REPO / "Dockerfile",
            context=REPO,
            context_files=_repository_files,
        ),
        Image(
            "clickhouse",
            f"{PREFIX}/clickhouse-chdb:{chdb_version}",
            HERE / "clickhouse",
            parent="base",
            files=_clickhouse_files,
        ),
        # For the compose stack only (the tests start Kafka Connect from the same jars on the host).
        Image(
            "connect", f"{PREFIX}/debezium-connect:{debezium_version}", HERE / "connect", "jre", "JRE", _connect_files
        ),
        Image("curl", f"{PREFIX}/curl:{SUITE}", HERE / "curl", parent="base"),
        Image("prometheus", f"{PREFIX}/prometheus:{SUITE}", HERE / "prometheus", parent="base"),
    ]


# ------------------------------------------------------------------------------------------------- docker


def build_command() -> list[str]:
    """BuildKit: the classic builder starts a container (on vfs: a full copy of the image) for every instruction.

    ``docker buildx`` where the plugin is installed; otherwise a client older than 23 (Debian's docker.io), whose
    built-in BuildKit ``DOCKER_BUILDKIT=1`` turns on; otherwise the classic builder.
    """
    if subprocess.run(["docker", "buildx", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "buildx", "build", "--load"]
    for client in ("docker", "/usr/bin/docker"):
        found = shutil.which(client)
        if found is None:
            continue
        version = subprocess.run(
            [found, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if version.split(".")[0].isdigit() and int(version.split(".")[0]) < 23:
            return ["env", "DOCKER_BUILDKIT=1", found, "build"]
    return ["env", "DOCKER_BUILDKIT=0", "docker", "build"]


def docker(*args: str, capture: bool = False, stdin: bytes | None = None) -> str:
    result = subprocess.run(
        ["docker", *args],
        input=stdin,
        stdout=subprocess.PIPE if capture else None,
        check=True,
    )
    return result.stdout.decode().strip() if capture else ""


def image_label(tag: str) -> str | None:
    """The build hash of an existing image, or None when there is no such image."""
    result = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        return None
    labels = json.loads(result.stdout or b"null") or {}
    return str(labels.get(HASH_LABEL, ""))


def image_id(tag: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", tag, capture=True)


# -------------------------------------------------------------------------------------------------- hashes


def _hash_path(digest: hashlib._Hash, path: Path, name: str) -> None:
    """Names and contents; for jars from the cache (immutable, versioned), name and size are enough."""
    if path.is_dir():
        for child in sorted(path.rglob("*")):
            if child.is_file() and "__pycache__" not in child.parts:
                _hash_path(digest, child, f"{name}/{child.relative_to(path)}")
        return
    digest.update(name.encode() + b"\0")
    if path.suffix == ".jar":
        digest.update(str(path.stat().st_size).encode())
    else:
        digest.update(path.read_bytes())
    digest.update(b"\0")


def build_hash(image: Image, built: dict[str, str]) -> str:
    digest = hashlib.sha256()
    digest.update(f"{image.key}\0{image.tag}\0{SUITE}\0{MIRROR}\0".encode())
    if image.parent:
        digest.update(built[image.parent].encode())
    else:
        digest.update(ROOTFS_CLEANUP.encode())
    own = image.context_files() if image.context else sorted(p for p in image.directory.rglob("*") if p.is_file())
    for path in own:
        _hash_path(digest, path, str(path.relative_to(image.directory)))
    for name, path in sorted(image.files().items()):
        _hash_path(digest, path, name)
    digest.update(json.dumps(image.build_args, sort_keys=True).encode())
    return digest.hexdigest()[:24]


# -------------------------------------------------------------------------------------------------- builds


@contextmanager
def _context(image: Image) -> Iterator[Path]:
    """The image's directory plus its files, hard-linked where the file system allows (no copy of 150 MB jars)."""
    with tempfile.TemporaryDirectory(prefix=f"cdcsync-image-{image.key}-") as tmp:
        root = Path(tmp)
        shutil.copytree(image.directory, root, dirs_exist_ok=True)
        for name, source in image.files().items():
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                ignore = shutil.ignore_patterns("__pycache__")
                shutil.copytree(source, target, copy_function=_link_or_copy, ignore=ignore)
            else:
                _link_or_copy(source, target)
        yield root


def _link_or_copy(source: str | Path, target: str | Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def build_base(image: Image, digest: str, debootstrapped: Path | None) -> None:
    """debootstrap (minbase) with documentation excluded from the start, apt set up to keep no caches, imported.

    ``debootstrapped``: a tree ``debootstrap --variant=minbase bookworm`` made before (it is cleaned in place).
    """
    if debootstrapped is None and shutil.which("debootstrap") is None:
        sys.exit("debootstrap is missing: apt-get install -y debootstrap")
    with tempfile.TemporaryDirectory(prefix="cdcsync-rootfs-", dir=os.environ.get("CDCSYNC_ROOTFS_DIR")) as tmp:
        rootfs = debootstrapped or Path(tmp) / SUITE
        dpkg_cfg = rootfs / "etc/dpkg/dpkg.cfg.d"
        dpkg_cfg.mkdir(parents=True, exist_ok=True)
        shutil.copy(image.directory / "nodoc.dpkg.cfg", dpkg_cfg / "01-cdcsync-nodoc")
        if debootstrapped is None:
            debootstrap = ["debootstrap", "--variant=minbase", "--components=main", SUITE, str(rootfs), MIRROR]
            subprocess.run([*NICE, *debootstrap], check=True)
        shutil.copy(image.directory / "apt.conf", rootfs / "etc/apt/apt.conf.d/01-cdcsync")
        shutil.copy(image.directory / "sources.list", rootfs / "etc/apt/sources.list")
        subprocess.run(["sh", "-c", ROOTFS_CLEANUP], cwd=rootfs, check=True)
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            [
                "docker",
                "import",
                "--change",
                f"LABEL {HASH_LABEL}={digest}",
                "--change",
                'CMD ["bash"]',
                "--change",
                "ENV LANG=C.UTF-8",
                "-",
                image.tag,
            ],
            stdin=tar.stdout,
            check=True,
        )
        if tar.wait() != 0:
            sys.exit("tar of the debootstrapped root file system failed")


def build(image: Image, digest: str, built_tags: dict[str, str], debootstrapped: Path | None) -> None:
    if image.key == "base":
        build_base(image, digest, debootstrapped)
        return
    args = dict(image.build_args)
    if image.parent:
        args[image.parent_arg] = built_tags[image.parent]
    argv = [*build_command(), "--label", f"{HASH_LABEL}={digest}", "-t", image.tag]
    for name, value in args.items():
        argv += ["--build-arg", f"{name}={value}"]
    if image.context is not None:
        subprocess.run(
            [*argv, "-f", str(image.dockerfile or image.context / "Dockerfile"), str(image.context)], check=True
        )
        return
    with _context(image) as context:
        subprocess.run([*argv, str(context)], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print each image's tag and exit")
    parser.add_argument(
        "--env", action="store_true", help="print CDCSYNC_TEST_*_IMAGE=<tag> for the tests' containers and exit"
    )
    parser.add_argument("--rootfs", type=Path, help="import this debootstrapped tree instead of running debootstrap")
    parser.add_argument("--only", nargs="*", help="build only these images (and what they are built on)")
    args = parser.parse_args(argv)
    plan = images()
    if args.env:
        by_tag = {image.key: image.tag for image in plan}
        print(" ".join(f"CDCSYNC_TEST_{key.upper().replace('-', '_')}_IMAGE={by_tag[key]}" for key in TEST_IMAGES))
        return 0
    if args.list:
        for image in plan:
            print(f"{image.key}\t{image.tag}")
        return 0
    wanted = set(args.only or [image.key for image in plan])
    by_key = {image.key: image for image in plan}
    for key in list(wanted):
        while by_key[key].parent:
            key = by_key[key].parent or ""
            wanted.add(key)
    hashes: dict[str, str] = {}
    tags: dict[str, str] = {}
    total = time.monotonic()
    rebuilt = False
    for image in plan:
        if image.key not in wanted:
            continue
        digest = build_hash(image, hashes)
        started = time.monotonic()
        if image_label(image.tag) == digest:
            state = "up to date"
        else:
            print(f"==> building {image.tag}", flush=True)
            build(image, digest, tags, args.rootfs)
            rebuilt = True
            state = f"built in {time.monotonic() - started:.0f} s"
        hashes[image.key] = digest + image_id(image.tag)
        tags[image.key] = image.tag
        print(f"{image.key:16} {image.tag:40} {state}", flush=True)
    if rebuilt:
        docker("image", "prune", "--force")
    print(f"images ready in {time.monotonic() - total:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

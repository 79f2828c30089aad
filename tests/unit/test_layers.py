"""The layer contract in pyproject.toml (run by ``make lint``) holds, and it fails on a wrong-way import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(tree / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture()
def package_copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "cdcsync", tmp_path / "cdcsync", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_package_keeps_its_layers(package_copy: Path) -> None:
    result = _lint_imports(package_copy)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "wrong_way"),
    [
        ("cdcsync/core/names.py", "import cdcsync.config.settings"),  # the bottom layer reaching up
        ("cdcsync/sources/kafka.py", "import cdcsync.engine.batch"),  # a source reaching into the engine
        ("cdcsync/runtime/status.py", "import cdcsync.devstack.common"),  # the product starting the dev stack
    ],
)
def test_a_wrong_way_import_breaks_the_contract(package_copy: Path, module: str, wrong_way: str) -> None:
    path = package_copy / module
    path.write_text(path.read_text() + f"\n{wrong_way}  # noqa\n")
    result = _lint_imports(package_copy)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert wrong_way.split()[-1] in result.stdout

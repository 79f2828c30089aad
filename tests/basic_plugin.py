"""Makes ``examples/basic_plugin`` installed for a test without building it: its sources on the path, and a
``.dist-info`` with its entry point, which is what ``pip install -e`` leaves behind for importlib.metadata."""

from __future__ import annotations

from pathlib import Path

import tomllib

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "basic_plugin"


def install(root: Path) -> list[Path]:
    """The ``sys.path`` / ``PYTHONPATH`` entries under which the example plugin is installed (created in ``root``)."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    site = root / "plugin-site"
    dist_info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = ["[cdcsync.plugins]"] + [f"{k} = {v}" for k, v in project["entry-points"]["cdcsync.plugins"].items()]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return [site, EXAMPLE / "src"]

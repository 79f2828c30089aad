"""The docs hold together: README is a short front door, every relative link (and ``#anchor``) resolves, every page
in ``docs/`` can be reached from the README, and every command and option of ``cdcsync --help`` is documented."""

from __future__ import annotations

import functools
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_BYTES = 12_288

_FENCE_RE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN_RE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_INLINE_LINK_RE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEF_RE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.MULTILINE)
_HEADING_RE = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
_EXTERNAL_RE = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where brackets are not links."""
    return _CODE_SPAN_RE.sub("", _FENCE_RE.sub("", text))


def links(text: str) -> list[str]:
    """Every link target written in ``text`` (inline links, images and reference definitions)."""
    prose = _prose(text)
    return _INLINE_LINK_RE.findall(prose) + _REFERENCE_DEF_RE.findall(prose)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text in lower case, every character but letters, digits,
    ``_``, ``-`` and spaces dropped, spaces turned into hyphens (emphasis with ``_`` is not handled)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "").lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a markdown file's headings, numbered as GitHub numbers repeats (``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    result = set()
    for _, heading in _HEADING_RE.findall(_FENCE_RE.sub("", text)):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        result.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return result


def broken_links(page: Path, root: Path) -> list[str]:
    """The links of ``page`` that point at no file under ``root``, or at a heading its target lacks."""
    problems = []
    for target in links(page.read_text()):
        if _EXTERNAL_RE.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{page.relative_to(root)}: {target}: no such file")
        elif root not in resolved.parents and resolved != root:
            problems.append(f"{page.relative_to(root)}: {target}: outside the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            problems.append(f"{page.relative_to(root)}: {target}: no heading '#{anchor}' in {resolved.name}")
    return problems


def reachable_pages(start: Path) -> set[Path]:
    """Markdown files reachable from ``start`` by relative links."""
    seen = {start.resolve()}
    todo = [start.resolve()]
    while todo:
        page = todo.pop()
        for target in links(page.read_text()):
            path_part = target.partition("#")[0]
            if _EXTERNAL_RE.match(target) or not path_part.endswith(".md"):
                continue
            linked = (page.parent / path_part).resolve()
            if linked.is_file() and linked not in seen:
                seen.add(linked)
                todo.append(linked)
    return seen


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page, ROOT) == []


def test_the_readme_is_a_short_front_door() -> None:
    size = len(README.read_bytes())
    assert size < README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/"
    text = README.read_text()
    for command in ("make demo", "make test", "cdcsync init", "cdcsync run"):
        assert command in text


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    unreachable = set(DOCS.glob("*.md")) - reachable_pages(README)
    assert sorted(str(p.relative_to(ROOT)) for p in unreachable) == []


def test_every_cli_command_and_option_is_documented() -> None:
    import typer.main

    from cdcsync.cli import app

    documented = "\n".join(page.read_text() for page in pages())
    flat = " ".join(documented.replace("`", "").split())  # prose, without code markup
    missing = []
    visited: set[str] = set()

    def visit(command: Any, path: list[str]) -> None:
        """Typer builds on its own copy of click, so groups are recognised by their ``commands``."""
        subcommands: dict[str, Any] | None = getattr(command, "commands", None)
        visited.add(" ".join(path))
        if path:  # `cdcsync dev up`, or `up` in a list such as `cdcsync dev up | down | status`
            parents = "".join(f"{name} " for name in path[:-1])
            if not re.search(rf"cdcsync {parents}(?:[\w-]+ \| )*{path[-1]}\b", documented):
                missing.append(f"command: cdcsync {' '.join(path)}")
        if path and subcommands is None:  # its --help's first paragraph, word for word
            summary = " ".join((command.help or "").split("\n\n")[0].replace("`", "").split())
            if summary not in flat:
                missing.append(f"help of cdcsync {' '.join(path)}: {summary!r}")
        for param in command.params:
            for option in getattr(param, "opts", []):
                if option.startswith("--") and option != "--help" and option not in documented:
                    missing.append(f"option: cdcsync {' '.join(path)} {option}")
        for name, sub in (subcommands or {}).items():
            visit(sub, [*path, name])

    visit(typer.main.get_command(app), [])
    assert visited >= {"validate", "init", "migrate", "run", "status", "dev up", "dev down", "dev status", "dev env"}
    assert missing == []


_YAML_BLOCK_RE = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
_STUB_COLUMNS = {
    "id": "bigint",
    "customer_id": "bigint",
    "user_id": "bigint",
    "event_id": "bigint",
    "amount": "numeric(14,2)",
    "status": "text",
    "created_at": "timestamptz",
}
_STUB_SOURCES = {
    source_id: {"type": "kafka", "topic": f"t.{source_id}", "primary_key": key, "columns": dict(_STUB_COLUMNS)}
    for source_id, key in (("orders", "id"), ("orders.events", "id"), ("user.events", "event_id"))
}


def yaml_examples() -> list[tuple[str, dict[str, object]]]:
    """(page and number, document) of every YAML example in the docs."""
    import yaml

    found = []
    for page in pages():
        for number, block in enumerate(_YAML_BLOCK_RE.findall(page.read_text()), 1):
            found.append((f"{page.relative_to(ROOT)}#{number}", yaml.safe_load(block)))
    return found


@pytest.mark.parametrize(("where", "example"), yaml_examples(), ids=[where for where, _ in yaml_examples()])
def test_yaml_examples_are_valid(
    where: str, example: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipeline fragments validate (sources they leave out, and columns `cdcsync init` would read, are stubbed;
    the example plugin is installed for those naming it); a settings example is valid settings."""
    from cdcsync.config import plugins
    from cdcsync.config.load import validate_pipeline_dict
    from cdcsync.config.settings import Settings
    from tests import basic_plugin

    if "basic_plugin." in repr(example):
        for entry in basic_plugin.install(tmp_path):
            monkeypatch.syspath_prepend(str(entry))
        plugins.installed.cache_clear()
        monkeypatch.setattr(plugins, "installed", functools.cache(plugins.installed.__wrapped__))

    assert isinstance(example, dict), where
    if not {"sources", "sinks", "transforms"} & set(example):
        Settings.model_validate(example)
        return
    given = example.get("sources") or _STUB_SOURCES
    assert isinstance(given, dict), where
    sources = {source_id: dict(source) for source_id, source in given.items()}
    for source in sources.values():
        if "topic" in source:
            source["columns"] = {**_STUB_COLUMNS, **source.get("columns", {})}
    pipeline = {
        "name": example.get("name", "docs"),
        "sources": sources,
        "transforms": example.get("transforms") or {},
        "sinks": example.get("sinks") or {"stub": {"type": "postgres", "from": next(iter(sources)), "table": "t"}},
    }
    validate_pipeline_dict(pipeline)


# The checks above must be able to fail: each is exercised once on a page that is wrong on purpose.


def test_a_broken_link_and_a_missing_anchor_are_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Exactly-once: how `run` works\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#exactly-once-how-run-works) [gone](docs/b.md) [bad](docs/a.md#nothing)\n"
        "[web](https://example.org/x) `[code](docs/c.md)`\n```\n[fenced](docs/d.md)\n```\n"
    )
    assert broken_links(page, tmp_path) == [
        "README.md: docs/b.md: no such file",
        "README.md: docs/a.md#nothing: no heading '#nothing' in a.md",
    ]


def test_an_orphan_page_is_not_reachable(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "linked.md").write_text("[next](other.md)\n")
    (tmp_path / "docs" / "other.md").write_text("# other\n")
    (tmp_path / "docs" / "orphan.md").write_text("# orphan\n")
    (tmp_path / "README.md").write_text("[docs](docs/linked.md)\n")
    found = {p.name for p in reachable_pages(tmp_path / "README.md")}
    assert found == {"README.md", "linked.md", "other.md"}


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Exactly-once and ordering", "exactly-once-and-ordering"),
        ("Types: Debezium → Postgres → Spark", "types-debezium--postgres--spark"),
        ("`type: postgres_aggregate`", "type-postgres_aggregate"),
        ("Columns from the topic's schema", "columns-from-the-topics-schema"),
        ("Lookups (SQL transform + dynamic table)", "lookups-sql-transform--dynamic-table"),
        ("Types read by `cdcsync init`", "types-read-by-cdcsync-init"),
    ],
)
def test_github_slugs(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug

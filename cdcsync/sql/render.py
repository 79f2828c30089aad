"""Jinja2 rendering of the SQL templates in the repository's ``templates/`` directory.

Python passes values; the templates decide the shape of the SQL. Every identifier reaches SQL through the
``ident`` / ``qualified`` / ``columns`` filters, every string through ``literal`` and every column type through
``pg_type``, so a name from the pipeline YAML can never break out of its quotes, whatever it contains.

Filters available in every template:

``ident``       ``{{ name | ident }}`` -> ``"name"`` (always double-quoted, embedded ``"`` doubled)
``qualified``   ``{{ schema | qualified(table) }}`` -> ``"schema"."table"``
``ident_path``  ``{{ (schema, table) | ident_path }}`` -> ``"schema"."table"`` (any number of parts)
``columns``     ``{{ names | columns }}`` -> ``"a", "b"``
``literal``     ``{{ text | literal }}`` -> ``'text'`` (``'`` doubled; ``E'...'`` when it holds a backslash)
``pg_type``     ``{{ type_text | pg_type }}`` -> canonical Postgres type, refused unless cdcsync understands it
``comment``     ``{{ text | comment }}`` -> text safe inside a ``--`` comment (line breaks escaped)

ClickHouse templates (``templates/clickhouse/``) use backtick quoting instead:

``ch_ident``      ``{{ name | ch_ident }}`` -> ```name``` (backslash and backtick escaped with a backslash)
``ch_qualified``  ``{{ database | ch_qualified(table) }}`` -> ```db`.`t```
``ch_columns``    ``{{ names | ch_columns }}`` -> ```a`, `b```
``ch_literal``    ``{{ text | ch_literal }}`` -> ``'text'`` (backslash and ``'`` escaped with a backslash)
``ch_value``      ``{{ value | ch_value }}`` -> a setting value: numbers and booleans as is, text as ``ch_literal``

``%`` in names and strings (``"discount_%"`` is a legal Postgres column): psycopg reads every ``%`` of a statement
executed with parameters as the start of a placeholder (``%%`` for a ``%``), and sends a statement executed
without parameters as it is. Hence one rule, statement by statement (a statement ends with ``;`` at a line's end):

* a statement whose template holds a ``%(name)s`` placeholder is executed with parameters, and every ``%`` that
  the Postgres filters above write into it is doubled;
* any other statement is executed without parameters, and its ``%`` stay single: migration files (run as they
  are, also by hand with psql), most ``COPY`` statements, and every statement of a template without placeholders.

:func:`render` applies it (the filters write a marker for ``%``, which it settles once the statements are known);
callers keep their half: parameters for exactly the statements holding placeholders (:func:`holds_placeholder`,
which looks outside quotes: a name may spell ``%(batch_id)s``), never ``{}`` to ``execute`` for another (psycopg
would parse it; its ``copy`` takes ``{}`` as none). ClickHouse statements bind their values
server-side (``{name:Type}``), and clickhouse-connect formats a statement with ``%`` only when it is given
parameters yet holds no such placeholder, which none of cdcsync's does: the ``ch_`` filters leave ``%`` alone.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jinja2

import cdcsync
from cdcsync.config.types import UnknownTypeError, parse_pg_type
from cdcsync.core.errors import ConfigError

POSTGRES_MAX_IDENTIFIER_BYTES = 63
_PERCENT = "\x00percent\x00"
"""What the Postgres filters write for a ``%`` until :func:`render` settles it, so that the only ``%`` it finds
are the template's own. No name or string holds it: ``ident`` and ``literal`` refuse NUL."""
_PLACEHOLDER = re.compile(r"%\(\w+\)[sbt]")
_QUOTED = re.compile(r"\"(?:[^\"]|\"\")*\"|'(?:[^']|'')*'|--[^\n]*")
"""A quoted identifier, a string literal (also the body of an ``E'...'`` one: ``literal`` doubles its quotes) or a
line comment, leftmost first: where configuration's names and values are, and no placeholder is."""
_STATEMENT_END = re.compile(r"(?<=;\n)")


def templates_dir() -> Path:
    """The ``templates/`` directory: inside the package for wheel installs, else at the repository's top level."""
    package_dir = Path(cdcsync.__file__).parent
    bundled = package_dir / "templates"
    if bundled.is_dir():
        return bundled
    return package_dir.parent / "templates"


def _require_defined(value: object) -> None:
    """A missing template value fails as undefined (StrictUndefined), not as a confusing type error."""
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()


def quote_ident(name: object) -> str:
    """Quote a Postgres identifier: always double-quoted, embedded double quotes doubled.

    Refuses what Postgres would reject or silently change: empty names, NUL characters and names longer than
    63 bytes (Postgres would truncate them, and two long names could then land on the same table).
    """
    _require_defined(name)
    if not isinstance(name, str):
        raise TypeError(f"an identifier must be a string, got {type(name).__name__}")
    if name == "":
        raise ConfigError("an empty identifier cannot be used in SQL")
    if "\x00" in name:
        raise ConfigError(f"identifier {name!r} contains a NUL character, which Postgres does not allow")
    if len(name.encode()) > POSTGRES_MAX_IDENTIFIER_BYTES:
        raise ConfigError(
            f"identifier {name!r} is longer than Postgres' {POSTGRES_MAX_IDENTIFIER_BYTES}-byte limit "
            "(Postgres would silently truncate it)"
        )
    return '"' + name.replace('"', '""') + '"'


def quote_qualified(schema: object, name: object) -> str:
    """``schema`` and ``name`` as ``"schema"."name"``."""
    return f"{quote_ident(schema)}.{quote_ident(name)}"


def quote_path(parts: Iterable[object]) -> str:
    """A dotted name from its parts, e.g. ``("app", "orders")`` -> ``"app"."orders"``."""
    _require_defined(parts)
    if isinstance(parts, str):
        raise TypeError("the ident_path filter takes a sequence of names such as (schema, table), not a string")
    quoted = [quote_ident(part) for part in parts]
    if not quoted:
        raise ConfigError("an empty name cannot be used in SQL")
    return ".".join(quoted)


def _quote_list(names: Iterable[object], quote: Callable[[object], str], filter_name: str) -> str:
    _require_defined(names)
    if isinstance(names, str):
        raise TypeError(f"the {filter_name} filter takes a list of names, not a single string")
    quoted = [quote(name) for name in names]
    if not quoted:
        raise ConfigError("an empty column list cannot be used in SQL")
    return ", ".join(quoted)


def quote_columns(names: Iterable[object]) -> str:
    """A list of column names, each quoted, joined with ``, ``."""
    return _quote_list(names, quote_ident, "columns")


def quote_literal(value: object) -> str:
    """A SQL string literal.

    Single quotes are doubled. A value holding a backslash is written as an escape string (``E'...'``, with
    backslashes doubled too), which reads the same whatever ``standard_conforming_strings`` is set to.
    """
    _require_defined(value)
    if not isinstance(value, str):
        raise TypeError(f"the literal filter takes a string, got {type(value).__name__}")
    if "\x00" in value:
        raise ConfigError(f"string {value!r} contains a NUL character, which Postgres text cannot hold")
    escaped = value.replace("'", "''")
    if "\\" in value:
        return "E'" + escaped.replace("\\", "\\\\") + "'"
    return "'" + escaped + "'"


def canonical_pg_type(type_text: object) -> str:
    """The canonical spelling of a column type; anything cdcsync does not understand is refused."""
    _require_defined(type_text)
    if not isinstance(type_text, str):
        raise TypeError(f"the pg_type filter takes a string, got {type(type_text).__name__}")
    try:
        return parse_pg_type(type_text).sql
    except UnknownTypeError as error:
        raise ConfigError(str(error)) from None


def comment_text(value: object) -> str:
    """Text that is safe inside a ``--`` SQL comment: control characters and line separators are escaped."""
    text = str(value)
    out = []
    for char in text:
        if unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            out.append(char.encode("unicode_escape").decode("ascii"))
        else:
            out.append(char)
    return "".join(out)


def _identifier(name: object) -> str:
    """``name`` checked to be a usable identifier (a non-empty string without NUL)."""
    _require_defined(name)
    if not isinstance(name, str):
        raise TypeError(f"an identifier must be a string, got {type(name).__name__}")
    if name == "":
        raise ConfigError("an empty identifier cannot be used in SQL")
    if "\x00" in name:
        raise ConfigError(f"identifier {name!r} contains a NUL character")
    return name


def ch_quote_ident(name: object) -> str:
    """Quote a ClickHouse identifier with backticks; ``\\`` and ````` are escaped with a backslash."""
    return "`" + _identifier(name).replace("\\", "\\\\").replace("`", "\\`") + "`"


def ch_quote_qualified(database: object, name: object) -> str:
    """``database`` and ``name`` as ```database`.`name```."""
    return f"{ch_quote_ident(database)}.{ch_quote_ident(name)}"


def ch_quote_columns(names: Iterable[object]) -> str:
    """A list of ClickHouse column names, each quoted, joined with ``, ``."""
    return _quote_list(names, ch_quote_ident, "ch_columns")


def ch_quote_literal(value: object) -> str:
    """A ClickHouse string literal: backslashes and single quotes escaped with a backslash."""
    _require_defined(value)
    if not isinstance(value, str):
        raise TypeError(f"the ch_literal filter takes a string, got {type(value).__name__}")
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def ch_setting_value(value: object) -> str:
    """A table setting's value: numbers as is, booleans as 1/0, anything else as a string literal."""
    _require_defined(value)
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    return ch_quote_literal(str(value))


def spark_quote_ident(name: object) -> str:
    """Quote a Spark SQL identifier with backticks, embedded backticks doubled."""
    return "`" + _identifier(name).replace("`", "``") + "`"


def spark_quote_columns(names: Iterable[object]) -> str:
    """A list of Spark SQL column names, each quoted, joined with ``, ``."""
    return _quote_list(names, spark_quote_ident, "spark_columns")


def delta_table_ref(location: dict[str, Any]) -> str:
    """A Delta table as Spark SQL names it: ``delta.`<path>``` for ``{"path": ...}``, the quoted parts of a catalog
    name for ``{"table": "db.name"}``."""
    _require_defined(location)
    if location.get("path") is not None:
        return "delta." + spark_quote_ident(str(location["path"]))
    return ".".join(spark_quote_ident(part) for part in str(location["table"]).split("."))


def _marking_percent(quote: Callable[..., str]) -> Callable[..., str]:
    """``quote`` as a template filter: its ``%`` marked for :func:`render`. Another filter's output may be its input
    (``{{ (stage | ident_path) | literal }}``): that one's marks are ``%`` again first."""

    def unmarked(value: object) -> object:
        return value.replace(_PERCENT, "%") if isinstance(value, str) else value

    @functools.wraps(quote)
    def filter_(value: object, *args: object) -> str:
        return quote(unmarked(value), *map(unmarked, args)).replace("%", _PERCENT)

    return filter_


def template_text(statement: str) -> str:
    """A rendered statement without its quoted identifiers, string literals and line comments: the template's own
    words (its placeholders, its ``/* tags */``), none of the configuration's."""
    return _QUOTED.sub(" ", statement)


def holds_placeholder(statement: str) -> bool:
    """Whether a rendered statement is one to execute with parameters (the module docstring's rule)."""
    return _PLACEHOLDER.search(template_text(statement)) is not None


def _settle_percent(sql: str) -> str:
    """The marked ``%`` of each statement of ``sql``: ``%%`` where the statement holds a placeholder, else ``%``
    (the module docstring's rule)."""
    if _PERCENT not in sql:
        return sql
    return "".join(
        statement.replace(_PERCENT, "%%" if holds_placeholder(statement) else "%")
        for statement in _STATEMENT_END.split(sql)
    )


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The shared Jinja environment (cached): strict about undefined values, no HTML autoescaping."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["ident"] = _marking_percent(quote_ident)
    env.filters["qualified"] = _marking_percent(quote_qualified)
    env.filters["ident_path"] = _marking_percent(quote_path)
    env.filters["columns"] = _marking_percent(quote_columns)
    env.filters["literal"] = _marking_percent(quote_literal)
    env.filters["pg_type"] = canonical_pg_type
    env.filters["comment"] = _marking_percent(comment_text)
    env.filters["ch_ident"] = ch_quote_ident
    env.filters["ch_qualified"] = ch_quote_qualified
    env.filters["ch_columns"] = ch_quote_columns
    env.filters["ch_literal"] = ch_quote_literal
    env.filters["ch_value"] = ch_setting_value
    env.filters["spark_ident"] = spark_quote_ident
    env.filters["spark_columns"] = spark_quote_columns
    env.filters["spark_literal"] = ch_quote_literal  # Spark SQL's string literals escape like ClickHouse's
    env.filters["delta_table"] = delta_table_ref
    return env


def render(template: str, **values: Any) -> str:
    """Render ``template`` (a path under ``templates/``, e.g. ``postgres/mirror_table.sql.j2``) with ``values``."""
    try:
        return _settle_percent(environment().get_template(template).render(**values))
    except jinja2.TemplateNotFound:
        raise FileNotFoundError(f"SQL template {template!r} not found under {templates_dir()}") from None

"""Postgres column types as declared in a pipeline's ``columns:`` and their Spark / Arrow counterparts.

A source declares its business columns with Postgres types because Postgres is where they land. From that
one declaration we derive the Spark schema the decoder produces and the DDL the migrations render, so the
three can never disagree. Types without an exact Spark counterpart travel as strings (``numeric`` without
precision, ``uuid``, ``json``/``jsonb``, ``time``, ``timetz``, ``interval``, ``bit``/``bit varying``) and are cast
back by Postgres on COPY, which loses nothing; ``hstore`` travels in its Postgres text form. Arrays
(``integer[]``, ``numeric(10,2)[]``, ...) are Spark arrays of their element's type; Postgres ignores declared
dimensions, and so do we (one-dimensional values only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Canonical name -> Spark SQL type. Aliases are folded onto canonical names by ``parse_pg_type``.
_SPARK_TYPE_BY_CANONICAL: dict[str, str] = {
    "smallint": "smallint",
    "integer": "int",
    "bigint": "bigint",
    "real": "float",
    "double precision": "double",
    "numeric": "string",  # refined to decimal(p,s) when precision is given and fits Spark's 38 digits
    "boolean": "boolean",
    "text": "string",
    "character varying": "string",
    "character": "string",
    "date": "date",
    "timestamp without time zone": "timestamp_ntz",
    "timestamp with time zone": "timestamp",
    "time without time zone": "string",
    "time with time zone": "string",
    "interval": "string",
    "bit": "string",
    "bit varying": "string",
    "uuid": "string",
    "json": "string",
    "jsonb": "string",
    "bytea": "binary",
    "hstore": "string",  # its Postgres text form, "k"=>"v" (see hstore_text)
}

_ALIASES: dict[str, str] = {
    "int2": "smallint",
    "int": "integer",
    "int4": "integer",
    "int8": "bigint",
    "float4": "real",
    "float8": "double precision",
    "float": "double precision",
    "double": "double precision",
    "decimal": "numeric",
    "bool": "boolean",
    "varchar": "character varying",
    "char": "character",
    "timestamp": "timestamp without time zone",
    "timestamptz": "timestamp with time zone",
    "time": "time without time zone",
    "timetz": "time with time zone",
    "varbit": "bit varying",
}

_TYPE_RE = re.compile(
    r"^\s*(?P<name>[a-z][a-z0-9 ]*?)\s*(?:\(\s*(?P<args>[0-9 ,]+)\s*\))?\s*(?P<array>(?:\[\s*[0-9]*\s*\]\s*)*)$"
)
_ARRAY_WORD_RE = re.compile(r"^(?P<element>.*?)\s+array\s*(?:\[\s*[0-9]*\s*\])?\s*$")
_ARGS_ARITY: dict[str, tuple[int, ...]] = {
    "numeric": (1, 2),
    "character varying": (1,),
    "character": (1,),
    "bit": (1,),
    "bit varying": (1,),
    "time without time zone": (1,),
    "time with time zone": (1,),
    "timestamp without time zone": (1,),
    "timestamp with time zone": (1,),
}
TEMPORAL_WITH_PRECISION = (
    "time without time zone",
    "time with time zone",
    "timestamp without time zone",
    "timestamp with time zone",
)
"""Types whose argument is a fractional-seconds precision (0-6), written ``timestamp(3) with time zone``."""
_PRECISION_BEFORE_ZONE_RE = re.compile(
    r"^\s*(?P<base>timestamp|time)\s*\(\s*(?P<p>[0-9]+)\s*\)\s*(?P<zone>with(?:out)?\s+time\s+zone)\s*(?P<rest>.*)$"
)

SPARK_MAX_DECIMAL_PRECISION = 38


@dataclass(frozen=True)
class PgType:
    """A parsed Postgres column type."""

    name: str  # canonical, e.g. "numeric", "character varying"; "array" for arrays (see ``element``)
    args: tuple[int, ...] = ()
    element: PgType | None = None
    """The element type of an ``array`` (never itself an array: Postgres arrays of any dimension are one type)."""

    @property
    def sql(self) -> str:
        """The type as it appears in DDL (canonical spelling, so migrations do not churn)."""
        if self.element is not None:
            return f"{self.element.sql}[]"
        if self.args and self.name in TEMPORAL_WITH_PRECISION:  # Postgres' order: timestamp(3) with time zone
            base, _, zone = self.name.partition(" ")
            return f"{base}({self.args[0]}) {zone}"
        if self.args:
            return f"{self.name}({','.join(str(a) for a in self.args)})"
        return self.name

    @property
    def fraction_digits(self) -> int:
        """Fractional-second digits a time or timestamp column keeps (6 unless declared)."""
        return self.args[0] if self.args and self.name in TEMPORAL_WITH_PRECISION else 6

    @property
    def is_array(self) -> bool:
        return self.element is not None

    @property
    def spark_type(self) -> str:
        """Spark SQL type name used for this column in decoded DataFrames."""
        if self.element is not None:
            return f"array<{self.element.spark_type}>"
        if self.name == "numeric" and self.args:
            precision = self.args[0]
            scale = self.args[1] if len(self.args) > 1 else 0
            if precision <= SPARK_MAX_DECIMAL_PRECISION:
                return f"decimal({precision},{scale})"
        return _SPARK_TYPE_BY_CANONICAL[self.name]


class UnknownTypeError(ValueError):
    pass


def parse_pg_type(text: str) -> PgType:
    """Parse ``bigint``, ``numeric(12, 2)``, ``varchar(40)``, ``timestamptz`` ... into a :class:`PgType`.

    Arrays are written ``integer[]`` (any number of ``[]``/``[n]``, which Postgres ignores) or ``integer ARRAY``.
    Raises :class:`UnknownTypeError` with the list of supported names for anything else, so that the
    configuration layer can report it at the right YAML path.
    """
    lowered = text.lower()
    word = _ARRAY_WORD_RE.match(lowered)
    if word:
        lowered = word.group("element") + "[]"
    temporal = _PRECISION_BEFORE_ZONE_RE.match(lowered)
    if temporal:
        lowered = f"{temporal['base']} {temporal['zone']}({temporal['p']}){temporal['rest']}"
    match = _TYPE_RE.match(lowered)
    if not match:
        raise UnknownTypeError(f"'{text}' is not a Postgres type cdcsync understands; {supported_types_hint()}")
    name = " ".join(match.group("name").split())
    name = _ALIASES.get(name, name)
    if name not in _SPARK_TYPE_BY_CANONICAL:
        raise UnknownTypeError(f"'{text}' is not a Postgres type cdcsync understands; {supported_types_hint()}")
    args: tuple[int, ...] = ()
    if match.group("args"):
        args = tuple(int(a) for a in match.group("args").replace(" ", "").split(",") if a)
        if len(args) not in _ARGS_ARITY.get(name, ()):
            raise UnknownTypeError(f"'{text}': {name} takes no such arguments")
        if name == "numeric" and len(args) == 2 and not 0 <= args[1] <= args[0]:
            raise UnknownTypeError(f"'{text}': numeric scale must be between 0 and the precision")
        if name in TEMPORAL_WITH_PRECISION:
            if args[0] > 6:
                raise UnknownTypeError(f"'{text}': {name} precision must be between 0 and 6")
        elif any(a <= 0 for a in args[:1]):
            raise UnknownTypeError(f"'{text}': length/precision must be positive")
    if match.group("array"):
        return PgType("array", (), PgType(name, args))
    return PgType(name, args)


def hstore_text(pairs: dict[str, str | None]) -> str:
    """The Postgres text form of an ``hstore`` value (``"k"=>"v", "n"=>NULL``), keys in order, as COPY reads it."""

    def quoted(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return ", ".join(f"{quoted(key)}=>{'NULL' if value is None else quoted(value)}" for key, value in pairs.items())


def supported_types_hint() -> str:
    names = sorted(set(_SPARK_TYPE_BY_CANONICAL) | set(_ALIASES))
    return "supported: " + ", ".join(names) + ", and arrays of them (integer[])"

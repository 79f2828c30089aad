"""Which columns Debezium may send as its unavailable-value placeholder, and what the placeholder looks like there.

An update that leaves a large (TOASTed, stored out of line) value unchanged reaches Kafka without the value when
the source table's replica identity is not ``FULL``: Debezium's Postgres connector sends a placeholder of the
column's type instead (``UnchangedToastedPlaceholder`` / ``UnchangedToastedReplicationMessageColumn`` in
debezium-connector-postgres 3.x):

* scalar text-like and ``json``/``jsonb`` columns: the placeholder text; ``bytea``: its UTF-8 bytes;
* ``text[]``, ``varchar[]``, ``char[]``, ``json[]``, ``jsonb[]``: a one-element array of the placeholder text;
* ``bytea[]``: a one-element array of its bytes;
* ``integer[]``, ``bigint[]`` and ``date[]``: an array of its UTF-8 byte values (for ``date[]``: days since
  1970-01-01, as Debezium's ``io.debezium.time.Date`` carries dates);
* ``uuid[]``: a one-element array of the name-based (version 3) UUID of its bytes;
* ``hstore``: the map ``{placeholder: placeholder}``, or (``hstore.handling.mode=json``) that map as JSON text; the
  decoder turns either into the hstore text ``"placeholder"=>"placeholder"``.

Arrays of every other element type (``smallint[]``, ``numeric[]``, ``boolean[]``, ``timestamp[]`` ...) have no
placeholder: Debezium's converter cannot fit the text into the array's schema and, under its default
``event.converting.failure.handling.mode=warn``, sends NULL, which no consumer can tell from a real NULL. Those
columns are refused at validation unless the source declares that the table's replica identity is ``FULL`` (then
Debezium sends every value) or lists the column in ``untoasted_columns`` (its values never reach TOAST's ~2 kB).

This module is the one place that knows it: the sinks compare and resolve placeholders with it, the merge
templates render the comparison by its ``kind``, and validation refuses what cannot be resolved.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import date, timedelta
from typing import Any

from cdcsync.config.types import PgType, hstore_text

UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"
"""Debezium's default ``unavailable.value.placeholder``."""
UNAVAILABLE_JSON = f'"{UNAVAILABLE_PLACEHOLDER}"'
"""The placeholder in a ``json``/``jsonb`` column: the decoder turns the bare text into this JSON string, so that
it is valid JSON on its way to the merge."""
PLACEHOLDER_BYTES = UNAVAILABLE_PLACEHOLDER.encode()
PLACEHOLDER_UUID = str(uuid.UUID(bytes=hashlib.md5(PLACEHOLDER_BYTES).digest(), version=3))
"""Java's ``UUID.nameUUIDFromBytes(placeholder bytes)``: what a ``uuid[]`` placeholder holds."""
_EPOCH = date(1970, 1, 1)

_SCALAR_KIND = {
    "text": "text",
    "character varying": "text",
    "character": "text",
    "bytea": "bytea",
    "json": "json",
    "jsonb": "jsonb",
    "hstore": "hstore",
}
_ARRAY_KIND = {
    "text": "text[]",
    "character varying": "text[]",
    "character": "text[]",
    "json": "json[]",
    "jsonb": "json[]",
    "bytea": "bytea[]",
    "integer": "integer[]",
    "bigint": "integer[]",
    "date": "date[]",
    "uuid": "uuid[]",
}
"""Element type -> kind, for the arrays Debezium has a placeholder of their own type for (see the module doc)."""

Placeholder = str | bytes | tuple[Any, ...]
"""The placeholder as a decoded value of its column (an array as a tuple of its elements)."""
PLACEHOLDER_BY_KIND: dict[str, Placeholder] = {
    "text": UNAVAILABLE_PLACEHOLDER,
    "bytea": PLACEHOLDER_BYTES,
    "json": UNAVAILABLE_JSON,
    "jsonb": UNAVAILABLE_JSON,
    "text[]": (UNAVAILABLE_PLACEHOLDER,),
    "json[]": (UNAVAILABLE_JSON,),
    "bytea[]": (PLACEHOLDER_BYTES,),
    "integer[]": tuple(PLACEHOLDER_BYTES),
    "date[]": tuple(_EPOCH + timedelta(days=code) for code in PLACEHOLDER_BYTES),
    "uuid[]": (PLACEHOLDER_UUID,),
    "hstore": hstore_text({UNAVAILABLE_PLACEHOLDER: UNAVAILABLE_PLACEHOLDER}),
}

TEMPLATE_VALUES: dict[str, str] = {
    "placeholder": UNAVAILABLE_PLACEHOLDER,
    "placeholder_codes": ",".join(str(code) for code in PLACEHOLDER_BYTES),
    "placeholder_dates": ",".join(str(day) for day in PLACEHOLDER_BY_KIND["date[]"]),
    "placeholder_uuid": PLACEHOLDER_UUID,
}
"""What ``templates/postgres/runtime/unavailable.sql.j2`` compares with, by name."""


def toast_kind(pg: PgType) -> str | None:
    """How Debezium's placeholder shows in a column of this type (a key of :data:`PLACEHOLDER_BY_KIND`), or None
    when the type has none (never TOASTed, or an array without a placeholder: see :func:`lacks_placeholder`)."""
    if pg.element is not None:
        return _ARRAY_KIND.get(pg.element.name)
    return _SCALAR_KIND.get(pg.name)


def lacks_placeholder(pg: PgType) -> bool:
    """An array Postgres may TOAST whose unchanged value Debezium sends as NULL (no placeholder of its type)."""
    return pg.element is not None and pg.element.name not in _ARRAY_KIND


def toastable(columns: dict[str, PgType], exempt: set[str] | frozenset[str] = frozenset()) -> dict[str, str]:
    """Column -> kind, for the columns of ``columns`` that may carry a placeholder (``exempt``: never TOASTed)."""
    return {name: kind for name, pg in columns.items() if name not in exempt and (kind := toast_kind(pg)) is not None}

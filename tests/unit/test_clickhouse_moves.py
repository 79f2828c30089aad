"""The pieces of a ClickHouse sink's key-change links that need no server (cdcsync.sinks.clickhouse_moves)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from cdcsync.config.toast import PLACEHOLDER_BY_KIND
from cdcsync.sinks.clickhouse_moves import is_placeholder, key_from_json, key_json, known

pytestmark = pytest.mark.unit


def test_a_key_comes_back_from_its_link_as_clickhouse_binds_its_types() -> None:
    import json

    primary_key = ("tenant", "id", "amount", "day", "at", "uid")
    key_types = ("String", "Int64", "Decimal(12, 2)", "Date32", "DateTime64(6, 'UTC')", "UUID")
    at = dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.timezone.utc)
    key = ("a", 7, Decimal("1.50"), dt.date(2024, 2, 29), at, "0b6a2b52-46bc-4f34-a2d1-3c1a6f0f3c11")
    text = key_json(primary_key, key)
    assert key_from_json(json.loads(text), primary_key, key_types) == key
    assert key_json(primary_key, key) == text  # the same key, the same JSON: a replayed task's link is the same


@pytest.mark.parametrize(
    ("kind", "value"),
    [("text", "x" * 3000), ("bytea", b"\x00\x01"), ("text[]", ["a", None]), ("date[]", [dt.date(2024, 1, 1)])],
)
def test_a_delete_row_carries_a_value_only_when_it_is_neither_empty_nor_the_placeholder(
    kind: str, value: object
) -> None:
    placeholder = PLACEHOLDER_BY_KIND[kind]
    as_read = list(placeholder) if isinstance(placeholder, tuple) else placeholder  # arrays come back as lists
    assert is_placeholder(as_read, placeholder) and not known(as_read, placeholder)
    assert known(value, placeholder) and not is_placeholder(value, placeholder)
    empty = [] if isinstance(placeholder, tuple) else type(placeholder)()
    assert not known(None, placeholder) and not known(empty, placeholder)  # NULL, or ClickHouse's default

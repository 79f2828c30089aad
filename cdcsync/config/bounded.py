"""Bounded sources (a table read once, in chunks) and Streamling's ``type: hybrid`` (bounded phases, then Kafka).

A bounded source standing alone (``type: postgres``, ``type: clickhouse``) ends when it has been read. A hybrid
source reads its ``bounded_sources`` in order, each with ``source_type:`` instead of ``type:``, then streams its
``unbounded_source`` (``source_type: kafka``): validation turns that part into an ordinary
:class:`~cdcsync.config.pipeline.KafkaSource` under the hybrid's id, so everything that streams a Kafka source
streams it unchanged, and records the phases in a :class:`BoundedPlan` (``Pipeline.bounded``), which the runtime
reads before the Kafka query starts (:mod:`cdcsync.runtime.bounded`).

Rows of a bounded phase rank below every streamed change of the same key: see :func:`phase_version`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator

from cdcsync.config.base import StrictModel as _Model
from cdcsync.config.base import as_key_list as _as_key_list
from cdcsync.config.types import PgType, parse_pg_type

_UNSUPPORTED_BOUNDED_TYPES = ("array", "bit", "bit varying", "hstore")
"""Types a ClickHouse or Delta bounded read cannot carry yet (their text forms do not cast in Spark to what the
decoder gives); a Postgres read carries them (:mod:`cdcsync.sources.bounded`)."""


def phase_version(phase: int) -> int:
    """``_cdc_version`` of every row of bounded phase ``phase`` (1-based, in ``bounded_sources`` order).

    The pair (0, phase) in the version encoding of docs/exactly-once.md: commit part 0, so below every streamed
    Debezium change (commit part 1 or more, at least 2^64) and, in practice, below Debezium's own snapshot reads
    (0, S), whose S is a WAL position far above any phase count. A later phase outranks an earlier one. The rows
    carry ``_cdc_op = 'c'``, not ``'r'``: they are not positions of the source's WAL, so the check that a
    snapshot lies above what a sink has merged (the source went back) does not apply to them.
    """
    return phase


class PostgresTableSource(_Model):
    """A Postgres table read once, in chunks of key ranges, each through ``COPY``.

    Alone (``type: postgres``) it needs ``columns`` and ``primary_key``; inside a hybrid (``source_type:
    postgres``) both default to the hybrid's."""

    type: Literal["postgres"]
    dsn: SecretStr | None = None
    """The source database; defaults to ``CDCSYNC__POSTGRES__DSN``."""
    schema_: str = Field(default="public", alias="schema", min_length=1)
    table: str = Field(min_length=1)
    primary_key: list[str] | None = None
    columns: dict[str, str] = Field(default_factory=dict)
    """Name -> Postgres type, as for a Kafka source; the table may have more columns (they are not read)."""
    chunk_size: int = Field(default=100_000, gt=0)
    """Rows per chunk: one micro-batch, checkpointed when it has landed."""
    parallelism: int = Field(default=4, gt=0, le=256)
    """Key ranges per chunk, each read by a Spark task of its own with ``COPY``."""

    _normalise_pk = field_validator("primary_key", mode="before")(_as_key_list)

    @property
    def label(self) -> str:
        return f"postgres table {self.schema_}.{self.table}"


class ClickHouseTableSource(_Model):
    """Streamling's ClickHouse source: a table read once, in pages of ``page_size`` rows in key order.

    Alone (``type: clickhouse``) it needs ``columns`` and ``primary_key``; inside a hybrid (``source_type:
    clickhouse``) both default to the hybrid's. Pages are key ranges, planned like a Postgres source's chunks."""

    type: Literal["clickhouse"]
    url: SecretStr | None = None
    """The ClickHouse HTTP endpoint (``http://user:password@host:8123``); defaults to ``CDCSYNC__CLICKHOUSE__URL``."""
    database: str = Field(default="default", min_length=1)
    table: str = Field(validation_alias=AliasChoices("table_name", "table"), min_length=1)
    """Streamling's ``table_name``; ``table`` is accepted too."""
    primary_key: list[str] | None = None
    columns: dict[str, str] = Field(default_factory=dict)
    page_size: int = Field(default=100_000, gt=0)
    """Rows per page: one micro-batch, checkpointed when it has landed."""
    parallelism: int = Field(default=1, gt=0, le=256)
    """Key ranges per page, each read by a Spark task of its own."""
    final: bool = False
    """Read with ``FINAL`` (a ``ReplacingMergeTree`` table's current rows only, merged at read time)."""

    _normalise_pk = field_validator("primary_key", mode="before")(_as_key_list)

    @property
    def label(self) -> str:
        return f"clickhouse table {self.database}.{self.table}"

    @property
    def chunk_size(self) -> int:
        return self.page_size


class DeltaTableSource(_Model):
    """A Delta table read once through the run's Spark session: a snapshot (at ``version`` or ``timestamp``, else
    the newest version when the backfill is planned), or with ``change_data_feed`` its changes since
    ``starting_version``, newest per key. Chunks are key ranges, like a Postgres source's; each is a filtered scan
    of the snapshot, which Delta's file statistics narrow when the files are clustered by the key."""

    type: Literal["delta"]
    path: str | None = Field(default=None, min_length=1)
    table: str | None = Field(default=None, min_length=1)
    """A catalog table instead of a path."""
    version: int | None = Field(default=None, ge=0)
    timestamp: str | None = Field(default=None, min_length=1)
    change_data_feed: bool = False
    """Read the table's change feed from ``starting_version`` (the table needs ``delta.enableChangeDataFeed``)."""
    starting_version: int | None = Field(default=None, ge=0)
    primary_key: list[str] | None = None
    columns: dict[str, str] = Field(default_factory=dict)
    chunk_size: int = Field(default=100_000, gt=0)

    _normalise_pk = field_validator("primary_key", mode="before")(_as_key_list)

    @model_validator(mode="after")
    def _one_reading(self) -> DeltaTableSource:
        if (self.path is None) == (self.table is None):
            raise ValueError("path: give either path (a directory or URI) or table (a catalog table)")
        if self.version is not None and self.timestamp is not None:
            raise ValueError("timestamp: give either version or timestamp, not both")
        if self.change_data_feed and self.starting_version is None:
            raise ValueError("starting_version: required with change_data_feed: true")
        if self.starting_version is not None and not self.change_data_feed:
            raise ValueError("starting_version: only with change_data_feed: true")
        return self

    @property
    def parallelism(self) -> int:
        """One range per chunk: Spark splits each scan over the table's files itself."""
        return 1

    @property
    def label(self) -> str:
        return f"delta table {self.table if self.table is not None else self.path}"


BoundedModel = PostgresTableSource | ClickHouseTableSource | DeltaTableSource
BOUNDED_TYPES: dict[str, type[BoundedModel]] = {
    "postgres": PostgresTableSource,
    "clickhouse": ClickHouseTableSource,
    "delta": DeltaTableSource,
}

_TIMESTAMP_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}")


class KafkaPhase(_Model):
    """``unbounded_source`` of a hybrid: ``source_type: kafka``, ``start_at``, and any key of a Kafka source."""

    source_type: Literal["kafka"]
    start_at: str = "earliest"
    """``earliest``, ``latest``, or a time (ISO 8601, or milliseconds since the epoch): Spark's
    ``startingTimestamp``, the first offset of each partition at or after it."""
    rest: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _gather(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        known = {"source_type", "start_at"}
        return {
            **{k: v for k, v in raw.items() if k in known},
            "rest": {k: v for k, v in raw.items() if k not in known},
        }

    @field_validator("start_at", mode="before")
    @classmethod
    def _start_at(cls, value: Any) -> str:
        text = str(value).strip()
        if text in ("earliest", "latest") or text.isdigit():
            return text
        if _TIMESTAMP_RE.match(text):
            try:
                datetime.fromisoformat(text.replace("Z", "+00:00"))
                return text
            except ValueError:
                pass
        raise ValueError(f"'{text}' is not earliest, latest, an ISO 8601 time or milliseconds since the epoch")

    def kafka_fields(self) -> dict[str, Any]:
        """The keys of the :class:`~cdcsync.config.pipeline.KafkaSource` this phase streams."""
        fields: dict[str, Any] = {"type": "kafka", **self.rest}
        if self.start_at in ("earliest", "latest"):
            fields["starting_offsets"] = self.start_at
            return fields
        millis = self.start_at if self.start_at.isdigit() else _epoch_ms(self.start_at)
        fields["options"] = {**dict(fields.get("options") or {}), "startingTimestamp": millis}
        return fields


def _epoch_ms(text: str) -> str:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"start_at: '{text}' needs a time zone (e.g. Z or +00:00)")
    return str(int(moment.timestamp() * 1000))


class HybridSource(_Model):
    """Streamling's hybrid source: ``bounded_sources`` in order, then ``unbounded_source``."""

    type: Literal["hybrid"]
    bounded_sources: list[Annotated[BoundedModel, Field(discriminator="type")]] = Field(min_length=1)
    unbounded_source: KafkaPhase
    primary_key: list[str] | None = None
    columns: dict[str, str] = Field(default_factory=dict)
    """As for a Kafka source: optional once ``cdcsync init`` has read the topic's schema."""

    _normalise_pk = field_validator("primary_key", mode="before")(_as_key_list)

    @field_validator("bounded_sources", mode="before")
    @classmethod
    def _source_type(cls, phases: Any) -> Any:
        """Each phase names its kind with ``source_type`` (Streamling's key), read here as the model's ``type``."""
        if not isinstance(phases, list):
            return phases
        out = []
        for phase in phases:
            if isinstance(phase, dict) and "source_type" in phase:
                phase = {"type": phase["source_type"], **{k: v for k, v in phase.items() if k != "source_type"}}
                if phase["type"] not in BOUNDED_TYPES:
                    raise ValueError(
                        f"source_type: '{phase['type']}' is not one of {', '.join(BOUNDED_TYPES)} (bounded sources)"
                    )
            elif isinstance(phase, dict):
                raise ValueError("source_type: required key is missing in each bounded source")
            out.append(phase)
        return out

    def kafka_fields(self) -> dict[str, Any]:
        fields = self.unbounded_source.kafka_fields()
        if self.primary_key is not None:
            fields.setdefault("primary_key", self.primary_key)
        if self.columns:
            fields["columns"] = {**self.columns, **dict(fields.get("columns") or {})}
        return fields


@dataclass(frozen=True)
class BoundedPlan:
    """What the runtime reads of one source before (or instead of) streaming it."""

    source_id: str
    phases: tuple[BoundedModel, ...]
    columns: tuple[tuple[str, PgType], ...]
    primary_key: tuple[str, ...]
    streams: bool
    """True for a hybrid (its Kafka phase follows), False for a bounded source alone."""


def check_phase_columns(where: str, phase: BoundedModel, columns: dict[str, PgType], problems: list[str]) -> None:
    """A bounded read carries every column its source declares, of types it can carry."""
    if isinstance(phase, PostgresTableSource):
        return  # every type: scalars in their text forms, arrays as JSON lists of them
    for name, pg in columns.items():
        kind = pg.name
        if kind in _UNSUPPORTED_BOUNDED_TYPES:
            problems.append(
                f"{where}: column '{name}' ({kind}) cannot be read by a bounded {phase.type} source yet; "
                "leave it to the Kafka phase or drop it from columns"
            )


def plan_of(
    source_id: str, phases: tuple[BoundedModel, ...], columns: dict[str, str], key: list[str] | None, streams: bool
) -> BoundedPlan:
    """The plan of a source whose columns parse and whose key is known (checked by the caller)."""
    typed = tuple((name, parse_pg_type(text)) for name, text in columns.items())
    return BoundedPlan(source_id, phases, typed, tuple(key or ()), streams)

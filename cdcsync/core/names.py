"""Names of the Postgres objects cdcsync creates and the columns it adds, shared by migrations and sinks.

Tables cdcsync owns live in the :data:`INTERNAL_SCHEMA`; the functions here return bare (unquoted) table
names within it. Quote them with :func:`cdcsync.sql.render.quote_qualified` or the templates' ``qualified``
filter: ``{{ internal_schema | qualified(stage_table) }}``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

INTERNAL_SCHEMA = "cdcsync"
SCHEMA_MIGRATIONS_TABLE = "schema_migrations"
BATCH_LEDGER_TABLE = "batch_ledger"
DEAD_LETTERS_TABLE = "dead_letters"
TRUNCATIONS_TABLE = "truncations"
SOURCE_POSITIONS_TABLE = "source_positions"
KEY_MOVES_TABLE = "key_moves"
DYNAMIC_TABLE_CHANGES_TABLE = "dynamic_table_changes"
INTERNAL_TABLES = (
    SCHEMA_MIGRATIONS_TABLE,
    BATCH_LEDGER_TABLE,
    DEAD_LETTERS_TABLE,
    TRUNCATIONS_TABLE,
    SOURCE_POSITIONS_TABLE,
    KEY_MOVES_TABLE,
    DYNAMIC_TABLE_CHANGES_TABLE,
)
DYNAMIC_TABLE_BOOKKEEPING: tuple[tuple[str, str], ...] = (
    ("_cdc_pipeline", "text"),
    ("_cdc_checkpoint", "text"),
    ("_cdc_batch_id", "bigint"),
)
"""Columns of a dynamic table that the pipeline fills for the rows it writes (NULL in rows anyone else writes)."""

# Columns of the mirror table beside the business columns.
VERSION_COLUMN = "_cdc_version"
VERSION_TYPE = "numeric(38,0)"
"""Postgres type of every version column (mirrors, staging, tombstones, truncate watermarks): a commit position
(commit LSN, LSN) packed into 128 bits (:mod:`cdcsync.sources.debezium.envelope`). ``bigint`` before; ``cdcsync
init`` writes the upgrade."""
CLICKHOUSE_VERSION_TYPE = "UInt128"
"""ClickHouse type of ``_version`` (``UInt64`` before)."""
TS_COLUMN = "_cdc_ts"
DELETED_COLUMN = "_cdc_deleted"  # soft delete mode only
# Columns of the staging table beside the business columns.
BATCH_ID_COLUMN = "_batch_id"
OP_COLUMN = "_cdc_op"
KEY_MOVE_OP = "n"
"""``_cdc_op`` of a key-move row: the new key of a primary-key change, read from the Kafka header
``__debezium.newkey`` of the delete of its old key, with that delete's version and every other column null
(:mod:`cdcsync.sources.debezium.plan`). Not a change: sinks use it to pair the delete with the create of the new
key (:mod:`cdcsync.sinks.key_moves`); transforms pass it on like a truncate; nothing lands it."""


def stage_table(pipeline: str, sink_id: str) -> str:
    """The UNLOGGED staging table a sink COPYs a micro-batch into, in :data:`INTERNAL_SCHEMA`."""
    return f"{pipeline}__{sink_id}__stage"


def tombstone_table(pipeline: str, sink_id: str) -> str:
    """The table remembering hard-deleted keys (delete_mode hard only), in :data:`INTERNAL_SCHEMA`."""
    return f"{pipeline}__{sink_id}__tombstones"


def mirror_columns(business_columns: Sequence[str], delete_mode: str) -> list[str]:
    """Column order of a mirror table."""
    extra = [DELETED_COLUMN] if delete_mode == "soft" else []
    return [*business_columns, VERSION_COLUMN, TS_COLUMN, *extra]


def stage_columns(business_columns: Sequence[str]) -> list[str]:
    """Column order of a staging table (the order COPY should use)."""
    return [BATCH_ID_COLUMN, *business_columns, OP_COLUMN, VERSION_COLUMN, TS_COLUMN]


def tombstone_columns(primary_key: Sequence[str]) -> list[str]:
    """Column order of a tombstone table."""
    return [*primary_key, VERSION_COLUMN]


def aggregate_function(pipeline: str, sink_id: str, event: str) -> str:
    """The plpgsql function behind a ``postgres_aggregate`` sink's statement trigger for ``event``."""
    return f"{pipeline}__{sink_id}__agg_{event}"


def bounded(*parts: str) -> str:
    """``parts`` joined by ``__``, shortened with a stable hash suffix when longer than Postgres' 63 bytes.

    For names of indexes cdcsync creates in a user's schema: readable when they fit, unique when they do not.
    """
    name = "__".join(parts)
    if len(name.encode()) <= 63:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    head = name.encode()[:54].decode(errors="ignore")
    return f"{head}_{digest}"


OWNER_ROLE = "cdcsync_owner"
"""The role that owns every object cdcsync's migrations create; the migrations run as it (``SET LOCAL ROLE``)."""
WRITER_ROLE = "cdcsync_writer"
"""The role ``cdcsync run`` needs: reads and writes rows of the targets and cdcsync's tables, no DDL. Both roles are
NOLOGIN group roles: a DBA grants them to login roles (docs/operations.md#roles)."""

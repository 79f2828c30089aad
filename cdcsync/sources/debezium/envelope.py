"""The Debezium envelope around a row: ``op``, the ``after`` / ``before`` row, the ``source`` block, and the
columns every decoded change carries beside its business columns.

The row decoder is generated per spec (:func:`cdcsync.sources.debezium.plan.compile_payload_decoder`); the parts
of its source that read the envelope rather than the row's columns are here: :data:`PAYLOAD_HEAD` picks the row
by ``op``, :data:`PAYLOAD_TAIL` reads the version and commit time from the ``source`` block, and
:func:`envelope_namespace` holds the names both use.

``_cdc_version``: the commit order of the source
-----------------------------------------------
A change's own LSN is not commit order: two transactions interleave in the WAL, and the one that commits later
can hold the lower LSN (with a DEFERRABLE primary key, a delete in one transaction and the re-insert of the same
key in a transaction that began earlier and commits later). So the version is a position in commit order, read
from what Debezium's Postgres connector (3.x: ``SourceInfo``, ``PostgresOffsetContext``,
``PostgresStreamingChangeEventSource``, ``PostgresSnapshotChangeEventSource``) puts in the ``source`` block:

* ``source.sequence`` is a JSON array of two decimal strings, ``[last commit LSN, LSN]``, either of which may be
  null. While streaming, the connector handles transactions whole and in commit order; each COMMIT moves "last
  commit LSN" to that commit's end, so every change of a transaction carries the commit position of the
  transaction *before* it, and "LSN" is the change's own WAL position. (last commit, LSN) therefore grows
  strictly from one transaction to the next and within a transaction. Debezium replays after a crash carry the
  same pair again (the last commit LSN is restored from the offset's ``lsn_commit``), so replays stay idempotent.
  The last commit LSN is null only before the first COMMIT a connector sees when its offset holds none, i.e. for
  the first transaction streamed after a snapshot taken with fresh offsets.
* ``source.lsn`` repeats the LSN; ``source.txId`` is the transaction id, which says nothing about commit order.
* An initial snapshot (also a re-snapshot: ``snapshot.mode`` ``always`` / ``when_needed``, or fresh offsets)
  stamps every read with ``[null, S]``: S is where streaming will start (the new slot's consistent point, else
  the current WAL position), and Debezium knows no commit position. The transaction streamed first after it can
  have begun before S, so its changes can carry LSNs below S. Only the ``recovery`` snapshotter, which keeps the
  old offset, stamps reads with the offset's last commit LSN.
* A blocking snapshot (``execute-snapshot`` with ``type: blocking``) keeps the streaming offset: its reads carry
  the position streaming paused at, ``[last commit L, LSN]``, and streaming resumes with last commit L.
* An incremental (ad-hoc) snapshot through the signal table emits each chunk when its close-window signal row
  streams by, with that row's position; ``source.snapshot`` is ``incremental``. Changes of the chunk's keys
  inside the window are dropped from the chunk by Debezium, so each read is the row's state at exactly that
  position: it ranks like a streamed change.

From that, :func:`change_position` makes ``(commit, lsn)`` and packs it into ``commit * 2**64 + lsn`` (Spark
``decimal(38,0)``, Postgres ``numeric(38,0)``, ClickHouse ``UInt128``), exact and ordered as numbers:

* streamed changes and incremental reads: ``(last commit, LSN)``; with no last commit, ``(LSN, LSN)``, which still
  sits above every earlier transaction and below the next one (whose last commit is this one's commit end);
* snapshot reads with a last commit L: ``(L, 0)``, below every change of the transactions after L and above
  every older change, so a blocking snapshot repairs a stale row and re-creates a wrongly deleted one;
* snapshot reads without one: ``(0, S)``, below every streamed change (the snapshot/stream race above), and a
  later such snapshot above an earlier one. It cannot outrank what an older streamed change left (nothing in
  the message says which transactions it has seen): an incremental snapshot is the repair for that.

Messages without an integer LSN (not Debezium's Postgres connector) fall back to the Kafka offset:
``(1, offset)`` for changes and ``(0, offset)`` for snapshot reads (:func:`offset_version`).

``_cdc_ts`` is ``source.ts_ms``, else the payload's ``ts_ms``, else the Kafka message timestamp.
"""

from __future__ import annotations

from typing import Any

from cdcsync.sources.debezium.values import MAX_US, MIN_US, describe_json, show

CDC_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_cdc_op", "string"),
    ("_cdc_version", "decimal(38,0)"),
    ("_cdc_ts", "timestamp"),
    ("_cdc_topic", "string"),
    ("_cdc_partition", "int"),
    ("_cdc_offset", "bigint"),
)
"""Metadata columns, in output order, with their Spark types."""
NEW_KEY_HEADER = "__debezium.newkey"
"""The Kafka header Debezium's Postgres connector puts on the delete of an old primary key: the new key, serialized
by the key converter (like the message key)."""
NEW_KEY_COLUMN = "new_key"
"""The decoder's input column holding :data:`NEW_KEY_HEADER`'s value (null without it)."""
DLQ_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_dlq_reason", "string"),
    ("_dlq_report", "string"),
    ("_dlq_key", "binary"),
    ("_dlq_value", "binary"),
)
"""Columns of a message that did not decode, null on good rows: the reason for people (and the dead-letter
table), the :class:`~cdcsync.core.reports.Report` (encoded) for the task, and the raw bytes."""

POSITION_BITS = 64
"""Bits of the LSN part of a version: ``_cdc_version = commit * 2**POSITION_BITS + lsn``."""
MAX_LSN = 2**POSITION_BITS - 1
MAX_COMMIT = 2**62 - 1
"""The largest commit part that keeps a version within ``numeric(38,0)`` (10**38 > 2**126 + 2**64)."""

MIN_TS_MS = MIN_US // 1000
MAX_TS_MS = MAX_US // 1000


def bad_op(op: Any) -> str:
    if op is None:
        return "no 'op' field: not a Debezium change event"
    return f"unsupported op {show(op)}; expected one of c, u, d, r, t"


def bad_row(op: str, struct: str, row: Any) -> str:
    if row is None:
        return f"op '{op}' has no 'after' row"
    return f"'{struct}' is {describe_json(row)}, not an object"


PAYLOAD_HEAD = """
def decode_payload(payload, schema, raw, key_raw):
    op = payload.get('op')
    if op == 'c' or op == 'u' or op == 'r':
        struct = 'after'
    elif op == 'd':
        struct = 'before'
    elif op == 't':
        return decode_truncate(payload)
    else:
        return bad_op(op)
    row = payload.get(struct)
    if type(row) is not dict:
        if row is not None or struct == 'after':
            return bad_row(op, struct, row)
        row = EMPTY
    ctx = (schema, struct, raw)
"""
"""Start of the generated ``decode_payload``: the row of the change (``row``), by ``op``; a truncate (op ``t``)
goes to ``decode_truncate``, which has no row."""

PAYLOAD_TAIL = """
    version = ts = None
    source = payload.get("source")
    if type(source) is dict:
        version = change_position(source, op)
        if type(version) is str:
            return version
        ts_ms = source.get("ts_ms")
        if type(ts_ms) is int and MIN_TS_MS <= ts_ms <= MAX_TS_MS:
            ts = ts_ms * 1000
    if ts is None:
        ts_ms = payload.get("ts_ms")
        if type(ts_ms) is int and MIN_TS_MS <= ts_ms <= MAX_TS_MS:
            ts = ts_ms * 1000
    values.append(op)
    values.append(version)
    values.append(ts)
    return values
"""
"""End of the generated ``decode_payload`` and ``decode_truncate``: ``_cdc_op``, ``_cdc_version`` and
``_cdc_ts`` appended to ``values`` (None where the message lacks them: the batch fills in :func:`offset_version`
and the Kafka timestamp); a dead-letter reason when the position does not fit a version."""


def change_position(source: dict[str, Any], op: str) -> int | str | None:
    """The version of a change from its ``source`` block (see the module docstring), None when the block has no
    integer LSN (the caller falls back to :func:`offset_version`), or a dead-letter reason."""
    commit = lsn = None
    sequence = source.get("sequence")
    if type(sequence) is str:
        # Debezium writes '["<commit>","<lsn>"]'; the commit may be null: '[null,"<lsn>"]'.
        middle = sequence.find('","')
        if middle > 2 and sequence[:2] == '["' and sequence[-2:] == '"]':
            text, lsn_text = sequence[2:middle], sequence[middle + 3 : -2]
            if text.isdigit() and lsn_text.isdigit():
                commit, lsn = int(text), int(lsn_text)
        elif sequence[:7] == '[null,"' and sequence[-2:] == '"]' and sequence[7:-2].isdigit():
            lsn = int(sequence[7:-2])
    if lsn is None:
        lsn = source.get("lsn")
        if type(lsn) is not int:
            return None
    if not 0 < lsn <= MAX_LSN or (commit is not None and not 0 < commit <= MAX_COMMIT):
        return (
            f"source position {sequence if sequence is not None else lsn} does not fit _cdc_version: LSNs must lie "
            f"in 1..{MAX_COMMIT} (commit) and 1..{MAX_LSN}"
        )
    if op == "r" and source.get("snapshot") != "incremental":
        return commit << POSITION_BITS if commit is not None else lsn
    return ((lsn if commit is None else commit) << POSITION_BITS) + lsn


def offset_version(offset: int, op: str) -> int:
    """The version of a message without a source position: its Kafka offset, snapshot reads below changes."""
    return offset if op == "r" else (1 << POSITION_BITS) + offset


def envelope_namespace() -> dict[str, Any]:
    """The names :data:`PAYLOAD_HEAD` and :data:`PAYLOAD_TAIL` use."""
    return {
        "EMPTY": {},
        "bad_op": bad_op,
        "bad_row": bad_row,
        "change_position": change_position,
        "MIN_TS_MS": MIN_TS_MS,
        "MAX_TS_MS": MAX_TS_MS,
    }

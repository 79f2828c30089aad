"""The Debezium envelope around a row: ``op``, the ``after`` / ``before`` row, the ``source`` block, and the
columns every decoded change carries beside its business columns.

The row decoder is generated per spec (:func:`cdcsync.sources.debezium.plan.compile_payload_decoder`); the parts
of its source that read the envelope rather than the row's columns are here: :data:`PAYLOAD_HEAD` picks the row
by ``op``, :data:`PAYLOAD_TAIL` reads the version and commit time from the ``source`` block, and
:func:`envelope_namespace` holds the names both use.

* ``_cdc_version`` is ``source.lsn`` when the connector gives an integer LSN, else the Kafka offset, minus
  :data:`SNAPSHOT_SHIFT` for snapshot reads so that they never outrank a streamed change.
* ``_cdc_ts`` is ``source.ts_ms``, else the payload's ``ts_ms``, else the Kafka message timestamp.
"""

from __future__ import annotations

from typing import Any

from cdcsync.sources.debezium.values import MAX_US, MIN_US, describe_json, show

CDC_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_cdc_op", "string"),
    ("_cdc_version", "bigint"),
    ("_cdc_ts", "timestamp"),
    ("_cdc_topic", "string"),
    ("_cdc_partition", "int"),
    ("_cdc_offset", "bigint"),
)
"""Metadata columns, in output order, with their Spark types."""
DLQ_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_dlq_reason", "string"),
    ("_dlq_report", "string"),
    ("_dlq_key", "binary"),
    ("_dlq_value", "binary"),
)
"""Columns of a message that did not decode, null on good rows: the reason for people (and the dead-letter
table), the :class:`~cdcsync.core.reports.Report` (encoded) for the task, and the raw bytes."""

SNAPSHOT_SHIFT = 1 << 62
"""Subtracted from the version of snapshot reads (op ``r``), so that any streamed change outranks them.

Debezium stamps every snapshot row with the LSN at which the snapshot started, and a change streamed right
after it can carry that very LSN (a tie), or even a lower one (a transaction that began before the snapshot and
committed after it). Either way the streamed change is the newer state. Among snapshot reads, a later snapshot
still outranks an earlier one.
"""

MAX_BIGINT = 2**63 - 1
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
        lsn = source.get("lsn")
        if type(lsn) is int and 0 <= lsn <= MAX_BIGINT:
            version = lsn
        ts_ms = source.get("ts_ms")
        if type(ts_ms) is int and MIN_TS_MS <= ts_ms <= MAX_TS_MS:
            ts = ts_ms * 1000
    if ts is None:
        ts_ms = payload.get("ts_ms")
        if type(ts_ms) is int and MIN_TS_MS <= ts_ms <= MAX_TS_MS:
            ts = ts_ms * 1000
    if op == 'r' and version is not None:
        version -= SNAPSHOT_SHIFT
    values.append(op)
    values.append(version)
    values.append(ts)
    return values
"""
"""End of the generated ``decode_payload`` and ``decode_truncate``: ``_cdc_op``, ``_cdc_version`` and
``_cdc_ts`` appended to ``values`` (None where the message lacks them: the batch fills in the Kafka offset and
timestamp)."""


def envelope_namespace() -> dict[str, Any]:
    """The names :data:`PAYLOAD_HEAD` and :data:`PAYLOAD_TAIL` use."""
    return {
        "EMPTY": {},
        "bad_op": bad_op,
        "bad_row": bad_row,
        "MAX_BIGINT": MAX_BIGINT,
        "SNAPSHOT_SHIFT": SNAPSHOT_SHIFT,
        "MIN_TS_MS": MIN_TS_MS,
        "MAX_TS_MS": MAX_TS_MS,
    }

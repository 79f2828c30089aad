"""Typed reports from executor tasks to the driver.

A Spark task tells the driver about what it cannot settle itself: a message that does not decode (under
``on_decode_error: fail``), a schema change, a topic no table is known for, a write that failed (maybe
transiently). Each is a :class:`Report`, a kind and a few JSON-able fields, and this module alone builds the
fields of each kind, encodes them and turns a report into the driver's :class:`~cdcsync.core.errors.CdcsyncError`:
a new kind touches this module only, and rewording a message breaks nothing.

Reports travel in one of two ways, both encoded by :meth:`Report.encode` only:

* as data, wherever rows flow back anyway: the decoder's ``_dlq_report`` column, the row a staging task returns
  instead of its counts. A task that reports as data ends normally, so Spark kills no Python worker mid-task.
* inside exception text, where a task must fail (a failed write): :class:`ReportedFailure` appends the report as a
  token to its message. Spark hands the driver executor exceptions as text (the Python traceback inside a JVM
  exception), and :func:`find_report` takes the token back out. An accumulator could not do this: Spark drops the
  accumulator updates of failed tasks.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from cdcsync.core.errors import (
    BrokerUnavailable,
    CdcsyncError,
    NewTopicError,
    SchemaChangeError,
    ServiceError,
    SinkError,
    SourceWentBack,
    TargetRefused,
    UndecodableMessage,
)


class Kind(str, Enum):
    """What a report is about. The order of the members is the order the driver raises them in when several
    tasks report at once: what the user must resolve (a new topic, a schema change) before a bad message."""

    NEW_TOPIC = "new_topic"
    """fields: source, topic, partition, offset (the first message of a topic no table is known for)."""
    SCHEMA_CHANGE = "schema_change"
    """fields: fields ([name, type or None, why or None] of every column of the new schema), added (names),
    changed ([name, recorded type, new type]); once located, source, topic, partition, offset."""
    SOURCE_WENT_BACK = "source_went_back"
    """fields: message, hint. Snapshot reads below the positions a sink merged: the source database went back
    (restored, replaced); the task wrote nothing (:mod:`cdcsync.sinks.positions`)."""
    UNDECODABLE = "undecodable"
    """fields: reason; once located, topic, partition, offset."""
    WRITE_FAILED = "write_failed"
    """fields: message (what was being written, and the error), retriable (whether a retry may help)."""
    REFUSED = "refused"
    """fields: message. A target refused a write as wrong (an HTTP 4xx): not retried, the run stops (exit 2)."""
    SERVICE_UNAVAILABLE = "service_unavailable"
    """fields: message. A service the decoder needs (the schema registry) was down, refused the credentials or
    answered 5xx past its retry budget: an infrastructure fault, never a dead letter; the batch is replayed."""
    BROKER_UNAVAILABLE = "broker_unavailable"
    """fields: detail. The executors' own Kafka read (:mod:`cdcsync.sources.kafka_fetch`) got nothing from the
    broker in time: retried as the broker's outage, like a failure of Spark's reader."""
    OFFSETS_LOST = "offsets_lost"
    """fields: message. Offsets a batch reads are no longer in Kafka (retention deleted them before they were
    read): the run stops, as Spark's reader does under its default ``failOnDataLoss``."""


_MESSAGE_KINDS = (Kind.WRITE_FAILED, Kind.SERVICE_UNAVAILABLE, Kind.REFUSED, Kind.SOURCE_WENT_BACK, Kind.OFFSETS_LOST)
"""Kinds whose description is their ``message`` field."""
_TOKEN_PREFIX = "[cdcsync-report:"
_TOKEN_RE = re.compile(re.escape(_TOKEN_PREFIX) + r"([A-Za-z0-9_=-]+)\]")
_ORDER = {kind: rank for rank, kind in enumerate(Kind)}


class UnknownReport(ValueError):
    """Text that is not a report this version of cdcsync knows (malformed, or of a kind it lacks)."""


@dataclass(frozen=True)
class Report:
    kind: Kind
    fields: Mapping[str, Any] = field(default_factory=dict)

    def located(self, **where: Any) -> Report:
        """The report with where it happened (source, topic, partition, offset) added to its fields."""
        return Report(self.kind, {**self.fields, **where})

    def encode(self) -> str:
        """The one encoding of a report, for string columns and (base64) inside exception text."""
        return json.dumps({"kind": self.kind.value, "fields": dict(self.fields)}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Report:
        """The report :meth:`encode` wrote; raises :class:`UnknownReport` for anything else."""
        try:
            document = json.loads(text)
            kind = Kind(document["kind"])
            fields = document["fields"]
        except (ValueError, KeyError, TypeError):
            raise UnknownReport(f"not a cdcsync report: {text[:200]!r}") from None
        if not isinstance(fields, dict):
            raise UnknownReport(f"not a cdcsync report: {text[:200]!r}")
        return cls(kind, fields)

    def describe(self) -> str:
        """One line for people (logs, dead-letter reasons, the text Spark shows around a failed task)."""
        f = self.fields
        if self.kind is Kind.UNDECODABLE:
            if "topic" in f:
                return f"message at {f['topic']}/{f['partition']}@{f['offset']} could not be decoded: {f['reason']}"
            return str(f["reason"])
        if self.kind in _MESSAGE_KINDS:
            return str(f["message"])
        if self.kind is Kind.SCHEMA_CHANGE and "topic" not in f:
            changes = [f"new field {name!r}" for name in f["added"]]
            changes += [f"field {name!r} changed type from {old} to {new}" for name, old, new in f["changed"]]
            return f"the message's schema changed: {'; '.join(changes)}"
        return self.error().message

    def error(self, doing: str = "", pipeline_file: str = "PIPELINE.yaml") -> CdcsyncError:
        """The driver's error for this report; ``doing`` is what the driver was running (a write failure's
        context), ``pipeline_file`` the file the hints name."""
        f = self.fields
        if self.kind is Kind.NEW_TOPIC:
            return NewTopicError(
                source_id=f["source"],
                topic=f["topic"],
                partition=f["partition"],
                offset=f["offset"],
                pipeline_file=pipeline_file,
            )
        if self.kind is Kind.SCHEMA_CHANGE:
            return SchemaChangeError(
                source_id=f.get("source", "?"),
                topic=f.get("topic", "?"),
                partition=f.get("partition", -1),
                offset=f.get("offset", -1),
                fields=[(name, sql, why) for name, sql, why in f["fields"]],
                added=list(f["added"]),
                changed=[(name, old, new) for name, old, new in f["changed"]],
                pipeline_file=pipeline_file,
            )
        if self.kind is Kind.UNDECODABLE:
            return UndecodableMessage(
                self.describe(),
                hint=(
                    "nothing after it was merged. Either fix the pipeline (a column type, a decoding mode) or the "
                    "producer and run again, or set `on_decode_error: dlq` on the source to record such messages "
                    "in cdcsync.dead_letters and go on, then apply them with `cdcsync dead-letters replay "
                    f"{pipeline_file}` once the configuration is fixed"
                ),
            )
        if self.kind is Kind.SOURCE_WENT_BACK:
            return SourceWentBack(str(f["message"]), hint=str(f["hint"]))  # names the sink and the batch's reads
        if self.kind is Kind.BROKER_UNAVAILABLE:
            return BrokerUnavailable(str(f["detail"]))  # the batch's attempt names the brokers
        if self.kind is Kind.OFFSETS_LOST:
            return ServiceError(
                f"Kafka no longer has offsets this batch reads: {f['message']}",
                hint=(
                    "retention deleted them before cdcsync read them, so those changes cannot be mirrored from Kafka. "
                    "Nothing of the batch was merged. Re-snapshot the table (a Debezium incremental snapshot), or "
                    "start the source again from the offsets Kafka still has (docs/operations.md#rewind)"
                ),
                retriable=False,
            )
        message = f"{doing}: {f['message']}" if doing else str(f["message"])
        if self.kind is Kind.REFUSED:
            return TargetRefused(
                message, hint="nothing of the batch was recorded: fix the sink or the receiver, then run again"
            )
        if self.kind is Kind.SERVICE_UNAVAILABLE:
            return ServiceError(
                message,
                hint="nothing was dead-lettered or merged: the batch is read again when the run is started again",
                retriable=True,
            )
        return SinkError(message, retriable=bool(f["retriable"]))


# ---- the kinds' fields -------------------------------------------------------------------------------------------


def undecodable(reason: str) -> Report:
    """A message that does not decode (a dead letter); the task locates it (:meth:`Report.located`)."""
    return Report(Kind.UNDECODABLE, {"reason": reason})


def schema_change(
    fields: Iterable[tuple[str, str | None, str | None]], added: Iterable[str], changed: Iterable[tuple[str, str, str]]
) -> Report:
    """A message whose schema differs from the source's columns; the task locates it."""
    return Report(
        Kind.SCHEMA_CHANGE,
        {"fields": [list(f) for f in fields], "added": list(added), "changed": [list(c) for c in changed]},
    )


def new_topic(source_id: str, topic: str, partition: int, offset: int) -> Report:
    return Report(Kind.NEW_TOPIC, {"source": source_id, "topic": topic, "partition": partition, "offset": offset})


def write_failed(message: str, *, retriable: bool) -> Report:
    return Report(Kind.WRITE_FAILED, {"message": message, "retriable": retriable})


def refused(message: str) -> Report:
    return Report(Kind.REFUSED, {"message": message})


def service_unavailable(message: str) -> Report:
    return Report(Kind.SERVICE_UNAVAILABLE, {"message": message})


def broker_unavailable(detail: str) -> Report:
    return Report(Kind.BROKER_UNAVAILABLE, {"detail": detail})


def offsets_lost(message: str) -> Report:
    return Report(Kind.OFFSETS_LOST, {"message": message})


def source_went_back(message: str, hint: str) -> Report:
    return Report(Kind.SOURCE_WENT_BACK, {"message": message, "hint": hint})


def first_to_raise(reports: Iterable[Report]) -> Report | None:
    """Of the reports several tasks returned, the one the driver raises: by kind (see :class:`Kind`), then the
    lowest topic, partition and offset, so the same batch always fails the same way."""

    def rank(report: Report) -> tuple[int, str, int, int]:
        f = report.fields
        return _ORDER[report.kind], str(f.get("topic", "")), int(f.get("partition", 0)), int(f.get("offset", 0))

    return min(reports, key=rank, default=None)


# ---- inside exception text ---------------------------------------------------------------------------------------


class ReportedFailure(RuntimeError):
    """What a task raises to fail with a report: its text is the report's description, then the token."""

    def __init__(self, report: Report) -> None:
        self.report = report
        token = base64.urlsafe_b64encode(report.encode().encode()).decode("ascii")
        super().__init__(f"{report.describe()} {_TOKEN_PREFIX}{token}]")

    def __reduce__(self) -> tuple[type[ReportedFailure], tuple[Report]]:
        return ReportedFailure, (self.report,)  # pickled with its report, not its text


def find_report(text: str) -> Report | None:
    """The report inside an executor failure's text (Spark's wrapping of a :class:`ReportedFailure`), or None.

    The last readable token wins: Spark repeats the innermost error, and its cause comes last."""
    for match in reversed(_TOKEN_RE.findall(text)):
        try:
            return Report.decode(base64.urlsafe_b64decode(match).decode())
        except (UnknownReport, binascii.Error, UnicodeDecodeError):
            continue
    return None


def without_tokens(text: str) -> str:
    """``text`` without report tokens, for messages shown to people."""
    return _TOKEN_RE.sub("", text).rstrip()

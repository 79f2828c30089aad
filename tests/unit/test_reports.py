"""Typed executor -> driver reports: one encoding, read back from Spark's wrapping of a failed task."""

from __future__ import annotations

import base64
import json
import pickle

import pytest

from cdcsync.core.errors import (
    NewTopicError,
    SchemaChangeError,
    SinkError,
    SourceWentBack,
    UndecodableMessage,
    exit_code_for,
)
from cdcsync.core.reports import (
    Kind,
    Report,
    ReportedFailure,
    UnknownReport,
    find_report,
    first_to_raise,
    new_topic,
    schema_change,
    source_went_back,
    undecodable,
    without_tokens,
    write_failed,
)
from cdcsync.db.executor_errors import executor_error

pytestmark = pytest.mark.unit

EVERY_KIND = [
    new_topic("cdc", "shop.public.refunds", 3, 7),
    schema_change([("id", "bigint", None), ("where", None, "no mapping")], ["where"], [("id", "integer", "bigint")]),
    undecodable('value is not JSON: "quoted", [brackets] and\nnewlines, ünïcödé').located(
        topic="t", partition=0, offset=5
    ),
    write_failed("sink 'm': COPY failed: connection refused", retriable=True),
    source_went_back("sink 'ch': 2 snapshot read(s) from topic 't' at source position 3/0 lie below", "see docs"),
]


def spark_text(failure: BaseException) -> str:
    """What the driver's exception says when a Python task raised ``failure``: Spark's Py4J wrapping, the
    Python traceback, JVM frames, and the cause repeated."""
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/opt/spark/python/pyspark/worker.py", line 1247, in main\n'
        "    process()\n"
        f"{type(failure).__module__}.{type(failure).__name__}: {failure}\n"
    )
    return (
        "An error occurred while calling o123.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 4.0 failed 1 times, "
        "most recent failure: Lost task 0.0 in stage 4.0 (TID 9) (10.0.0.1 executor driver): "
        f"org.apache.spark.api.python.PythonException: {traceback}"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:572)\n"
        "\tat org.apache.spark.sql.execution.python.PythonArrowOutput$$anon$1.read(PythonArrowOutput.scala:118)\n"
        "Driver stacktrace:\n"
        f"Caused by: org.apache.spark.api.python.PythonException: {traceback}"
    )


@pytest.mark.parametrize("report", EVERY_KIND, ids=lambda r: r.kind.value)
def test_every_kind_round_trips_through_its_encoding_and_through_spark_text(report: Report) -> None:
    assert Report.decode(report.encode()) == report
    failure = ReportedFailure(report)
    assert str(failure).startswith(report.describe())
    assert find_report(spark_text(failure)) == report
    assert without_tokens(str(failure)) == report.describe()
    assert pickle.loads(pickle.dumps(failure)).report == report


def test_every_kind_becomes_its_driver_error_with_the_contracted_exit_code() -> None:
    topic, change, bad, write, back = (report.error("staging batch 4", "shop.yaml") for report in EVERY_KIND)
    assert isinstance(topic, NewTopicError) and exit_code_for(topic) == 2
    assert (topic.topic, topic.partition, topic.offset) == ("shop.public.refunds", 3, 7)
    assert "cdcsync init shop.yaml" in (topic.hint or "")
    assert isinstance(change, SchemaChangeError) and exit_code_for(change) == 2
    assert change.changed == [("id", "integer", "bigint")] and change.unmapped == ["where"]
    assert isinstance(bad, UndecodableMessage) and exit_code_for(bad) == 1
    assert str(bad).startswith("message at t/0@5 could not be decoded: value is not JSON")
    assert isinstance(write, SinkError) and write.retriable and exit_code_for(write) == 1
    assert str(write) == "staging batch 4: sink 'm': COPY failed: connection refused"
    assert isinstance(back, SourceWentBack) and exit_code_for(back) == 2 and back.hint == "see docs"
    assert str(back).startswith("sink 'ch': 2 snapshot read(s)")  # the same text as a Postgres sink's


def test_a_report_of_an_unknown_kind_is_not_read_and_the_failure_stays_unclassified() -> None:
    future = json.dumps({"kind": "disk_on_fire", "fields": {"message": "smoke"}})
    with pytest.raises(UnknownReport):
        Report.decode(future)
    for text in ("not json", '{"kind": "undecodable"}', '{"kind": "undecodable", "fields": []}', "[]"):
        with pytest.raises(UnknownReport):
            Report.decode(text)
    token = base64.urlsafe_b64encode(future.encode()).decode()
    text = f"PythonException: Traceback ...\nRuntimeError: it broke [cdcsync-report:{token}]\n\tat org.apache..."
    assert find_report(text) is None
    error = executor_error(RuntimeError(text), "staging batch 2")
    assert isinstance(error, SinkError) and not error.retriable
    assert str(error) == "staging batch 2: it broke"  # the token is not shown


def test_an_unreadable_token_does_not_hide_a_readable_one() -> None:
    known = ReportedFailure(write_failed("x", retriable=False))
    assert find_report(f"{known}\n... [cdcsync-report:!!!] [cdcsync-report:bm90IGpzb24=]") == known.report
    assert find_report("no report here at all") is None


def test_the_driver_raises_what_the_user_must_resolve_first_then_the_earliest_message() -> None:
    late = undecodable("a").located(topic="t", partition=0, offset=9)
    early = undecodable("b").located(topic="t", partition=0, offset=2)
    other = undecodable("c").located(topic="t", partition=1, offset=0)
    change = schema_change([("x", "text", None)], ["x"], []).located(topic="t", partition=1, offset=50)
    assert first_to_raise([late, early, other]) == early
    assert first_to_raise([late, change, early]) == change
    assert first_to_raise([late, change, new_topic("s", "u", 0, 99)]).kind is Kind.NEW_TOPIC
    assert first_to_raise([]) is None


def test_reports_before_they_are_located_read_well() -> None:
    assert undecodable("value is not JSON").describe() == "value is not JSON"
    change = schema_change([("note", "json", None), ("id", "text", None)], ["note"], [("id", "bigint", "text")])
    assert change.describe() == (
        "the message's schema changed: new field 'note'; field 'id' changed type from bigint to text"
    )
    located = change.located(source="orders", topic="t", partition=2, offset=41)
    assert located.describe().startswith("the schema of topic t changed at partition 2, offset 41")

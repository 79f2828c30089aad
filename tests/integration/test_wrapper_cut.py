"""The schema-wrapper cut of :func:`cdcsync.sources.kafka.decoder_input`, in Spark: the JVM sends Python what the
rule says, byte for byte (``jvm_cut`` of the unit tests, which the decoder is held to there), and the batches it
sends decode as the whole messages do, dead letters' original bytes included. No Kafka: the rows are Spark's
Kafka source columns built from the workload's messages."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from cdcsync.devstack import workload
from cdcsync.sources.debezium.dispatch import decode_batches
from cdcsync.sources.debezium.json import wrapper_prefix
from cdcsync.sources.debezium.wrappers import CUT_COLUMNS, KEY_WRAPPER_COLUMN, WRAPPER_COLUMN, with_wrappers
from cdcsync.sources.kafka import KnownWrappers, decoder_input
from tests.unit.test_debezium_columnar import OTHER_WRAPPER, comparable, jvm_cut, spec_of

pytestmark = pytest.mark.integration

KAFKA_DDL = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"


def kafka_rows(spark: Any, values: list[tuple[bytes | None, bytes | None]]) -> Any:
    batch = workload.to_kafka_batch(
        [workload.ChangeEvent(key, value, i, None) for i, (key, value) in enumerate(values)]
    ).select(["key", "value", "topic", "partition", "offset", "timestamp"])
    return spark.createDataFrame(batch.to_pylist(), KAFKA_DDL), batch


def test_the_jvm_cuts_known_wrappers_off_byte_for_byte_and_the_cut_decodes_as_the_whole(spark: Any) -> None:
    events = workload.generate(100, 30, seed=5, wrapped=True).events
    messages = [(e.key, e.value) for e in events]
    wrapper = wrapper_prefix(next(value for _, value in messages if value is not None))
    key_wrapper = wrapper_prefix(messages[0][0] or b"")
    assert wrapper is not None and key_wrapper is not None
    renamed = [
        (key, value.replace(b".Value", b".Value2")) for key, value in messages[:20] if value is not None
    ]  # another schema, not known: crosses whole
    odd = [wrapper + b"}", wrapper + b'{"op":"c"', wrapper[:-1] + b" {}}", b"{}", b"", wrapper + b"{}} "]
    malformed = [(e.key, e.value) for e in workload.malformed_events(wrapped=True)]
    values = messages + renamed + [(b'{"id":1}', v) for v in odd] + malformed
    raw, batch = kafka_rows(spark, values)
    wrappers = (wrapper, OTHER_WRAPPER, key_wrapper)

    sent = decoder_input(raw, wrappers).toArrow()
    expected = jvm_cut(batch, wrappers)
    for column, wrapper_column in CUT_COLUMNS:
        assert sent.column(column).to_pylist() == expected.column(column).to_pylist()
        assert sent.column(wrapper_column).to_pylist() == expected.column(wrapper_column).to_pylist()
    assert sum(w == 0 for w in sent.column(WRAPPER_COLUMN).to_pylist()) > 80  # the workload's messages were cut
    assert sum(w == 2 for w in sent.column(KEY_WRAPPER_COLUMN).to_pylist()) > 80  # and their keys

    spec = spec_of(dict(workload.ORDERS_COLUMNS), detect=True)
    cut = [with_wrappers(b, wrappers) for b in sent.to_batches()]
    got = pa.Table.from_batches(list(decode_batches(iter(cut), spec)))
    whole = pa.Table.from_batches(list(decode_batches(iter([batch]), spec)))
    assert comparable(pa.concat_batches(got.to_batches())) == comparable(pa.concat_batches(whole.to_batches()))
    dead = [v for v in got.column("_dlq_value").to_pylist() if v is not None]
    assert set(dead) >= {wrapper + b"}", *(v for _, v in malformed if v is not None)}  # their original bytes


def test_the_driver_learns_the_wrapper_of_the_first_message_once(spark: Any) -> None:
    events = workload.generate(30, 10, seed=2, wrapped=True).events
    first = next(e for e in events if e.value is not None)
    wrappers = {wrapper_prefix(first.value or b""), wrapper_prefix(first.key or b"")}
    raw, _ = kafka_rows(spark, [(b"k", None)] + [(e.key, e.value) for e in events])
    known = KnownWrappers()
    assert set(known.for_batch(raw)) == wrappers and None not in wrappers
    bare, _ = kafka_rows(spark, [(e.key, e.value) for e in workload.generate(30, 10, seed=2).events])
    nothing = KnownWrappers()
    assert nothing.for_batch(bare) == ()
    assert nothing.peeked and nothing.for_batch(raw) == ()  # one peek a run: later wrappers come from the tasks
    tombstones, _ = kafka_rows(spark, [(b"k", None)])
    waiting = KnownWrappers()
    assert waiting.for_batch(tombstones) == () and not waiting.peeked  # nothing read yet: peek at the next batch
    assert decoder_input(bare).columns == decoder_input(bare, ()).columns  # nothing known: nothing added

"""print, blackhole and webhook sinks: their YAML, and their executor writers (the webhook's against a real local
HTTP receiver)."""

from __future__ import annotations

import datetime
import decimal
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from cdcsync.config.load import validate_pipeline_dict
from cdcsync.core import changes_json
from cdcsync.core.errors import ConfigError
from cdcsync.core.reports import Kind, ReportedFailure
from cdcsync.db.retry import RetryBudget
from cdcsync.sinks.console import PrintWriter
from cdcsync.sinks.webhook import WebhookWriter

pytestmark = pytest.mark.unit

SOURCE = {"type": "kafka", "topic": "t", "primary_key": "id", "columns": {"id": "bigint", "amount": "numeric(12,2)"}}


def pipeline_with(**sink: Any) -> dict[str, Any]:
    return {"name": "ops", "sources": {"orders": SOURCE}, "sinks": {"out": {"from": "orders", **sink}}}


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(doc)
    return caught.value.problems


def test_the_three_sinks_validate_and_own_no_table() -> None:
    doc = pipeline_with(type="webhook", url="https://hooks.example/in", headers={"Authorization": "Bearer s3cret"})
    doc["sinks"]["p"] = {"type": "print", "from": "orders", "sample_every": 10}
    doc["sinks"]["b"] = {"type": "blackhole", "from": "orders"}
    pipeline = validate_pipeline_dict(doc)
    assert set(pipeline.sinks) == {"out", "p", "b"}
    assert pipeline.postgres_sinks() == {} and pipeline.clickhouse_sinks() == {}
    assert pipeline.sinks["out"].batch_size == 500  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("sink", "expected"),
    [
        ({"type": "webhook", "url": "ftp://x/y"}, "sinks.out.url: 'ftp://x/y' is not an http:// or https:// URL"),
        ({"type": "webhook"}, "sinks.out.url: required key is missing"),
        ({"type": "webhook", "url": "http://h/", "timeout_s": 0}, "sinks.out.timeout_s: Input should be greater"),
        ({"type": "webhook", "url": "http://h/", "headers": {"Idempotency-Key": "x"}}, "set by cdcsync itself"),
        ({"type": "print", "sample_every": 0}, "sinks.out.sample_every: Input should be greater than 0"),
        ({"type": "print", "smaple_every": 2}, "sinks.out.smaple_every: unknown key (did you mean 'sample_every'?)"),
        ({"type": "blackhol"}, "sinks.out.type: 'blackhol' is not one of"),
        ({"type": "blackhole", "primary_key": "nope"}, "sinks.out.primary_key: column 'nope' is not in source"),
    ],
)
def test_bad_options_are_refused_with_their_yaml_path(sink: dict[str, Any], expected: str) -> None:
    found = problems(pipeline_with(**sink))
    assert any(expected in problem for problem in found), found
    if sink["type"] == "blackhol":
        assert "(did you mean 'blackhole'?)" in found[0]


def _changes(n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "amount": pa.array([decimal.Decimal("1.50")] * n, pa.decimal128(12, 2)),
            "born": pa.array([datetime.date(2020, 1, 2)] * n, pa.date32()),
            "_cdc_op": pa.array(["c", "u", "d"] * (n // 3) + ["c"] * (n % 3)),
            "_cdc_version": pa.array(range(100, 100 + n), pa.decimal128(38, 0)),
            "_cdc_topic": pa.array(["t"] * n),
            "_cdc_partition": pa.array([0] * n, pa.int32()),
            "_cdc_offset": pa.array(range(n), pa.int64()),
        }
    )


def test_changes_keep_their_precision_as_json() -> None:
    row = changes_json.rows(_changes(1))[0]
    assert json.loads(changes_json.dumps(row)) == {
        "id": 0,
        "amount": "1.50",
        "born": "2020-01-02",
        "_cdc_op": "c",
        "_cdc_version": "100",
        "_cdc_topic": "t",
        "_cdc_partition": 0,
        "_cdc_offset": 0,
    }


def test_print_writes_every_nth_change_prefixed_with_its_op(capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    assert PrintWriter(sample_every=2).stage(_changes(6)) == 3
    lines = capfdbinary.readouterr().out.decode().splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["INSERT", "DELETE", "UPDATE"]
    assert [json.loads(line.split(" ", 1)[1])["id"] for line in lines] == [0, 2, 4]


class Receiver:
    """A threaded local HTTP receiver that answers each request with the next planned status (then 200)."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.requests.append((dict(self.headers), json.loads(body)))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"no such hook" if status == 404 else b"")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?token=abc"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    server = Receiver(getattr(request, "param", []))
    yield server
    server.close()


def _writer(url: str, budget_s: float = 5.0) -> WebhookWriter:
    return WebhookWriter(
        url=url,
        headers=(("Authorization", "Bearer s3cret"),),
        timeout_s=2.0,
        batch_size=4,
        key_prefix="ops/out/ckpt/7",
        pipeline="ops",
        sink_id="out",
        batch_id=7,
        budget=RetryBudget(seconds=budget_s, first_delay_s=0.01, max_delay_s=0.05),
    )


@pytest.mark.parametrize("receiver", [[503, 500, 429]], indirect=True)
def test_webhook_parts_carry_stable_idempotency_keys_and_survive_5xx(receiver: Receiver) -> None:
    assert _writer(receiver.url).stage(_changes(10)) == 10
    delivered = [(headers["Idempotency-Key"], body) for headers, body in receiver.requests]
    assert len(delivered) == 6  # three refusals retried, then three parts of at most 4 changes
    keys = [key for key, _ in delivered]
    assert keys[:4] == ["ops/out/ckpt/7/t-0@0-9#10/0"] * 4
    assert keys[4:] == ["ops/out/ckpt/7/t-0@0-9#10/1", "ops/out/ckpt/7/t-0@0-9#10/2"]
    assert [len(body["changes"]) for _, body in delivered[3:]] == [4, 4, 2]
    assert [change["id"] for _, body in delivered[3:] for change in body["changes"]] == list(range(10))
    assert all(headers["Authorization"] == "Bearer s3cret" for headers, _ in receiver.requests)


@pytest.mark.parametrize("receiver", [[404]], indirect=True)
def test_webhook_4xx_is_a_refusal_that_names_no_secret(receiver: Receiver) -> None:
    with pytest.raises(ReportedFailure) as caught:
        _writer(receiver.url).stage(_changes(2))
    report = caught.value.report
    assert report.kind is Kind.REFUSED
    error = report.error("landing")
    assert error.user_error and "HTTP 404" in str(error) and "no such hook" in str(error)
    assert "s3cret" not in str(caught.value) and "token=abc" not in str(caught.value)
    assert len(receiver.requests) == 1


def test_webhook_unreachable_is_retriable_after_its_budget() -> None:
    with pytest.raises(ReportedFailure) as caught:
        _writer("http://127.0.0.1:9/hook", budget_s=0.2).stage(_changes(2))
    report = caught.value.report
    assert report.kind is Kind.WRITE_FAILED and report.fields["retriable"] is True
    assert "gave up after" in report.describe() and "retry budget" in report.describe()

"""``handler`` and ``script`` transforms: options and the script's sandbox checked with their YAML paths before Spark
starts, and what the executors make of the code's results (a local HTTP server stands in for the handler)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.plan import PluginStep
from cdcsync.core.errors import ConfigError
from cdcsync.core.reports import Kind, ReportedFailure
from cdcsync.transforms.plugins import run_step
from tests.json_server import Answer, serving

pytestmark = pytest.mark.unit

SOURCE = {
    "type": "kafka",
    "topic": "t",
    "primary_key": "id",
    "columns": {"id": "bigint", "name": "text", "amount": "numeric(12,2)"},
}


def doc(transform: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "p",
        "sources": {"orders": SOURCE},
        "transforms": {"t": {"from": "orders", **transform}},
        "sinks": {"out": {"type": "postgres", "from": "t", "schema": "app", "table": "out"}},
    }


def problems(pipeline: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(pipeline)
    return caught.value.problems


def script(body: str, **more: Any) -> dict[str, Any]:
    return {"type": "script", "language": "python", "script": body, **more}


def step_of(transform: dict[str, Any]) -> PluginStep:
    (step,) = validate_pipeline_dict(doc(transform)).plan.plugin_chain("t")
    return step


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("import os\ndef process(input):\n    return input", "line 1: imports are not allowed"),
        ("def process(input):\n    from os import path\n    return input", "line 2: imports are not allowed"),
        ("def process(input):\n    return open('/etc/passwd')", "line 2: 'open' is not available"),
        ("def process(input):\n    exec('x = 1')\n    return input", "line 2: 'exec' is not available"),
        ("def process(input):\n    return eval('1')", "line 2: 'eval' is not available"),
        ("def process(input):\n    return __import__('os')", "line 2: '__import__' is not available"),
        ("def process(input):\n    return input.__class__", "line 2: attribute '.__class__' is not allowed"),
        ("def process(input):\n    return ().__class__.__bases__", "attribute '.__bases__' is not allowed"),
        ("def process(input):\n    return '{0.x}'.format(input)", "attribute '.format' is not allowed"),
        ("def process(input):\n    return (g for g in []).gi_frame", "attribute '.gi_frame' is not allowed"),
        ("def process(input):\n    return getattr(input, 'keys')", "'getattr' is not available"),
        ("def process(input):\n    return input['__builtins__']", "strings holding '__' are not allowed"),
        ("def process(input):\n    return input\n    yield 1", "line 3: Yield is not allowed"),
        ("def other(input):\n    return input", "defines no top-level function `def process(input):`"),
        ("def process(a, b):\n    return a", "process takes exactly one argument"),
        ("def process(input):\n    return (", "line 2: "),
    ],
)
def test_the_sandbox_refuses_at_validate_with_the_yaml_path(code: str, expected: str) -> None:
    found = problems(doc(script(code)))
    assert any(p.startswith("transforms.t.script: ") and expected in p for p in found), found


def test_typescript_is_refused_and_javascript_checked_in_its_sandbox() -> None:
    found = problems(doc({**script("function process(input: any) { return input; }"), "language": "typescript"}))
    assert any(p.startswith("transforms.t.language: 'typescript' is not supported") for p in found), found
    for code, expected in [
        ("function process(input) { return input; ", "SyntaxError: Unexpected end of input"),
        ("const x = 1;", "defines no function `process(input)`"),
        ("const fs = require('fs'); function process(input) { return input; }", "require is not defined"),
    ]:
        found = problems(doc({**script(code), "language": "javascript"}))
        assert any(p.startswith("transforms.t.script: ") and expected in p for p in found), found
    found = problems(doc({**script("def process(input):\n    return input"), "language": "lua"}))
    assert found == ["transforms.t.language: 'lua' is not one of python, javascript, typescript"]


@pytest.mark.parametrize(
    ("transform", "expected"),
    [
        ({"type": "handler", "url": "ftp://x"}, "transforms.t.url: 'ftp://x' is not an http:// or https:// URL"),
        ({"type": "handler", "url": "http://h", "concurency": 2}, "transforms.t.concurency: unknown key (did you"),
        ({"type": "handler", "url": "http://h", "concurrency": 0}, "transforms.t.concurrency: "),
        ({"type": "handler", "url": "http://h", "batch_size": -1}, "transforms.t.batch_size: "),
        ({"type": "handler", "url": "http://h", "timeout_s": 0}, "transforms.t.timeout_s: "),
        ({"type": "handler"}, "transforms.t.url: required key is missing"),
        ({"type": "handler", "url": "http://h", "headers": {"a b": "x"}}, "transforms.t.headers: 'a b': header"),
        (
            {"type": "handler", "url": "http://h", "schema_overrides": {"score": "floatish"}},
            "transforms.t.schema_overrides.score: ",
        ),
        (
            {"type": "handler", "url": "http://h", "schema_overrides": {"id": "text"}},
            "transforms.t.schema_overrides.id: 'id' is in the key, which passes through unchanged",
        ),
        (
            {"type": "handler", "url": "http://h", "schema_overrides": {"_cdc_op": "text"}},
            "transforms.t.schema_overrides._cdc_op: the _cdc_* columns pass through",
        ),
        (
            {"type": "handler", "url": "http://h", "schema_overrides": {"nope": None}},
            "transforms.t.schema_overrides.nope: removes 'nope', which its input does not have",
        ),
        (
            {"type": "handler", "url": "http://h", "primary_key": "nope"},
            "transforms.t.primary_key: column(s) nope not among its output columns",
        ),
        ({"type": "handler", "url": "http://h", "from": "ordes"}, "transforms.t.from: 'ordes' is not a source"),
        (script("def process(input):\n    return input", language=None), "transforms.t.language: "),
    ],
)
def test_options_are_checked_with_their_yaml_path(transform: dict[str, Any], expected: str) -> None:
    found = problems(doc(transform))
    assert any(p.startswith(expected) for p in found), found


def test_overrides_declare_the_columns_sinks_and_init_see() -> None:
    pipeline = validate_pipeline_dict(
        doc({"type": "handler", "url": "http://h", "schema_overrides": {"score": "integer", "name": None}})
    )
    assert {n: t.sql for n, t in pipeline.columns_of("t").items()} == {
        "id": "bigint",
        "amount": "numeric(12,2)",
        "score": "integer",
    }
    assert pipeline.primary_key_of("t") == ["id"]
    identity = script("def process(input):\n    return input")
    reading = doc(identity)
    reading["transforms"]["s"] = {"type": "sql", "primary_key": "id", "sql": "SELECT * FROM t"}
    found = problems(reading)
    assert any(p.startswith("transforms.s.sql: reads 't', a plugin, handler or script operator") for p in found)


def _changes() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "name": ["ann", "bob", None, "dan"],
            "amount": pa.array(["10.50", "2000.00", None, "7.00"]).cast(pa.decimal128(12, 2)),
            "_cdc_op": ["c", "u", "d", "r"],
            "_cdc_version": pa.array([1, 2, 3, 4], pa.decimal128(38, 0)),
            "_cdc_ts": pa.array([0] * 4, pa.timestamp("us", tz="UTC")),
            "_cdc_topic": ["t"] * 4,
            "_cdc_partition": pa.array([0] * 4, pa.int32()),
            "_cdc_offset": pa.array([0, 1, 2, 3], pa.int64()),
        }
    )


def test_a_script_computes_filters_and_leaves_deletes_alone() -> None:
    step = step_of(
        script(
            "def process(input):\n"
            "    if input['name'] == 'bob':\n"
            "        return None\n"
            "    input['tier'] = 'high' if input['amount'] > Decimal('1000') else 'low'\n"
            "    input['name'] = input['name'].upper()\n"
            "    return input\n",
            schema_overrides={"tier": "text"},
        )
    )
    out = run_step(step, _changes())
    assert out.column_names == ["id", "name", "amount", "tier", *[f for f in _changes().column_names if "_cdc" in f]]
    assert out.to_pydict()["id"] == [1, 2, 3, 4]
    assert out.column("_cdc_op").to_pylist() == ["c", "d", "d", "r"]  # bob dropped: a delete of its key
    assert out.column("name").to_pylist() == ["ANN", None, None, "DAN"]
    assert out.column("tier").to_pylist() == ["low", None, None, "low"]
    assert out.column("_cdc_offset").to_pylist() == [0, 1, 2, 3]


def test_a_script_that_raises_or_changes_the_key_stops_naming_the_change() -> None:
    step = step_of(script("def process(input):\n    x = 1\n    return {'amount': input['amount'] / (input['id'] - 4)}"))
    with pytest.raises(ReportedFailure) as caught:
        run_step(step, _changes())
    assert caught.value.report.kind is Kind.REFUSED
    message = caught.value.report.describe()
    assert "script transform 't': process raised InvalidOperation at line 3" in message or "DivisionByZero" in message
    assert "key id=4, at t/0@3" in message, message
    moved = step_of(script("def process(input):\n    input['id'] = input['id'] + 100\n    return input"))
    with pytest.raises(ReportedFailure, match="changed 'id' of the change with key id=1"):
        run_step(moved, _changes())
    version = step_of(script("def process(input):\n    return {'_cdc_op': 'd'}"))
    with pytest.raises(ReportedFailure, match="changed '_cdc_op'"):
        run_step(version, _changes())


def test_the_namespace_holds_only_the_allowed_builtins() -> None:
    step = step_of(script("def process(input):\n    return {'name': str(sorted(dir()))}"))
    with pytest.raises(ReportedFailure, match="NameError"):
        run_step(step, _changes())  # dir is not there
    fine = step_of(script("def process(input):\n    return {'name': str(math.floor(2.5)) + str(len(input) > 0)}"))
    assert run_step(fine, _changes()).column("name").to_pylist()[0] == "2True"


@pytest.fixture
def handler_server() -> Iterator[tuple[str, list[Any], list[Answer]]]:
    """A local handler: each request body is recorded; ``answers`` (a queue, the last one repeats) decide."""
    answers: list[Answer] = []

    def answer(body: Any) -> tuple[int, Any]:
        return (answers.pop(0) if len(answers) > 1 else answers[0])(body)

    with serving(answer) as server:
        yield server.url, server.bodies, answers


def _enrich(row: dict[str, Any]) -> dict[str, Any] | None:
    if row["name"] == "bob":
        return None
    return {**row, "score": len(row["name"]), "amount": "99.99" if row["id"] == 4 else row["amount"]}


def test_a_handler_enriches_in_batches_and_drops_rows(handler_server: tuple[str, list[Any], list[Answer]]) -> None:
    url, seen, answers = handler_server
    answers.append(lambda body: (200, [_enrich(row) for row in body]))
    step = step_of({"type": "handler", "url": url, "batch_size": 2, "schema_overrides": {"score": "integer"}})
    out = run_step(step, _changes())
    assert sorted([row["id"] for row in body] for body in seen) == [[1, 2], [4]]  # the delete is not sent
    first = next(body[0] for body in seen if body[0]["id"] == 1)
    assert first["amount"] == "10.50" and first["_cdc_op"] == "c"
    assert out.column("_cdc_op").to_pylist() == ["c", "d", "d", "r"]
    assert out.column("score").to_pylist() == [3, None, None, 3]
    assert [str(v) if v is not None else None for v in out.column("amount").to_pylist()] == [
        "10.50",
        None,
        None,
        "99.99",
    ]


def test_a_handler_one_row_per_request_retries_transient_failures(
    handler_server: tuple[str, list[Any], list[Answer]],
) -> None:
    url, seen, answers = handler_server
    answers += [
        lambda body: (503, {"error": "busy"}),
        lambda body: (429, {"error": "slow down"}),
        lambda body: (200, _enrich(body)),
    ]
    step = step_of(
        {
            "type": "handler",
            "url": url,
            "one_row_per_request": True,
            "concurrency": 1,
            "headers": {"X-Api-Key": "sekrit"},
            "schema_overrides": {"score": "integer"},
        }
    )
    out = run_step(step, _changes())
    assert len(seen) == 5 and all(isinstance(body, dict) for body in seen)  # 2 failures, then one per change
    assert out.column("score").to_pylist() == [3, None, None, 3]


def test_handler_failures_are_classified(handler_server: tuple[str, list[Any], list[Answer]]) -> None:
    url, _, answers = handler_server
    base = {"type": "handler", "url": url, "retry_budget_s": 0, "headers": {"Authorization": "Bearer sekrit"}}
    answers.append(lambda body: (400, {"error": "bad"}))
    with pytest.raises(ReportedFailure) as caught:
        run_step(step_of(base), _changes())
    assert caught.value.report.kind is Kind.REFUSED
    assert "handler transform 't'" in caught.value.report.describe() and "HTTP 400" in caught.value.report.describe()
    assert "sekrit" not in str(caught.value)
    answers[0] = lambda body: (502, {})
    with pytest.raises(ReportedFailure) as caught:
        run_step(step_of(base), _changes())
    assert caught.value.report.kind is Kind.WRITE_FAILED and caught.value.report.fields["retriable"] is True
    assert "gave up after" in caught.value.report.describe()
    for answer, expected in [
        (lambda body: (200, body[:1]), "answered an array of 1 for 3 change(s) sent"),
        (lambda body: (200, {"rows": body}), "answered a dict for 3 change(s) sent"),
        (lambda body: (200, [1, 2, 3]), "answered a int for a change"),
        (lambda body: (200, [{**r, "id": 7} for r in body]), "changed 'id' of the change with key id=1"),
        (lambda body: (200, [{**r, "amount": "lots"} for r in body]), "column 'amount' got 'lots'"),
    ]:
        answers[0] = answer
        with pytest.raises(ReportedFailure) as caught:
            run_step(step_of(base), _changes())
        assert caught.value.report.kind is Kind.REFUSED
        assert expected in caught.value.report.describe(), caught.value.report.describe()


JS = """
function process(input) {
  if (input.name === 'bob') return null;
  input.tier = Number(input.amount) > 1000 ? 'premium' : 'standard';
  input.name = input.name.toUpperCase();
  return input;
}
"""


def test_a_javascript_script_runs_in_v8_like_a_python_one() -> None:
    step = step_of(script(JS, language="javascript", schema_overrides={"tier": "text"}))
    out = run_step(step, _changes())
    assert out.column("_cdc_op").to_pylist() == ["c", "d", "d", "r"]
    assert out.column("name").to_pylist() == ["ANN", None, None, "DAN"]
    assert out.column("tier").to_pylist() == ["standard", None, None, "standard"]
    assert [str(v) for v in out.column("amount").to_pylist() if v is not None] == ["10.50", "7.00"]  # echoed, kept
    throws = step_of(
        script(
            "function process(input) {\n  if (input.id === 4) throw new Error('no four');\n  return input;\n}",
            language="javascript",
        )
    )
    with pytest.raises(ReportedFailure) as caught:
        run_step(throws, _changes())
    assert caught.value.report.kind is Kind.REFUSED
    assert "process threw Error: no four (change with key id=4, at t/0@3)" in caught.value.report.describe()
    moved = step_of(script("function process(input) { input.id = 9; return input; }", language="javascript"))
    with pytest.raises(ReportedFailure, match="changed 'id' of the change with key id=1"):
        run_step(moved, _changes())

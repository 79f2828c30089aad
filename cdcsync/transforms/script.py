"""``type: script`` on the executors: the user's ``process(input)`` applied to each change, in a restricted
namespace (Python) or in a V8 isolate of its own (JavaScript, :class:`JavaScriptRunner`).

The script is compiled once per task (per partition the sink writes), with builtins limited to
:data:`~cdcsync.config.code_transforms.SCRIPT_BUILTINS` and a few value types; validation already refused imports,
``open``/``exec``/``eval``/``__import__``, dunder and frame attributes (:func:`script_problems`), and the same check
runs here again, so a plan built elsewhere cannot smuggle code past it. This keeps a script to computing on its
change; it is not a boundary against a hostile author of the pipeline file, who controls the deployment anyway.

An exception raised by the script fails the batch as the user's to fix (exit 2), naming the transform, the change's
key and position and the script's line: the script is deterministic code over the change, so a replay would fail
the same way, and a dead letter written from inside one sink's pass would be written once per sink reading it.
"""

from __future__ import annotations

import datetime
import decimal
import math
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync.config.code_transforms import (
    JS_RUN_TIMEOUT_S,
    SCRIPT_BUILTINS,
    ScriptTransform,
    javascript_context,
    script_problems,
)
from cdcsync.config.plan import PluginStep
from cdcsync.core import changes_json
from cdcsync.core.reports import ReportedFailure, refused
from cdcsync.transforms.code_rows import apply_results, key_text, processed_rows

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

_SCRIPT_FILE = "<script>"


def _namespace() -> dict[str, Any]:
    import builtins

    allowed = {name: getattr(builtins, name) for name in SCRIPT_BUILTINS}
    values = {"Decimal": decimal.Decimal, "date": datetime.date, "datetime": datetime.datetime}
    return {"__builtins__": allowed, **values, "timedelta": datetime.timedelta, "math": math}


@dataclass
class ScriptRunner:
    """One task's compiled script."""

    step: PluginStep
    process: Callable[[dict[str, Any]], Any]

    @classmethod
    def build(cls, step: PluginStep) -> ScriptRunner | JavaScriptRunner:
        transform = ScriptTransform.model_validate(dict(step.options))
        if transform.language == "javascript":
            return JavaScriptRunner(step, transform.script)
        where = f"transforms.{step.id}"
        problems = script_problems(where, transform)
        if problems:
            raise ReportedFailure(refused(f"script transform '{step.id}': {'; '.join(problems)}"))
        namespace = _namespace()
        exec(compile(transform.script, _SCRIPT_FILE, "exec"), namespace)  # checked by script_problems
        return cls(step, namespace["process"])

    def run(self, table: pa.Table) -> pa.Table:
        positions = processed_rows(table)
        if not positions:
            return apply_results(self.step, self._where, table, [], [], [])
        rows = table.to_pylist()
        sent = [rows[i] for i in positions]
        results = []
        for given in sent:
            try:
                results.append(self.process(dict(given)))
            except Exception as error:
                raise ReportedFailure(refused(self._failure(given, error))) from None
        return apply_results(self.step, self._where, table, positions, sent, results)

    @property
    def _where(self) -> str:
        return f"script transform '{self.step.id}'"

    def _failure(self, given: dict[str, Any], error: Exception) -> str:
        lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__) if frame.filename == _SCRIPT_FILE]
        at = f" at line {lines[-1]}" if lines else ""
        key = key_text(self.step, given)
        position = f"{given.get('_cdc_topic')}/{given.get('_cdc_partition')}@{given.get('_cdc_offset')}"
        return (
            f"{self._where}: process raised {type(error).__name__}{at}: {error} (change with key {key}, at "
            f"{position}); fix the script (transforms.{self.step.id}.script), or guard the case in it"
        )


@dataclass
class JavaScriptRunner:
    """One task's V8 isolate (:func:`~cdcsync.config.code_transforms.javascript_context`): the task's rows go in as
    JSON text, written like the handler's (:mod:`cdcsync.core.changes_json`), in one call, and come back as JSON."""

    step: PluginStep
    script: str

    def run(self, table: pa.Table) -> pa.Table:
        import orjson

        where = f"script transform '{self.step.id}' (javascript)"
        positions = processed_rows(table)
        if not positions:
            return apply_results(self.step, where, table, [], [], [])
        rows = changes_json.rows(table)
        text = changes_json.dumps([rows[i] for i in positions])
        sent = orjson.loads(text)
        try:
            context = javascript_context(self.script)
        except Exception as error:
            raise ReportedFailure(refused(f"{where}: does not run in the sandbox: {error}")) from None
        base, per_row = JS_RUN_TIMEOUT_S
        try:
            answer = orjson.loads(context.call("__cdcsync_run", text.decode(), timeout_sec=base + per_row * len(sent)))
        except Exception as error:  # the engine's: a timeout, out of memory, a result JSON cannot hold
            raise ReportedFailure(refused(f"{where}: {type(error).__name__}: {error}")) from None
        finally:
            context.close()
        if "failed" in answer:
            given = sent[answer["failed"]]
            thrown = str(answer["error"]).splitlines()
            position = f"{given.get('_cdc_topic')}/{given.get('_cdc_partition')}@{given.get('_cdc_offset')}"
            raise ReportedFailure(
                refused(
                    f"{where}: process threw {thrown[0] if thrown else '?'} (change with key "
                    f"{key_text(self.step, given)}, at {position}); fix the script (transforms.{self.step.id}.script)"
                )
            )
        return apply_results(self.step, where, table, positions, sent, answer["results"])

"""``type: handler`` and ``type: script`` transforms (Streamling's HTTP handler and script transforms): the user's
own code, per change, on the executors (:mod:`cdcsync.transforms.handler`, :mod:`cdcsync.transforms.script`).

Both are planned like plugin transforms (a :class:`~cdcsync.config.plan.PluginStep` run inside the executor pass
of each sink that reads them), and share one contract (docs/transforms.md#handler-and-script-transforms):

* inserts, updates and snapshot reads go to the code; deletes, truncates and key moves pass it untouched;
* the result replaces the change's business columns; a column the result lacks keeps the input's value;
* the key and the ``_cdc_*`` columns pass through: a result that changes one of them fails the batch;
* a change the code drops (``None``, JSON ``null``) comes out as a delete of its key, like a row a SQL
  transform's WHERE rejects, so a mirror holds the code applied to each key's latest change.

A Python script's sandbox is decided here, at validation, on the code's syntax tree (:func:`script_problems`), so
a refusal names the YAML path before Spark starts; the executors run only code that passed it. A JavaScript script
is compiled and its top level run in a V8 isolate (:func:`javascript_context`), which is the sandbox itself.
"""

from __future__ import annotations

import ast
from typing import Any, Literal

from pydantic import Field, field_validator

from cdcsync.config.base import StrictModel, as_key_list
from cdcsync.config.operators import http_headers, http_url

SCRIPT_BUILTINS = (
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "filter", "float", "int", "isinstance", "len",
    "list", "map", "max", "min", "range", "reversed", "round", "set", "sorted", "str", "sum", "tuple", "zip",
    "ArithmeticError", "Exception", "KeyError", "TypeError", "ValueError", "ZeroDivisionError",
)  # fmt: skip
"""The only builtins a script sees (besides ``Decimal``, ``date``, ``datetime``, ``timedelta`` and ``math``)."""

_REFUSED_NAMES = frozenset(
    {"open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "getattr", "setattr",
     "delattr", "hasattr", "type", "object", "super", "breakpoint", "help", "memoryview", "format",
     "classmethod", "staticmethod", "property", "print", "exit", "quit"}
)  # fmt: skip
_REFUSED_ATTRIBUTES = frozenset({"format", "format_map", "mro"})
# Frames, code objects and tracebacks lead back to real globals and builtins: no attribute of theirs is reachable.
_REFUSED_ATTRIBUTE_PREFIXES = ("_", "gi_", "cr_", "ag_", "f_", "co_", "tb_", "func_")


class ScriptTransform(StrictModel):
    """A ``process(input)`` function applied to each change: a dict of the change's columns in, the new columns
    (a dict) or ``None`` (drop it) out."""

    type: Literal["script"]
    from_: str = Field(alias="from", min_length=1)
    language: Literal["python", "javascript", "typescript"]
    script: str = Field(min_length=1)
    primary_key: list[str] | None = None
    """Defaults to the input's; must be among its output columns."""
    schema_overrides: dict[str, str | None] = Field(default_factory=dict)
    """Column -> Postgres type of a column the script adds or retypes; ``null`` removes a column."""

    _normalise_pk = field_validator("primary_key", mode="before")(as_key_list)


class HandlerTransform(StrictModel):
    """Changes POSTed as JSON to ``url``; the rows of the answer replace them."""

    type: Literal["handler"]
    from_: str = Field(alias="from", min_length=1)
    url: str = Field(min_length=1)
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every request; values of secret-looking names are never logged."""
    one_row_per_request: bool = False
    """True: each change is one request (a JSON object); false: batches of ``batch_size`` (a JSON array)."""
    batch_size: int = Field(default=100, gt=0)
    concurrency: int = Field(default=4, gt=0, le=64)
    """Requests in flight at once, per executor task."""
    timeout_s: float = Field(default=10.0, gt=0)
    retry_budget_s: float = Field(default=60.0, ge=0)
    """How long a request failing transiently (connection, timeout, 5xx, 408, 429) is retried with backoff."""
    primary_key: list[str] | None = None
    schema_overrides: dict[str, str | None] = Field(default_factory=dict)
    """Column -> Postgres type of a column the handler adds or retypes; ``null`` removes a column."""

    _normalise_pk = field_validator("primary_key", mode="before")(as_key_list)

    _http_url = field_validator("url")(http_url)
    _http_headers = field_validator("headers")(http_headers)


CodeTransform = HandlerTransform | ScriptTransform
CODE_TRANSFORM_TYPES: dict[str, type[StrictModel]] = {"handler": HandlerTransform, "script": ScriptTransform}


def script_problems(where: str, transform: ScriptTransform) -> list[str]:
    """What keeps ``transform``'s script from running in the sandbox, as ``yaml.path: message`` lines."""
    path = f"{where}.script"
    if transform.language == "typescript":
        return [
            f"{where}.language: 'typescript' is not supported: cdcsync bundles no TypeScript compiler it could run "
            "safely (docs/transforms.md#type-script); compile the function to JavaScript (language: javascript)"
        ]
    if transform.language == "javascript":
        return [f"{path}: {problem}" for problem in javascript_problems(transform.script)]
    try:
        tree = ast.parse(transform.script, filename=path)
    except SyntaxError as error:
        return [f"{path}: line {error.lineno}: {error.msg}"]
    problems = [f"{path}: line {getattr(node, 'lineno', '?')}: {why}" for node, why in _refusals(tree)]
    process = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "process"]
    if not process:
        problems.append(f"{path}: defines no top-level function `def process(input):`")
    elif len(process[0].args.args) != 1 or process[0].args.vararg or process[0].args.kwonlyargs:
        problems.append(f"{path}: line {process[0].lineno}: process takes exactly one argument, the change")
    return problems


def _refusals(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    found: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, "imports are not allowed (Decimal, date, datetime, timedelta and math are there)"))
        elif isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.Yield | ast.YieldFrom | ast.Global):
            found.append((node, f"{type(node).__name__} is not allowed in a script"))
        elif isinstance(node, ast.Name) and (node.id in _REFUSED_NAMES or node.id.startswith("__")):
            found.append((node, f"'{node.id}' is not available in the sandbox"))
        elif isinstance(node, ast.Attribute) and (
            node.attr in _REFUSED_ATTRIBUTES or node.attr.startswith(_REFUSED_ATTRIBUTE_PREFIXES)
        ):
            found.append((node, f"attribute '.{node.attr}' is not allowed (no private, dunder or frame attributes)"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "__" in node.value:
            found.append((node, "strings holding '__' are not allowed (they could name dunder attributes)"))
    return found


def output_problems(
    where: str, inputs: dict[str, str], overrides: dict[str, str | None]
) -> tuple[dict[str, str], list[str]]:
    """The output columns (name -> Postgres type text): the input's, with ``schema_overrides`` applied."""
    problems: list[str] = []
    output = dict(inputs)
    for name, type_text in overrides.items():
        at = f"{where}.schema_overrides.{name}"
        if name.startswith("_cdc_"):
            problems.append(f"{at}: the _cdc_* columns pass through every transform unchanged")
        elif type_text is None:
            if name not in output:
                problems.append(f"{at}: removes '{name}', which its input does not have")
            output.pop(name, None)
        else:
            output[name] = type_text
    return output, problems


JS_ENTRY = """
function __cdcsync_run(text) {
  const rows = JSON.parse(text);
  const out = [];
  for (let i = 0; i < rows.length; i++) {
    let result;
    try {
      result = process(rows[i]);
    } catch (e) {
      return JSON.stringify({failed: i, error: String(e && e.stack ? e.stack : e)});
    }
    out.push(result === undefined ? null : result);
  }
  return JSON.stringify({results: out});
}
"""
"""Defined beside a JavaScript script: runs ``process`` over a task's rows in one call into V8, and returns JSON
text (the results, or where and why ``process`` threw), so no engine object crosses into Python."""
JS_MEMORY_BYTES = 256 * 1024 * 1024
"""V8 heap limit of one script's isolate."""
JS_SETUP_TIMEOUT_S = 5.0
"""How long a script's top-level code may run (at validation and once per task)."""
JS_RUN_TIMEOUT_S = (30.0, 0.01)
"""A task's call of ``process`` over its rows is stopped after this many seconds, plus this many per row."""


def javascript_context(script: str) -> Any:
    """A fresh V8 isolate (mini-racer) holding ``script`` and :data:`JS_ENTRY`: no modules, no network, no files,
    no host objects; raises the engine's error for code that does not compile or throws at top level."""
    from py_mini_racer import MiniRacer

    context = MiniRacer()
    try:
        context.set_hard_memory_limit(JS_MEMORY_BYTES)
        context.eval(script, timeout_sec=JS_SETUP_TIMEOUT_S)
        context.eval(JS_ENTRY, timeout_sec=JS_SETUP_TIMEOUT_S)
    except BaseException:
        context.close()
        raise
    return context


def javascript_problems(script: str) -> list[str]:
    """What keeps a JavaScript script from running: it does not compile or run its top level in the sandbox, or
    defines no ``process`` function."""
    try:
        context = javascript_context(script)
    except ImportError:
        return ["language javascript needs the mini-racer package (pip install mini-racer), a V8 sandbox"]
    except Exception as error:  # the engine's own error kinds: syntax, a throw, a timeout, out of memory
        lines = [line for line in str(error).splitlines() if line.strip()]
        return [f"does not run in the sandbox: {lines[0] if lines else type(error).__name__}"]
    try:
        if context.eval("typeof process", timeout_sec=JS_SETUP_TIMEOUT_S) != "function":
            return ["defines no function `process(input)`"]
    finally:
        context.close()
    return []

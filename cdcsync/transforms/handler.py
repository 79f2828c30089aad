"""``type: handler`` on the executors: changes POSTed as JSON to the user's service, whose answer replaces them.

Each task sends its partition's inserts, updates and snapshot reads (in offset order) as JSON objects, written like
the webhook sink's changes (:mod:`cdcsync.core.changes_json`: business columns then ``_cdc_*``): one object per
request with ``one_row_per_request``, else arrays of up to ``batch_size``, ``concurrency`` requests at a time. The
answer is, per change sent, an object (its new columns; fields it lacks keep their value) or ``null`` (drop the
change: it becomes a delete of its key): a single one, or an array as long as the request's.

Failures are classified where they happen (:mod:`cdcsync.db.http`): a connection failure, a timeout, a 5xx, 408 or
429 is retried with backoff for ``retry_budget_s``, then fails the batch as retriable (an infrastructure fault: the
runtime replays the batch, nothing is dead-lettered); any other 4xx, or an answer that is not what is described
above, stops the run as the user's to fix (exit 2). A replayed batch calls the handler again with the same
changes: the output is only as deterministic as the handler's answers.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync.config.code_transforms import HandlerTransform
from cdcsync.config.plan import PluginStep
from cdcsync.core import changes_json
from cdcsync.core.errors import CdcsyncError, TargetRefused
from cdcsync.core.reports import ReportedFailure, refused, write_failed
from cdcsync.db.http import exchange_json, shown_url
from cdcsync.db.retry import RetryBudget, with_retries
from cdcsync.transforms.code_rows import Result, apply_results, processed_rows

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class HandlerRunner:
    step: PluginStep
    handler: HandlerTransform

    @classmethod
    def build(cls, step: PluginStep) -> HandlerRunner:
        return cls(step, HandlerTransform.model_validate(dict(step.options)))

    @property
    def _where(self) -> str:
        return f"handler transform '{self.step.id}' ({shown_url(self.handler.url)})"

    def run(self, table: pa.Table) -> pa.Table:
        import orjson

        positions = processed_rows(table)
        if not positions:
            return apply_results(self.step, self._where, table, [], [], [])
        rows = changes_json.rows(table)
        size = 1 if self.handler.one_row_per_request else self.handler.batch_size
        parts = [[rows[i] for i in positions[start : start + size]] for start in range(0, len(positions), size)]
        bodies = [changes_json.dumps(part[0] if self.handler.one_row_per_request else part) for part in parts]
        workers = min(self.handler.concurrency, len(bodies))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cdcsync-handler") as pool:
            answers = list(pool.map(self._call, bodies))
        sent: list[dict[str, Any]] = []
        results: list[Result] = []
        for body, answer in zip(bodies, answers, strict=True):
            given = orjson.loads(body)  # what the handler saw, to tell the values it changed from those it echoed
            given = [given] if self.handler.one_row_per_request else given
            sent += given
            results += self._results(answer, len(given))
        return apply_results(self.step, self._where, table, positions, sent, results)

    def _call(self, body: bytes) -> bytes:
        doing = f"{self._where}: POST of {len(body)} bytes"
        try:
            return with_retries(
                lambda: exchange_json(self.handler.url, body, self.handler.headers, self.handler.timeout_s)[1],
                describe=doing,
                budget=RetryBudget(seconds=self.handler.retry_budget_s),
            )
        except TargetRefused as error:
            raise ReportedFailure(refused(f"{doing}: {error.message}")) from None
        except CdcsyncError as error:
            raise ReportedFailure(write_failed(str(error), retriable=error.retriable)) from None

    def _results(self, answer: bytes, count: int) -> list[Result]:
        import orjson

        try:
            document = orjson.loads(answer)
        except orjson.JSONDecodeError:
            text = answer[:200].decode("utf-8", "replace")
            message = f"{self._where}: answered with something that is not JSON: {text!r}"
            raise ReportedFailure(refused(message)) from None
        if self.handler.one_row_per_request:
            document = [document]
        if not isinstance(document, list) or len(document) != count:
            got = f"an array of {len(document)}" if isinstance(document, list) else f"a {type(document).__name__}"
            raise ReportedFailure(
                refused(
                    f"{self._where}: answered {got} for {count} change(s) sent; answer with one object (or null, to "
                    "drop the change) per change sent, in the same order"
                )
            )
        for item in document:
            if item is not None and not isinstance(item, dict):
                raise ReportedFailure(
                    refused(f"{self._where}: answered a {type(item).__name__} for a change: an object or null, please")
                )
        return document

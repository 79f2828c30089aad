"""``cdcsync reset``: a fresh start for a pipeline (or for one sink and the source feeding it).

A fresh start forgets where the pipeline was: each affected source's Spark checkpoint is deleted (its next query
starts from the source's ``starting_offsets``), and the affected sinks' rows in the batch ledger, their
source-position marks and truncate watermarks go. Whatever the sinks hold stays: rows keep their
``_cdc_version``, so the re-read applies only changes newer than what a target has; to rebuild a target from
nothing (a new source database, say), empty it first.

``--sink S`` resets the source feeding S too, since Spark keeps one checkpoint per source: the source's other
sinks then read everything again as well, and the versioned merges make that a no-op for them (their ledger rows
name the old checkpoint, which no batch matches any more).

It holds the pipeline's lock while it works: refused (exit 2, naming the holder) while a run streams the pipeline.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from cdcsync.config.pipeline import Pipeline
from cdcsync.config.settings import Settings, redact_dsn
from cdcsync.core.errors import ServiceError, UserError, first_line
from cdcsync.runtime.lock import PipelineLock
from cdcsync.sql.render import render


@dataclass(frozen=True)
class ResetPlan:
    pipeline: str
    sources: list[str]
    """The sources whose checkpoints go."""
    sinks: list[str]
    """The sinks whose ledger rows, position marks and truncate watermarks go."""
    checkpoints: list[Path]

    def describe(self) -> list[str]:
        lines = [f"checkpoint of source '{s}': {path}" for s, path in zip(self.sources, self.checkpoints, strict=True)]
        lines += [f"batch ledger rows, position marks and truncate watermarks of sink '{sink}'" for sink in self.sinks]
        return lines


@dataclass(frozen=True)
class ResetResult:
    checkpoints_removed: int
    ledger_rows_removed: int


def plan_reset(pipeline: Pipeline, settings: Settings, sink: str | None = None) -> ResetPlan:
    """What a reset of ``pipeline`` (or of ``sink`` and its source) removes; nothing is touched yet."""
    streams = list(pipeline.streams())
    if sink is None:
        sources, sinks = streams, sorted(pipeline.sinks)
    else:
        routed = sorted(sid for sid, s in pipeline.sinks.items() if getattr(s, "routed_from", None) == sink)
        matching = [sink] if sink in pipeline.sinks else routed
        if not matching:
            known = ", ".join(sorted({*pipeline.sinks, *pipeline.routed_sinks})) or "none"
            raise UserError(f"pipeline '{pipeline.name}' has no sink '{sink}' (its sinks: {known})")
        sources = [sid for sid in streams if any(m in pipeline.sinks_of(sid) for m in matching)]
        sinks = matching
    # a backfill's progress goes with its ledger rows: the next run reads its chunks again
    bounded = [sid for sid in pipeline.bounded if sink is None or any(m in pipeline.sinks_of(sid) for m in sinks)]
    checkpoints = [settings.checkpoint_dir(pipeline.name, s) for s in sources]
    checkpoints += [settings.checkpoint_dir(pipeline.name, f"{s}.bounded") for s in bounded]
    return ResetPlan(pipeline.name, [*sources, *(f"{s}.bounded" for s in bounded)], sinks, checkpoints)


def reset(plan: ResetPlan, settings: Settings) -> ResetResult:
    """Carry out ``plan`` under the pipeline's lock: the ledger rows first, in one transaction, then the
    checkpoints (a failure in between leaves the checkpoint ahead of the ledger, which ``run`` refuses and the
    same reset repeated completes)."""
    import psycopg

    with PipelineLock(settings.postgres_dsn, plan.pipeline) as lock:
        lock.acquire()  # a run streaming the pipeline would write over what this removes
        try:
            with psycopg.connect(settings.postgres_dsn, connect_timeout=10) as conn, conn.transaction():
                deleted = 0
                for statement in render("postgres/runtime/reset_sinks.sql.j2").split(";\n"):
                    cursor = conn.execute(statement, {"pipeline": plan.pipeline, "sinks": plan.sinks})
                    deleted += max(cursor.rowcount, 0) if "batch_ledger" in statement else 0
        except psycopg.Error as error:
            raise ServiceError(
                f"pipeline '{plan.pipeline}': clearing its ledger rows in Postgres at "
                f"{redact_dsn(settings.postgres_dsn)}: {first_line(error)}"
            ) from None
        removed = 0
        for path in plan.checkpoints:
            if path.exists():
                shutil.rmtree(path)
                removed += 1
    return ResetResult(removed, deleted)

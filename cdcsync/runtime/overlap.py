"""Merging batch N while batch N+1 is read and staged (``run.overlap_merges``).

Why: a batch's merges run on the driver, one Postgres backend's work (a third of a bare-JSON run's wall time),
while the other core waits; the next batch's read, decode and COPY need both cores. So a source whose sinks are
all Postgres upsert sinks (directly or through SQL transforms, with no dynamic table filled from the source, whose
keys the next batch's transforms would have to see; the tasks reading Kafka themselves) hands its merges to a
thread and returns from ``foreachBatch``; Spark commits the batch and starts the next one, whose tasks stage while
the merges run. Merges stay in batch order, one batch at a time: the next batch waits for them after its staging,
before its own merges start. Stages hold both batches' rows meanwhile, each merge deleting only its own
(:meth:`~cdcsync.sinks.postgres.PostgresUpsertSink.merge`, ``shared_stage``).

Exactly-once holds because Spark's commit of a batch no longer means "merged": before the handler returns, the
checkpoint's marker (:func:`~cdcsync.runtime.checkpoint.mark_unmerged`) names the oldest batch whose merges may not
have run, synced to disk; it is cleared once they ran. A run that starts with a marker deletes that batch's commit
and every later offset entry (:func:`~cdcsync.runtime.checkpoint.rewind_unmerged`), so Spark runs it again from
the same offsets and each sink that had merged it skips it by its ledger, exactly as after a crash between a merge
and Spark's commit. The tasks read Kafka by offset ranges, so a batch can be read again at any time.

A merge that fails on something transient (Postgres restarting; a crash that emptied the UNLOGGED stage) is landed
again, staging and all, by the next batch before its own merges, or at the end of the run; any other failure
stops the run, whose next start runs the batch again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cdcsync.core.errors import CdcsyncError
from cdcsync.engine.batch import SinkOutcome, StagedBatch
from cdcsync.runtime.checkpoint import clear_unmerged, mark_unmerged

log = logging.getLogger(__name__)

Reland = Callable[[tuple[int, ...]], dict[str, SinkOutcome]]
"""Lands a batch again from its offsets (with retries), keeping the staged rows of the batches given."""
OnMerged = Callable[[dict[str, SinkOutcome], int], None]
"""Told each landed batch's outcome and id, on whichever thread landed it."""


class OverlappedMerges:
    """One source's batches, each staged while the one before merges (see the module doc)."""

    def __init__(self, on_merged: OnMerged) -> None:
        self.on_merged = on_merged
        self._merging: MergeInFlight | None = None
        self._checkpoint_dir: Path | None = None

    @property
    def merging(self) -> tuple[int, ...]:
        """The batch whose merges still run, if any: its staged rows stay in the stages."""
        return () if self._merging is None else (self._merging.batch_id,)

    def land(
        self, stage: Callable[[tuple[int, ...]], StagedBatch], reland: Reland, checkpoint_dir: Path
    ) -> dict[str, SinkOutcome] | None:
        """Stage a batch (``stage``, with retries, told the batches whose staged rows stay) while the last one's
        merges run, wait for those, then leave the batch's merges running, named first by the marker in the
        source's checkpoint. None when they run on; the outcome when every sink had the batch.

        Merges that ended before the batch starts are settled first, so that the stages can be truncated: a merge
        that overlaps the next batch deletes its rows instead, which leaves dead rows for later scans to read."""
        if self._merging is not None and self._merging.done:
            self.settle()
        staged = stage(self.merging)
        self.settle(staged_after=(staged.batch_id,) if staged.written else ())
        if not staged.written:
            return staged.merge()
        self._checkpoint_dir = checkpoint_dir
        mark_unmerged(checkpoint_dir, staged.batch_id)
        self._merging = MergeInFlight(staged, reland, self._merged).start()
        return None

    def settle(self, staged_after: tuple[int, ...] = ()) -> None:
        """Wait for the last batch's merges, if they still run, landing it again when they failed on something
        transient (:meth:`MergeInFlight.settle`)."""
        merging, self._merging = self._merging, None
        if merging is not None:
            merging.settle(staged_after)

    def _merged(self, outcome: dict[str, SinkOutcome], batch_id: int) -> None:
        self.on_merged(outcome, batch_id)
        assert self._checkpoint_dir is not None
        clear_unmerged(self._checkpoint_dir)  # every batch Spark committed is merged


@dataclass
class MergeInFlight:
    """One staged batch's merges, running on a thread of their own."""

    batch: StagedBatch
    reland: Reland
    on_merged: OnMerged
    error: BaseException | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def batch_id(self) -> int:
        return self.batch.batch_id

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def start(self) -> MergeInFlight:
        self._thread = threading.Thread(target=self._merge, name=f"cdcsync-merge-{self.batch_id}", daemon=True)
        self._thread.start()
        return self

    def _merge(self) -> None:
        try:
            outcome = self.batch.merge(shared_stage=True)
        except BaseException as error:  # handed to settle(), on the batch's thread
            self.error = error
            return
        self.on_merged(outcome, self.batch_id)

    def settle(self, staged_after: tuple[int, ...] = ()) -> None:
        """Wait for the merges; land the batch again when they failed on something transient (keeping the stages'
        rows of ``staged_after``, staged meanwhile), else raise what they failed on."""
        assert self._thread is not None, "started first"
        self._thread.join()
        error = self.error
        if error is None:
            return
        if not (isinstance(error, CdcsyncError) and error.retriable):
            if isinstance(error, CdcsyncError):
                raise error.add_context(f"merging batch {self.batch_id}")
            raise error
        log.warning("batch %d: its merges failed (%s); landing it again before going on", self.batch_id, error)
        self.on_merged(self.reland(staged_after), self.batch_id)

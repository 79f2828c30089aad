"""One exception root for cdcsync.

Every error raised on purpose is a :class:`CdcsyncError`. It carries:

* ``context``: what was being attempted, outermost first, so the CLI can print
  ``sink 'revenue': merging batch 17 into app.orders_state: connection refused``;
* ``hint``: the next step for the user, when there is one;
* ``user_error``: True when the input (configuration, pipeline, migrations) is at
  fault. The CLI exits 2 for these and never prints a traceback;
* ``retriable``: True for transient faults (connection refused, timeouts,
  serialization failures) that the runtime retries with backoff.

Exit codes are decided only at the CLI edge (:func:`exit_code_for`).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_RUNTIME_FAILURE = 1
EXIT_INVALID_INPUT = 2


class CdcsyncError(Exception):
    """Root of every error cdcsync raises on purpose."""

    user_error: bool = False
    retriable: bool = False

    def __init__(self, message: str, *, hint: str | None = None, retriable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.context: list[str] = []
        if retriable is not None:
            self.retriable = retriable

    def add_context(self, what: str) -> CdcsyncError:
        """Prefix what the caller was doing; returns self so it can be re-raised."""
        self.context.insert(0, what)
        return self

    def __str__(self) -> str:
        return ": ".join([*self.context, self.message])


class UserError(CdcsyncError):
    """The user's input is at fault; fixing it is the way out (exit 2)."""

    user_error = True


class ConfigError(UserError):
    """A pipeline or settings file is invalid; ``problems`` lists every finding with its YAML path."""

    def __init__(self, message: str, problems: list[str] | None = None, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.problems = problems or []

    def __str__(self) -> str:
        head = super().__str__()
        if not self.problems:
            return head
        return head + "\n" + "\n".join(f"  - {p}" for p in self.problems)


class MigrationError(UserError):
    """A migration is missing, pending or was altered after it was applied."""


class DependencyError(UserError):
    """An optional dependency or external tool is missing; the hint says how to install it."""


class PipelineLocked(UserError):
    """Another run of the pipeline holds its lock (:mod:`cdcsync.runtime.lock`); the message names it (exit 2)."""


class CheckpointAheadError(UserError):
    """Spark's checkpoint is past batches a sink's ledger lacks: the target went back in time (a restore, a failover
    to a replica that had not caught up), or the sink was added after the pipeline had run. ``run`` lands nothing
    (exit 2); ``cdcsync rewind PIPELINE --to-ledger`` makes the checkpoint read those batches again."""


class SourceWentBack(UserError):
    """The source's positions went backwards (restored from a backup, replaced): merging would rank its changes
    below what the target already holds."""


class ServiceError(CdcsyncError):
    """A service (Kafka, Postgres, the dev stack) failed or could not be reached."""


class BrokerUnavailable(ServiceError):
    """A Kafka reader (Spark's, or the executors' own) could not reach the brokers: retriable, nothing dead-lettered
    (:mod:`cdcsync.sources.kafka`)."""

    def __init__(self, detail: str, bootstrap: str | None = None) -> None:
        self.detail = detail
        where = f" at {bootstrap}" if bootstrap else ""
        super().__init__(
            f"the Kafka broker{where} did not answer: {detail}",
            hint=(
                "check that the brokers in CDCSYNC__KAFKA__BOOTSTRAP_SERVERS are up and reachable from this host, then "
                "run again: the batch was not committed, nothing was merged or dead-lettered, and the next run "
                "replays it. A longer outage can be ridden out with a larger CDCSYNC__RETRY__BUDGET_S"
            ),
            retriable=True,
        )

    def naming(self, bootstrap: str) -> BrokerUnavailable:
        """The same failure, naming the brokers it could not reach."""
        named = BrokerUnavailable(self.detail, bootstrap)
        named.context = list(self.context)
        return named


class SinkError(CdcsyncError):
    """Writing to a target failed."""


class TargetRefused(UserError):
    """A target answered that what was sent is wrong (an HTTP 4xx other than 408 and 429): sending it again cannot
    help, so the run stops (exit 2) until the sink's configuration or the receiver is fixed; the batch is replayed
    then."""


class DecodeError(CdcsyncError):
    """A message could not be decoded; with ``on_decode_error: fail`` this stops the pipeline."""

    user_error = True


class UndecodableMessage(CdcsyncError):
    """A message could not be decoded and its source says ``on_decode_error: fail``: the run stops (exit 1).

    Not a user error in the contract's sense (exit 2 is for configuration, pipelines and migrations): the input
    at fault is data in Kafka, and the run fails on it at run time.
    """


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its class name when it has none): drivers' multi-line messages
    (hints, server context, Java stack traces) stay readable inside one line of context."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def exit_code_for(error: BaseException) -> int:
    if isinstance(error, CdcsyncError) and error.user_error:
        return EXIT_INVALID_INPUT
    return EXIT_RUNTIME_FAILURE


class NewTopicError(UserError):
    """A ``topic_pattern`` source read a matching topic that ``cdcsync init`` did not know (a source table that
    appeared mid-stream): ``run`` stops before the batch is committed (exit 2), so it is replayed once the new
    table's migration is applied."""

    def __init__(self, *, source_id: str, topic: str, partition: int, offset: int, pipeline_file: str) -> None:
        self.source_id, self.topic, self.partition, self.offset = source_id, topic, partition, offset
        super().__init__(
            f"source '{source_id}' read topic {topic} (partition {partition}, offset {offset}), a new source table "
            "no migration creates a table for",
            hint=(
                f"run `cdcsync init {pipeline_file}` (it writes the next migration, creating that table), review it, "
                f"`cdcsync migrate {pipeline_file}`, then run again: this batch was not committed and is replayed, "
                "nothing is lost"
            ),
        )


class SchemaChangeError(UserError):
    """A source's topic schema gained a column its pipeline lacks, or changed a recorded column's type: ``run``
    stops before the batch is committed (exit 2), so it is replayed once the migration is applied.

    ``fields`` is every column of the new schema with its type (None: the type maps to nothing, ``why`` says
    so), ``added`` the new ones and ``changed`` (name, recorded type, new type) the retyped ones."""

    def __init__(
        self,
        *,
        source_id: str,
        topic: str,
        partition: int,
        offset: int,
        fields: list[tuple[str, str | None, str | None]],
        added: list[str],
        changed: list[tuple[str, str, str]],
        pipeline_file: str = "PIPELINE.yaml",
    ) -> None:
        self.source_id, self.topic, self.partition, self.offset = source_id, topic, partition, offset
        self.fields, self.added, self.changed = fields, added, changed
        types = {name: (type_text, why) for name, type_text, why in fields}
        self.unmapped = [name for name in added if types.get(name, (None, None))[0] is None]
        parts = []
        if added:
            shown = [
                f'"{name}" {types[name][0]}' if name not in self.unmapped else f'"{name}" ({types[name][1]})'
                for name in added
            ]
            parts.append(f"new column(s) {', '.join(shown)}")
        parts += [f'column "{name}" changed type from {old} to {new}' for name, old, new in changed]
        message = f"the schema of topic {topic} changed at partition {partition}, offset {offset}: {'; '.join(parts)}"
        yaml = pipeline_file
        if changed:
            hint = (
                "cdcsync does not change column types itself: alter the target tables with a migration written by "
                f"hand (ALTER TABLE … ALTER COLUMN … TYPE …), declare the new type under sources.{source_id}.columns, "
                f"and run `cdcsync init {yaml}` for the state line that migration needs"
            )
        elif self.unmapped:
            hint = (
                f"declare the type of {', '.join(repr(n) for n in self.unmapped)} under sources.{source_id}.columns, "
                f"then run `cdcsync init {yaml}` and `cdcsync migrate {yaml}`, and run again"
            )
        else:
            hint = (
                f"run `cdcsync init {yaml}` (it writes the next migration, adding the column(s) to every table fed by "
                f"source '{source_id}'), review it, `cdcsync migrate {yaml}`, then run again: this batch was not "
                "committed and is replayed, nothing is lost. Or set schema_evolution: auto on the source"
            )
        super().__init__(message, hint=hint)

    @property
    def additive(self) -> bool:
        """Only new columns, each with a type: what ``schema_evolution: auto`` applies by itself."""
        return bool(self.added) and not self.changed and not self.unmapped

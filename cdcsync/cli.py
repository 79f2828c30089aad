"""The ``cdcsync`` command line. Thin: parse flags, call the layers below, render with Rich.

Results go to stdout; progress, logs and errors to stderr. Exit codes: 0 ok, 1 runtime failure, 2 invalid input.
A user error prints one clean line (plus a hint); ``--debug`` adds the traceback for bug reports.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cdcsync import __version__
from cdcsync.config.load import load_pipeline
from cdcsync.config.pipeline import Pipeline, RoutedClickHouseSink, RoutedPostgresSink
from cdcsync.config.settings import Settings, load_settings
from cdcsync.core.errors import CdcsyncError, exit_code_for

app = typer.Typer(
    name="cdcsync",
    help="Debezium changelogs from Kafka through Spark into Postgres mirrors, Postgres aggregation tables and "
    "ClickHouse tables, each change applied exactly once. Exit codes: 0 ok, 1 runtime failure, 2 invalid input.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
dev_app = typer.Typer(
    help="Local services for demos and tests (Postgres, Kafka, a schema registry, ClickHouse; Debezium on request), "
    "as plain processes on 127.0.0.1; no Docker needed.",
    no_args_is_help=True,
)
app.add_typer(dev_app, name="dev")
dead_letters_app = typer.Typer(
    help="Messages that could not be decoded (sources with on_decode_error: dlq): list them, or apply them once "
    "the configuration is fixed.",
    no_args_is_help=True,
)
app.add_typer(dead_letters_app, name="dead-letters")

out = Console()
err = Console(stderr=True)
_state: dict[str, Any] = {"debug": False}

F = TypeVar("F", bound=Callable[..., Any])

PipelineArg = Annotated[Path, typer.Argument(help="Pipeline YAML file.", show_default=False)]
MigrationsDirOpt = Annotated[
    Path | None,
    typer.Option("--migrations-dir", help="Where migrations live (CDCSYNC__MIGRATIONS_DIR; default ./migrations)."),
]


def _version(value: bool) -> None:
    if value:
        out.print(f"cdcsync {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")] = False,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", help="Checkpoints and dev-stack data (CDCSYNC__STATE_DIR; default ./.cdcsync)."),
    ] = None,
) -> None:
    _state["debug"] = debug
    _state["state_dir"] = state_dir
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # py4j logs every exception raised in a foreachBatch callback with its traceback; cdcsync reports it itself.
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.INFO if debug else logging.CRITICAL)


def handles_errors(command: F) -> F:
    """Turn CdcsyncErrors into one clean line and the contract's exit code."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except CdcsyncError as error:
            if _state["debug"]:
                err.print_exception(show_locals=False)
            err.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, markup=True, soft_wrap=True)
            if error.hint:
                err.print(f"[dim]hint:[/] {escape(error.hint)}", highlight=False, soft_wrap=True)
            raise typer.Exit(exit_code_for(error)) from None

    return wrapper  # type: ignore[return-value]


def _settings(migrations_dir: Path | None = None) -> Settings:
    return load_settings(migrations_dir=migrations_dir, state_dir=_state.get("state_dir"))


def _pipeline(path: Path, settings: Settings) -> Pipeline:
    """The pipeline, its sources' columns completed from what the migrations recorded (no registry, no Kafka)."""
    from cdcsync.migrations import recorded_lookup

    return load_pipeline(path, recorded_lookup(settings.migrations_dir))


# ------------------------------------------------------------------------------------------------ validate


@app.command()
@handles_errors
def validate(pipeline_file: PipelineArg, migrations_dir: MigrationsDirOpt = None) -> None:
    """Check a pipeline file, reporting every problem with its YAML path (exit 2 when invalid).

    Offline: columns come from the file and from what `cdcsync init` recorded in the migrations.
    """
    pipeline = _pipeline(pipeline_file, _settings(migrations_dir))
    tables = sum(len(route) for route in pipeline.routes.values())
    bounded_alone = [plan for plan in pipeline.bounded.values() if not plan.streams]
    sinks = len([s for s in pipeline.sinks.values() if not isinstance(s, RoutedPostgresSink | RoutedClickHouseSink)])
    out.print(
        f"{pipeline_file}: ok — pipeline '{pipeline.name}', "
        f"{len(pipeline.streams()) + len(pipeline.plan.plugin_sources) + len(bounded_alone)} source(s), "
        f"{sinks + len(pipeline.routed_sinks)} sink(s)" + (f", {tables} routed table(s)" if pipeline.routes else ""),
        highlight=False,
    )


# ------------------------------------------------------------------------------------------------ migrations


@app.command()
@handles_errors
def init(pipeline_file: PipelineArg, migrations_dir: MigrationsDirOpt = None) -> None:
    """Read the sources' columns and render the DDL into the next numbered migration file(s), for review.

    Columns come from each topic's schema (the schema registry for Avro, the newest messages for JSON); declared
    `columns:` override them. Only what is new gets a file; destructive changes are refused (exit 2).
    """
    from cdcsync import migrations
    from cdcsync.sources.introspect import init_lookup, truncate_note

    settings = _settings(migrations_dir)
    notes: list[str] = []
    try:
        pipeline = load_pipeline(pipeline_file, init_lookup(settings, settings.migrations_dir, notes))
    finally:
        for note in notes:
            err.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    up_to_date = True
    for target in migrations.TARGETS:
        result = migrations.init(target, pipeline, settings.migrations_dir)
        if target.used_by(pipeline):
            out.print(result.summary(), highlight=False)
        up_to_date = up_to_date and result.up_to_date
    if not up_to_date:
        out.print(f"review them, then apply with `cdcsync migrate {pipeline_file}` (or psql -f)", highlight=False)
        truncates = truncate_note(pipeline)
        if truncates:
            err.print(f"[yellow]note:[/] {escape(truncates)}", highlight=False, soft_wrap=True)


@app.command()
@handles_errors
def migrate(
    pipeline_file: PipelineArg,
    migrations_dir: MigrationsDirOpt = None,
    status: Annotated[bool, typer.Option("--status", help="List migrations and their state; apply nothing.")] = False,
) -> None:
    """Apply pending migrations to Postgres and, for ClickHouse and Delta sinks, to ClickHouse and Delta tables.

    For development and demos; a DBA may apply the same files with psql / clickhouse-client / spark-sql instead.
    """
    from contextlib import ExitStack

    from cdcsync import migrations

    settings = _settings(migrations_dir)
    pipeline = _pipeline(pipeline_file, settings)
    with ExitStack() as stack:
        targets = [t for t in migrations.TARGETS if t.used_by(pipeline)]
        if not status and migrations.DELTA in targets:  # Delta's DDL runs on Spark (its ledger is in Postgres)
            from cdcsync.runtime.spark import build_spark_session

            err.print(f"starting Spark to apply the Delta migrations of pipeline '{pipeline.name}' …", highlight=False)
            stack.callback(build_spark_session(settings, app_name=f"cdcsync-{pipeline.name}-migrate").stop)
        connections = [(target, stack.enter_context(target.connect(settings))) for target in targets]
        if status:
            table = Table("migration", "state")
            for target, connection in connections:
                for item in migrations.status(target, connection, pipeline.name, settings.migrations_dir):
                    colour = {"applied": "green", "pending": "yellow", "altered": "red"}[item.state]
                    table.add_row(str(item.path), f"[{colour}]{item.state}[/]")
            out.print(table)
            return
        applied = [
            item
            for target, connection in connections
            for item in migrations.apply_pending(target, connection, pipeline.name, settings.migrations_dir)
        ]
    if not applied:
        out.print("nothing to apply; the database is up to date")
    for item in applied:
        out.print(f"applied {item.path}", highlight=False)


def _connect(settings: Settings) -> Any:
    from cdcsync.db.postgres import connect_from_settings

    return connect_from_settings(settings)


def _check_targets(pipeline: Pipeline, settings: Settings, pipeline_file: Path) -> None:
    """Refuse (exit 2) a target database that lacks a migration, or a ClickHouse table unlike the pipeline's."""
    from cdcsync import migrations
    from cdcsync.sinks.clickhouse import startup_check

    with _connect(settings) as conn:
        migrations.check_ready(
            migrations.POSTGRES,
            conn,
            pipeline.name,
            settings.migrations_dir,
            pipeline_file=pipeline_file,
            pipeline=pipeline,
        )
        if migrations.DELTA.used_by(pipeline):  # their ledger is in Postgres; the tables are checked once Spark runs
            migrations.check_ready(
                migrations.DELTA,
                migrations.delta.DeltaConnection(conn, None),
                pipeline.name,
                settings.migrations_dir,
                pipeline_file=pipeline_file,
                pipeline=pipeline,
            )
    startup_check(pipeline, settings, pipeline_file=pipeline_file)  # ClickHouse sinks only


# ------------------------------------------------------------------------------------------------ run


@app.command()
@handles_errors
def run(
    pipeline_file: PipelineArg,
    available_now: Annotated[
        bool, typer.Option("--available-now", help="Drain what is in Kafka now, then exit 0.")
    ] = False,
    migrations_dir: MigrationsDirOpt = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="If another run of this pipeline holds its lock, wait for it to end.")
    ] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Serve Prometheus metrics on /metrics and health on /healthz at this port (CDCSYNC__METRICS__PORT).",
        ),
    ] = None,
) -> None:
    """Stream the pipeline from Kafka into its targets, each change exactly once.

    Bounded sources and the bounded phases of hybrid sources are read first, chunk by chunk (a rerun continues
    where a run stopped); with job_mode: true or CDCSYNC__JOB_MODE=true the run then exits 0 instead of streaming.
    Refuses to start (exit 2) while a migration is pending or altered. Ctrl-C (or SIGTERM) finishes the current
    batch and exits 0; a batch that takes longer than run.stop_timeout_s (25 s) is left for the next run (exit 1).
    One run per pipeline: a second one exits 2 naming the run that holds the pipeline's lock, or
    waits for it with --wait.
    """
    from cdcsync.runtime.bounded import job_mode, plan_before_spark
    from cdcsync.runtime.live import ProgressView
    from cdcsync.runtime.metrics import RunTelemetry
    from cdcsync.runtime.spark import build_spark_session
    from cdcsync.runtime.stream import PipelineRunner
    from cdcsync.sources.kafka import check_kafka_reachable

    settings = _settings(migrations_dir)
    pipeline = _pipeline(pipeline_file, settings)
    _check_targets(pipeline, settings, pipeline_file)
    if job_mode(pipeline, settings):  # refused (exit 2) when a source only streams
        err.print("job mode: the run ends after the bounded phases", highlight=False)

    missing = check_kafka_reachable(settings, [s.topic for s in pipeline.streams().values() if s.topic is not None])
    for topic in missing:
        err.print(f"[yellow]warning:[/] topic '{topic}' does not exist yet; nothing to read from it", highlight=False)

    runner = PipelineRunner(pipeline, settings, available_now=available_now, wait_for_lock=wait)
    runner.install_signal_handlers()
    telemetry = RunTelemetry(settings.metrics, runner.snapshot, runner.health, port=metrics_port)
    with runner.locked(), telemetry:  # before Spark starts: a second runner is refused (or waits) at once
        runner.check_ledger()  # a checkpoint past what a sink holds is refused before Spark starts too
        plan_before_spark(pipeline, settings)  # the bounded phases' tables: planned, or refused, before Spark too
        err.print(f"starting Spark for pipeline '{pipeline.name}' …", highlight=False)
        spark = build_spark_session(settings, app_name=f"cdcsync-{pipeline.name}")
        try:
            with ProgressView(err) as view:
                snapshot = runner.run(spark, on_progress=view.update)
        finally:
            spark.stop()
    for sink_id, stats in snapshot.sinks.items():
        out.print(
            f"sink {escape(sink_id)} -> {escape(snapshot.sink_targets[sink_id])}: {stats.batches} batch(es), "
            f"{stats.rows_out:,} change(s) applied",
            highlight=False,
        )
    for source_id, source_stats in snapshot.sources.items():
        if source_stats.dead_letters:
            out.print(
                f"source {source_id}: {source_stats.dead_letters} message(s) sent to cdcsync.dead_letters "
                f"(fix the configuration, then `cdcsync dead-letters replay {pipeline_file}`)",
                highlight=False,
            )


# ------------------------------------------------------------------------------------------------ status


@app.command()
@handles_errors
def status(
    pipeline_file: PipelineArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the same facts as one JSON document.")] = False,
) -> None:
    """Show lag per partition, the last committed batch and row counts per sink (read-only, safe while running).

    Also names the run holding the pipeline's lock (pid, host, since when), if one is streaming it now.
    """
    from cdcsync.runtime.status import pipeline_status

    settings = _settings()
    pipeline = _pipeline(pipeline_file, settings)
    report = pipeline_status(pipeline, settings)
    if as_json:
        import json

        typer.echo(json.dumps(report.to_json(pipeline.name), indent=2))
        return
    lag = Table("source", "topic/partition", "processed up to", "end offset", "lag")
    for row in report.partitions:
        lag.add_row(
            Text(row.source), Text(f"{row.topic}/{row.partition}"), str(row.committed), str(row.end), f"{row.lag:,}"
        )
    out.print(lag)
    sinks = Table("sink", "target", "last batch", "committed at", "rows")
    for sink in report.sinks:
        committed = sink.committed_at.strftime("%Y-%m-%d %H:%M:%S %Z") if sink.committed_at else "-"
        last_batch = "-" if sink.last_batch is None else str(sink.last_batch)
        target = sink.target if sink.version is None else f"{sink.target} (version {sink.version})"
        rows = "-" if sink.rows < 0 else f"{sink.rows:,}"
        sinks.add_row(Text(sink.sink), Text(target), last_batch, committed, rows)
    out.print(sinks)
    if report.bounded:
        bounded = Table("bounded source", "phase", "chunks landed")
        for phase in report.bounded:
            of = "not planned yet" if phase.chunks is None else f"{phase.chunks_done:,} of {phase.chunks:,}"
            bounded.add_row(Text(phase.source), Text(phase.phase), of)
        out.print(bounded)
    if report.dead_letters:
        out.print(
            f"dead letters: {report.dead_letters} message(s) in cdcsync.dead_letters, {report.dead_letter_keys} key(s) "
            "whose target rows may be stale or missing until they are applied",
            highlight=False,
        )
    running = f"{report.running.describe()} holds the pipeline's lock" if report.running else "none"
    out.print(f"running: {running}", highlight=False)


# ------------------------------------------------------------------------------------------------ plugins


@app.command()
@handles_errors
def plugins() -> None:
    """List the installed plugin operators (entry-point group `cdcsync.plugins`) and how a pipeline names them.

    A pipeline names one as `type: <namespace>.<operator>` with its `options:` (docs/plugins.md). Plugins that
    cannot be loaded are listed with the reason.
    """
    from cdcsync.config.plugins import installed

    registry = installed()
    table = Table("type", "kind", "package", "what it does")
    for op_id, found in sorted(registry.operators.items()):
        table.add_row(Text(op_id), found.kind[:-1], Text(f"{found.distribution} {found.version}"), Text(found.summary))
    if registry.operators:
        out.print(table)
    else:
        out.print("no plugins installed (entry-point group cdcsync.plugins)", highlight=False)
    for problem in registry.problems:
        err.print(f"[yellow]warning:[/] {escape(problem)}", highlight=False)


# ------------------------------------------------------------------------------------------------ rewind


@app.command()
@handles_errors
def rewind(
    pipeline_file: PipelineArg,
    to_ledger: Annotated[
        bool,
        typer.Option("--to-ledger", help="Rewind each source's checkpoint to the last batch every sink has landed."),
    ] = False,
    migrations_dir: MigrationsDirOpt = None,
) -> None:
    """Make the checkpoints read again the batches a sink lacks: the target went back in time (restored from a
    backup, failed over to a replica), or a sink was added after the pipeline had run.

    Rewrites each such source's checkpoint so its next batch starts after the last batch every sink has in the
    ledger (for a sink with none, at the source's start offsets). Sinks that have the re-read changes apply them
    again, idempotently. Holds the pipeline's lock: refused (exit 2) while a run streams it.
    """
    from cdcsync.core.errors import UserError
    from cdcsync.runtime.checkpoint import rewind_to_ledger
    from cdcsync.runtime.lock import PipelineLock

    if not to_ledger:
        raise UserError("say where to rewind to", hint=f"cdcsync rewind {pipeline_file} --to-ledger")
    settings = _settings(migrations_dir)
    pipeline = _pipeline(pipeline_file, settings)
    with PipelineLock(settings.postgres_dsn, pipeline.name) as lock:
        lock.acquire()  # a running query would write over the checkpoint
        with _connect(settings) as conn:
            rewound = rewind_to_ledger(conn, pipeline, settings)
    if not rewound:
        out.print("nothing to rewind: every sink has every batch its source's checkpoint committed")
    for done in rewound:
        where = "its start offsets" if done.to_batch < 0 else f"the end of batch {done.to_batch}"
        out.print(
            f"source {escape(done.source)}: checkpoint rewound from batch {done.from_batch} to {done.to_batch}; "
            f"the next run reads again from {where}",
            highlight=False,
        )


# ------------------------------------------------------------------------------------------------ reset


@app.command()
@handles_errors
def reset(
    pipeline_file: PipelineArg,
    sink: Annotated[
        str | None, typer.Option("--sink", help="Reset only this sink (and the checkpoint of its source).")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    migrations_dir: MigrationsDirOpt = None,
) -> None:
    """Start afresh: delete the checkpoints and the batch ledger rows, so the next run reads the sources again.

    Target tables are left as they are (the versioned merges apply only newer changes). Asks first; refused
    (exit 2) while a run streams the pipeline.
    """
    from cdcsync.core.errors import UserError
    from cdcsync.runtime.reset import plan_reset
    from cdcsync.runtime.reset import reset as reset_pipeline

    settings = _settings(migrations_dir)
    pipeline = _pipeline(pipeline_file, settings)
    plan = plan_reset(pipeline, settings, sink)
    err.print(f"this removes, for pipeline '{escape(pipeline.name)}':", highlight=False)
    for line in plan.describe():
        err.print(f"  {escape(line)}", highlight=False)
    if not yes:
        if not sys.stdin.isatty():
            raise UserError("reset needs a confirmation", hint="run it on a terminal, or pass --yes")
        if not typer.confirm("reset?", default=False, err=True):
            raise typer.Exit(1)
    result = reset_pipeline(plan, settings)
    out.print(
        f"reset: {result.checkpoints_removed} checkpoint(s) and {result.ledger_rows_removed} ledger row(s) removed; "
        "the next run reads the sources from their starting offsets",
        highlight=False,
    )


# ------------------------------------------------------------------------------------------------ dead letters


@dead_letters_app.command("list")
@handles_errors
def dead_letters_list(pipeline_file: PipelineArg) -> None:
    """List the pipeline's dead letters: where each message is in Kafka, when it failed and why."""
    from cdcsync.db.dead_letters import read_dead_letters

    settings = _settings()
    pipeline = _pipeline(pipeline_file, settings)
    letters = read_dead_letters(settings.postgres_dsn, pipeline.name)
    table = Table("source", "topic/partition@offset", "failed at", "reason")
    for letter in letters:
        failed_at = letter.failed_at.strftime("%Y-%m-%d %H:%M:%S %Z")
        table.add_row(Text(letter.source), Text(letter.where), failed_at, Text(letter.reason))
    out.print(table)
    out.print(f"{len(letters)} dead letter(s)", highlight=False)


@dead_letters_app.command("replay")
@handles_errors
def dead_letters_replay(pipeline_file: PipelineArg, migrations_dir: MigrationsDirOpt = None) -> None:
    """Decode the dead letters again with the pipeline as it is now and apply those that decode to every sink,
    exactly once and by version, then remove them; the others stay, with the reason they fail with now.

    Run it after fixing the configuration. It takes the pipeline's lock: it exits 2 while a run streams the pipeline.
    """
    from cdcsync.runtime.replay import replay_dead_letters
    from cdcsync.runtime.spark import build_spark_session

    settings = _settings(migrations_dir)
    pipeline = _pipeline(pipeline_file, settings)
    _check_targets(pipeline, settings, pipeline_file)
    started: list[Any] = []

    def start_spark() -> Any:
        err.print(f"starting Spark for pipeline '{pipeline.name}' …", highlight=False)
        started.append(build_spark_session(settings, app_name=f"cdcsync-{pipeline.name}-replay"))
        return started[0]

    try:
        results = replay_dead_letters(pipeline, settings, start_spark, str(pipeline_file))
    finally:
        for spark in started:
            spark.stop()
    if not results:
        out.print("no dead letters", highlight=False)
    for result in results:
        out.print(
            f"source {escape(result.source)}: {result.applied} dead letter(s) applied and removed, "
            f"{len(result.still_failing)} still failing",
            highlight=False,
        )
        for letter, reason in result.still_failing[:10]:
            out.print(f"  {escape(letter.where)}: {escape(reason)}", highlight=False)


# ------------------------------------------------------------------------------------------------ dev stack


def _devstack_config() -> Any:
    from cdcsync.devstack import DevStackConfig

    settings = _settings()
    return DevStackConfig(state_dir=settings.state_dir.resolve(), **settings.devstack.model_dump())


def _print_stack_status(status: Any) -> None:
    table = Table("service", "state", "pid", "address", "log")
    for name, info in status.items():
        colour = "green" if info.running else "red"
        table.add_row(name, f"[{colour}]{info.state}[/]", str(info.pid or "-"), info.address, str(info.log_file))
    out.print(table)


@dev_app.command("up")
@handles_errors
def dev_up(
    with_debezium: Annotated[
        bool,
        typer.Option(
            "--with-debezium",
            help="Also run Kafka Connect with the Debezium Postgres connector, capturing database cdcsync_source "
            "(JSON; Avro in the Confluent wire format with CDCSYNC__DEVSTACK__DEBEZIUM_FORMAT=avro).",
        ),
    ] = False,
    spark_workers: Annotated[
        int,
        typer.Option(
            "--spark-workers",
            min=0,
            help="Also run a Spark standalone master and N workers (pyspark's own); run pipelines on it with "
            "CDCSYNC__SPARK__MASTER=spark://127.0.0.1:17077 (see `cdcsync dev env`).",
        ),
    ] = 0,
) -> None:
    """Start the dev services that are not running and wait until all accept connections (safe to repeat)."""
    from cdcsync.devstack import up

    err.print("starting the dev stack (the first run downloads the JVM services from Maven Central) …")
    _print_stack_status(up(_devstack_config(), with_debezium=with_debezium, spark_workers=spark_workers))


@dev_app.command("down")
@handles_errors
def dev_down() -> None:
    """Stop the services `dev up` started (by their recorded pids)."""
    from cdcsync.devstack import down

    down(_devstack_config())
    out.print("dev stack stopped")


@dev_app.command("status")
@handles_errors
def dev_status() -> None:
    """Show whether each dev service is running, with its pid, address and log file."""
    from cdcsync.devstack import status as stack_status

    _print_stack_status(stack_status(_devstack_config()))


@dev_app.command("env")
@handles_errors
def dev_env() -> None:
    """Print `export` lines pointing cdcsync (and you) at the dev stack: eval "$(cdcsync dev env)"."""
    from cdcsync.devstack import env_lines

    for line in env_lines(_devstack_config()):
        typer.echo(line)


def main() -> None:
    app()

"""Prometheus metrics and a health endpoint for ``cdcsync run`` (``--metrics-port``, ``CDCSYNC__METRICS__PORT``).

Nothing here counts rows itself: every figure is one the run already keeps on the driver for its live view
(:class:`~cdcsync.runtime.progress.RunSnapshot`: Spark's progress for the rows read and the lag, the staging
tasks' row counts and the merges' results for the sinks), read when a scraper asks. So a scrape costs no pass over
the data and cannot disagree with what ``run`` prints at its end.

Labels follow Streamling's: ``pipeline``, ``id`` (the source's or sink's key in the YAML), ``topology_node_type``
(``source`` or ``sink``) and ``operator_type`` (``kafka``, ``postgres``, ``postgres_aggregate``, ``clickhouse``);
lag adds ``topic`` and ``partition``. No label or value ever holds a setting, so no DSN or password can leak here.

``/healthz`` answers 200 while the run streams (its queries are active, nothing failed, no stop was asked, and the
supervising loop is alive) and 503 otherwise, with a JSON body giving the reason and the last batch's age. With
``metrics.max_batch_age_s`` set, a last batch older than that is unhealthy too (off by default: a quiet topic runs
no batches at all).

With ``metrics.otlp_endpoint`` set (and the ``otlp`` extra installed), the same counters and gauges are also
pushed over OTLP/HTTP by opentelemetry-sdk; the histograms are Prometheus-only.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import ServiceError, UserError

if TYPE_CHECKING:
    from cdcsync.config.settings import MetricsSettings
    from cdcsync.runtime.progress import RunSnapshot

log = logging.getLogger(__name__)

BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, math.inf)
"""Upper bounds (seconds) of the batch and merge duration histograms."""
PREFIX = "cdcsync_"


@dataclass
class Durations:
    """A fixed-bucket histogram of durations, kept by the batch handler and read by scrapes."""

    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        for index, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.counts[index] += 1
                break
        self.total += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs as Prometheus wants them: counts of observations at or below each bound."""
        running, pairs = 0, []
        for bound, count in zip(BUCKETS, self.counts, strict=True):
            running += count
            pairs.append(("+Inf" if math.isinf(bound) else repr(bound), float(running)))
        return pairs


@dataclass(frozen=True)
class Health:
    healthy: bool
    reason: str
    last_batch_age_s: float | None

    def body(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.healthy else "unhealthy",
            "reason": self.reason,
            "last_batch_age_seconds": None if self.last_batch_age_s is None else round(self.last_batch_age_s, 3),
        }


METRICS: dict[str, tuple[str, str]] = {
    "source_batches": ("counter", "Micro-batches the source landed in all its sinks"),
    "source_changes_in": ("counter", "Kafka messages the source's query read (Spark's progress)"),
    "source_dead_letters": ("counter", "Messages sent to cdcsync.dead_letters"),
    "source_lag": ("gauge", "Messages in the partition not yet processed, at the query's last progress"),
    "sink_batches": ("counter", "Micro-batches that reached the sink (landed or skipped)"),
    "sink_skipped_batches": ("counter", "Replayed micro-batches the ledger skipped"),
    "sink_rows_staged": ("counter", "Changes the executors staged for the sink"),
    "sink_rows_merged": ("counter", "Rows the merges wrote to the target"),
}
"""Name (without :data:`PREFIX`) -> (kind, help) of every counter and gauge."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _source_labels(pipeline: str, source_id: str) -> dict[str, str]:
    return {"pipeline": pipeline, "id": source_id, "topology_node_type": "source", "operator_type": "kafka"}


def _sink_labels(pipeline: str, sink_id: str, operator_type: str) -> dict[str, str]:
    return {"pipeline": pipeline, "id": sink_id, "topology_node_type": "sink", "operator_type": operator_type}


def samples(snapshot: RunSnapshot) -> list[Sample]:
    """Every counter and gauge of a snapshot (histograms: :func:`histograms`)."""
    found: list[Sample] = []
    for source_id, stats in snapshot.sources.items():
        labels = _source_labels(snapshot.pipeline, source_id)
        found += [
            Sample("source_batches", labels, stats.batches),
            Sample("source_changes_in", labels, stats.rows_in),
            Sample("source_dead_letters", labels, stats.dead_letters),
        ]
        for where, lag in sorted(stats.lag.items()):
            topic, partition = where.rsplit("/", 1)
            found.append(Sample("source_lag", {**labels, "topic": topic, "partition": partition}, lag))
    for sink_id, sink_stats in snapshot.sinks.items():
        labels = _sink_labels(snapshot.pipeline, sink_id, snapshot.sink_types.get(sink_id, "postgres"))
        found += [
            Sample("sink_batches", labels, sink_stats.batches),
            Sample("sink_skipped_batches", labels, sink_stats.skipped_batches),
            Sample("sink_rows_staged", labels, sink_stats.rows_in),
            Sample("sink_rows_merged", labels, sink_stats.rows_out),
        ]
    return found


def histograms(snapshot: RunSnapshot) -> list[tuple[str, str, dict[str, str], Durations]]:
    """(name, help, labels, durations) of every histogram of a snapshot."""
    found = [
        (
            "source_batch_duration_seconds",
            "Wall time of a micro-batch: decode, stage and merge into every sink",
            _source_labels(snapshot.pipeline, source_id),
            stats.durations,
        )
        for source_id, stats in snapshot.sources.items()
    ]
    found += [
        (
            "sink_merge_duration_seconds",
            "Wall time of the driver's merge and ledger row of one batch",
            _sink_labels(snapshot.pipeline, sink_id, snapshot.sink_types.get(sink_id, "postgres")),
            sink_stats.merge_durations,
        )
        for sink_id, sink_stats in snapshot.sinks.items()
    ]
    return found


class RunCollector:
    """A prometheus-client collector reading the run's snapshot at each scrape."""

    def __init__(self, snapshot: Callable[[], RunSnapshot], health: Callable[[], Health]) -> None:
        self.snapshot = snapshot
        self.health = health

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        snapshot = self.snapshot()
        families: dict[str, Any] = {}
        for sample in samples(snapshot):
            family = families.get(sample.name)
            if family is None:
                kind, help_text = METRICS[sample.name]
                make = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                family = families[sample.name] = make(PREFIX + sample.name, help_text, labels=list(sample.labels))
            family.add_metric(list(sample.labels.values()), sample.value)
        yield from families.values()
        by_name: dict[str, Any] = {}
        for name, help_text, labels, durations in histograms(snapshot):
            family = by_name.get(name)
            if family is None:
                family = by_name[name] = HistogramMetricFamily(PREFIX + name, help_text, labels=list(labels))
            family.add_metric(list(labels.values()), durations.cumulative(), durations.total)
        yield from by_name.values()
        health = self.health()
        up = GaugeMetricFamily(PREFIX + "up", "1 while the run streams (what /healthz says)", labels=["pipeline"])
        up.add_metric([snapshot.pipeline], 1.0 if health.healthy else 0.0)
        yield up
        if health.last_batch_age_s is not None:
            age = GaugeMetricFamily(
                PREFIX + "last_batch_age_seconds", "Seconds since a batch last landed", labels=["pipeline"]
            )
            age.add_metric([snapshot.pipeline], health.last_batch_age_s)
            yield age


class MetricsServer:
    """``/metrics`` (Prometheus text format) and ``/healthz`` on one port, served from a daemon thread."""

    def __init__(self, collector: RunCollector, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.collector = collector
        try:
            self._server = ThreadingHTTPServer((host, port), self._handler())
        except OSError as error:
            raise UserError(
                f"serving metrics on {host}:{port}: {error.strerror or error}",
                hint="choose another port with --metrics-port (or CDCSYNC__METRICS__PORT)",
            ) from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="cdcsync-metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(server.registry))
                elif path == "/healthz":
                    health = server.collector.health()
                    body = json.dumps(health.body()).encode()
                    self._send(200 if health.healthy else 503, "application/json", body)
                else:
                    self._send(404, "text/plain", b"not found: try /metrics or /healthz\n")

            def _send(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
                log.debug("metrics: " + format, *args)

        return Handler


class OtlpExport:
    """Pushes :func:`samples` over OTLP/HTTP every ``interval_s`` through opentelemetry-sdk (optional extra)."""

    def __init__(self, snapshot: Callable[[], RunSnapshot], endpoint: str, interval_s: float) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.metrics import CallbackOptions, Observation
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
        except ImportError:
            raise UserError(
                "metrics.otlp_endpoint is set, but opentelemetry-sdk is not installed",
                hint="pip install 'cdcsync[otlp]'",
            ) from None
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=endpoint), export_interval_millis=int(interval_s * 1000)
        )
        self.provider = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "cdcsync"}))
        meter = self.provider.get_meter("cdcsync")

        def callback(name: str) -> Callable[[CallbackOptions], list[Any]]:
            def observe(_options: CallbackOptions) -> list[Any]:
                return [Observation(s.value, s.labels) for s in samples(snapshot()) if s.name == name]

            return observe

        for name, (kind, help_text) in METRICS.items():
            create = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
            create(PREFIX + name, callbacks=[callback(name)], description=help_text)

    def stop(self) -> None:
        try:
            self.provider.shutdown()  # exports once more
        except Exception as error:  # an unreachable collector must not turn a clean stop into a failure
            log.warning("metrics: the last OTLP export failed: %s", ServiceError(str(error)))


class RunTelemetry:
    """What ``run`` serves while it streams: the Prometheus server and, when configured, the OTLP export."""

    def __init__(
        self,
        settings: MetricsSettings,
        snapshot: Callable[[], RunSnapshot],
        health: Callable[[], Health],
        port: int | None = None,
    ) -> None:
        self.port = settings.port if port is None else port
        self.server = (
            MetricsServer(RunCollector(snapshot, health), settings.host, self.port) if self.port is not None else None
        )
        self.otlp = (
            OtlpExport(snapshot, settings.otlp_endpoint, settings.otlp_interval_s) if settings.otlp_endpoint else None
        )

    def __enter__(self) -> RunTelemetry:
        if self.server is not None:
            self.server.start()
            log.warning("serving metrics on port %d: /metrics and /healthz", self.server.port)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.server is not None:
            self.server.stop()
        if self.otlp is not None:
            self.otlp.stop()

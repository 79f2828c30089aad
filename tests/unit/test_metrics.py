"""The run's metrics and health endpoint, scraped over HTTP from a snapshot (no Spark, no services)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from cdcsync.runtime.metrics import Durations, Health, MetricsServer, RunCollector
from cdcsync.runtime.progress import RunSnapshot, SinkStats, SourceStats


def _snapshot() -> RunSnapshot:
    source = SourceStats(batches=3, rows_in=1200, dead_letters=2, lag={"shop.orders/0": 7, "shop.orders/1": 0})
    source.durations.observe(0.3)
    source.durations.observe(4.0)
    mirror = SinkStats(rows_in=1198, rows_out=1100, batches=3, skipped_batches=1)
    mirror.merge_durations.observe(0.07)
    return RunSnapshot(
        pipeline="shop",
        sources={"orders": source},
        sinks={"mirror": mirror},
        sink_targets={"mirror": "app.orders"},
        elapsed=10.0,
        sink_types={"mirror": "postgres_aggregate"},
    )


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_durations_are_cumulative_per_bucket() -> None:
    durations = Durations()
    for seconds in (0.01, 0.3, 0.3, 7.0, 1000.0):
        durations.observe(seconds)
    pairs = dict(durations.cumulative())
    assert pairs["0.05"] == 1 and pairs["0.5"] == 3 and pairs["10.0"] == 4 and pairs["+Inf"] == 5
    assert durations.count == 5 and abs(durations.total - 1007.61) < 1e-9


def test_metrics_and_health_over_http() -> None:
    health = {"now": Health(True, "streaming", 1.5)}
    server = MetricsServer(RunCollector(_snapshot, lambda: health["now"]), "127.0.0.1", 0).start()
    try:
        status, text = _get(server.port, "/metrics")
        assert status == 200
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
        source = (("id", "orders"), ("operator_type", "kafka"), ("pipeline", "shop"), ("topology_node_type", "source"))
        sink = (
            ("id", "mirror"),
            ("operator_type", "postgres_aggregate"),
            ("pipeline", "shop"),
            ("topology_node_type", "sink"),
        )
        assert samples[("cdcsync_source_changes_in_total", source)] == 1200
        assert samples[("cdcsync_source_batches_total", source)] == 3
        assert samples[("cdcsync_source_dead_letters_total", source)] == 2
        lag = tuple(sorted((*source, ("topic", "shop.orders"), ("partition", "0"))))
        assert samples[("cdcsync_source_lag", lag)] == 7
        assert samples[("cdcsync_sink_rows_staged_total", sink)] == 1198
        assert samples[("cdcsync_sink_rows_merged_total", sink)] == 1100
        assert samples[("cdcsync_sink_skipped_batches_total", sink)] == 1
        assert samples[("cdcsync_source_batch_duration_seconds_count", source)] == 2
        assert samples[("cdcsync_source_batch_duration_seconds_bucket", tuple(sorted((*source, ("le", "0.5")))))] == 1
        assert samples[("cdcsync_sink_merge_duration_seconds_count", sink)] == 1
        assert samples[("cdcsync_up", (("pipeline", "shop"),))] == 1

        status, body = _get(server.port, "/healthz")
        assert status == 200 and json.loads(body) == {
            "status": "ok",
            "reason": "streaming",
            "last_batch_age_seconds": 1.5,
        }
        health["now"] = Health(False, "stopping", None)
        status, body = _get(server.port, "/healthz")
        assert status == 503 and json.loads(body)["reason"] == "stopping"
        assert _get(server.port, "/metrics")[1].count('cdcsync_up{pipeline="shop"} 0.0') == 1
        assert _get(server.port, "/other")[0] == 404
    finally:
        server.stop()


def test_the_grafana_dashboard_reads_metrics_the_run_serves() -> None:
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).parents[2] / "compose/grafana/dashboards/cdcsync.json").read_text())
    wanted = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bcdcsync_[a-z_]+", target["expr"])
    }
    collector = RunCollector(_snapshot, lambda: Health(True, "streaming", 2.0))
    served = {sample.name for family in collector.collect() for sample in family.samples}
    assert wanted and wanted <= served, wanted - served


def test_otlp_export_pushes_the_same_counters() -> None:
    """metrics.otlp_endpoint: opentelemetry-sdk posts the counters and gauges, labels included, to a collector
    (here a stand-in HTTP server that keeps the request bodies)."""
    import http.server
    import threading

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from cdcsync.runtime.metrics import OtlpExport

    bodies: list[bytes] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        export = OtlpExport(_snapshot, f"http://127.0.0.1:{server.server_address[1]}/v1/metrics", 60.0)
        export.stop()  # exports once more on shutdown
    finally:
        server.shutdown()
    request = ExportMetricsServiceRequest()
    request.ParseFromString(bodies[-1])
    metrics = {m.name: m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    changes = metrics["cdcsync_source_changes_in"].sum.data_points[0]
    assert (changes.as_int or changes.as_double) == 1200
    assert {a.key: a.value.string_value for a in changes.attributes} == {
        "pipeline": "shop",
        "id": "orders",
        "topology_node_type": "source",
        "operator_type": "kafka",
    }
    lag = {
        tuple(a.value.string_value for a in point.attributes if a.key == "partition"): point.as_int or point.as_double
        for point in metrics["cdcsync_source_lag"].gauge.data_points
    }
    assert lag == {("0",): 7, ("1",): 0}

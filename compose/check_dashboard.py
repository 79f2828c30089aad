"""Every query of the Grafana dashboard, evaluated by a running Prometheus: do the panels show data?

``python compose/check_dashboard.py [--prometheus http://127.0.0.1:19090] [--pipeline NAME]`` with the compose
stack up and cdcsync streaming. Grafana's own variables are filled in as Grafana would (``$pipeline`` with the
pipeline's name or ``.*``, ``$__rate_interval`` with a minute). Exits 1 naming each panel whose query Prometheus
refuses or answers with no series, so a renamed metric or a broken query shows before a user opens the dashboard.
Needs no Grafana: the stack's Grafana reads these same queries through the same Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parent / "grafana" / "dashboards" / "cdcsync.json"


def panel_queries(dashboard: dict, pipeline: str) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target, with Grafana's variables substituted."""
    return [
        (
            panel["title"],
            target["expr"].replace("$pipeline", pipeline).replace("$__rate_interval", "1m"),
        )
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def evaluate(prometheus: str, query: str) -> tuple[int, str]:
    """(number of series, error text) of an instant query."""
    url = f"{prometheus.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as error:
        return 0, json.load(error).get("error", str(error))
    except OSError as error:
        return 0, f"Prometheus at {prometheus} did not answer: {error}"
    return len(body["data"]["result"]), ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prometheus", default="http://127.0.0.1:19090")
    parser.add_argument("--pipeline", default=".*", help="the dashboard's $pipeline (a regex); default: every one")
    args = parser.parse_args(argv)
    failed = 0
    for title, query in panel_queries(json.loads(DASHBOARD.read_text()), args.pipeline):
        series, error = evaluate(args.prometheus, query)
        state = f"{series} series" if series else f"NO DATA {error}".rstrip()
        print(f"{state:>12}  {title}: {query}")
        failed += not series
    print(f"{failed} of the dashboard's queries returned nothing" if failed else "every dashboard query has data")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

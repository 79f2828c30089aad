"""An aggregation table written by an older cdcsync (sums rounded per row in their declared type) is upgraded by
the migration the next ``cdcsync init`` writes: after it, and after more changes, it equals a fresh GROUP BY."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.core import names
from cdcsync.migrations import POSTGRES
from tests.legacy_aggregates import first_trigger_revision, legacy_layout

pytestmark = pytest.mark.integration

TABLE = "SELECT grp, total, n, avg_f::text, avg_raw::text FROM app.agg ORDER BY grp"
FRESH = """
    SELECT grp, sum(fine)::numeric(18,2), count(*), avg(fine)::double precision::text, avg(raw)::text
    FROM app.landing GROUP BY grp ORDER BY grp
"""


def _pipeline() -> Pipeline:
    columns = {"id": "bigint", "grp": "text", "fine": "numeric(12,4)", "raw": "numeric"}
    return validate_pipeline_dict(
        {
            "name": "upg",
            "sources": {"s": {"type": "kafka", "topic": "t", "primary_key": "id", "columns": columns}},
            "sinks": {
                "agg": {
                    "type": "postgres_aggregate",
                    "from": "s",
                    "schema": "app",
                    "landing_table": "landing",
                    "agg_table": "agg",
                    "group_by": ["grp"],
                    "aggregate": {
                        "total": {"from": "fine", "fn": "sum", "type": "numeric(18,2)"},
                        "n": {"fn": "count"},
                        "avg_f": {"from": "fine", "fn": "avg", "type": "double precision"},
                        "avg_raw": {"from": "raw", "fn": "avg"},
                    },
                }
            },
        }
    )


def _land(conn: psycopg.Connection[Any], rows: list[tuple[int, str, str, str]]) -> None:
    """Rows straight into the landing table, one statement: its triggers fire as for a merged batch."""
    conn.execute(
        "INSERT INTO app.landing (id, grp, fine, raw, _cdc_version) "
        "SELECT id, grp, fine::numeric, raw::numeric, 1 FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[])"
        " AS r(id, grp, fine, raw)",
        [list(column) for column in zip(*rows, strict=True)],
    )
    conn.commit()


def test_upgrade_rebuilds_the_running_state_exactly(postgres_dsn: str, tmp_path: Path) -> None:
    definition = _pipeline()
    with legacy_layout():
        migrations.init(POSTGRES, definition, tmp_path)
    with psycopg.connect(postgres_dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, definition.name, tmp_path)
        half_cents = [(1, "a", "0.0050", "1"), (2, "a", "0.0050", "1"), (3, "a", "0.3333", "2")]
        _land(conn, [*half_cents, (4, "a", "0.1000", "0.000000000000000000000001"), (5, "b", "1.0001", "3.5")])
        conn.execute("DELETE FROM app.landing WHERE id = 4")
        conn.commit()
        legacy = conn.execute(TABLE).fetchall()
        fresh = conn.execute(FRESH).fetchall()
        assert legacy != fresh  # the old layout rounded each row to cents (0.01 + 0.01 + 0.33)
        assert legacy[0][1] - fresh[0][1] == Decimal("0.01")
        conn.commit()

        migrations.init(POSTGRES, definition, tmp_path)
        files = sorted(path.name for path in (tmp_path / "upg" / "postgres").iterdir())
        assert files == ["0001_init.sql", "0002_upgrade_aggregate_agg.sql"]
        assert [s.filename for s in migrations.apply_pending(POSTGRES, conn, definition.name, tmp_path)] == [files[1]]
        assert conn.execute(TABLE).fetchall() == conn.execute(FRESH).fetchall()

        _land(conn, [(6, "a", "0.0049", "7.25"), (7, "b", "-0.0051", "0.5")])
        conn.execute("UPDATE app.landing SET fine = fine + 0.0001, grp = 'b' WHERE id IN (1, 3)")
        conn.execute("DELETE FROM app.landing WHERE id = 2")
        conn.commit()
        assert conn.execute(TABLE).fetchall() == conn.execute(FRESH).fetchall()


def test_a_newer_trigger_revision_replaces_only_the_functions(postgres_dsn: str, tmp_path: Path) -> None:
    """Functions of an older revision (stand-ins that aggregate nothing on UPDATE and DELETE, so a change they
    missed shows) are replaced by the upgrade; the tables and their state stay as they are."""
    definition = _pipeline()
    with first_trigger_revision():
        migrations.init(POSTGRES, definition, tmp_path)
    with psycopg.connect(postgres_dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, definition.name, tmp_path)
        _land(conn, [(1, "a", "0.0050", "1"), (2, "a", "0.3333", "2.5"), (3, "b", "1.0001", "3")])
        for event in ("update", "delete"):
            function = sql.Identifier(names.INTERNAL_SCHEMA, names.aggregate_function("upg", "agg", event))
            stub = "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$"
            conn.execute(sql.SQL(stub).format(function))
        conn.commit()

        migrations.init(POSTGRES, definition, tmp_path)
        upgrade = tmp_path / "upg" / "postgres" / "0002_upgrade_aggregate_agg.sql"
        text = upgrade.read_text()
        assert "LOCK TABLE" not in text and "ALTER TABLE" not in text  # no state to rebuild
        assert text.count("CREATE OR REPLACE FUNCTION") == 3
        assert [s.filename for s in migrations.apply_pending(POSTGRES, conn, definition.name, tmp_path)] == [
            upgrade.name
        ]
        conn.execute("UPDATE app.landing SET fine = fine + 0.0001, grp = 'b' WHERE id = 1")
        conn.execute("DELETE FROM app.landing WHERE id = 2")
        conn.commit()
        assert conn.execute(TABLE).fetchall() == conn.execute(FRESH).fetchall()

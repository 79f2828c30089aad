"""``cdcsync init`` planning: files, numbering, checksums, state lines, additive vs destructive changes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlglot import exp as sqlglot_exp

import cdcsync
from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.core.errors import MigrationError
from cdcsync.migrations import POSTGRES

pytestmark = pytest.mark.unit


def base_raw() -> dict[str, Any]:
    return {
        "name": "shop",
        "sources": {
            "orders": {
                "type": "kafka",
                "topic": "shop.public.orders",
                "primary_key": "id",
                "columns": {"id": "bigint", "customer_id": "bigint", "amount": "numeric(12,2)"},
            }
        },
        "sinks": {"orders_mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}},
    }


def pipeline(raw: dict[str, Any]) -> Pipeline:
    return validate_pipeline_dict(copy.deepcopy(raw))


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())} if directory.exists() else {}


@pytest.fixture
def migrations_dir(tmp_path: Path) -> Path:
    return tmp_path / "migrations"


def files_dir(migrations_dir: Path) -> Path:
    return migrations_dir / "shop" / "postgres"


def test_first_init_writes_0001_init(migrations_dir: Path) -> None:
    result = migrations.init(POSTGRES, pipeline(base_raw()), migrations_dir)
    assert [m.filename for m in result.written] == ["0001_init.sql"]
    assert result.directory == files_dir(migrations_dir)
    assert list(snapshot(files_dir(migrations_dir))) == ["0001_init.sql"]
    assert "0001_init.sql" in result.summary()
    assert list(result) == [files_dir(migrations_dir) / "0001_init.sql"] and len(result) == 1


def test_init_twice_is_a_no_op(migrations_dir: Path) -> None:
    migrations.init(POSTGRES, pipeline(base_raw()), migrations_dir)
    before = snapshot(files_dir(migrations_dir))
    again = migrations.init(POSTGRES, pipeline(base_raw()), migrations_dir)
    assert again.up_to_date and again.written == [] and not again
    assert "nothing written" in again.summary()
    assert snapshot(files_dir(migrations_dir)) == before


def test_adding_a_sink_writes_only_0002(migrations_dir: Path) -> None:
    raw = base_raw()
    migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    first = snapshot(files_dir(migrations_dir))
    raw["sinks"]["orders_copy"] = {"type": "postgres", "from": "orders", "schema": "app", "table": "orders_copy"}
    result = migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    assert [m.filename for m in result.written] == ["0002_add_sink_orders_copy.sql"]
    after = snapshot(files_dir(migrations_dir))
    assert list(after) == ["0001_init.sql", "0002_add_sink_orders_copy.sql"]
    assert after["0001_init.sql"] == first["0001_init.sql"], "an existing migration must never be rewritten"
    body = migrations.parse_migration(after["0002_add_sink_orders_copy.sql"].decode()).body
    assert 'CREATE TABLE IF NOT EXISTS "app"."orders_copy"' in body
    assert 'CREATE UNLOGGED TABLE IF NOT EXISTS "cdcsync"."shop__orders_copy__stage"' in body
    assert '"app"."orders" (' not in body and "schema_migrations" not in body, "only the new sink's objects"
    assert migrations.init(POSTGRES, pipeline(raw), migrations_dir).up_to_date


def test_adding_a_column_writes_add_columns_for_each_sink_of_the_source(migrations_dir: Path) -> None:
    raw = base_raw()
    raw["sinks"]["orders_soft"] = {
        "type": "postgres",
        "from": "orders",
        "schema": "app",
        "table": "orders_soft",
        "delete_mode": "soft",
    }
    migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    raw["sources"]["orders"]["columns"]["note"] = "varchar(40)"
    result = migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    assert [m.filename for m in result.written] == [
        "0002_add_columns_orders_mirror.sql",
        "0003_add_columns_orders_soft.sql",
    ]
    text = result.written[0].text
    assert 'ALTER TABLE "app"."orders"\n    ADD COLUMN IF NOT EXISTS "note" character varying(40);' in text
    assert 'ALTER TABLE "cdcsync"."shop__orders_mirror__stage"\n    ADD COLUMN IF NOT EXISTS "note"' in text
    assert "-- adds:" in text
    # the cumulative state after the last file knows the new column: nothing more to do
    assert migrations.init(POSTGRES, pipeline(raw), migrations_dir).up_to_date
    columns = result.written[-1].state["sinks"]["orders_mirror"]["columns"]
    assert [c["name"] for c in columns] == ["id", "customer_id", "amount", "note"]


def test_a_sink_and_a_column_at_once(migrations_dir: Path) -> None:
    raw = base_raw()
    migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    raw["sources"]["orders"]["columns"]["note"] = "text"
    raw["sinks"]["b_copy"] = {"type": "postgres", "from": "orders", "schema": "app", "table": "b_copy"}
    result = migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    assert [m.filename for m in result.written] == ["0002_add_sink_b_copy.sql", "0003_add_columns_orders_mirror.sql"]
    assert '"note" text' in result.written[0].text, "a new sink is created with all current columns"


def test_reordered_columns_and_type_aliases_are_no_change(migrations_dir: Path) -> None:
    raw = base_raw()
    migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    raw["sources"]["orders"]["columns"] = {"amount": "decimal(12, 2)", "id": "int8", "customer_id": "BIGINT"}
    assert migrations.init(POSTGRES, pipeline(raw), migrations_dir).up_to_date


def _change_type(raw: dict[str, Any]) -> None:
    raw["sources"]["orders"]["columns"]["amount"] = "numeric(18,4)"


def _drop_column(raw: dict[str, Any]) -> None:
    del raw["sources"]["orders"]["columns"]["amount"]


def _drop_sink(raw: dict[str, Any]) -> None:
    raw["sinks"] = {"other": {"type": "postgres", "from": "orders", "schema": "app", "table": "other"}}


def _change_pk(raw: dict[str, Any]) -> None:
    raw["sinks"]["orders_mirror"]["primary_key"] = ["id", "customer_id"]


def _change_delete_mode(raw: dict[str, Any]) -> None:
    raw["sinks"]["orders_mirror"]["delete_mode"] = "soft"


def _change_table(raw: dict[str, Any]) -> None:
    raw["sinks"]["orders_mirror"]["table"] = "orders_v2"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (_change_type, "sink 'orders_mirror': column 'amount' changed type from numeric(12,2) to numeric(18,4)"),
        (_drop_column, "sink 'orders_mirror': column 'amount' was removed"),
        (_drop_sink, "sink 'orders_mirror' was removed"),
        (_change_pk, "sink 'orders_mirror': primary key changed from (id) to (id, customer_id)"),
        (_change_delete_mode, "sink 'orders_mirror': delete_mode changed from hard to soft"),
        (_change_table, 'sink \'orders_mirror\': target table changed from "app"."orders" to "app"."orders_v2"'),
    ],
)
def test_destructive_changes_are_refused(migrations_dir: Path, change: Any, expected: str) -> None:
    raw = base_raw()
    migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    before = snapshot(files_dir(migrations_dir))
    change(raw)
    with pytest.raises(MigrationError) as caught:
        migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    assert expected in str(caught.value)
    assert caught.value.user_error
    assert caught.value.hint is not None and "by hand" in caught.value.hint
    assert "0002_<what>.sql" in caught.value.hint
    assert snapshot(files_dir(migrations_dir)) == before, "nothing is written when a change is refused"


def test_destructive_and_additive_together_writes_nothing(migrations_dir: Path) -> None:
    raw = base_raw()
    migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    _drop_column(raw)
    raw["sinks"]["orders_copy"] = {"type": "postgres", "from": "orders", "schema": "app", "table": "orders_copy"}
    with pytest.raises(MigrationError):
        migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    assert list(snapshot(files_dir(migrations_dir))) == ["0001_init.sql"]


def test_hand_written_migration_with_state_line_is_the_new_baseline(migrations_dir: Path) -> None:
    raw = base_raw()
    migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    _drop_column(raw)
    with pytest.raises(MigrationError) as caught:
        migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    assert caught.value.hint is not None
    state_line = next(line for line in caught.value.hint.splitlines() if line.startswith("-- cdcsync-state: "))
    hand_written = files_dir(migrations_dir) / "0002_drop_amount.sql"
    hand_written.write_text(f"-- dropped by our DBA\n{state_line}\n\nALTER TABLE app.orders DROP COLUMN amount;\n")
    assert migrations.init(POSTGRES, pipeline(raw), migrations_dir).up_to_date
    raw["sinks"]["orders_copy"] = {"type": "postgres", "from": "orders", "schema": "app", "table": "orders_copy"}
    assert [m.filename for m in migrations.init(POSTGRES, pipeline(raw), migrations_dir).written] == [
        "0003_add_sink_orders_copy.sql"
    ]


def test_hand_written_migration_without_state_line_is_numbered_around(migrations_dir: Path) -> None:
    raw = base_raw()
    migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    (files_dir(migrations_dir) / "0002_index.sql").write_text("CREATE INDEX ON app.orders (customer_id);\n")
    assert migrations.init(POSTGRES, pipeline(raw), migrations_dir).up_to_date
    raw["sinks"]["orders_copy"] = {"type": "postgres", "from": "orders", "schema": "app", "table": "orders_copy"}
    written = migrations.init(POSTGRES, pipeline(raw), migrations_dir).written
    assert [m.filename for m in written] == ["0003_add_sink_orders_copy.sql"]


def test_corrupt_state_line_is_reported(migrations_dir: Path) -> None:
    raw = base_raw()
    migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    path = files_dir(migrations_dir) / "0001_init.sql"
    path.write_text(path.read_text().replace('"format":1', '"format":1,', 1))
    with pytest.raises(MigrationError, match=r"0001_init\.sql"):
        migrations.init(POSTGRES, pipeline(raw), migrations_dir)


def test_duplicate_numbers_are_refused(migrations_dir: Path) -> None:
    migrations.init(POSTGRES, pipeline(base_raw()), migrations_dir)
    (files_dir(migrations_dir) / "0001_other.sql").write_text("SELECT 1;\n")
    with pytest.raises(MigrationError, match="same number 0001"):
        migrations.list_migration_files(migrations_dir, "shop", "postgres")


def test_other_files_are_ignored(migrations_dir: Path) -> None:
    migrations.init(POSTGRES, pipeline(base_raw()), migrations_dir)
    (files_dir(migrations_dir) / "README.md").write_text("notes\n")
    (files_dir(migrations_dir) / "0001_init.sql.orig").write_text("old\n")
    assert [p.name for p in migrations.list_migration_files(migrations_dir, "shop", "postgres")] == ["0001_init.sql"]


# ---- determinism and file format -----------------------------------------------------------------------------------


def test_files_are_byte_stable(tmp_path: Path) -> None:
    raw = base_raw()
    raw["sinks"]["a_soft"] = {"type": "postgres", "from": "orders", "schema": "x", "table": "y", "delete_mode": "soft"}
    first = migrations.init(POSTGRES, pipeline(raw), tmp_path / "one")
    # Same pipeline, sinks declared in the other order: same bytes.
    reordered = dict(raw, sinks=dict(reversed(list(raw["sinks"].items()))))
    second = migrations.init(POSTGRES, pipeline(reordered), tmp_path / "two")
    assert snapshot(first.directory) == snapshot(second.directory)
    assert [m.text for m in migrations.plan(POSTGRES, pipeline(raw), tmp_path / "three")] == [
        m.text for m in first.written
    ]
    # Re-rendering the file from its own parts gives the same bytes.
    planned = first.written[0]
    parsed = migrations.parse_migration(planned.text)
    assert parsed.state == planned.state
    rerendered = migrations.render_migration_file(
        POSTGRES, planned.filename, "shop", planned.what, parsed.body.strip("\n") + "\n", planned.state
    )
    assert rerendered == planned.text
    without_checksums = re.sub(r"sha256:[0-9a-f]+", "", planned.text)  # "sha256:52..." is not a time
    assert not re.search(r"\d{4}-\d{2}-\d{2}|\d{2}:\d{2}", without_checksums), "no timestamps in files"


def test_header_checksum_and_state(migrations_dir: Path) -> None:
    (planned,) = migrations.init(POSTGRES, pipeline(base_raw()), migrations_dir).written
    text = planned.path.read_text()
    parsed = migrations.parse_migration(text)
    assert parsed.declared_checksum == parsed.checksum
    assert parsed.checksum.startswith("sha256:") and len(parsed.checksum) == len("sha256:") + 64
    assert parsed.records_itself
    assert parsed.state == POSTGRES.desired_state(pipeline(base_raw()))
    header_lines = parsed.header.splitlines()
    assert header_lines[0] == "-- cdcsync migration 0001_init.sql for pipeline 'shop' (postgres)"
    assert any(line.startswith("-- generator: cdcsync ") for line in header_lines)
    assert header_lines[-2] == f"-- checksum: {parsed.checksum}"
    assert header_lines[-1].startswith("-- cdcsync-state: {")
    assert parsed.trailer.startswith("-- cdcsync-ledger:")
    assert f"'{parsed.checksum}'" in parsed.trailer
    # The checksum covers the body: any edit to it shows; line endings do not matter.
    assert migrations.parse_migration(text.replace("\n", "\r\n")).checksum == parsed.checksum
    edited = text.replace('"amount" numeric(12,2)', '"amount" numeric(14,2)', 1)
    assert migrations.parse_migration(edited).checksum != parsed.checksum


def test_desired_state_is_json_able() -> None:
    raw = base_raw()
    raw["sinks"]["soft"] = {"type": "postgres", "from": "orders", "schema": "s", "table": "t", "delete_mode": "soft"}
    state = POSTGRES.desired_state(pipeline(raw))
    assert json.loads(json.dumps(state)) == state
    assert list(state["sinks"]) == ["orders_mirror", "soft"]
    mirror = state["sinks"]["orders_mirror"]
    assert mirror == {
        "schema": "app",
        "table": "orders",
        "columns": [
            {"name": "id", "type": "bigint"},
            {"name": "customer_id", "type": "bigint"},
            {"name": "amount", "type": "numeric(12,2)"},
        ],
        "primary_key": ["id"],
        "delete_mode": "hard",
        "stage_table": "shop__orders_mirror__stage",
        "tombstone_table": "shop__orders_mirror__tombstones",
        "version_type": "numeric(38,0)",
    }
    assert state["sinks"]["soft"]["tombstone_table"] is None


def test_filenames_are_slugged(migrations_dir: Path) -> None:
    raw = base_raw()
    migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    raw["sinks"]["Orders Copy/ü"] = {"type": "postgres", "from": "orders", "schema": "app", "table": "c"}
    (written,) = migrations.init(POSTGRES, pipeline(raw), migrations_dir).written
    assert written.filename == "0002_add_sink_orders_copy.sql"


def test_migrations_of_an_older_cdcsync_get_an_internal_upgrade(migrations_dir: Path) -> None:
    """Files written before the ``truncations`` table existed (internal tables version 1) are upgraded by a
    migration of their own; the mirrors are left alone."""
    migrations.init(POSTGRES, pipeline(base_raw()), migrations_dir)
    first = files_dir(migrations_dir) / "0001_init.sql"
    old_text = first.read_text()
    state_line = next(line for line in old_text.splitlines() if line.startswith(migrations.STATE_PREFIX))
    old_state = json.loads(state_line[len(migrations.STATE_PREFIX) :])
    del old_state["internal_version"]
    first.write_text(old_text.replace(state_line, migrations.state_line(old_state)))

    result = migrations.init(POSTGRES, pipeline(base_raw()), migrations_dir)
    assert [m.filename for m in result.written] == ["0002_upgrade_internal_tables.sql"]
    text = result.written[0].text
    assert 'CREATE TABLE IF NOT EXISTS "cdcsync"."truncations"' in text
    assert '"app"."orders"' not in text
    assert migrations.init(POSTGRES, pipeline(base_raw()), migrations_dir).up_to_date


def test_tables_with_bigint_versions_get_an_upgrade_that_widens_them(migrations_dir: Path) -> None:
    """Migrations written when ``_cdc_version`` was a bigint (no ``version_type``, internal tables version 4):
    ``init`` widens every version column in place, values kept, and ``run`` refuses until it is applied."""
    raw = base_raw()
    raw["sinks"]["soft"] = {"type": "postgres", "from": "orders", "schema": "s", "table": "t", "delete_mode": "soft"}
    migrations.init(POSTGRES, pipeline(raw), migrations_dir)
    first = files_dir(migrations_dir) / "0001_init.sql"
    old_text = first.read_text()
    state_line = next(line for line in old_text.splitlines() if line.startswith(migrations.STATE_PREFIX))
    old_state = json.loads(state_line[len(migrations.STATE_PREFIX) :])
    old_state["internal_version"] = 4
    for sink in old_state["sinks"].values():
        del sink["version_type"]
    first.write_text(old_text.replace(state_line, migrations.state_line(old_state)))

    pending = migrations.plan(POSTGRES, pipeline(raw), migrations_dir)
    assert [m.filename for m in pending] == [
        "0002_upgrade_internal_tables.sql",
        "0003_upgrade_versions_orders_mirror.sql",
        "0004_upgrade_versions_soft.sql",
    ]
    internal, mirror, soft = (m.text for m in migrations.init(POSTGRES, pipeline(raw), migrations_dir).written)
    assert 'ALTER TABLE "cdcsync"."truncations" ALTER COLUMN "version" TYPE numeric(38,0);' in internal
    widened = re.findall(r'ALTER TABLE ("[^;]+") ALTER COLUMN "_cdc_version" TYPE numeric\(38,0\);', mirror)
    assert widened == [
        '"app"."orders"',
        '"cdcsync"."shop__orders_mirror__stage"',
        '"cdcsync"."shop__orders_mirror__tombstones"',
    ]
    assert soft.count("ALTER COLUMN") == 2  # soft delete mode has no tombstone table
    assert migrations.init(POSTGRES, pipeline(raw), migrations_dir).up_to_date


# ---- dynamic tables ------------------------------------------------------------------------------------------


def with_dynamic_tables(raw: dict[str, Any], **tables: dict[str, Any]) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    raw["transforms"] = {
        table_id: {"type": "dynamic_table", "backend_type": "postgres", "backend_entity_name": table_id, **table}
        for table_id, table in tables.items()
    }
    return raw


def test_dynamic_table_migration_golden(tmp_path: Path) -> None:
    from tests.unit.test_templates import check_golden, parse_postgres

    raw = with_dynamic_tables(
        base_raw(),
        vip={"backend_entity_name": "VIP customers", "schema": "crm", "key_type": "bigint"},
        seen={"sql": "SELECT customer_id AS customer FROM orders"},
        scratch={"backend_type": "in-memory", "sql": "SELECT id FROM orders"},
    )
    (planned,) = migrations.plan(POSTGRES, pipeline(raw), tmp_path)
    check_golden(
        "0001_init_dynamic_tables.sql", planned.text.replace(f"cdcsync {cdcsync.__version__}", "cdcsync VERSION")
    )
    assert planned.state["dynamic_tables"] == {
        "seen": {"schema": "public", "table": "seen", "key_column": "customer", "key_type": "bigint"},
        "vip": {"schema": "crm", "table": "VIP customers", "key_column": "key", "key_type": "bigint"},
    }, "in_memory tables have no Postgres objects"
    assert "scratch" not in planned.text
    creates = [s for s in parse_postgres(planned.text) if isinstance(s, sqlglot_exp.Create) and s.kind == "TABLE"]
    vip = next(s for s in creates if s.find(sqlglot_exp.Table).name == "VIP customers")
    assert [c.name for c in vip.find_all(sqlglot_exp.ColumnDef)] == [
        "key",
        "_cdc_pipeline",
        "_cdc_checkpoint",
        "_cdc_batch_id",
    ]
    assert 'AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON "crm"."VIP customers"' in planned.text


def test_adding_a_dynamic_table_writes_only_its_migration(migrations_dir: Path) -> None:
    migrations.init(POSTGRES, pipeline(base_raw()), migrations_dir)
    raw = with_dynamic_tables(base_raw(), vip={"key_type": "bigint"})
    (written,) = migrations.init(POSTGRES, pipeline(raw), migrations_dir).written
    assert written.filename == "0002_add_dynamic_table_vip.sql"
    assert 'CREATE TABLE IF NOT EXISTS "public"."vip"' in written.text and '"app"."orders"' not in written.text
    assert 'CREATE TABLE IF NOT EXISTS "cdcsync"' not in written.text, (
        "the counter table itself comes with the internal tables"
    )
    assert migrations.init(POSTGRES, pipeline(raw), migrations_dir).up_to_date
    # An in_memory table needs nothing in Postgres.
    memory = with_dynamic_tables(raw, vip={"key_type": "bigint"}, memo={"backend_type": "in_memory"})
    assert migrations.init(POSTGRES, pipeline(memory), migrations_dir).up_to_date


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({"key_type": "text"}, "dynamic table 'vip': key type changed from bigint to text"),
        ({"key_type": "bigint", "key_column": "customer_id"}, "key column changed from key to customer_id"),
        ({"key_type": "bigint", "backend_entity_name": "vips"}, "table changed from vip to vips"),
        ({"key_type": "bigint", "backend_type": "in_memory"}, "dynamic table 'vip' was removed, renamed or moved"),
    ],
)
def test_dynamic_table_changes_are_destructive(migrations_dir: Path, table: dict[str, Any], expected: str) -> None:
    migrations.init(POSTGRES, pipeline(with_dynamic_tables(base_raw(), vip={"key_type": "bigint"})), migrations_dir)
    with pytest.raises(MigrationError) as caught:
        migrations.init(POSTGRES, pipeline(with_dynamic_tables(base_raw(), vip=table)), migrations_dir)
    assert expected in str(caught.value)
    assert len(list(files_dir(migrations_dir).iterdir())) == 1


@pytest.mark.parametrize(
    ("old_version", "creates"),
    [
        (None, ["truncations", "dynamic_table_changes", "source_positions", "key_moves"]),
        (2, ["dynamic_table_changes", "source_positions", "key_moves"]),
        (3, ["source_positions", "key_moves"]),
    ],
)
def test_internal_upgrade_creates_what_the_old_version_lacks(
    migrations_dir: Path, old_version: int | None, creates: list[str]
) -> None:
    migrations.init(POSTGRES, pipeline(base_raw()), migrations_dir)
    first = files_dir(migrations_dir) / "0001_init.sql"
    old_text = first.read_text()
    state_line = next(line for line in old_text.splitlines() if line.startswith(migrations.STATE_PREFIX))
    old_state = json.loads(state_line[len(migrations.STATE_PREFIX) :])
    if old_version is None:
        del old_state["internal_version"]
    else:
        old_state["internal_version"] = old_version
    first.write_text(old_text.replace(state_line, migrations.state_line(old_state)))

    (written,) = migrations.init(POSTGRES, pipeline(with_dynamic_tables(base_raw(), vip={})), migrations_dir).written[
        :1
    ]
    created = re.findall(r'CREATE TABLE IF NOT EXISTS "cdcsync"\."(\w+)"', written.text)
    assert written.filename == "0002_upgrade_internal_tables.sql" and created == creates
    assert 'ALTER TABLE "cdcsync"."batch_ledger" ADD COLUMN IF NOT EXISTS "offsets" jsonb' in written.text

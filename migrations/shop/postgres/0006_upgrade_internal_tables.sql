-- cdcsync migration 0006_upgrade_internal_tables.sql for pipeline 'shop' (postgres)
-- generator: cdcsync 0.1.0
-- creates:
--   table "cdcsync"."truncations": watermarks widened to numeric(38,0)
--   table "cdcsync"."source_positions": the newest source position per sink
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0006_upgrade_internal_tables.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:f9843d797b8e5e60b5ac7e19be09186d615a27df29e7a4185a034b31ee99003d
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","internal_version":5,"pipeline":"shop","sinks":{"orders_audit":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"soft","primary_key":["id"],"schema":"app","stage_table":"shop__orders_audit__stage","table":"orders_with_deleted","tombstone_table":null},"orders_mirror":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__orders_mirror__stage","table":"orders","tombstone_table":"shop__orders_mirror__tombstones"},"revenue":{"aggregate":{"aggregates":[{"accumulator_type":"numeric","fn":"sum","index":null,"name":"revenue","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"count","index":null,"name":"orders","source":null,"type":"bigint"},{"accumulator_type":"numeric","fn":"avg","index":null,"name":"avg_amount","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"max","index":"revenue_by_customer__amount__minmax","name":"largest","source":"amount","type":"numeric(12,2)"}],"empty_groups":"delete","empty_index":"revenue_by_customer__empty","functions":{"delete":"shop__revenue__agg_delete","insert":"shop__revenue__agg_insert","update":"shop__revenue__agg_update"},"group_by":[{"cast":false,"name":"customer_id","source":"customer_id","type":"bigint"}],"table":"revenue_by_customer"},"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__revenue__stage","table":"orders_state","tombstone_table":"shop__revenue__tombstones"}}}

ALTER TABLE "cdcsync"."truncations" ALTER COLUMN "version" TYPE numeric(38,0);

CREATE TABLE IF NOT EXISTS "cdcsync"."source_positions" (
    "pipeline" text,
    "sink" text,
    "position" numeric(38,0),
    "snapshot" numeric(38,0),
    "seen_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("pipeline", "sink")
);
COMMENT ON TABLE "cdcsync"."source_positions" IS 'cdcsync: per sink, the newest source commit position and snapshot merged; a new snapshot below the position stops the run';

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum")
VALUES ('shop', '0006_upgrade_internal_tables.sql', 'sha256:f9843d797b8e5e60b5ac7e19be09186d615a27df29e7a4185a034b31ee99003d')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

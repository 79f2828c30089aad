-- cdcsync migration 0004_upgrade_internal_tables.sql for pipeline 'shop' (postgres)
-- generator: cdcsync 0.1.0
-- creates:
--   table "cdcsync"."dynamic_table_changes": the change counter of dynamic tables, and the trigger function bumping it
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0004_upgrade_internal_tables.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:e0a6347eafeb7a6ba012c362691164550e37bb1c89b72d1bb4815da984b44284
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","internal_version":3,"pipeline":"shop","sinks":{"orders_audit":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"soft","primary_key":["id"],"schema":"app","stage_table":"shop__orders_audit__stage","table":"orders_with_deleted","tombstone_table":null},"orders_mirror":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__orders_mirror__stage","table":"orders","tombstone_table":"shop__orders_mirror__tombstones"},"revenue":{"aggregate":{"aggregates":[{"accumulator_type":"numeric","fn":"sum","index":null,"name":"revenue","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"count","index":null,"name":"orders","source":null,"type":"bigint"},{"accumulator_type":"numeric","fn":"avg","index":null,"name":"avg_amount","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"max","index":"revenue_by_customer__amount__minmax","name":"largest","source":"amount","type":"numeric(12,2)"}],"empty_groups":"delete","empty_index":"revenue_by_customer__empty","functions":{"delete":"shop__revenue__agg_delete","insert":"shop__revenue__agg_insert","update":"shop__revenue__agg_update"},"group_by":[{"cast":false,"name":"customer_id","source":"customer_id","type":"bigint"}],"table":"revenue_by_customer"},"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__revenue__stage","table":"orders_state","tombstone_table":"shop__revenue__tombstones"}}}

CREATE TABLE IF NOT EXISTS "cdcsync"."dynamic_table_changes" (
    "table_schema" text,
    "table_name" text,
    "change_count" bigint NOT NULL,
    PRIMARY KEY ("table_schema", "table_name")
);
COMMENT ON TABLE "cdcsync"."dynamic_table_changes" IS 'cdcsync: per dynamic table, how many statements changed it; the pipeline reloads its keys when this moves';

CREATE OR REPLACE FUNCTION "cdcsync"."count_dynamic_table_change"() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $cdcsync$
BEGIN
    INSERT INTO "cdcsync"."dynamic_table_changes" AS counter ("table_schema", "table_name", "change_count")
    VALUES (TG_TABLE_SCHEMA, TG_TABLE_NAME, 1)
    ON CONFLICT ("table_schema", "table_name") DO UPDATE SET "change_count" = counter."change_count" + 1;
    RETURN NULL;
END
$cdcsync$;

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum")
VALUES ('shop', '0004_upgrade_internal_tables.sql', 'sha256:e0a6347eafeb7a6ba012c362691164550e37bb1c89b72d1bb4815da984b44284')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

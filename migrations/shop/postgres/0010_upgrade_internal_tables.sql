-- cdcsync migration 0010_upgrade_internal_tables.sql for pipeline 'shop' (postgres)
-- generator: cdcsync 0.1.0
-- creates:
--   table "cdcsync"."key_moves": the old key's large values of primary-key changes whose create is still to come
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0010_upgrade_internal_tables.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:f127c3b62ad0bc367347305fe53cec24b05a60ac1648e3d5011294effbd72210
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","internal_version":6,"pipeline":"shop","sinks":{"orders_audit":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"soft","primary_key":["id"],"schema":"app","stage_table":"shop__orders_audit__stage","table":"orders_with_deleted","tombstone_table":null,"version_type":"numeric(38,0)"},"orders_mirror":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__orders_mirror__stage","table":"orders","tombstone_table":"shop__orders_mirror__tombstones","version_type":"numeric(38,0)"},"revenue":{"aggregate":{"aggregates":[{"accumulator_type":"numeric","fn":"sum","index":null,"name":"revenue","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"count","index":null,"name":"orders","source":null,"type":"bigint"},{"accumulator_type":"numeric","fn":"avg","index":null,"name":"avg_amount","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"max","index":"revenue_by_customer__amount__minmax","name":"largest","source":"amount","type":"numeric(12,2)"}],"empty_groups":"delete","empty_index":"revenue_by_customer__empty","functions":{"delete":"shop__revenue__agg_delete","insert":"shop__revenue__agg_insert","update":"shop__revenue__agg_update"},"group_by":[{"cast":false,"name":"customer_id","source":"customer_id","type":"bigint"}],"table":"revenue_by_customer"},"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__revenue__stage","table":"orders_state","tombstone_table":"shop__revenue__tombstones","version_type":"numeric(38,0)"}}}

CREATE TABLE IF NOT EXISTS "cdcsync"."key_moves" (
    "pipeline" text,
    "sink" text,
    "key" jsonb,
    "_cdc_version" numeric(38,0) NOT NULL,
    "values" jsonb NOT NULL,
    "moved_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("pipeline", "sink", "key")
);
COMMENT ON TABLE "cdcsync"."key_moves" IS 'cdcsync: per sink, the old key''s large values of a primary-key change whose delete was merged before the create of the new key; removed when the new key is merged';

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum")
VALUES ('shop', '0010_upgrade_internal_tables.sql', 'sha256:f127c3b62ad0bc367347305fe53cec24b05a60ac1648e3d5011294effbd72210')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

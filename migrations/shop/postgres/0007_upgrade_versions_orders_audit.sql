-- cdcsync migration 0007_upgrade_versions_orders_audit.sql for pipeline 'shop' (postgres)
-- generator: cdcsync 0.1.0
-- creates:
--   sink 'orders_audit': "_cdc_version" bigint -> numeric(38,0) (source commit order; values kept) in "app"."orders_with_deleted", "cdcsync"."shop__orders_audit__stage"
--     (each table is rewritten under an exclusive lock: stop the pipeline first)
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0007_upgrade_versions_orders_audit.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:c3887f563b43ec77241defea8533f8b141e1ae1808adc93f955a335f2a90c371
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","internal_version":5,"pipeline":"shop","sinks":{"orders_audit":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"soft","primary_key":["id"],"schema":"app","stage_table":"shop__orders_audit__stage","table":"orders_with_deleted","tombstone_table":null,"version_type":"numeric(38,0)"},"orders_mirror":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__orders_mirror__stage","table":"orders","tombstone_table":"shop__orders_mirror__tombstones"},"revenue":{"aggregate":{"aggregates":[{"accumulator_type":"numeric","fn":"sum","index":null,"name":"revenue","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"count","index":null,"name":"orders","source":null,"type":"bigint"},{"accumulator_type":"numeric","fn":"avg","index":null,"name":"avg_amount","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"max","index":"revenue_by_customer__amount__minmax","name":"largest","source":"amount","type":"numeric(12,2)"}],"empty_groups":"delete","empty_index":"revenue_by_customer__empty","functions":{"delete":"shop__revenue__agg_delete","insert":"shop__revenue__agg_insert","update":"shop__revenue__agg_update"},"group_by":[{"cast":false,"name":"customer_id","source":"customer_id","type":"bigint"}],"table":"revenue_by_customer"},"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__revenue__stage","table":"orders_state","tombstone_table":"shop__revenue__tombstones"}}}

ALTER TABLE "app"."orders_with_deleted" ALTER COLUMN "_cdc_version" TYPE numeric(38,0);
ALTER TABLE "cdcsync"."shop__orders_audit__stage" ALTER COLUMN "_cdc_version" TYPE numeric(38,0);

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum")
VALUES ('shop', '0007_upgrade_versions_orders_audit.sql', 'sha256:c3887f563b43ec77241defea8533f8b141e1ae1808adc93f955a335f2a90c371')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

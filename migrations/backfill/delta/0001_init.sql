-- cdcsync migration 0001_init.sql for pipeline 'backfill' (delta)
-- generator: cdcsync 0.1.0
-- creates:
--   sink 'orders_lake': Delta table delta.`lake/backfill/orders`, mirror, hard deletes, key (`id`)
--     tombstones delta.`lake/backfill/orders__cdcsync_tombstones`: versions of deleted keys
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: spark-sql (with the Delta extension, see docs/delta.md) -f 0001_init.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:13be22cd251c8f92cd82e6d614fabb5436da2c6d58a7e17a58f59b525fa51768
-- cdcsync-state: {"database":"delta","format":1,"ledger":"postgres","pipeline":"backfill","sinks":{"orders_lake":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"decimal(12,2)"},{"name":"status","type":"string"},{"name":"updated_at","type":"timestamp"}],"delete_mode":"hard","location":{"path":"lake/backfill/orders"},"mode":"mirror","partition_by":[],"primary_key":["id"],"properties":{"delta.enableChangeDataFeed":"true"}}}}

CREATE TABLE IF NOT EXISTS delta.`lake/backfill/orders` (
    `id` BIGINT,
    `customer_id` BIGINT,
    `amount` DECIMAL(12,2),
    `status` STRING,
    `updated_at` TIMESTAMP,
    `_cdc_op` STRING,
    `_cdc_version` DECIMAL(38,0),
    `_cdc_ts` TIMESTAMP
)
USING DELTA
TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true');
CREATE TABLE IF NOT EXISTS delta.`lake/backfill/orders__cdcsync_tombstones` (
    `id` BIGINT,
    `_cdc_version` DECIMAL(38,0)
)
USING DELTA;

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
-- then, in the pipeline's Postgres database (psql), record it:
-- INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum") VALUES ('backfill', 'delta/0001_init.sql', 'sha256:13be22cd251c8f92cd82e6d614fabb5436da2c6d58a7e17a58f59b525fa51768') ON CONFLICT DO NOTHING;

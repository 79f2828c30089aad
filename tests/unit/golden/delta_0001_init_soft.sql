-- cdcsync migration 0001_init.sql for pipeline 'shop' (delta)
-- generator: cdcsync 0.1.0
-- creates:
--   sink 'lake': Delta table delta.`/lake/orders`, mirror, soft deletes, key (`id`)
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: spark-sql (with the Delta extension, see docs/delta.md) -f 0001_init.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:aa77c06de3e1b816f26cedd6063dda729d4f2efceb33bf45f8df31df9e4294cf
-- cdcsync-state: {"database":"delta","format":1,"ledger":"postgres","pipeline":"shop","sinks":{"lake":{"columns":[{"name":"id","type":"bigint"},{"name":"region","type":"string"},{"name":"amount","type":"decimal(12,2)"},{"name":"Note `x`","type":"string"},{"name":"tags","type":"array<string>"}],"delete_mode":"soft","location":{"path":"/lake/orders"},"mode":"mirror","partition_by":[],"primary_key":["id"],"properties":{"delta.enableChangeDataFeed":"true","delta.logRetentionDuration":"30 days"}}}}

CREATE TABLE IF NOT EXISTS delta.`/lake/orders` (
    `id` BIGINT,
    `region` STRING,
    `amount` DECIMAL(12,2),
    `Note ``x``` STRING,
    `tags` ARRAY<STRING>,
    `_cdc_op` STRING,
    `_cdc_version` DECIMAL(38,0),
    `_cdc_ts` TIMESTAMP,
    `_cdc_deleted` BOOLEAN
)
USING DELTA
TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true', 'delta.logRetentionDuration' = '30 days');

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
-- then, in the pipeline's Postgres database (psql), record it:
-- INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum") VALUES ('shop', 'delta/0001_init.sql', 'sha256:aa77c06de3e1b816f26cedd6063dda729d4f2efceb33bf45f8df31df9e4294cf') ON CONFLICT DO NOTHING;

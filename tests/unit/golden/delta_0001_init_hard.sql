-- cdcsync migration 0001_init.sql for pipeline 'shop' (delta)
-- generator: cdcsync 0.1.0
-- creates:
--   sink 'lake': Delta table delta.`/lake/orders`, mirror, hard deletes, key (`id`)
--     tombstones delta.`/lake/orders__cdcsync_tombstones`: versions of deleted keys
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: spark-sql (with the Delta extension, see docs/delta.md) -f 0001_init.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:d1c0cd4354cc3e3f060ae5e551b9e33bb4ea7066a55ac5db9ee789f67838cc06
-- cdcsync-state: {"database":"delta","format":1,"ledger":"postgres","pipeline":"shop","sinks":{"lake":{"columns":[{"name":"id","type":"bigint"},{"name":"region","type":"string"},{"name":"amount","type":"decimal(12,2)"},{"name":"Note `x`","type":"string"},{"name":"tags","type":"array<string>"}],"delete_mode":"hard","location":{"path":"/lake/orders"},"mode":"mirror","partition_by":["region"],"primary_key":["id"],"properties":{"delta.enableChangeDataFeed":"true"}}}}

CREATE TABLE IF NOT EXISTS delta.`/lake/orders` (
    `id` BIGINT,
    `region` STRING,
    `amount` DECIMAL(12,2),
    `Note ``x``` STRING,
    `tags` ARRAY<STRING>,
    `_cdc_op` STRING,
    `_cdc_version` DECIMAL(38,0),
    `_cdc_ts` TIMESTAMP
)
USING DELTA
PARTITIONED BY (`region`)
TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true');
CREATE TABLE IF NOT EXISTS delta.`/lake/orders__cdcsync_tombstones` (
    `id` BIGINT,
    `_cdc_version` DECIMAL(38,0)
)
USING DELTA;

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
-- then, in the pipeline's Postgres database (psql), record it:
-- INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum") VALUES ('shop', 'delta/0001_init.sql', 'sha256:d1c0cd4354cc3e3f060ae5e551b9e33bb4ea7066a55ac5db9ee789f67838cc06') ON CONFLICT DO NOTHING;

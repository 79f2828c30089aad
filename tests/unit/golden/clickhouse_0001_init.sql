-- cdcsync migration 0001_init.sql for pipeline 'shop' (clickhouse)
-- generator: cdcsync VERSION
-- creates:
--   database `cdcsync` with table `schema_migrations`
--   sink 'orders_ch': table `analytics`.`orders`, ReplacingMergeTree(_version, _is_deleted) ORDER BY (`id`)
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: clickhouse-client --multiquery --queries-file 0001_init.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:5550c1d9ec3399583c6807dd5a2950413b537180e1ea75cb2a3d2b71f2421bc3
-- cdcsync-state: {"database":"clickhouse","format":1,"internal_database":"cdcsync","pipeline":"shop","sinks":{"orders_ch":{"columns":[{"name":"id","type":"Int64"},{"name":"region","type":"Nullable(String)"},{"name":"amount","type":"Nullable(Decimal(12, 2))"},{"name":"huge","type":"Nullable(String)"},{"name":"loose","type":"Nullable(String)"},{"name":"paid","type":"Nullable(Bool)"},{"name":"at","type":"Nullable(DateTime64(6, 'UTC'))"},{"name":"day","type":"Nullable(Date32)"},{"name":"uid","type":"Nullable(UUID)"},{"name":"doc","type":"Nullable(String)"},{"name":"Note `x`","type":"Nullable(String)"}],"database":"analytics","legacy_server":false,"partition_by":null,"primary_key":["id"],"settings":{"non_replicated_deduplication_window":1000},"table":"orders","ttl":null,"version_type":"UInt128","view":null}}}

CREATE DATABASE IF NOT EXISTS `cdcsync`;
CREATE TABLE IF NOT EXISTS `cdcsync`.`schema_migrations` (
    `pipeline` String,
    `filename` String,
    `checksum` String,
    `applied_at` DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(`applied_at`)
ORDER BY (`pipeline`, `filename`);

CREATE DATABASE IF NOT EXISTS `analytics`;
CREATE TABLE IF NOT EXISTS `analytics`.`orders` (
    `id` Int64,
    `region` Nullable(String),
    `amount` Nullable(Decimal(12, 2)),
    `huge` Nullable(String),
    `loose` Nullable(String),
    `paid` Nullable(Bool),
    `at` Nullable(DateTime64(6, 'UTC')),
    `day` Nullable(Date32),
    `uid` Nullable(UUID),
    `doc` Nullable(String),
    `Note \`x\`` Nullable(String),
    `_version` UInt128,
    `_is_deleted` UInt8,
    `_cdc_ts` Nullable(DateTime64(6, 'UTC'))
)
ENGINE = ReplacingMergeTree(`_version`, `_is_deleted`)
ORDER BY (`id`)
SETTINGS non_replicated_deduplication_window = 1000;

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
INSERT INTO `cdcsync`.`schema_migrations` (`pipeline`, `filename`, `checksum`)
VALUES ('shop', '0001_init.sql', 'sha256:5550c1d9ec3399583c6807dd5a2950413b537180e1ea75cb2a3d2b71f2421bc3');

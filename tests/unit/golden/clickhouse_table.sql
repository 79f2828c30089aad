CREATE DATABASE IF NOT EXISTS `analytics`;
CREATE TABLE IF NOT EXISTS `analytics`.`orders` (
    `id` Int64,
    `region` LowCardinality(Nullable(String)),
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
PARTITION BY toYYYYMM(day)
ORDER BY (`id`)
TTL day + INTERVAL 1 YEAR
SETTINGS index_granularity = 4096, non_replicated_deduplication_window = 1000;

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
ENGINE = ReplacingMergeTree(`_version`)
ORDER BY (`id`)
SETTINGS non_replicated_deduplication_window = 1000;
CREATE VIEW IF NOT EXISTS `analytics`.`orders_current` AS
SELECT * EXCEPT (`_is_deleted`) FROM `analytics`.`orders` FINAL
WHERE `_is_deleted` = 0;

CREATE SCHEMA IF NOT EXISTS "app";

CREATE TABLE IF NOT EXISTS "app"."orders_soft" (
    "id" bigint NOT NULL,
    "customer_id" bigint,
    "amount" numeric(12,2),
    "note" text,
    "_cdc_version" numeric(38,0) NOT NULL,
    "_cdc_ts" timestamptz,
    "_cdc_deleted" boolean NOT NULL DEFAULT false,
    PRIMARY KEY ("id")
);
COMMENT ON TABLE "app"."orders_soft" IS 'maintained by cdcsync pipeline ''shop'', sink ''orders_soft'' (delete_mode soft); do not write to it by hand';

CREATE UNLOGGED TABLE IF NOT EXISTS "cdcsync"."shop__orders_soft__stage" (
    "_batch_id" bigint NOT NULL,
    "id" bigint,
    "customer_id" bigint,
    "amount" numeric(12,2),
    "note" text,
    "_cdc_op" text NOT NULL,
    "_cdc_version" numeric(38,0) NOT NULL,
    "_cdc_ts" timestamptz
);
COMMENT ON TABLE "cdcsync"."shop__orders_soft__stage" IS 'cdcsync staging table of pipeline ''shop'', sink ''orders_soft'': micro-batches are copied here, then merged into "app"."orders_soft"';

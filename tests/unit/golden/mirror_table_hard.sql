CREATE SCHEMA IF NOT EXISTS "app";

CREATE TABLE IF NOT EXISTS "app"."orders" (
    "id" bigint NOT NULL,
    "customer_id" bigint,
    "amount" numeric(12,2),
    "note" text,
    "_cdc_version" numeric(38,0) NOT NULL,
    "_cdc_ts" timestamptz,
    PRIMARY KEY ("id")
);
COMMENT ON TABLE "app"."orders" IS 'maintained by cdcsync pipeline ''shop'', sink ''orders_mirror'' (delete_mode hard); do not write to it by hand';

CREATE UNLOGGED TABLE IF NOT EXISTS "cdcsync"."shop__orders_mirror__stage" (
    "_batch_id" bigint NOT NULL,
    "id" bigint,
    "customer_id" bigint,
    "amount" numeric(12,2),
    "note" text,
    "_cdc_op" text NOT NULL,
    "_cdc_version" numeric(38,0) NOT NULL,
    "_cdc_ts" timestamptz
);
COMMENT ON TABLE "cdcsync"."shop__orders_mirror__stage" IS 'cdcsync staging table of pipeline ''shop'', sink ''orders_mirror'': micro-batches are copied here, then merged into "app"."orders"';

CREATE TABLE IF NOT EXISTS "cdcsync"."shop__orders_mirror__tombstones" (
    "id" bigint NOT NULL,
    "_cdc_version" numeric(38,0) NOT NULL,
    PRIMARY KEY ("id")
);
COMMENT ON TABLE "cdcsync"."shop__orders_mirror__tombstones" IS 'cdcsync tombstones of pipeline ''shop'', sink ''orders_mirror'': keys hard-deleted from "app"."orders" and the version of their delete';

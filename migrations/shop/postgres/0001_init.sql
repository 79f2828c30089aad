-- cdcsync migration 0001_init.sql for pipeline 'shop' (postgres)
-- generator: cdcsync 0.1.0
-- creates:
--   schema "cdcsync" with tables "schema_migrations", "batch_ledger", "dead_letters"
--   sink 'orders_audit' (delete_mode soft, primary key "id"):
--     table "app"."orders_with_deleted": the mirror table
--     unlogged table "cdcsync"."shop__orders_audit__stage": its staging table
--   sink 'orders_mirror' (delete_mode hard, primary key "id"):
--     table "app"."orders": the mirror table
--     unlogged table "cdcsync"."shop__orders_mirror__stage": its staging table
--     table "cdcsync"."shop__orders_mirror__tombstones": its hard-deleted keys
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0001_init.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:b57f1b138ca8b86899f74dd74d37f5c048e4056243a35e3411d3cefdd4649bb8
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","pipeline":"shop","sinks":{"orders_audit":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"soft","primary_key":["id"],"schema":"app","stage_table":"shop__orders_audit__stage","table":"orders_with_deleted","tombstone_table":null},"orders_mirror":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__orders_mirror__stage","table":"orders","tombstone_table":"shop__orders_mirror__tombstones"}}}

CREATE SCHEMA IF NOT EXISTS "cdcsync";

CREATE TABLE IF NOT EXISTS "cdcsync"."schema_migrations" (
    "pipeline" text,
    "filename" text,
    "checksum" text NOT NULL,
    "applied_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("pipeline", "filename")
);
COMMENT ON TABLE "cdcsync"."schema_migrations" IS 'cdcsync: migration files applied to this database, with the checksum of each as applied';

CREATE TABLE IF NOT EXISTS "cdcsync"."batch_ledger" (
    "pipeline" text,
    "sink" text,
    "checkpoint_id" text,
    "batch_id" bigint,
    "rows_written" bigint NOT NULL,
    "committed_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("pipeline", "sink", "checkpoint_id", "batch_id")
);
COMMENT ON TABLE "cdcsync"."batch_ledger" IS 'cdcsync: one row per micro-batch committed to a Postgres sink; a replayed batch finds its row and is skipped';

CREATE TABLE IF NOT EXISTS "cdcsync"."dead_letters" (
    "id" bigserial PRIMARY KEY,
    "pipeline" text NOT NULL,
    "source" text NOT NULL,
    "topic" text NOT NULL,
    "partition" int NOT NULL,
    "offset" bigint NOT NULL,
    "key" bytea,
    "value" bytea,
    "reason" text NOT NULL,
    "failed_at" timestamptz NOT NULL DEFAULT now(),
    UNIQUE ("pipeline", "topic", "partition", "offset")
);
COMMENT ON TABLE "cdcsync"."dead_letters" IS 'cdcsync: messages that could not be decoded, with where they came from and why';

CREATE SCHEMA IF NOT EXISTS "app";

CREATE TABLE IF NOT EXISTS "app"."orders_with_deleted" (
    "id" bigint NOT NULL,
    "customer_id" bigint,
    "amount" numeric(12,2),
    "status" text,
    "Note" text,
    "updated_at" timestamp with time zone,
    "_cdc_version" bigint NOT NULL,
    "_cdc_ts" timestamptz,
    "_cdc_deleted" boolean NOT NULL DEFAULT false,
    PRIMARY KEY ("id")
);
COMMENT ON TABLE "app"."orders_with_deleted" IS 'maintained by cdcsync pipeline ''shop'', sink ''orders_audit'' (delete_mode soft); do not write to it by hand';

CREATE UNLOGGED TABLE IF NOT EXISTS "cdcsync"."shop__orders_audit__stage" (
    "_batch_id" bigint NOT NULL,
    "id" bigint,
    "customer_id" bigint,
    "amount" numeric(12,2),
    "status" text,
    "Note" text,
    "updated_at" timestamp with time zone,
    "_cdc_op" text NOT NULL,
    "_cdc_version" bigint NOT NULL,
    "_cdc_ts" timestamptz
);
COMMENT ON TABLE "cdcsync"."shop__orders_audit__stage" IS 'cdcsync staging table of pipeline ''shop'', sink ''orders_audit'': micro-batches are copied here, then merged into "app"."orders_with_deleted"';

CREATE SCHEMA IF NOT EXISTS "app";

CREATE TABLE IF NOT EXISTS "app"."orders" (
    "id" bigint NOT NULL,
    "customer_id" bigint,
    "amount" numeric(12,2),
    "status" text,
    "Note" text,
    "updated_at" timestamp with time zone,
    "_cdc_version" bigint NOT NULL,
    "_cdc_ts" timestamptz,
    PRIMARY KEY ("id")
);
COMMENT ON TABLE "app"."orders" IS 'maintained by cdcsync pipeline ''shop'', sink ''orders_mirror'' (delete_mode hard); do not write to it by hand';

CREATE UNLOGGED TABLE IF NOT EXISTS "cdcsync"."shop__orders_mirror__stage" (
    "_batch_id" bigint NOT NULL,
    "id" bigint,
    "customer_id" bigint,
    "amount" numeric(12,2),
    "status" text,
    "Note" text,
    "updated_at" timestamp with time zone,
    "_cdc_op" text NOT NULL,
    "_cdc_version" bigint NOT NULL,
    "_cdc_ts" timestamptz
);
COMMENT ON TABLE "cdcsync"."shop__orders_mirror__stage" IS 'cdcsync staging table of pipeline ''shop'', sink ''orders_mirror'': micro-batches are copied here, then merged into "app"."orders"';

CREATE TABLE IF NOT EXISTS "cdcsync"."shop__orders_mirror__tombstones" (
    "id" bigint NOT NULL,
    "_cdc_version" bigint NOT NULL,
    PRIMARY KEY ("id")
);
COMMENT ON TABLE "cdcsync"."shop__orders_mirror__tombstones" IS 'cdcsync tombstones of pipeline ''shop'', sink ''orders_mirror'': keys hard-deleted from "app"."orders" and the version of their delete';

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum")
VALUES ('shop', '0001_init.sql', 'sha256:b57f1b138ca8b86899f74dd74d37f5c048e4056243a35e3411d3cefdd4649bb8')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

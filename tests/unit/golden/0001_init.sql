-- cdcsync migration 0001_init.sql for pipeline 'shop' (postgres)
-- generator: cdcsync VERSION
-- creates:
--   roles "cdcsync_owner" (owns every object; this file and the later ones run as it) and "cdcsync_writer" (what `cdcsync run` needs: rows, no DDL), NOLOGIN, unless they exist; needs a role that may create roles (a DBA)
--   schema "cdcsync" with tables "schema_migrations", "batch_ledger", "dead_letters", "truncations", "source_positions", "key_moves", "dynamic_table_changes"
--   sink 'orders_mirror' (delete_mode hard, primary key "id"):
--     table "app"."orders": the mirror table
--     unlogged table "cdcsync"."shop__orders_mirror__stage": its staging table
--     table "cdcsync"."shop__orders_mirror__tombstones": its hard-deleted keys
--   sink 'orders_soft' (delete_mode soft, primary key "id"):
--     table "app"."orders_soft": the mirror table
--     unlogged table "cdcsync"."shop__orders_soft__stage": its staging table
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0001_init.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:de434f346aaa037b55400f9e12f8b8d39e22c20241f8ba8a1d7ad7b34cf92370
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","internal_version":6,"pipeline":"shop","roles":{"owner":"cdcsync_owner","writer":"cdcsync_writer"},"sinks":{"orders_mirror":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"note","type":"text"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__orders_mirror__stage","table":"orders","tombstone_table":"shop__orders_mirror__tombstones","version_type":"numeric(38,0)"},"orders_soft":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"note","type":"text"}],"delete_mode":"soft","primary_key":["id"],"schema":"app","stage_table":"shop__orders_soft__stage","table":"orders_soft","tombstone_table":null,"version_type":"numeric(38,0)"}}}

DO $cdcsync$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cdcsync_owner') THEN
        BEGIN
            CREATE ROLE "cdcsync_owner" NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cdcsync_writer') THEN
        BEGIN
            CREATE ROLE "cdcsync_writer" NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
    -- SET ROLE needs the SET option on Postgres 16 and later (a CREATEROLE user is not given it by itself)
    IF NOT pg_catalog.pg_has_role(current_user, 'cdcsync_owner',
            CASE WHEN current_setting('server_version_num')::int >= 160000 THEN 'SET' ELSE 'MEMBER' END) THEN
        EXECUTE format('GRANT %I TO %I', 'cdcsync_owner', current_user);
    END IF;
    EXECUTE format('GRANT CREATE, TEMPORARY ON DATABASE %I TO %I', current_database(), 'cdcsync_owner');
    EXECUTE format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO %I', current_database(), 'cdcsync_writer');
END
$cdcsync$;
CREATE SCHEMA IF NOT EXISTS "cdcsync";
GRANT USAGE, CREATE ON SCHEMA "cdcsync" TO "cdcsync_owner";
GRANT USAGE ON SCHEMA "cdcsync" TO "cdcsync_writer";
CREATE SCHEMA IF NOT EXISTS "app";
GRANT USAGE, CREATE ON SCHEMA "app" TO "cdcsync_owner";
GRANT USAGE ON SCHEMA "app" TO "cdcsync_writer";

DO $cdcsync$
BEGIN
    IF to_regclass('"cdcsync"."schema_migrations"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."schema_migrations" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."batch_ledger"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."batch_ledger" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."dead_letters"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."dead_letters" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."truncations"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."truncations" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."source_positions"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."source_positions" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."key_moves"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."key_moves" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."dynamic_table_changes"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."dynamic_table_changes" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"app"."orders"') IS NOT NULL THEN
        ALTER TABLE "app"."orders" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."shop__orders_mirror__stage"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."shop__orders_mirror__stage" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."shop__orders_mirror__tombstones"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."shop__orders_mirror__tombstones" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"app"."orders_soft"') IS NOT NULL THEN
        ALTER TABLE "app"."orders_soft" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."shop__orders_soft__stage"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."shop__orders_soft__stage" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regprocedure('"cdcsync"."count_dynamic_table_change"()') IS NOT NULL THEN
        ALTER FUNCTION "cdcsync"."count_dynamic_table_change"() OWNER TO "cdcsync_owner";
    END IF;
END
$cdcsync$;
SET LOCAL ROLE "cdcsync_owner";

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
    "offsets" jsonb,
    PRIMARY KEY ("pipeline", "sink", "checkpoint_id", "batch_id")
);
COMMENT ON TABLE "cdcsync"."batch_ledger" IS 'cdcsync: one row per micro-batch committed to a sink, with the Kafka offsets it read ({"topic": {"partition": [start, end]}}); a replay of the same offsets finds its row and is skipped';

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

GRANT SELECT ON "cdcsync"."schema_migrations" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."batch_ledger" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."dead_letters" TO "cdcsync_writer";
GRANT USAGE ON SEQUENCE "cdcsync"."dead_letters_id_seq" TO "cdcsync_writer";

CREATE TABLE IF NOT EXISTS "cdcsync"."truncations" (
    "pipeline" text,
    "sink" text,
    "version" numeric(38,0) NOT NULL,
    "truncated_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("pipeline", "sink")
);
COMMENT ON TABLE "cdcsync"."truncations" IS 'cdcsync: per sink, the version of the newest source truncate applied; older changes are ignored';
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."truncations" TO "cdcsync_writer";

CREATE TABLE IF NOT EXISTS "cdcsync"."source_positions" (
    "pipeline" text,
    "sink" text,
    "position" numeric(38,0),
    "snapshot" numeric(38,0),
    "seen_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("pipeline", "sink")
);
COMMENT ON TABLE "cdcsync"."source_positions" IS 'cdcsync: per sink, the newest source commit position and snapshot merged; a new snapshot below the position stops the run';
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."source_positions" TO "cdcsync_writer";

CREATE TABLE IF NOT EXISTS "cdcsync"."key_moves" (
    "pipeline" text,
    "sink" text,
    "key" jsonb,
    "_cdc_version" numeric(38,0) NOT NULL,
    "values" jsonb NOT NULL,
    "moved_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("pipeline", "sink", "key")
);
COMMENT ON TABLE "cdcsync"."key_moves" IS 'cdcsync: per sink, the old key''s large values of a primary-key change whose delete was merged before the create of the new key; removed when the new key is merged';
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."key_moves" TO "cdcsync_writer";

CREATE TABLE IF NOT EXISTS "cdcsync"."dynamic_table_changes" (
    "table_schema" text,
    "table_name" text,
    "change_count" bigint NOT NULL,
    PRIMARY KEY ("table_schema", "table_name")
);
COMMENT ON TABLE "cdcsync"."dynamic_table_changes" IS 'cdcsync: per dynamic table, how many statements changed it; the pipeline reloads its keys when this moves';
GRANT SELECT ON "cdcsync"."dynamic_table_changes" TO "cdcsync_writer";

CREATE OR REPLACE FUNCTION "cdcsync"."count_dynamic_table_change"() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $cdcsync$
BEGIN
    INSERT INTO "cdcsync"."dynamic_table_changes" AS counter ("table_schema", "table_name", "change_count")
    VALUES (TG_TABLE_SCHEMA, TG_TABLE_NAME, 1)
    ON CONFLICT ("table_schema", "table_name") DO UPDATE SET "change_count" = counter."change_count" + 1;
    RETURN NULL;
END
$cdcsync$;

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
GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."orders" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON "cdcsync"."shop__orders_mirror__stage" TO "cdcsync_writer";
COMMENT ON TABLE "cdcsync"."shop__orders_mirror__stage" IS 'cdcsync staging table of pipeline ''shop'', sink ''orders_mirror'': micro-batches are copied here, then merged into "app"."orders"';

CREATE TABLE IF NOT EXISTS "cdcsync"."shop__orders_mirror__tombstones" (
    "id" bigint NOT NULL,
    "_cdc_version" numeric(38,0) NOT NULL,
    PRIMARY KEY ("id")
);
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."shop__orders_mirror__tombstones" TO "cdcsync_writer";
COMMENT ON TABLE "cdcsync"."shop__orders_mirror__tombstones" IS 'cdcsync tombstones of pipeline ''shop'', sink ''orders_mirror'': keys hard-deleted from "app"."orders" and the version of their delete';

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
GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."orders_soft" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON "cdcsync"."shop__orders_soft__stage" TO "cdcsync_writer";
COMMENT ON TABLE "cdcsync"."shop__orders_soft__stage" IS 'cdcsync staging table of pipeline ''shop'', sink ''orders_soft'': micro-batches are copied here, then merged into "app"."orders_soft"';

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum")
VALUES ('shop', '0001_init.sql', 'sha256:de434f346aaa037b55400f9e12f8b8d39e22c20241f8ba8a1d7ad7b34cf92370')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

-- cdcsync migration 0011_grant_roles.sql for pipeline 'shop' (postgres)
-- generator: cdcsync 0.1.0
-- creates:
--   roles "cdcsync_owner" (owns every object; this file and the later ones run as it) and "cdcsync_writer" (what `cdcsync run` needs: rows, no DDL), NOLOGIN, unless they exist; needs a role that may create roles (a DBA)
--     existing tables and trigger functions handed to "cdcsync_owner", their rows granted to "cdcsync_writer"
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0011_grant_roles.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:2285327d3114bcf14883b14a6975f9747f6ac6e3f1e374fcf24f487c6c3cb95a
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","internal_version":6,"pipeline":"shop","roles":{"owner":"cdcsync_owner","writer":"cdcsync_writer"},"sinks":{"orders_audit":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"soft","primary_key":["id"],"schema":"app","stage_table":"shop__orders_audit__stage","table":"orders_with_deleted","tombstone_table":null,"version_type":"numeric(38,0)"},"orders_mirror":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__orders_mirror__stage","table":"orders","tombstone_table":"shop__orders_mirror__tombstones","version_type":"numeric(38,0)"},"revenue":{"aggregate":{"aggregates":[{"accumulator_type":"numeric","fn":"sum","index":null,"name":"revenue","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"count","index":null,"name":"orders","source":null,"type":"bigint"},{"accumulator_type":"numeric","fn":"avg","index":null,"name":"avg_amount","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"max","index":"revenue_by_customer__amount__minmax","name":"largest","source":"amount","type":"numeric(12,2)"}],"empty_groups":"delete","empty_index":"revenue_by_customer__empty","functions":{"delete":"shop__revenue__agg_delete","insert":"shop__revenue__agg_insert","update":"shop__revenue__agg_update"},"group_by":[{"cast":false,"name":"customer_id","source":"customer_id","type":"bigint"}],"table":"revenue_by_customer"},"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__revenue__stage","table":"orders_state","tombstone_table":"shop__revenue__tombstones","version_type":"numeric(38,0)"}}}

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
    IF to_regclass('"app"."orders_with_deleted"') IS NOT NULL THEN
        ALTER TABLE "app"."orders_with_deleted" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."shop__orders_audit__stage"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."shop__orders_audit__stage" OWNER TO "cdcsync_owner";
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
    IF to_regclass('"app"."orders_state"') IS NOT NULL THEN
        ALTER TABLE "app"."orders_state" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."shop__revenue__stage"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."shop__revenue__stage" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"cdcsync"."shop__revenue__tombstones"') IS NOT NULL THEN
        ALTER TABLE "cdcsync"."shop__revenue__tombstones" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regclass('"app"."revenue_by_customer"') IS NOT NULL THEN
        ALTER TABLE "app"."revenue_by_customer" OWNER TO "cdcsync_owner";
    END IF;
    IF to_regprocedure('"cdcsync"."count_dynamic_table_change"()') IS NOT NULL THEN
        ALTER FUNCTION "cdcsync"."count_dynamic_table_change"() OWNER TO "cdcsync_owner";
    END IF;
    IF to_regprocedure('"cdcsync"."shop__revenue__agg_delete"()') IS NOT NULL THEN
        ALTER FUNCTION "cdcsync"."shop__revenue__agg_delete"() OWNER TO "cdcsync_owner";
    END IF;
    IF to_regprocedure('"cdcsync"."shop__revenue__agg_insert"()') IS NOT NULL THEN
        ALTER FUNCTION "cdcsync"."shop__revenue__agg_insert"() OWNER TO "cdcsync_owner";
    END IF;
    IF to_regprocedure('"cdcsync"."shop__revenue__agg_update"()') IS NOT NULL THEN
        ALTER FUNCTION "cdcsync"."shop__revenue__agg_update"() OWNER TO "cdcsync_owner";
    END IF;
END
$cdcsync$;
SET LOCAL ROLE "cdcsync_owner";

GRANT SELECT ON "cdcsync"."schema_migrations" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."batch_ledger" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."dead_letters" TO "cdcsync_writer";
GRANT USAGE ON SEQUENCE "cdcsync"."dead_letters_id_seq" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."truncations" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."source_positions" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."key_moves" TO "cdcsync_writer";
GRANT SELECT ON "cdcsync"."dynamic_table_changes" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."orders_with_deleted" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON "cdcsync"."shop__orders_audit__stage" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."orders" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON "cdcsync"."shop__orders_mirror__stage" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."shop__orders_mirror__tombstones" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."orders_state" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON "cdcsync"."shop__revenue__stage" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."shop__revenue__tombstones" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."revenue_by_customer" TO "cdcsync_writer";

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum")
VALUES ('shop', '0011_grant_roles.sql', 'sha256:2285327d3114bcf14883b14a6975f9747f6ac6e3f1e374fcf24f487c6c3cb95a')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

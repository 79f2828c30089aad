-- cdcsync migration 0001_init.sql for pipeline 'shop' (postgres)
-- generator: cdcsync VERSION
-- creates:
--   roles "cdcsync_owner" (owns every object; this file and the later ones run as it) and "cdcsync_writer" (what `cdcsync run` needs: rows, no DDL), NOLOGIN, unless they exist; needs a role that may create roles (a DBA)
--   schema "cdcsync" with tables "schema_migrations", "batch_ledger", "dead_letters", "truncations", "source_positions", "key_moves", "dynamic_table_changes"
--   sink 'revenue' (delete_mode hard, primary key "id"):
--     table "app"."orders_state": the landing table (current row per key)
--     unlogged table "cdcsync"."shop__revenue__stage": its staging table
--     table "cdcsync"."shop__revenue__tombstones": its hard-deleted keys
--     table "app"."revenue_by_customer": sum(amount) as "revenue", count(*) as "orders", sum(qty) as "units", avg(amount) as "avg_amount", avg(price) as "avg_price", min(amount) as "smallest", max(amount) as "amount" grouped by "customer_id", "region"
--     statement triggers on "app"."orders_state" keeping it up to date, and their functions
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0001_init.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:825a1e0b7848f25d8d4f485f4fd05971d507e2762eace56cdb30ad4f60568abd
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","internal_version":6,"pipeline":"shop","roles":{"owner":"cdcsync_owner","writer":"cdcsync_writer"},"sinks":{"revenue":{"aggregate":{"aggregates":[{"accumulator_type":"numeric(18,2)","fn":"sum","index":null,"name":"revenue","source":"amount","type":"numeric(18,2)"},{"accumulator_type":null,"fn":"count","index":null,"name":"orders","source":null,"type":"bigint"},{"accumulator_type":"bigint","fn":"sum","index":null,"name":"units","source":"qty","type":"bigint"},{"accumulator_type":"numeric","fn":"avg","index":null,"name":"avg_amount","source":"amount","type":"numeric"},{"accumulator_type":"double precision","fn":"avg","index":null,"name":"avg_price","source":"price","type":"double precision"},{"accumulator_type":null,"fn":"min","index":"revenue_by_customer__amount__minmax","name":"smallest","source":"amount","type":"numeric(12,2)"},{"accumulator_type":null,"fn":"max","index":"revenue_by_customer__amount__minmax","name":"amount","source":"amount","type":"numeric(12,2)"}],"empty_groups":"delete","empty_index":"revenue_by_customer__empty","functions":{"delete":"shop__revenue__agg_delete","insert":"shop__revenue__agg_insert","update":"shop__revenue__agg_update"},"group_by":[{"cast":true,"name":"customer_id","source":"customer_id","type":"bigint"},{"cast":false,"name":"region","source":"region","type":"character varying(8)"}],"revision":2,"table":"revenue_by_customer"},"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"integer"},{"name":"region","type":"character varying(8)"},{"name":"amount","type":"numeric(12,2)"},{"name":"qty","type":"integer"},{"name":"price","type":"double precision"},{"name":"paid","type":"boolean"},{"name":"meta","type":"jsonb"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__revenue__stage","table":"orders_state","tombstone_table":"shop__revenue__tombstones","version_type":"numeric(38,0)"}}}

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
    IF to_regprocedure('"cdcsync"."shop__revenue__agg_insert"()') IS NOT NULL THEN
        ALTER FUNCTION "cdcsync"."shop__revenue__agg_insert"() OWNER TO "cdcsync_owner";
    END IF;
    IF to_regprocedure('"cdcsync"."shop__revenue__agg_update"()') IS NOT NULL THEN
        ALTER FUNCTION "cdcsync"."shop__revenue__agg_update"() OWNER TO "cdcsync_owner";
    END IF;
    IF to_regprocedure('"cdcsync"."shop__revenue__agg_delete"()') IS NOT NULL THEN
        ALTER FUNCTION "cdcsync"."shop__revenue__agg_delete"() OWNER TO "cdcsync_owner";
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

CREATE TABLE IF NOT EXISTS "app"."orders_state" (
    "id" bigint NOT NULL,
    "customer_id" integer,
    "region" character varying(8),
    "amount" numeric(12,2),
    "qty" integer,
    "price" double precision,
    "paid" boolean,
    "meta" jsonb,
    "_cdc_version" numeric(38,0) NOT NULL,
    "_cdc_ts" timestamptz,
    PRIMARY KEY ("id")
);
COMMENT ON TABLE "app"."orders_state" IS 'maintained by cdcsync pipeline ''shop'', sink ''revenue'' (delete_mode hard); do not write to it by hand';

CREATE UNLOGGED TABLE IF NOT EXISTS "cdcsync"."shop__revenue__stage" (
    "_batch_id" bigint NOT NULL,
    "id" bigint,
    "customer_id" integer,
    "region" character varying(8),
    "amount" numeric(12,2),
    "qty" integer,
    "price" double precision,
    "paid" boolean,
    "meta" jsonb,
    "_cdc_op" text NOT NULL,
    "_cdc_version" numeric(38,0) NOT NULL,
    "_cdc_ts" timestamptz
);
GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."orders_state" TO "cdcsync_writer";
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON "cdcsync"."shop__revenue__stage" TO "cdcsync_writer";
COMMENT ON TABLE "cdcsync"."shop__revenue__stage" IS 'cdcsync staging table of pipeline ''shop'', sink ''revenue'': micro-batches are copied here, then merged into "app"."orders_state"';

CREATE TABLE IF NOT EXISTS "cdcsync"."shop__revenue__tombstones" (
    "id" bigint NOT NULL,
    "_cdc_version" numeric(38,0) NOT NULL,
    PRIMARY KEY ("id")
);
GRANT SELECT, INSERT, UPDATE, DELETE ON "cdcsync"."shop__revenue__tombstones" TO "cdcsync_writer";
COMMENT ON TABLE "cdcsync"."shop__revenue__tombstones" IS 'cdcsync tombstones of pipeline ''shop'', sink ''revenue'': keys hard-deleted from "app"."orders_state" and the version of their delete';


CREATE TABLE IF NOT EXISTS "app"."revenue_by_customer" (
    "customer_id" bigint,
    "region" character varying(8),
    "revenue" numeric(18,2),
    "_cdc_revenue_n" bigint NOT NULL DEFAULT 0,
    "orders" bigint NOT NULL DEFAULT 0,
    "units" bigint,
    "_cdc_units_n" bigint NOT NULL DEFAULT 0,
    "avg_amount_sum" numeric,
    "avg_amount_count" bigint NOT NULL DEFAULT 0,
    "avg_amount" numeric GENERATED ALWAYS AS ((CASE WHEN "avg_amount_count" = 0 THEN NULL ELSE "avg_amount_sum" / "avg_amount_count" END)::numeric) STORED,
    "avg_price_sum" double precision,
    "avg_price_count" bigint NOT NULL DEFAULT 0,
    "avg_price" double precision GENERATED ALWAYS AS ((CASE WHEN "avg_price_count" = 0 THEN NULL ELSE "avg_price_sum" / "avg_price_count" END)::double precision) STORED,
    "smallest" numeric(12,2),
    "amount" numeric(12,2),
    "_cdc_rows" bigint NOT NULL DEFAULT 0,
    UNIQUE NULLS NOT DISTINCT ("customer_id", "region")
);
COMMENT ON TABLE "app"."revenue_by_customer" IS 'maintained by triggers on "app"."orders_state" (cdcsync pipeline ''shop'', sink ''revenue''); do not write to it by hand';
GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."revenue_by_customer" TO "cdcsync_writer";

CREATE INDEX IF NOT EXISTS "revenue_by_customer__amount__minmax" ON "app"."orders_state" ((("customer_id")::bigint), "region", "amount");

CREATE OR REPLACE FUNCTION "cdcsync"."shop__revenue__agg_insert"() RETURNS trigger LANGUAGE plpgsql AS $cdcsync$
BEGIN
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "region", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "units", "_cdc_units_n", "avg_amount_sum", "avg_amount_count", "avg_price_sum", "avg_price_count", "smallest", "amount")
    SELECT "customer_id", "region", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), sum(d."_cdc_rows"), sum(d."v3"), sum(d."n4"), sum(d."v5"), sum(d."n2"), sum(d."v6"), sum(d."n7"), min(d."v8"), max(d."v8")
    FROM (
        SELECT (r."customer_id")::bigint AS "customer_id", r."region" AS "region", 1 AS "_cdc_rows",
            (r."amount")::numeric(18,2) AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE 1 END AS "n2",
            (r."qty")::bigint AS "v3",
            CASE WHEN r."qty" IS NULL THEN 0 ELSE 1 END AS "n4",
            (r."amount")::numeric AS "v5",
            (r."price")::double precision AS "v6",
            CASE WHEN r."price" IS NULL THEN 0 ELSE 1 END AS "n7",
            (r."amount")::numeric(12,2) AS "v8"
        FROM new_rows AS r
    ) AS d
    GROUP BY "customer_id", "region"
    ON CONFLICT ("customer_id", "region") DO UPDATE SET
        "_cdc_rows" = a."_cdc_rows" + EXCLUDED."_cdc_rows",
        "revenue" = CASE WHEN a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n" = 0 THEN NULL
            ELSE coalesce(a."revenue", 0) + coalesce(EXCLUDED."revenue", 0) END,
        "_cdc_revenue_n" = a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n",
        "orders" = a."orders" + EXCLUDED."orders",
        "units" = CASE WHEN a."_cdc_units_n" + EXCLUDED."_cdc_units_n" = 0 THEN NULL
            ELSE coalesce(a."units", 0) + coalesce(EXCLUDED."units", 0) END,
        "_cdc_units_n" = a."_cdc_units_n" + EXCLUDED."_cdc_units_n",
        "avg_amount_sum" = CASE WHEN a."avg_amount_count" + EXCLUDED."avg_amount_count" = 0 THEN NULL
            ELSE coalesce(a."avg_amount_sum", 0) + coalesce(EXCLUDED."avg_amount_sum", 0) END,
        "avg_amount_count" = a."avg_amount_count" + EXCLUDED."avg_amount_count",
        "avg_price_sum" = CASE WHEN a."avg_price_count" + EXCLUDED."avg_price_count" = 0 THEN NULL
            ELSE coalesce(a."avg_price_sum", 0) + coalesce(EXCLUDED."avg_price_sum", 0) END,
        "avg_price_count" = a."avg_price_count" + EXCLUDED."avg_price_count",
        "smallest" = least(a."smallest", EXCLUDED."smallest"),
        "amount" = greatest(a."amount", EXCLUDED."amount");
    RETURN NULL;
END
$cdcsync$;

CREATE OR REPLACE TRIGGER "cdcsync_aggregate_insert"
    AFTER INSERT ON "app"."orders_state"
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION "cdcsync"."shop__revenue__agg_insert"();

CREATE OR REPLACE FUNCTION "cdcsync"."shop__revenue__agg_update"() RETURNS trigger LANGUAGE plpgsql AS $cdcsync$
DECLARE
    emptied boolean;
BEGIN
    WITH "_cdc_delta" AS (
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "region", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "units", "_cdc_units_n", "avg_amount_sum", "avg_amount_count", "avg_price_sum", "avg_price_count", "smallest", "amount")
    SELECT "customer_id", "region", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), sum(d."_cdc_rows"), sum(d."v3"), sum(d."n4"), sum(d."v5"), sum(d."n2"), sum(d."v6"), sum(d."n7"), min(d."v8"), max(d."v8")
    FROM (
        SELECT (r."customer_id")::bigint AS "customer_id", r."region" AS "region", 1 AS "_cdc_rows",
            (r."amount")::numeric(18,2) AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE 1 END AS "n2",
            (r."qty")::bigint AS "v3",
            CASE WHEN r."qty" IS NULL THEN 0 ELSE 1 END AS "n4",
            (r."amount")::numeric AS "v5",
            (r."price")::double precision AS "v6",
            CASE WHEN r."price" IS NULL THEN 0 ELSE 1 END AS "n7",
            (r."amount")::numeric(12,2) AS "v8"
        FROM new_rows AS r
        UNION ALL
        SELECT (r."customer_id")::bigint AS "customer_id", r."region" AS "region", -1 AS "_cdc_rows",
            -(r."amount")::numeric(18,2) AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE -1 END AS "n2",
            -(r."qty")::bigint AS "v3",
            CASE WHEN r."qty" IS NULL THEN 0 ELSE -1 END AS "n4",
            -(r."amount")::numeric AS "v5",
            -(r."price")::double precision AS "v6",
            CASE WHEN r."price" IS NULL THEN 0 ELSE -1 END AS "n7",
            (r."amount")::numeric(12,2) AS "v8"
        FROM old_rows AS r
    ) AS d
    GROUP BY "customer_id", "region"
    ON CONFLICT ("customer_id", "region") DO UPDATE SET
        "_cdc_rows" = a."_cdc_rows" + EXCLUDED."_cdc_rows",
        "revenue" = CASE WHEN a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n" = 0 THEN NULL
            ELSE coalesce(a."revenue", 0) + coalesce(EXCLUDED."revenue", 0) END,
        "_cdc_revenue_n" = a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n",
        "orders" = a."orders" + EXCLUDED."orders",
        "units" = CASE WHEN a."_cdc_units_n" + EXCLUDED."_cdc_units_n" = 0 THEN NULL
            ELSE coalesce(a."units", 0) + coalesce(EXCLUDED."units", 0) END,
        "_cdc_units_n" = a."_cdc_units_n" + EXCLUDED."_cdc_units_n",
        "avg_amount_sum" = CASE WHEN a."avg_amount_count" + EXCLUDED."avg_amount_count" = 0 THEN NULL
            ELSE coalesce(a."avg_amount_sum", 0) + coalesce(EXCLUDED."avg_amount_sum", 0) END,
        "avg_amount_count" = a."avg_amount_count" + EXCLUDED."avg_amount_count",
        "avg_price_sum" = CASE WHEN a."avg_price_count" + EXCLUDED."avg_price_count" = 0 THEN NULL
            ELSE coalesce(a."avg_price_sum", 0) + coalesce(EXCLUDED."avg_price_sum", 0) END,
        "avg_price_count" = a."avg_price_count" + EXCLUDED."avg_price_count",
        "smallest" = CASE WHEN EXCLUDED."smallest" <= a."smallest"
            THEN CASE WHEN a."customer_id" IS NULL OR a."region" IS NULL
                THEN (SELECT min(l."amount") FROM "app"."orders_state" AS l WHERE ((l."customer_id")::bigint = a."customer_id" OR ((l."customer_id")::bigint IS NULL AND a."customer_id" IS NULL)) AND (l."region" = a."region" OR (l."region" IS NULL AND a."region" IS NULL)))::numeric(12,2)
                ELSE (SELECT min(l."amount") FROM "app"."orders_state" AS l WHERE (l."customer_id")::bigint = a."customer_id" AND l."region" = a."region")::numeric(12,2) END
            WHEN a."smallest" IS NULL THEN EXCLUDED."smallest"
            ELSE a."smallest" END,
        "amount" = CASE WHEN EXCLUDED."amount" >= a."amount"
            THEN CASE WHEN a."customer_id" IS NULL OR a."region" IS NULL
                THEN (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE ((l."customer_id")::bigint = a."customer_id" OR ((l."customer_id")::bigint IS NULL AND a."customer_id" IS NULL)) AND (l."region" = a."region" OR (l."region" IS NULL AND a."region" IS NULL)))::numeric(12,2)
                ELSE (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE (l."customer_id")::bigint = a."customer_id" AND l."region" = a."region")::numeric(12,2) END
            WHEN a."amount" IS NULL THEN EXCLUDED."amount"
            ELSE a."amount" END
    RETURNING "_cdc_rows" = 0 AS "_cdc_emptied"
    )
    SELECT coalesce(bool_or("_cdc_emptied"), false) INTO emptied FROM "_cdc_delta";

    IF emptied THEN
        DELETE FROM "app"."revenue_by_customer" AS a
        USING (SELECT DISTINCT (r."customer_id")::bigint AS "customer_id", r."region" AS "region" FROM old_rows AS r) AS r
        WHERE a."_cdc_rows" = 0 AND a."customer_id" = r."customer_id" AND a."region" = r."region";
        DELETE FROM "app"."revenue_by_customer" AS a WHERE a."_cdc_rows" = 0 AND (a."customer_id" IS NULL OR a."region" IS NULL);
    END IF;
    RETURN NULL;
END
$cdcsync$;

CREATE OR REPLACE TRIGGER "cdcsync_aggregate_update"
    AFTER UPDATE ON "app"."orders_state"
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION "cdcsync"."shop__revenue__agg_update"();

CREATE OR REPLACE FUNCTION "cdcsync"."shop__revenue__agg_delete"() RETURNS trigger LANGUAGE plpgsql AS $cdcsync$
DECLARE
    emptied boolean;
BEGIN
    WITH "_cdc_delta" AS (
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "region", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "units", "_cdc_units_n", "avg_amount_sum", "avg_amount_count", "avg_price_sum", "avg_price_count", "smallest", "amount")
    SELECT "customer_id", "region", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), sum(d."_cdc_rows"), sum(d."v3"), sum(d."n4"), sum(d."v5"), sum(d."n2"), sum(d."v6"), sum(d."n7"), min(d."v8"), max(d."v8")
    FROM (
        SELECT (r."customer_id")::bigint AS "customer_id", r."region" AS "region", -1 AS "_cdc_rows",
            -(r."amount")::numeric(18,2) AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE -1 END AS "n2",
            -(r."qty")::bigint AS "v3",
            CASE WHEN r."qty" IS NULL THEN 0 ELSE -1 END AS "n4",
            -(r."amount")::numeric AS "v5",
            -(r."price")::double precision AS "v6",
            CASE WHEN r."price" IS NULL THEN 0 ELSE -1 END AS "n7",
            (r."amount")::numeric(12,2) AS "v8"
        FROM old_rows AS r
    ) AS d
    GROUP BY "customer_id", "region"
    ON CONFLICT ("customer_id", "region") DO UPDATE SET
        "_cdc_rows" = a."_cdc_rows" + EXCLUDED."_cdc_rows",
        "revenue" = CASE WHEN a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n" = 0 THEN NULL
            ELSE coalesce(a."revenue", 0) + coalesce(EXCLUDED."revenue", 0) END,
        "_cdc_revenue_n" = a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n",
        "orders" = a."orders" + EXCLUDED."orders",
        "units" = CASE WHEN a."_cdc_units_n" + EXCLUDED."_cdc_units_n" = 0 THEN NULL
            ELSE coalesce(a."units", 0) + coalesce(EXCLUDED."units", 0) END,
        "_cdc_units_n" = a."_cdc_units_n" + EXCLUDED."_cdc_units_n",
        "avg_amount_sum" = CASE WHEN a."avg_amount_count" + EXCLUDED."avg_amount_count" = 0 THEN NULL
            ELSE coalesce(a."avg_amount_sum", 0) + coalesce(EXCLUDED."avg_amount_sum", 0) END,
        "avg_amount_count" = a."avg_amount_count" + EXCLUDED."avg_amount_count",
        "avg_price_sum" = CASE WHEN a."avg_price_count" + EXCLUDED."avg_price_count" = 0 THEN NULL
            ELSE coalesce(a."avg_price_sum", 0) + coalesce(EXCLUDED."avg_price_sum", 0) END,
        "avg_price_count" = a."avg_price_count" + EXCLUDED."avg_price_count",
        "smallest" = CASE WHEN EXCLUDED."smallest" <= a."smallest"
            THEN CASE WHEN a."customer_id" IS NULL OR a."region" IS NULL
                THEN (SELECT min(l."amount") FROM "app"."orders_state" AS l WHERE ((l."customer_id")::bigint = a."customer_id" OR ((l."customer_id")::bigint IS NULL AND a."customer_id" IS NULL)) AND (l."region" = a."region" OR (l."region" IS NULL AND a."region" IS NULL)))::numeric(12,2)
                ELSE (SELECT min(l."amount") FROM "app"."orders_state" AS l WHERE (l."customer_id")::bigint = a."customer_id" AND l."region" = a."region")::numeric(12,2) END
            WHEN a."smallest" IS NULL THEN EXCLUDED."smallest"
            ELSE a."smallest" END,
        "amount" = CASE WHEN EXCLUDED."amount" >= a."amount"
            THEN CASE WHEN a."customer_id" IS NULL OR a."region" IS NULL
                THEN (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE ((l."customer_id")::bigint = a."customer_id" OR ((l."customer_id")::bigint IS NULL AND a."customer_id" IS NULL)) AND (l."region" = a."region" OR (l."region" IS NULL AND a."region" IS NULL)))::numeric(12,2)
                ELSE (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE (l."customer_id")::bigint = a."customer_id" AND l."region" = a."region")::numeric(12,2) END
            WHEN a."amount" IS NULL THEN EXCLUDED."amount"
            ELSE a."amount" END
    RETURNING "_cdc_rows" = 0 AS "_cdc_emptied"
    )
    SELECT coalesce(bool_or("_cdc_emptied"), false) INTO emptied FROM "_cdc_delta";

    IF emptied THEN
        DELETE FROM "app"."revenue_by_customer" AS a
        USING (SELECT DISTINCT (r."customer_id")::bigint AS "customer_id", r."region" AS "region" FROM old_rows AS r) AS r
        WHERE a."_cdc_rows" = 0 AND a."customer_id" = r."customer_id" AND a."region" = r."region";
        DELETE FROM "app"."revenue_by_customer" AS a WHERE a."_cdc_rows" = 0 AND (a."customer_id" IS NULL OR a."region" IS NULL);
    END IF;
    RETURN NULL;
END
$cdcsync$;

CREATE OR REPLACE TRIGGER "cdcsync_aggregate_delete"
    AFTER DELETE ON "app"."orders_state"
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT
    EXECUTE FUNCTION "cdcsync"."shop__revenue__agg_delete"();

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum")
VALUES ('shop', '0001_init.sql', 'sha256:825a1e0b7848f25d8d4f485f4fd05971d507e2762eace56cdb30ad4f60568abd')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

-- cdcsync migration 0003_add_sink_revenue.sql for pipeline 'shop' (postgres)
-- generator: cdcsync 0.1.0
-- creates:
--   sink 'revenue' (delete_mode hard, primary key "id"):
--     table "app"."orders_state": the landing table (current row per key)
--     unlogged table "cdcsync"."shop__revenue__stage": its staging table
--     table "cdcsync"."shop__revenue__tombstones": its hard-deleted keys
--     table "app"."revenue_by_customer": sum(amount) as "revenue", count(*) as "orders", avg(amount) as "avg_amount", max(amount) as "largest" grouped by "customer_id"
--     statement triggers on "app"."orders_state" keeping it up to date, and their functions
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0003_add_sink_revenue.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:d4d853e9034114ca582df319280bfc259e8eab9928c29f1a82cc4b2d9fead1c6
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","internal_version":2,"pipeline":"shop","sinks":{"orders_audit":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"soft","primary_key":["id"],"schema":"app","stage_table":"shop__orders_audit__stage","table":"orders_with_deleted","tombstone_table":null},"orders_mirror":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__orders_mirror__stage","table":"orders","tombstone_table":"shop__orders_mirror__tombstones"},"revenue":{"aggregate":{"aggregates":[{"accumulator_type":"numeric","fn":"sum","index":null,"name":"revenue","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"count","index":null,"name":"orders","source":null,"type":"bigint"},{"accumulator_type":"numeric","fn":"avg","index":null,"name":"avg_amount","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"max","index":"revenue_by_customer__amount__minmax","name":"largest","source":"amount","type":"numeric(12,2)"}],"empty_groups":"delete","empty_index":"revenue_by_customer__empty","functions":{"delete":"shop__revenue__agg_delete","insert":"shop__revenue__agg_insert","update":"shop__revenue__agg_update"},"group_by":[{"cast":false,"name":"customer_id","source":"customer_id","type":"bigint"}],"table":"revenue_by_customer"},"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__revenue__stage","table":"orders_state","tombstone_table":"shop__revenue__tombstones"}}}

CREATE SCHEMA IF NOT EXISTS "app";

CREATE TABLE IF NOT EXISTS "app"."orders_state" (
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
COMMENT ON TABLE "app"."orders_state" IS 'maintained by cdcsync pipeline ''shop'', sink ''revenue'' (delete_mode hard); do not write to it by hand';

CREATE UNLOGGED TABLE IF NOT EXISTS "cdcsync"."shop__revenue__stage" (
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
COMMENT ON TABLE "cdcsync"."shop__revenue__stage" IS 'cdcsync staging table of pipeline ''shop'', sink ''revenue'': micro-batches are copied here, then merged into "app"."orders_state"';

CREATE TABLE IF NOT EXISTS "cdcsync"."shop__revenue__tombstones" (
    "id" bigint NOT NULL,
    "_cdc_version" bigint NOT NULL,
    PRIMARY KEY ("id")
);
COMMENT ON TABLE "cdcsync"."shop__revenue__tombstones" IS 'cdcsync tombstones of pipeline ''shop'', sink ''revenue'': keys hard-deleted from "app"."orders_state" and the version of their delete';


CREATE TABLE IF NOT EXISTS "app"."revenue_by_customer" (
    "customer_id" bigint,
    "revenue" numeric,
    "_cdc_revenue_n" bigint NOT NULL DEFAULT 0,
    "orders" bigint NOT NULL DEFAULT 0,
    "avg_amount_sum" numeric,
    "avg_amount_count" bigint NOT NULL DEFAULT 0,
    "avg_amount" numeric GENERATED ALWAYS AS ((CASE WHEN "avg_amount_count" = 0 THEN NULL ELSE "avg_amount_sum" / "avg_amount_count" END)::numeric) STORED,
    "largest" numeric(12,2),
    "_cdc_rows" bigint NOT NULL DEFAULT 0,
    UNIQUE NULLS NOT DISTINCT ("customer_id")
);
COMMENT ON TABLE "app"."revenue_by_customer" IS 'maintained by triggers on "app"."orders_state" (cdcsync pipeline ''shop'', sink ''revenue''); do not write to it by hand';

CREATE INDEX IF NOT EXISTS "revenue_by_customer__amount__minmax" ON "app"."orders_state" ("customer_id", "amount");

CREATE OR REPLACE FUNCTION "cdcsync"."shop__revenue__agg_insert"() RETURNS trigger LANGUAGE plpgsql AS $cdcsync$
BEGIN
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "avg_amount_sum", "avg_amount_count", "largest")
    SELECT "customer_id", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n1"), sum(d."n2"), sum(d."v3"), sum(d."n3"), max(d."v4")
    FROM (
        SELECT r."customer_id" AS "customer_id", 1 AS "_cdc_rows",
            (r."amount")::numeric AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE 1 END AS "n1",
            1 AS "n2",
            (r."amount")::numeric AS "v3",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE 1 END AS "n3",
            (r."amount")::numeric(12,2) AS "v4"
        FROM new_rows AS r
    ) AS d
    GROUP BY "customer_id"
    ON CONFLICT ("customer_id") DO UPDATE SET
        "_cdc_rows" = a."_cdc_rows" + EXCLUDED."_cdc_rows",
        "revenue" = CASE WHEN a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n" = 0 THEN NULL
            ELSE coalesce(a."revenue", 0) + coalesce(EXCLUDED."revenue", 0) END,
        "_cdc_revenue_n" = a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n",
        "orders" = a."orders" + EXCLUDED."orders",
        "avg_amount_sum" = CASE WHEN a."avg_amount_count" + EXCLUDED."avg_amount_count" = 0 THEN NULL
            ELSE coalesce(a."avg_amount_sum", 0) + coalesce(EXCLUDED."avg_amount_sum", 0) END,
        "avg_amount_count" = a."avg_amount_count" + EXCLUDED."avg_amount_count",
        "largest" = greatest(a."largest", EXCLUDED."largest");
    RETURN NULL;
END
$cdcsync$;

CREATE OR REPLACE TRIGGER "cdcsync_aggregate_insert"
    AFTER INSERT ON "app"."orders_state"
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION "cdcsync"."shop__revenue__agg_insert"();

CREATE OR REPLACE FUNCTION "cdcsync"."shop__revenue__agg_update"() RETURNS trigger LANGUAGE plpgsql AS $cdcsync$
BEGIN
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "avg_amount_sum", "avg_amount_count", "largest")
    SELECT "customer_id", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n1"), sum(d."n2"), sum(d."v3"), sum(d."n3"), max(d."v4")
    FROM (
        SELECT r."customer_id" AS "customer_id", 1 AS "_cdc_rows",
            (r."amount")::numeric AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE 1 END AS "n1",
            1 AS "n2",
            (r."amount")::numeric AS "v3",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE 1 END AS "n3",
            (r."amount")::numeric(12,2) AS "v4"
        FROM new_rows AS r
        UNION ALL
        SELECT r."customer_id" AS "customer_id", -1 AS "_cdc_rows",
            -(r."amount")::numeric AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE -1 END AS "n1",
            -1 AS "n2",
            -(r."amount")::numeric AS "v3",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE -1 END AS "n3",
            NULL::numeric(12,2) AS "v4"
        FROM old_rows AS r
    ) AS d
    GROUP BY "customer_id"
    ON CONFLICT ("customer_id") DO UPDATE SET
        "_cdc_rows" = a."_cdc_rows" + EXCLUDED."_cdc_rows",
        "revenue" = CASE WHEN a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n" = 0 THEN NULL
            ELSE coalesce(a."revenue", 0) + coalesce(EXCLUDED."revenue", 0) END,
        "_cdc_revenue_n" = a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n",
        "orders" = a."orders" + EXCLUDED."orders",
        "avg_amount_sum" = CASE WHEN a."avg_amount_count" + EXCLUDED."avg_amount_count" = 0 THEN NULL
            ELSE coalesce(a."avg_amount_sum", 0) + coalesce(EXCLUDED."avg_amount_sum", 0) END,
        "avg_amount_count" = a."avg_amount_count" + EXCLUDED."avg_amount_count",
        "largest" = greatest(a."largest", EXCLUDED."largest");

    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "largest")
    SELECT "customer_id", max(o."v1")
    FROM (
        SELECT r."customer_id" AS "customer_id", (r."amount")::numeric(12,2) AS "v1"
        FROM old_rows AS r
    ) AS o
    GROUP BY "customer_id"
    ON CONFLICT ("customer_id") DO UPDATE SET
        "largest" = CASE WHEN EXCLUDED."largest" >= a."largest"
            THEN CASE WHEN a."customer_id" IS NULL
                THEN (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE (l."customer_id" = a."customer_id" OR (l."customer_id" IS NULL AND a."customer_id" IS NULL)))::numeric(12,2)
                ELSE (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE l."customer_id" = a."customer_id")::numeric(12,2) END
            ELSE a."largest" END;

    DELETE FROM "app"."revenue_by_customer" AS a USING old_rows AS r
    WHERE a."_cdc_rows" = 0 AND a."customer_id" = r."customer_id";
    IF EXISTS (SELECT 1 FROM old_rows AS r WHERE r."customer_id" IS NULL) THEN
        DELETE FROM "app"."revenue_by_customer" AS a WHERE a."_cdc_rows" = 0 AND (a."customer_id" IS NULL);
    END IF;
    RETURN NULL;
END
$cdcsync$;

CREATE OR REPLACE TRIGGER "cdcsync_aggregate_update"
    AFTER UPDATE ON "app"."orders_state"
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION "cdcsync"."shop__revenue__agg_update"();

CREATE OR REPLACE FUNCTION "cdcsync"."shop__revenue__agg_delete"() RETURNS trigger LANGUAGE plpgsql AS $cdcsync$
BEGIN
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "avg_amount_sum", "avg_amount_count", "largest")
    SELECT "customer_id", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n1"), sum(d."n2"), sum(d."v3"), sum(d."n3"), max(d."v4")
    FROM (
        SELECT r."customer_id" AS "customer_id", -1 AS "_cdc_rows",
            -(r."amount")::numeric AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE -1 END AS "n1",
            -1 AS "n2",
            -(r."amount")::numeric AS "v3",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE -1 END AS "n3",
            NULL::numeric(12,2) AS "v4"
        FROM old_rows AS r
    ) AS d
    GROUP BY "customer_id"
    ON CONFLICT ("customer_id") DO UPDATE SET
        "_cdc_rows" = a."_cdc_rows" + EXCLUDED."_cdc_rows",
        "revenue" = CASE WHEN a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n" = 0 THEN NULL
            ELSE coalesce(a."revenue", 0) + coalesce(EXCLUDED."revenue", 0) END,
        "_cdc_revenue_n" = a."_cdc_revenue_n" + EXCLUDED."_cdc_revenue_n",
        "orders" = a."orders" + EXCLUDED."orders",
        "avg_amount_sum" = CASE WHEN a."avg_amount_count" + EXCLUDED."avg_amount_count" = 0 THEN NULL
            ELSE coalesce(a."avg_amount_sum", 0) + coalesce(EXCLUDED."avg_amount_sum", 0) END,
        "avg_amount_count" = a."avg_amount_count" + EXCLUDED."avg_amount_count",
        "largest" = greatest(a."largest", EXCLUDED."largest");

    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "largest")
    SELECT "customer_id", max(o."v1")
    FROM (
        SELECT r."customer_id" AS "customer_id", (r."amount")::numeric(12,2) AS "v1"
        FROM old_rows AS r
    ) AS o
    GROUP BY "customer_id"
    ON CONFLICT ("customer_id") DO UPDATE SET
        "largest" = CASE WHEN EXCLUDED."largest" >= a."largest"
            THEN CASE WHEN a."customer_id" IS NULL
                THEN (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE (l."customer_id" = a."customer_id" OR (l."customer_id" IS NULL AND a."customer_id" IS NULL)))::numeric(12,2)
                ELSE (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE l."customer_id" = a."customer_id")::numeric(12,2) END
            ELSE a."largest" END;

    DELETE FROM "app"."revenue_by_customer" AS a USING old_rows AS r
    WHERE a."_cdc_rows" = 0 AND a."customer_id" = r."customer_id";
    IF EXISTS (SELECT 1 FROM old_rows AS r WHERE r."customer_id" IS NULL) THEN
        DELETE FROM "app"."revenue_by_customer" AS a WHERE a."_cdc_rows" = 0 AND (a."customer_id" IS NULL);
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
VALUES ('shop', '0003_add_sink_revenue.sql', 'sha256:d4d853e9034114ca582df319280bfc259e8eab9928c29f1a82cc4b2d9fead1c6')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

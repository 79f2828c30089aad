-- cdcsync migration 0002_upgrade_aggregate_revenue.sql for pipeline 'shop' (postgres)
-- generator: cdcsync VERSION
-- upgrades:
--   the running state of "fine_total", "fine_avg_f", "raw_avg" in "app"."revenue_by_customer", kept at full precision from now on and rebuilt from the landing table "app"."orders_state"
--     (the landing table is locked while this runs; generated avg columns are re-created, last in the table)
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0002_upgrade_aggregate_revenue.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:8dd99b79247da3f9b48fa42774396f10e53d7d6ce090f72d1f91cb942b514908
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","internal_version":6,"pipeline":"shop","roles":{"owner":"cdcsync_owner","writer":"cdcsync_writer"},"sinks":{"revenue":{"aggregate":{"aggregates":[{"accumulator_type":"numeric(18,2)","fn":"sum","index":null,"name":"revenue","source":"amount","type":"numeric(18,2)"},{"accumulator_type":null,"fn":"count","index":null,"name":"orders","source":null,"type":"bigint"},{"accumulator_type":"bigint","fn":"sum","index":null,"name":"units","source":"qty","type":"bigint"},{"accumulator_type":"numeric","fn":"avg","index":null,"name":"avg_amount","source":"amount","type":"numeric"},{"accumulator_type":"double precision","fn":"avg","index":null,"name":"avg_price","source":"price","type":"double precision"},{"accumulator_type":null,"fn":"min","index":"revenue_by_customer__amount__minmax","name":"smallest","source":"amount","type":"numeric(12,2)"},{"accumulator_type":null,"fn":"max","index":"revenue_by_customer__amount__minmax","name":"amount","source":"amount","type":"numeric(12,2)"},{"accumulator_type":"numeric","fn":"sum","index":null,"name":"fine_total","source":"fine","type":"numeric(18,2)"},{"accumulator_type":"numeric","fn":"avg","index":null,"name":"fine_avg_f","source":"fine","type":"double precision"},{"accumulator_type":"numeric","fn":"avg","index":null,"name":"raw_avg","scale_index":"revenue_by_customer__raw__scale","source":"raw","type":"numeric"}],"empty_groups":"delete","empty_index":"revenue_by_customer__empty","functions":{"delete":"shop__revenue__agg_delete","insert":"shop__revenue__agg_insert","update":"shop__revenue__agg_update"},"group_by":[{"cast":true,"name":"customer_id","source":"customer_id","type":"bigint"},{"cast":false,"name":"region","source":"region","type":"character varying(8)"}],"revision":2,"table":"revenue_by_customer"},"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"integer"},{"name":"region","type":"character varying(8)"},{"name":"amount","type":"numeric(12,2)"},{"name":"qty","type":"integer"},{"name":"price","type":"double precision"},{"name":"paid","type":"boolean"},{"name":"meta","type":"jsonb"},{"name":"fine","type":"numeric(12,4)"},{"name":"raw","type":"numeric"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__revenue__stage","table":"orders_state","tombstone_table":"shop__revenue__tombstones","version_type":"numeric(38,0)"}}}


SET LOCAL ROLE "cdcsync_owner";


LOCK TABLE "app"."orders_state" IN SHARE ROW EXCLUSIVE MODE;
ALTER TABLE "app"."revenue_by_customer" ADD COLUMN IF NOT EXISTS "_cdc_fine_total_sum" numeric;
ALTER TABLE "app"."revenue_by_customer" DROP COLUMN IF EXISTS "fine_avg_f";
ALTER TABLE "app"."revenue_by_customer" ALTER COLUMN "fine_avg_f_sum" TYPE numeric;
ALTER TABLE "app"."revenue_by_customer" DROP COLUMN IF EXISTS "raw_avg";
ALTER TABLE "app"."revenue_by_customer" ALTER COLUMN "raw_avg_sum" TYPE numeric;
ALTER TABLE "app"."revenue_by_customer" ADD COLUMN IF NOT EXISTS "_cdc_raw_avg_scale" integer;
UPDATE "app"."revenue_by_customer" AS a SET
    "_cdc_fine_total_sum" = s."v1",
    "fine_total" = (s."v1")::numeric(18,2),
    "fine_avg_f_sum" = s."v2",
    "raw_avg_sum" = s."v3",
    "_cdc_raw_avg_scale" = s."s3"
FROM (
    SELECT (l."customer_id")::bigint AS "customer_id", l."region" AS "region", sum((l."fine")::numeric) AS "v1", sum((l."fine")::numeric) AS "v2", sum((l."raw")::numeric) AS "v3", max(scale(l."raw")) AS "s3"
    FROM "app"."orders_state" AS l
    GROUP BY "customer_id", "region"
) AS s
WHERE a."customer_id" IS NOT DISTINCT FROM s."customer_id" AND a."region" IS NOT DISTINCT FROM s."region";
ALTER TABLE "app"."revenue_by_customer" ADD COLUMN "fine_avg_f" double precision GENERATED ALWAYS AS ((CASE WHEN "fine_avg_f_count" = 0 THEN NULL ELSE "fine_avg_f_sum" / "fine_avg_f_count" END)::double precision) STORED;
ALTER TABLE "app"."revenue_by_customer" ADD COLUMN "raw_avg" numeric GENERATED ALWAYS AS ((CASE WHEN "raw_avg_count" = 0 THEN NULL ELSE round("raw_avg_sum", "_cdc_raw_avg_scale") / "raw_avg_count" END)::numeric) STORED;

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
    "fine_total" numeric(18,2),
    "_cdc_fine_total_sum" numeric,
    "_cdc_fine_total_n" bigint NOT NULL DEFAULT 0,
    "fine_avg_f_sum" numeric,
    "fine_avg_f_count" bigint NOT NULL DEFAULT 0,
    "fine_avg_f" double precision GENERATED ALWAYS AS ((CASE WHEN "fine_avg_f_count" = 0 THEN NULL ELSE "fine_avg_f_sum" / "fine_avg_f_count" END)::double precision) STORED,
    "raw_avg_sum" numeric,
    "raw_avg_count" bigint NOT NULL DEFAULT 0,
    "_cdc_raw_avg_scale" integer,
    "raw_avg" numeric GENERATED ALWAYS AS ((CASE WHEN "raw_avg_count" = 0 THEN NULL ELSE round("raw_avg_sum", "_cdc_raw_avg_scale") / "raw_avg_count" END)::numeric) STORED,
    "_cdc_rows" bigint NOT NULL DEFAULT 0,
    UNIQUE NULLS NOT DISTINCT ("customer_id", "region")
);
COMMENT ON TABLE "app"."revenue_by_customer" IS 'maintained by triggers on "app"."orders_state" (cdcsync pipeline ''shop'', sink ''revenue''); do not write to it by hand';
GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."revenue_by_customer" TO "cdcsync_writer";

CREATE INDEX IF NOT EXISTS "revenue_by_customer__amount__minmax" ON "app"."orders_state" ((("customer_id")::bigint), "region", "amount");

CREATE INDEX IF NOT EXISTS "revenue_by_customer__raw__scale" ON "app"."orders_state" ((("customer_id")::bigint), "region", (scale("raw")));

CREATE OR REPLACE FUNCTION "cdcsync"."shop__revenue__agg_insert"() RETURNS trigger LANGUAGE plpgsql AS $cdcsync$
BEGIN
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "region", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "units", "_cdc_units_n", "avg_amount_sum", "avg_amount_count", "avg_price_sum", "avg_price_count", "smallest", "amount", "_cdc_fine_total_sum", "fine_total", "_cdc_fine_total_n", "fine_avg_f_sum", "fine_avg_f_count", "raw_avg_sum", "raw_avg_count", "_cdc_raw_avg_scale")
    SELECT "customer_id", "region", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), sum(d."_cdc_rows"), sum(d."v3"), sum(d."n4"), sum(d."v5"), sum(d."n2"), sum(d."v6"), sum(d."n7"), min(d."v8"), max(d."v8"), sum(d."v9"), (sum(d."v9"))::numeric(18,2), sum(d."n10"), sum(d."v9"), sum(d."n10"), sum(d."v11"), sum(d."n12"), max(d."s13")
    FROM (
        SELECT (r."customer_id")::bigint AS "customer_id", r."region" AS "region", 1 AS "_cdc_rows",
            (r."amount")::numeric(18,2) AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE 1 END AS "n2",
            (r."qty")::bigint AS "v3",
            CASE WHEN r."qty" IS NULL THEN 0 ELSE 1 END AS "n4",
            (r."amount")::numeric AS "v5",
            (r."price")::double precision AS "v6",
            CASE WHEN r."price" IS NULL THEN 0 ELSE 1 END AS "n7",
            (r."amount")::numeric(12,2) AS "v8",
            (r."fine")::numeric AS "v9",
            CASE WHEN r."fine" IS NULL THEN 0 ELSE 1 END AS "n10",
            (r."raw")::numeric AS "v11",
            CASE WHEN r."raw" IS NULL THEN 0 ELSE 1 END AS "n12",
            scale(r."raw") AS "s13"
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
        "amount" = greatest(a."amount", EXCLUDED."amount"),
        "_cdc_fine_total_sum" = CASE WHEN a."_cdc_fine_total_n" + EXCLUDED."_cdc_fine_total_n" = 0 THEN NULL
            ELSE coalesce(a."_cdc_fine_total_sum", 0) + coalesce(EXCLUDED."_cdc_fine_total_sum", 0) END,
        "fine_total" = (CASE WHEN a."_cdc_fine_total_n" + EXCLUDED."_cdc_fine_total_n" = 0 THEN NULL
            ELSE coalesce(a."_cdc_fine_total_sum", 0) + coalesce(EXCLUDED."_cdc_fine_total_sum", 0) END)::numeric(18,2),
        "_cdc_fine_total_n" = a."_cdc_fine_total_n" + EXCLUDED."_cdc_fine_total_n",
        "fine_avg_f_sum" = CASE WHEN a."fine_avg_f_count" + EXCLUDED."fine_avg_f_count" = 0 THEN NULL
            ELSE coalesce(a."fine_avg_f_sum", 0) + coalesce(EXCLUDED."fine_avg_f_sum", 0) END,
        "fine_avg_f_count" = a."fine_avg_f_count" + EXCLUDED."fine_avg_f_count",
        "raw_avg_sum" = CASE WHEN a."raw_avg_count" + EXCLUDED."raw_avg_count" = 0 THEN NULL
            ELSE coalesce(a."raw_avg_sum", 0) + coalesce(EXCLUDED."raw_avg_sum", 0) END,
        "raw_avg_count" = a."raw_avg_count" + EXCLUDED."raw_avg_count",
"_cdc_raw_avg_scale" = greatest(a."_cdc_raw_avg_scale", EXCLUDED."_cdc_raw_avg_scale");
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
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "region", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "units", "_cdc_units_n", "avg_amount_sum", "avg_amount_count", "avg_price_sum", "avg_price_count", "smallest", "amount", "_cdc_fine_total_sum", "fine_total", "_cdc_fine_total_n", "fine_avg_f_sum", "fine_avg_f_count", "raw_avg_sum", "raw_avg_count", "_cdc_raw_avg_scale")
    SELECT "customer_id", "region", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), sum(d."_cdc_rows"), sum(d."v3"), sum(d."n4"), sum(d."v5"), sum(d."n2"), sum(d."v6"), sum(d."n7"), min(d."v8"), max(d."v8"), sum(d."v9"), (sum(d."v9"))::numeric(18,2), sum(d."n10"), sum(d."v9"), sum(d."n10"), sum(d."v11"), sum(d."n12"), max(d."s13")
    FROM (
        SELECT (r."customer_id")::bigint AS "customer_id", r."region" AS "region", 1 AS "_cdc_rows",
            (r."amount")::numeric(18,2) AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE 1 END AS "n2",
            (r."qty")::bigint AS "v3",
            CASE WHEN r."qty" IS NULL THEN 0 ELSE 1 END AS "n4",
            (r."amount")::numeric AS "v5",
            (r."price")::double precision AS "v6",
            CASE WHEN r."price" IS NULL THEN 0 ELSE 1 END AS "n7",
            (r."amount")::numeric(12,2) AS "v8",
            (r."fine")::numeric AS "v9",
            CASE WHEN r."fine" IS NULL THEN 0 ELSE 1 END AS "n10",
            (r."raw")::numeric AS "v11",
            CASE WHEN r."raw" IS NULL THEN 0 ELSE 1 END AS "n12",
            scale(r."raw") AS "s13"
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
            (r."amount")::numeric(12,2) AS "v8",
            -(r."fine")::numeric AS "v9",
            CASE WHEN r."fine" IS NULL THEN 0 ELSE -1 END AS "n10",
            -(r."raw")::numeric AS "v11",
            CASE WHEN r."raw" IS NULL THEN 0 ELSE -1 END AS "n12",
            scale(r."raw") AS "s13"
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
            ELSE a."amount" END,
        "_cdc_fine_total_sum" = CASE WHEN a."_cdc_fine_total_n" + EXCLUDED."_cdc_fine_total_n" = 0 THEN NULL
            ELSE coalesce(a."_cdc_fine_total_sum", 0) + coalesce(EXCLUDED."_cdc_fine_total_sum", 0) END,
        "fine_total" = (CASE WHEN a."_cdc_fine_total_n" + EXCLUDED."_cdc_fine_total_n" = 0 THEN NULL
            ELSE coalesce(a."_cdc_fine_total_sum", 0) + coalesce(EXCLUDED."_cdc_fine_total_sum", 0) END)::numeric(18,2),
        "_cdc_fine_total_n" = a."_cdc_fine_total_n" + EXCLUDED."_cdc_fine_total_n",
        "fine_avg_f_sum" = CASE WHEN a."fine_avg_f_count" + EXCLUDED."fine_avg_f_count" = 0 THEN NULL
            ELSE coalesce(a."fine_avg_f_sum", 0) + coalesce(EXCLUDED."fine_avg_f_sum", 0) END,
        "fine_avg_f_count" = a."fine_avg_f_count" + EXCLUDED."fine_avg_f_count",
        "raw_avg_sum" = CASE WHEN a."raw_avg_count" + EXCLUDED."raw_avg_count" = 0 THEN NULL
            ELSE coalesce(a."raw_avg_sum", 0) + coalesce(EXCLUDED."raw_avg_sum", 0) END,
        "raw_avg_count" = a."raw_avg_count" + EXCLUDED."raw_avg_count",
"_cdc_raw_avg_scale" = CASE WHEN EXCLUDED."_cdc_raw_avg_scale" >= a."_cdc_raw_avg_scale"
            THEN CASE WHEN a."customer_id" IS NULL OR a."region" IS NULL
                THEN (SELECT max(scale(l."raw")) FROM "app"."orders_state" AS l WHERE ((l."customer_id")::bigint = a."customer_id" OR ((l."customer_id")::bigint IS NULL AND a."customer_id" IS NULL)) AND (l."region" = a."region" OR (l."region" IS NULL AND a."region" IS NULL)))::integer
                ELSE (SELECT max(scale(l."raw")) FROM "app"."orders_state" AS l WHERE (l."customer_id")::bigint = a."customer_id" AND l."region" = a."region")::integer END
            WHEN a."_cdc_raw_avg_scale" IS NULL THEN EXCLUDED."_cdc_raw_avg_scale"
            ELSE a."_cdc_raw_avg_scale" END
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
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "region", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "units", "_cdc_units_n", "avg_amount_sum", "avg_amount_count", "avg_price_sum", "avg_price_count", "smallest", "amount", "_cdc_fine_total_sum", "fine_total", "_cdc_fine_total_n", "fine_avg_f_sum", "fine_avg_f_count", "raw_avg_sum", "raw_avg_count", "_cdc_raw_avg_scale")
    SELECT "customer_id", "region", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), sum(d."_cdc_rows"), sum(d."v3"), sum(d."n4"), sum(d."v5"), sum(d."n2"), sum(d."v6"), sum(d."n7"), min(d."v8"), max(d."v8"), sum(d."v9"), (sum(d."v9"))::numeric(18,2), sum(d."n10"), sum(d."v9"), sum(d."n10"), sum(d."v11"), sum(d."n12"), max(d."s13")
    FROM (
        SELECT (r."customer_id")::bigint AS "customer_id", r."region" AS "region", -1 AS "_cdc_rows",
            -(r."amount")::numeric(18,2) AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE -1 END AS "n2",
            -(r."qty")::bigint AS "v3",
            CASE WHEN r."qty" IS NULL THEN 0 ELSE -1 END AS "n4",
            -(r."amount")::numeric AS "v5",
            -(r."price")::double precision AS "v6",
            CASE WHEN r."price" IS NULL THEN 0 ELSE -1 END AS "n7",
            (r."amount")::numeric(12,2) AS "v8",
            -(r."fine")::numeric AS "v9",
            CASE WHEN r."fine" IS NULL THEN 0 ELSE -1 END AS "n10",
            -(r."raw")::numeric AS "v11",
            CASE WHEN r."raw" IS NULL THEN 0 ELSE -1 END AS "n12",
            scale(r."raw") AS "s13"
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
            ELSE a."amount" END,
        "_cdc_fine_total_sum" = CASE WHEN a."_cdc_fine_total_n" + EXCLUDED."_cdc_fine_total_n" = 0 THEN NULL
            ELSE coalesce(a."_cdc_fine_total_sum", 0) + coalesce(EXCLUDED."_cdc_fine_total_sum", 0) END,
        "fine_total" = (CASE WHEN a."_cdc_fine_total_n" + EXCLUDED."_cdc_fine_total_n" = 0 THEN NULL
            ELSE coalesce(a."_cdc_fine_total_sum", 0) + coalesce(EXCLUDED."_cdc_fine_total_sum", 0) END)::numeric(18,2),
        "_cdc_fine_total_n" = a."_cdc_fine_total_n" + EXCLUDED."_cdc_fine_total_n",
        "fine_avg_f_sum" = CASE WHEN a."fine_avg_f_count" + EXCLUDED."fine_avg_f_count" = 0 THEN NULL
            ELSE coalesce(a."fine_avg_f_sum", 0) + coalesce(EXCLUDED."fine_avg_f_sum", 0) END,
        "fine_avg_f_count" = a."fine_avg_f_count" + EXCLUDED."fine_avg_f_count",
        "raw_avg_sum" = CASE WHEN a."raw_avg_count" + EXCLUDED."raw_avg_count" = 0 THEN NULL
            ELSE coalesce(a."raw_avg_sum", 0) + coalesce(EXCLUDED."raw_avg_sum", 0) END,
        "raw_avg_count" = a."raw_avg_count" + EXCLUDED."raw_avg_count",
"_cdc_raw_avg_scale" = CASE WHEN EXCLUDED."_cdc_raw_avg_scale" >= a."_cdc_raw_avg_scale"
            THEN CASE WHEN a."customer_id" IS NULL OR a."region" IS NULL
                THEN (SELECT max(scale(l."raw")) FROM "app"."orders_state" AS l WHERE ((l."customer_id")::bigint = a."customer_id" OR ((l."customer_id")::bigint IS NULL AND a."customer_id" IS NULL)) AND (l."region" = a."region" OR (l."region" IS NULL AND a."region" IS NULL)))::integer
                ELSE (SELECT max(scale(l."raw")) FROM "app"."orders_state" AS l WHERE (l."customer_id")::bigint = a."customer_id" AND l."region" = a."region")::integer END
            WHEN a."_cdc_raw_avg_scale" IS NULL THEN EXCLUDED."_cdc_raw_avg_scale"
            ELSE a."_cdc_raw_avg_scale" END
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
VALUES ('shop', '0002_upgrade_aggregate_revenue.sql', 'sha256:8dd99b79247da3f9b48fa42774396f10e53d7d6ce090f72d1f91cb942b514908')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

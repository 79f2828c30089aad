-- cdcsync migration 0012_upgrade_aggregate_revenue.sql for pipeline 'shop' (postgres)
-- generator: cdcsync 0.1.0
-- upgrades:
--   the trigger functions on "app"."orders_state" that keep "app"."revenue_by_customer", replaced by revision 2 (same results, cheaper SQL; the tables are unchanged)
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0012_upgrade_aggregate_revenue.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:c6757d271ce843c8e8410f0879b8dec56896c4fc995d74abbe7f6d47ff768d37
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","internal_version":6,"pipeline":"shop","roles":{"owner":"cdcsync_owner","writer":"cdcsync_writer"},"sinks":{"orders_audit":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"soft","primary_key":["id"],"schema":"app","stage_table":"shop__orders_audit__stage","table":"orders_with_deleted","tombstone_table":null,"version_type":"numeric(38,0)"},"orders_mirror":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__orders_mirror__stage","table":"orders","tombstone_table":"shop__orders_mirror__tombstones","version_type":"numeric(38,0)"},"revenue":{"aggregate":{"aggregates":[{"accumulator_type":"numeric","fn":"sum","index":null,"name":"revenue","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"count","index":null,"name":"orders","source":null,"type":"bigint"},{"accumulator_type":"numeric","fn":"avg","index":null,"name":"avg_amount","source":"amount","type":"numeric"},{"accumulator_type":null,"fn":"max","index":"revenue_by_customer__amount__minmax","name":"largest","source":"amount","type":"numeric(12,2)"}],"empty_groups":"delete","empty_index":"revenue_by_customer__empty","functions":{"delete":"shop__revenue__agg_delete","insert":"shop__revenue__agg_insert","update":"shop__revenue__agg_update"},"group_by":[{"cast":false,"name":"customer_id","source":"customer_id","type":"bigint"}],"revision":2,"table":"revenue_by_customer"},"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__revenue__stage","table":"orders_state","tombstone_table":"shop__revenue__tombstones","version_type":"numeric(38,0)"}}}


SET LOCAL ROLE "cdcsync_owner";


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
GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."revenue_by_customer" TO "cdcsync_writer";

CREATE INDEX IF NOT EXISTS "revenue_by_customer__amount__minmax" ON "app"."orders_state" ("customer_id", "amount");

CREATE OR REPLACE FUNCTION "cdcsync"."shop__revenue__agg_insert"() RETURNS trigger LANGUAGE plpgsql AS $cdcsync$
BEGIN
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "avg_amount_sum", "avg_amount_count", "largest")
    SELECT "customer_id", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), max(d."v3")
    FROM (
        SELECT r."customer_id" AS "customer_id", 1 AS "_cdc_rows",
            (r."amount")::numeric AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE 1 END AS "n2",
            (r."amount")::numeric(12,2) AS "v3"
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
DECLARE
    emptied boolean;
BEGIN
    WITH "_cdc_delta" AS (
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "avg_amount_sum", "avg_amount_count", "largest")
    SELECT "customer_id", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), max(d."v3")
    FROM (
        SELECT r."customer_id" AS "customer_id", 1 AS "_cdc_rows",
            (r."amount")::numeric AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE 1 END AS "n2",
            (r."amount")::numeric(12,2) AS "v3"
        FROM new_rows AS r
        UNION ALL
        SELECT r."customer_id" AS "customer_id", -1 AS "_cdc_rows",
            -(r."amount")::numeric AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE -1 END AS "n2",
            (r."amount")::numeric(12,2) AS "v3"
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
        "largest" = CASE WHEN EXCLUDED."largest" >= a."largest"
            THEN CASE WHEN a."customer_id" IS NULL
                THEN (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE (l."customer_id" = a."customer_id" OR (l."customer_id" IS NULL AND a."customer_id" IS NULL)))::numeric(12,2)
                ELSE (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE l."customer_id" = a."customer_id")::numeric(12,2) END
            WHEN a."largest" IS NULL THEN EXCLUDED."largest"
            ELSE a."largest" END
    RETURNING "_cdc_rows" = 0 AS "_cdc_emptied"
    )
    SELECT coalesce(bool_or("_cdc_emptied"), false) INTO emptied FROM "_cdc_delta";

    IF emptied THEN
        DELETE FROM "app"."revenue_by_customer" AS a
        USING (SELECT DISTINCT r."customer_id" AS "customer_id" FROM old_rows AS r) AS r
        WHERE a."_cdc_rows" = 0 AND a."customer_id" = r."customer_id";
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
DECLARE
    emptied boolean;
BEGIN
    WITH "_cdc_delta" AS (
    INSERT INTO "app"."revenue_by_customer" AS a ("customer_id", "_cdc_rows", "revenue", "_cdc_revenue_n", "orders", "avg_amount_sum", "avg_amount_count", "largest")
    SELECT "customer_id", sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), sum(d."_cdc_rows"), sum(d."v1"), sum(d."n2"), max(d."v3")
    FROM (
        SELECT r."customer_id" AS "customer_id", -1 AS "_cdc_rows",
            -(r."amount")::numeric AS "v1",
            CASE WHEN r."amount" IS NULL THEN 0 ELSE -1 END AS "n2",
            (r."amount")::numeric(12,2) AS "v3"
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
        "largest" = CASE WHEN EXCLUDED."largest" >= a."largest"
            THEN CASE WHEN a."customer_id" IS NULL
                THEN (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE (l."customer_id" = a."customer_id" OR (l."customer_id" IS NULL AND a."customer_id" IS NULL)))::numeric(12,2)
                ELSE (SELECT max(l."amount") FROM "app"."orders_state" AS l WHERE l."customer_id" = a."customer_id")::numeric(12,2) END
            WHEN a."largest" IS NULL THEN EXCLUDED."largest"
            ELSE a."largest" END
    RETURNING "_cdc_rows" = 0 AS "_cdc_emptied"
    )
    SELECT coalesce(bool_or("_cdc_emptied"), false) INTO emptied FROM "_cdc_delta";

    IF emptied THEN
        DELETE FROM "app"."revenue_by_customer" AS a
        USING (SELECT DISTINCT r."customer_id" AS "customer_id" FROM old_rows AS r) AS r
        WHERE a."_cdc_rows" = 0 AND a."customer_id" = r."customer_id";
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
VALUES ('shop', '0012_upgrade_aggregate_revenue.sql', 'sha256:c6757d271ce843c8e8410f0879b8dec56896c4fc995d74abbe7f6d47ff768d37')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

ALTER TABLE "app"."orders"
    ADD COLUMN IF NOT EXISTS "shipped_at" timestamp with time zone,
    ADD COLUMN IF NOT EXISTS "Region" character varying(8);

ALTER TABLE "cdcsync"."shop__orders_mirror__stage"
    ADD COLUMN IF NOT EXISTS "shipped_at" timestamp with time zone,
    ADD COLUMN IF NOT EXISTS "Region" character varying(8);

-- cdcsync migration 0002_upgrade_internal_tables.sql for pipeline 'shop' (postgres)
-- generator: cdcsync 0.1.0
-- creates:
--   table "cdcsync"."truncations": the last truncate applied per sink
-- apply with: cdcsync migrate PIPELINE.yaml
--         or: psql --single-transaction -v ON_ERROR_STOP=1 -f 0002_upgrade_internal_tables.sql
-- the checksum covers the SQL between this header and the ledger record at the end;
-- an applied file must not change: write a new migration instead
-- checksum: sha256:37883cb82ac813f7b3bc4224f5fb53240dc59e4ad7612181abcde8655904dfef
-- cdcsync-state: {"database":"postgres","format":1,"internal_schema":"cdcsync","internal_version":2,"pipeline":"shop","sinks":{"orders_audit":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"soft","primary_key":["id"],"schema":"app","stage_table":"shop__orders_audit__stage","table":"orders_with_deleted","tombstone_table":null},"orders_mirror":{"columns":[{"name":"id","type":"bigint"},{"name":"customer_id","type":"bigint"},{"name":"amount","type":"numeric(12,2)"},{"name":"status","type":"text"},{"name":"Note","type":"text"},{"name":"updated_at","type":"timestamp with time zone"}],"delete_mode":"hard","primary_key":["id"],"schema":"app","stage_table":"shop__orders_mirror__stage","table":"orders","tombstone_table":"shop__orders_mirror__tombstones"}}}

CREATE TABLE IF NOT EXISTS "cdcsync"."truncations" (
    "pipeline" text,
    "sink" text,
    "version" bigint NOT NULL,
    "truncated_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("pipeline", "sink")
);
COMMENT ON TABLE "cdcsync"."truncations" IS 'cdcsync: per sink, the version of the newest source truncate applied; older changes are ignored';

-- cdcsync-ledger: record this file as applied (cdcsync migrate records it itself)
INSERT INTO "cdcsync"."schema_migrations" ("pipeline", "filename", "checksum")
VALUES ('shop', '0002_upgrade_internal_tables.sql', 'sha256:37883cb82ac813f7b3bc4224f5fb53240dc59e4ad7612181abcde8655904dfef')
ON CONFLICT ("pipeline", "filename") DO NOTHING;

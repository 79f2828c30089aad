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

CREATE TABLE IF NOT EXISTS "cdcsync"."truncations" (
    "pipeline" text,
    "sink" text,
    "version" numeric(38,0) NOT NULL,
    "truncated_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("pipeline", "sink")
);
COMMENT ON TABLE "cdcsync"."truncations" IS 'cdcsync: per sink, the version of the newest source truncate applied; older changes are ignored';

CREATE TABLE IF NOT EXISTS "cdcsync"."source_positions" (
    "pipeline" text,
    "sink" text,
    "position" numeric(38,0),
    "snapshot" numeric(38,0),
    "seen_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("pipeline", "sink")
);
COMMENT ON TABLE "cdcsync"."source_positions" IS 'cdcsync: per sink, the newest source commit position and snapshot merged; a new snapshot below the position stops the run';

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

CREATE TABLE IF NOT EXISTS "cdcsync"."dynamic_table_changes" (
    "table_schema" text,
    "table_name" text,
    "change_count" bigint NOT NULL,
    PRIMARY KEY ("table_schema", "table_name")
);
COMMENT ON TABLE "cdcsync"."dynamic_table_changes" IS 'cdcsync: per dynamic table, how many statements changed it; the pipeline reloads its keys when this moves';

CREATE OR REPLACE FUNCTION "cdcsync"."count_dynamic_table_change"() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $cdcsync$
BEGIN
    INSERT INTO "cdcsync"."dynamic_table_changes" AS counter ("table_schema", "table_name", "change_count")
    VALUES (TG_TABLE_SCHEMA, TG_TABLE_NAME, 1)
    ON CONFLICT ("table_schema", "table_name") DO UPDATE SET "change_count" = counter."change_count" + 1;
    RETURN NULL;
END
$cdcsync$;

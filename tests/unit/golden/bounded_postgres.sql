SELECT "Re gion"::text, "we""ird"::text
FROM (
  SELECT "Re gion", "we""ird", row_number() OVER (ORDER BY "Re gion", "we""ird") AS "_cdc_row"
  FROM "My App"."select"
) AS keys
WHERE ("_cdc_row" - 1) %% %(step)s = 0
ORDER BY "_cdc_row"

COPY (
  SELECT "Re gion", "we""ird", encode("blob", 'hex'), "at", array_to_json("Tags"::text[])
  FROM "My App"."select"
  WHERE ("Re gion", "we""ird") >= (CAST(%(lo0)s AS text), CAST(%(lo1)s AS bigint))
    AND ("Re gion", "we""ird") < (CAST(%(hi0)s AS text), CAST(%(hi1)s AS bigint))
) TO STDOUT WITH (FORMAT csv)

COPY (
  SELECT "Re gion", "we""ird", encode("blob", 'hex'), "at", array_to_json("Tags"::text[])
  FROM "My App"."select"
  WHERE TRUE
    AND ("Re gion", "we""ird") < (CAST(%(hi0)s AS text), CAST(%(hi1)s AS bigint))
) TO STDOUT WITH (FORMAT csv)

COPY (
  SELECT "Re gion", "we""ird", encode("blob", 'hex'), "at", array_to_json("Tags"::text[])
  FROM "My App"."select"
  WHERE ("Re gion", "we""ird") >= (CAST(%(lo0)s AS text), CAST(%(lo1)s AS bigint))
    AND TRUE
) TO STDOUT WITH (FORMAT csv)

COPY (
  SELECT "Re gion", "we""ird", encode("blob", 'hex'), "at", array_to_json("Tags"::text[])
  FROM "My App"."select"
  WHERE TRUE
    AND TRUE
) TO STDOUT WITH (FORMAT csv)

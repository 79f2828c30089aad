SELECT toString(`Re gion`), toString(`we\`ird`)
FROM (
  SELECT `Re gion`, `we\`ird`, row_number() OVER (ORDER BY `Re gion`, `we\`ird`) AS _cdc_row
  FROM `my db`.`select` FINAL
)
WHERE (_cdc_row - 1) % {step:UInt64} = 0
ORDER BY _cdc_row

SELECT `Re gion`, `we\`ird`, hex(`blob`)
FROM `my db`.`select`
WHERE (`Re gion`, `we\`ird`) >= (CAST({lo0:String}, 'String'), CAST({lo1:String}, 'DateTime64(6, \'UTC\')'))
  AND (`Re gion`, `we\`ird`) < (CAST({hi0:String}, 'String'), CAST({hi1:String}, 'DateTime64(6, \'UTC\')'))

SELECT `Re gion`, `we\`ird`, hex(`blob`)
FROM `my db`.`select`
WHERE 1
  AND 1

-- fence_create.sql: makes the fencing table if it is missing, with its one
-- row. Two statements, sent one by one (split on ";\n").
-- No parameters. The fence table's name (Options.FenceTable, quoted)
-- replaces $TABLE.
CREATE TABLE IF NOT EXISTS $TABLE (
  id TINYINT UNSIGNED NOT NULL PRIMARY KEY,
  n BIGINT UNSIGNED NOT NULL
) ENGINE = InnoDB;
INSERT IGNORE INTO $TABLE (id, n) VALUES (1, 0)

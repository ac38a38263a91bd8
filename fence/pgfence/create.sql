-- The guard table: one row per resource, holding the highest fence accepted
-- for it. {{table}} is the table's quoted name. numeric(20) holds every
-- uint64 fence.
CREATE TABLE IF NOT EXISTS {{table}} (
    resource text PRIMARY KEY,
    fence    numeric(20) NOT NULL
)

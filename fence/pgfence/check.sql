-- Records fence $2 as the highest of resource $1 unless a higher one is
-- recorded. Parameters: $1 resource (text), $2 fence (decimal text).
-- Returns one row when accepted, none when refused. Either way the row of
-- the resource stays locked until the caller's transaction ends, so a
-- concurrent check of the same resource waits for it and then sees its fence.
INSERT INTO {{table}} AS f (resource, fence) VALUES ($1, $2::numeric)
ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence
    WHERE f.fence <= EXCLUDED.fence
RETURNING f.fence::text

-- The highest fence accepted for resource $1 (text), as decimal text.
SELECT fence::text FROM {{table}} WHERE resource = $1

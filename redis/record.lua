-- record.lua: write a lock's record (dlock.Once's completion marker) only
-- if the lock is still the lease's.
--
-- KEYS[1]  the lock key   P{N} (default layout only)
-- KEYS[2]  the record     P{N}:record
-- ARGV[1]  the lease token
-- ARGV[2]  the record's value
-- ARGV[3]  how long to keep it, in milliseconds
--
-- Returns 1 when it wrote the record, 0 when the lock was not the lease's
-- (and nothing was written).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1

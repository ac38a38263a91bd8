-- unrecord.lua: delete a record that a refused Record wrote on a minority of
-- the nodes, only if it is still that write's.
--
-- KEYS[1]  the record     P{N}:record
-- ARGV[1]  the value the refused Record wrote
--
-- Returns 1 when it deleted the record, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0

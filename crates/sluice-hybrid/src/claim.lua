-- The hybrid store's claim script: the first step of a settle, which takes a reservation's
-- record for the one settle that may give back or charge. Atomic, so that of two settles, from
-- any instances, one claims it and the other finds it settled.
--
-- KEYS[1]: the record's key.
-- ARGV[1]: nanoseconds added to Redis TIME (0 in production; see clock.lua).
--
-- Returns 'unknown' (no record), 'settled' (claimed before), 'expired' (its ttl has ended), or
-- the record's items, once: the record is marked settled.
--#include clock.lua
--#include helpers.lua

local rec = KEYS[1]
local head = redis.pcall('LRANGE', rec, 0, 1)
if type(head) ~= 'table' or #head < 2 then return 'unknown' end
if head[1] ~= 'open' then return 'settled' end
if since_now(head[2]) <= 0 then return 'expired' end
redis.call('LSET', rec, 0, 'settled')
return redis.call('LRANGE', rec, 2, -1)

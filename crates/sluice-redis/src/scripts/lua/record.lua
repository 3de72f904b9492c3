-- The record script: records a reservation whose checks the check script has committed, slot by
-- slot, on a Cluster, where the record's key is in a slot of its own. `RECORD` in
-- src/scripts/mod.rs documents its KEYS, ARGV and reply.

--#include clock.lua
--#include helpers.lua

local rec = KEYS[1]
if redis.call('EXISTS', rec) == 1 then
  return redis.error_reply('RESERVED a reservation of this id exists already')
end
local ttl = tonumber(ARGV[2])
local items = {}
for i = 3, #ARGV do items[#items + 1] = ARGV[i] end
--#include write_reservation.lua
return 1

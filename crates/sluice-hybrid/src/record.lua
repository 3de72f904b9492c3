-- The hybrid store's record script: records a reservation whose checks this instance decided
-- locally, in the record format of the Redis store's reservations (`write_reservation.lua`), so
-- that any instance can claim it with `claim.lua`.
--
-- KEYS[1]: the record's key.
-- ARGV[1]: nanoseconds added to Redis TIME (0 in production; see clock.lua).
-- ARGV[2]: the reservation's ttl in ns.
-- ARGV[3..]: the record's items: `hybrid`, then five per check (see `reservations.rs`).
--
-- Returns 1, or an error if a record of this id exists already.
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

-- Resets a hybrid counter: its value becomes a marker, "reset | <ms>", instead of going, so that
-- no instance lays the floor it read before the reset on the key (see `sync.lua`): a sync meets
-- the marker as a key under another algorithm, and starts the key afresh with a new birth,
-- which no floor read before matches. A key Redis holds no value for takes the floors.
--
-- KEYS[1]: the counter key.
-- ARGV[1]: nanoseconds added to Redis TIME (0 in production; see clock.lua).
-- ARGV[2]: how long (ms) the marker stays, when no sync replaces it.
--
-- Returns 1 when the key held a count (not a marker), 0 otherwise.
--#include clock.lua

local old = redis.call('GET', KEYS[1])
local ms = S * 1000 + math.floor(now / 1000000)
redis.call('SET', KEYS[1], 'reset | ' .. string.format('%d', ms), 'PX', ARGV[2])
if old and string.sub(old, 1, 6) ~= 'reset ' then return 1 end
return 0

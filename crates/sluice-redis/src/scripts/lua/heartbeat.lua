-- The hybrid store's heartbeat: records that an instance is alive and returns how many are, so
-- that each takes its share of what a limit has left between two syncs.
--
-- KEYS[1]: the registry of instances, a sorted set scored by when each was last seen (ms).
-- ARGV[1]: nanoseconds added to Redis TIME (0 in production; see clock.lua).
-- ARGV[2]: this instance's id.
-- ARGV[3]: how long (ms) an instance counts as alive after its last heartbeat.
--
-- Returns the number of instances alive.
--#include clock.lua
local ms = S * 1000 + math.floor(now / 1000000)
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], ms, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - ttl)
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return redis.call('ZCARD', KEYS[1])

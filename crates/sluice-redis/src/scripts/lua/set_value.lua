-- How the check script stores a counter's state when it is a string (every algorithm's but
-- those whose file has a store section): SET replaces a value of any type, and sets the TTL,
-- `reset` ns plus a second in whole milliseconds, in the same command.
local m = reset % 1000000
local ms = (reset - m) / 1000000 + 1000
if m > 0 then ms = ms + 1 end
redis.call('SET', key, state, 'PX', ms .. '')

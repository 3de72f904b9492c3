-- The time, shared by both scripts: Redis `TIME` plus the offset in ARGV[1], as S (whole seconds
-- since the epoch) and now (nanoseconds after S). No function is defined here, so that the check
-- script's single-check path runs without creating one.
local clock = redis.call('TIME')
local S = clock[1] + 0
local now = clock[2] * 1000
if ARGV[1] ~= '0' then
  now = now + ARGV[1]
  local r = math.fmod(now, 1000000000)
  if r < 0 then r = r + 1000000000 end
  S = S + (now - r) / 1000000000
  now = r
end

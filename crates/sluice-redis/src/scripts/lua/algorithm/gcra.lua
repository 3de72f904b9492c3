-- GCRA, the leaky bucket as a meter, as `sluice_core::Gcra` decides it: p1 burst, p2 emission
-- interval (ns). Stored as "<code> <tat>": the theoretical arrival time, an absolute time in
-- nanoseconds; how far it lies after now is the backlog. The contract of each section is in
-- check.lua and refund.lua.

--#section check
local burst, interval = p1, p2
local backlog = 0
if raw == nil then raw = redis.pcall('GET', key) end
if type(raw) == 'string' then
  local code, at = string.match(raw, '^(%d+) (%d+)$')
  -- Seconds and nanoseconds apart, since a timestamp is too long for a double. (A pattern
  -- that splits them backtracks, and costs microseconds.) Nine digits or fewer would be a
  -- time in 1970, long past: the same as none.
  if code == GCRA and #at > 9 then
    backlog = (string.sub(at, 1, -10) - S) * 1000000000 + (string.sub(at, -9) - now)
    if backlog < 0 then backlog = 0 end
  end
end
local horizon = burst * interval
if need > burst then
  retry = -1
else
  -- The core's backlog + need * interval > horizon, without a sum that can pass 2^53.
  local slack = horizon - need * interval
  if backlog > slack then
    retry = backlog - slack
  else
    allowed = 1
    backlog = backlog + cost * interval
  end
end
local left = horizon - backlog
if left > 0 then remaining = (left - left % interval) / interval end
if allowed == 1 and write then
  -- now + backlog, exactly: whole seconds and nanoseconds apart.
  local r = backlog % 1000000000
  local s = S + (backlog - r) / 1000000000
  r = r + now
  if r >= 1000000000 then s, r = s + 1, r - 1000000000 end
  state = string.format('%s %d%09d', GCRA, s, r)
end
reset = backlog

--#section refund
-- The arrival time moves back by the cost's share of the interval, never before now: a meter
-- with no backlog has nothing to give back. The token plays no part.
gcra_refund = function(key, raw, cost, burst, interval, p3, p4, token)
  local code, at = string.match(raw, '^(%d+) (%d+)$')
  if code ~= GCRA or #at <= 9 then return nil end
  local backlog = since_now(at)
  if backlog <= 0 then return nil end
  return GCRA .. ' ' .. after_now(sat(backlog - cost * interval))
end

--#section charge
-- The arrival time moves on by the cost's share of the interval from now or the backlog's end,
-- past the burst if need be: requests are refused until the backlog drains below it again.
gcra_charge = function(key, raw, cost, burst, interval, p3, p4)
  local backlog = 0
  local code, at = string.match(raw, '^(%d+) (%d+)$')
  if code == GCRA and #at > 9 then backlog = sat(since_now(at)) end
  backlog = exact(backlog + cost * interval)
  return GCRA .. ' ' .. after_now(backlog), backlog
end

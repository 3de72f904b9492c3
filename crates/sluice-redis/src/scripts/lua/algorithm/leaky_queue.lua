-- The leaky bucket as a queue, as `sluice_core::LeakyQueue` decides it: p1 capacity, p2 release
-- interval (ns), p3 maximum wait (ns), p4 1 if the rate is 0 (it admits nothing). Stored as
-- "<code> <next>": when the next free slot opens, an absolute time in nanoseconds; how far it
-- lies after now is the backlog. The contract of each section is in check.lua and refund.lua.

--#section check
local cap, interval = p1, p2
local backlog = 0
if raw == nil then raw = redis.pcall('GET', key) end
if type(raw) == 'string' then
  local code, at = string.match(raw, '^(%d+) (%d+)$')
  -- Seconds and nanoseconds apart, as for GCRA.
  if code == LEAKY_QUEUE and #at > 9 then
    backlog = (string.sub(at, 1, -10) - S) * 1000000000 + (string.sub(at, -9) - now)
    if backlog < 0 then backlog = 0 end
  end
end
local max_wait = p3 + 0
if p4 == '1' or need > cap then
  retry = -1
else
  local bound = (cap - need) * interval
  if bound > max_wait then bound = max_wait end
  if backlog > bound then
    retry = backlog - bound
  else
    allowed = 1
    delay = backlog
    backlog = backlog + cost * interval
  end
end
-- Free places behind the backlog: by the queue's length, and by the maximum wait.
local r = backlog % interval
local queued = (backlog - r) / interval
if r > 0 then queued = queued + 1 end
remaining = cap - queued
if remaining < 0 then remaining = 0 end
if max_wait < backlog then
  remaining = 0
else
  local slack = max_wait - backlog
  local by_wait = (slack - slack % interval) / interval + 1
  if by_wait < remaining then remaining = by_wait end
end
if allowed == 1 and write then
  -- now + backlog, exactly: whole seconds and nanoseconds apart.
  local r = backlog % 1000000000
  local s = S + (backlog - r) / 1000000000
  r = r + now
  if r >= 1000000000 then s, r = s + 1, r - 1000000000 end
  state = string.format('%s %d%09d', LEAKY_QUEUE, s, r)
end
reset = backlog

--#section refund
-- The next free slot moves back by the cost's share of the interval, never before now: an
-- empty queue has nothing to give back. The token plays no part.
leaky_queue_refund = function(key, raw, cost, cap, interval, p3, p4, token)
  local code, at = string.match(raw, '^(%d+) (%d+)$')
  if code ~= LEAKY_QUEUE or #at <= 9 then return nil end
  local backlog = since_now(at)
  if backlog <= 0 then return nil end
  return LEAKY_QUEUE .. ' ' .. after_now(sat(backlog - cost * interval))
end

--#section charge
-- The next free slot moves on by the cost's share of the interval from now or the queue's end,
-- past the queue's capacity if need be: requests are refused until it drains.
leaky_queue_charge = function(key, raw, cost, cap, interval, p3, p4)
  local backlog = 0
  local code, at = string.match(raw, '^(%d+) (%d+)$')
  if code == LEAKY_QUEUE and #at > 9 then backlog = sat(since_now(at)) end
  backlog = exact(backlog + cost * interval)
  return LEAKY_QUEUE .. ' ' .. after_now(backlog), backlog
end

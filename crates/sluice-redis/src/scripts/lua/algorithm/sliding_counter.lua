-- The sliding counter, as `sluice_core::SlidingCounter` decides it: p1 limit, p2 window (ns), p4
-- a window start near now (absolute ns) on the grid. Stored as "<code> <start> <current>
-- <previous>", the start an absolute time in nanoseconds; the refund token is the start of the
-- window the check counted in. The contract of each section is in check.lua and refund.lua.

--#section helpers
--#include mul_div.lua

--#section check
local limit, w, ref = p1, p2, p4
-- The window now falls in, on the grid through the reference start.
local start
do
  local n = #ref
  local r
  if n <= 9 then
    r = ref - S * 1000000000
  else
    r = (string.sub(ref, 1, n - 9) - S) * 1000000000 + string.sub(ref, n - 8)
  end
  local d = now - r
  local m = math.fmod(d, w)
  if m < 0 then m = m + w end
  start = r + (d - m)
end
if raw == nil then raw = redis.pcall('GET', key) end
local current, previous = 0, 0
if type(raw) == 'string' then
  local code, at, c, p = string.match(raw, '^(%d+) (%d+) (%d+) (%d+)$')
  if code == SLIDING_COUNTER and #at > 9 then
    local vstart = (string.sub(at, 1, -10) - S) * 1000000000 + string.sub(at, -9)
    if start <= vstart then
      start, current, previous = vstart, c + 0, p + 0
    elseif start - vstart == w then
      previous = c + 0
    end
  end
end
local elapsed = now - start
if elapsed < 0 then elapsed = 0 end
if elapsed > w - 1 then elapsed = w - 1 end
local to_next = w - elapsed
local estimate = mul_div(previous, w - elapsed, w, false) + current
remaining = limit - estimate
if remaining < 0 then remaining = 0 end
if need > limit then
  retry = -1
elseif need > remaining then
  -- The first offset into a window where `previous` weighs at most `room`, or nil.
  retry = nil
  if current + need <= limit then
    local room = limit - need - current
    if previous == 0 then
      retry = 0
    else
      local e = w + 1 - mul_div(room + 1, w, previous, true)
      if e < 0 then e = 0 end
      if e < w then
        retry = e - elapsed
        if retry < 0 then retry = 0 end
      end
    end
  end
  if retry == nil then
    -- In the next window, this window's count becomes the previous one.
    local e = w
    if current == 0 then
      e = 0
    else
      local f = w + 1 - mul_div(limit - need + 1, w, current, true)
      if f < 0 then f = 0 end
      if f < w then e = f end
    end
    retry = to_next + e
  end
else
  allowed = 1
  current = current + cost
  remaining = remaining - cost
end
if current > 0 then
  reset = to_next + w
elseif previous > 0 then
  reset = to_next
end
if allowed == 1 and cost > 0 then
  local r = start % 1000000000
  token = string.format('%d%09d', S + (start - r) / 1000000000, r)
  if write then
    state = string.format('%s %s %d %d', SLIDING_COUNTER, token, current, previous)
  end
end

--#section refund
-- The units go back to the window the check counted in (the token, its start): the stored
-- current window, or the previous one when the counter has moved on since, which still weighs.
-- An empty token names the window that holds now.
sliding_counter_refund = function(key, raw, cost, limit, w, p3, p4, token)
  local code, at, c, p = string.match(raw, '^(%d+) (%d+) (%d+) (%d+)$')
  if code ~= SLIDING_COUNTER then return nil end
  if token == '' then token = absolute(grid_start(rel(p4), w)) end
  local start = rel(at)
  local current, previous = tonumber(c), tonumber(p)
  if absolute(start) == token then
    current = sat(current - cost)
  elseif absolute(start - w) == token then
    previous = sat(previous - cost)
  else
    return nil
  end
  return SLIDING_COUNTER .. ' ' .. absolute(start) .. ' ' .. int(current) .. ' ' .. int(previous)
end

--#section charge
-- The units count in the window that holds now, rolled to as the check rolls, past the limit if
-- need be: requests are refused until its weight has drained.
sliding_counter_charge = function(key, raw, cost, limit, w, p3, p4)
  local start = grid_start(rel(p4), w)
  local current, previous = 0, 0
  local code, at, c, p = string.match(raw, '^(%d+) (%d+) (%d+) (%d+)$')
  if code == SLIDING_COUNTER and #at > 9 then
    local vstart = rel(at)
    if start <= vstart then
      start, current, previous = vstart, tonumber(c), tonumber(p)
    elseif start - vstart == w then
      previous = tonumber(c)
    end
  end
  -- A count holds at most 2^32 - 1, as the core's does: far past any limit.
  current = current + cost
  if current > 4294967295 then current = 4294967295 end
  local elapsed = now - start
  if elapsed < 0 then elapsed = 0 end
  if elapsed > w - 1 then elapsed = w - 1 end
  return SLIDING_COUNTER .. ' ' .. absolute(start) .. ' ' .. int(current) .. ' ' .. int(previous),
    2 * w - elapsed
end

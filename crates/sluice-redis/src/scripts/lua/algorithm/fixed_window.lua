-- The fixed window, as `sluice_core::FixedWindow` decides it: p1 limit, p2 window (ns), p3 1 if
-- clock-aligned, p4 a window start near now (absolute ns) on the clock-aligned grid. Stored as
-- "<code> <start> <count>", the start an absolute time in nanoseconds; the refund token is the
-- start. The contract of each section is in check.lua and refund.lua.

--#section check
local limit, w, ref = p1, p2, p4
local start
if p3 == '1' then
  -- The window now falls in, on the grid through the reference start.
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
local vstart, count
if type(raw) == 'string' then
  local code, at, c = string.match(raw, '^(%d+) (%d+) (%d+)$')
  if code == FIXED_WINDOW and #at > 9 then
    vstart = (string.sub(at, 1, -10) - S) * 1000000000 + string.sub(at, -9)
    count = c + 0
  end
end
if start == nil then
  if vstart ~= nil and now < vstart + w then start = vstart else start = now end
end
-- A clock that stepped back into an earlier window keeps counting the later one.
if vstart ~= nil and start <= vstart and count > 0 then start = vstart else count = 0 end
reset = start + w - now
if reset < 0 then reset = 0 end
remaining = limit - count
if remaining < 0 then remaining = 0 end
if need > limit then
  retry = -1
elseif need > remaining then
  retry = reset
else
  allowed = 1
  count = count + cost
  remaining = remaining - cost
  if count == 0 then reset = 0 end
end
if allowed == 1 and cost > 0 then
  local r = start % 1000000000
  token = string.format('%d%09d', S + (start - r) / 1000000000, r)
  if write then state = FIXED_WINDOW .. ' ' .. token .. ' ' .. string.format('%d', count) end
end

--#section refund
-- The units go back to the window the check counted in (the token, its start), if it is still
-- the stored one; an empty token names the window that holds now.
fixed_window_refund = function(key, raw, cost, limit, w, p3, p4, token)
  local code, at, c = string.match(raw, '^(%d+) (%d+) (%d+)$')
  if code ~= FIXED_WINDOW then return nil end
  local start = rel(at)
  if token == '' then
    if now < start or now >= start + w then return nil end
  elseif absolute(start) ~= token then
    return nil
  end
  return FIXED_WINDOW .. ' ' .. absolute(start) .. ' ' .. int(sat(tonumber(c) - cost))
end

--#section charge
-- The units count in the window that holds now, found as the check finds it (a new one when the
-- stored one has ended), past the limit if need be: requests are refused until it ends.
fixed_window_charge = function(key, raw, cost, limit, w, p3, p4)
  local start
  if p3 == 1 then start = grid_start(rel(p4), w) end
  local vstart, count
  local code, at, c = string.match(raw, '^(%d+) (%d+) (%d+)$')
  if code == FIXED_WINDOW and #at > 9 then vstart, count = rel(at), tonumber(c) end
  if start == nil then
    if vstart ~= nil and now < vstart + w then start = vstart else start = now end
  end
  if vstart ~= nil and start <= vstart and count > 0 then start = vstart else count = 0 end
  count = exact(count + cost)
  return FIXED_WINDOW .. ' ' .. absolute(start) .. ' ' .. int(count), sat(start + w - now)
end

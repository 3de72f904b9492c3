-- The bucketed window, as `sluice_core::BucketedWindow` decides it: p1 limit, p2 bucket length
-- (ns), p3 buckets in the window, p4 a bucket start near now (absolute ns) on the grid. Stored as
-- "<code> <newest bucket's start> <count>...", one count per bucket, newest first, without the
-- trailing (oldest) empty ones; the refund token is the start of the bucket the check counted
-- in. The contract of each section is in check.lua and refund.lua.

--#section check
local limit, b, n, ref = p1, p2, p3 + 0, p4
-- The bucket now falls in, on the grid through the reference start.
local cur
do
  local len = #ref
  local r
  if len <= 9 then
    r = ref - S * 1000000000
  else
    r = (string.sub(ref, 1, len - 9) - S) * 1000000000 + string.sub(ref, len - 8)
  end
  local d = now - r
  local m = math.fmod(d, b)
  if m < 0 then m = m + b end
  cur = r + (d - m)
end
if raw == nil then raw = redis.pcall('GET', key) end
-- The stored counts, shifted by the buckets that have passed since the newest one:
-- counts[j + 1] is the bucket j lengths before the current one.
local stored, shift = nil, n
if type(raw) == 'string' then
  local code, at, rest = string.match(raw, '^(%d+) (%d+)(.*)$')
  if code == BUCKETED_WINDOW and #at > 9 then
    local start = (string.sub(at, 1, -10) - S) * 1000000000 + string.sub(at, -9)
    stored = {}
    for c in string.gmatch(rest, '%d+') do stored[#stored + 1] = c + 0 end
    if cur <= start then
      -- A clock behind the newest bucket counts as that bucket: no time passes.
      cur, shift = start, 0
    else
      local d = cur - start
      shift = (d - d % b) / b
      if shift > n then shift = n end
    end
  end
end
local counts, used = {}, 0
for j = 1, n do
  local c = 0
  if j > shift then c = stored[j - shift] or 0 end
  counts[j] = c
  used = used + c
end
-- Until the newest bucket that holds anything leaves the window: the bucket j lengths
-- before the current one leaves it cur + (n - j) * b - now from now.
local last = 0
for j = 1, n do
  if counts[j] > 0 then
    last = cur + (n - j + 1) * b - now
    if last < 0 then last = 0 end
    break
  end
end
reset = last
remaining = limit - used
if remaining < 0 then remaining = 0 end
if need > limit then
  retry = -1
elseif need <= remaining then
  allowed = 1
  if cost > 0 then
    counts[1] = counts[1] + cost
    reset = cur + n * b - now
    if reset < 0 then reset = 0 end
  end
  remaining = remaining - cost
else
  -- Wait until enough of the oldest buckets leave to make room. A charge may have taken the
  -- window past its limit, so the room is what is left of `used` once they have left, not
  -- `remaining` plus them.
  local freed = 0
  retry = cur + n * b - now
  for j = n, 1, -1 do
    freed = freed + counts[j]
    if used - freed + need <= limit then
      retry = cur + (n - j + 1) * b - now
      break
    end
  end
  if retry < 0 then retry = 0 end
end
if allowed == 1 and cost > 0 then
  local r = cur % 1000000000
  token = string.format('%d%09d', S + (cur - r) / 1000000000, r)
  if write then
    local keep = n
    while keep > 1 and counts[keep] == 0 do keep = keep - 1 end
    local parts = {BUCKETED_WINDOW, token}
    for j = 1, keep do parts[j + 2] = string.format('%d', counts[j]) end
    state = table.concat(parts, ' ')
  end
end

--#section refund
-- The units go back to the bucket the check counted in (the token, its start), if the window
-- still holds it; an empty token names the bucket that holds now.
bucketed_window_refund = function(key, raw, cost, limit, b, p3, p4, token)
  local code, at, rest = string.match(raw, '^(%d+) (%d+)(.*)$')
  if code ~= BUCKETED_WINDOW then return nil end
  if token == '' then token = absolute(grid_start(rel(p4), b)) end
  local start = rel(at)
  local counts = {}
  for c in string.gmatch(rest, '%d+') do counts[#counts + 1] = tonumber(c) end
  local changed = false
  for j = 1, #counts do
    if absolute(start - (j - 1) * b) == token then
      counts[j] = sat(counts[j] - cost)
      changed = true
      break
    end
  end
  if not changed then return nil end
  local keep = #counts
  while keep > 1 and counts[keep] == 0 do keep = keep - 1 end
  local parts = {BUCKETED_WINDOW, absolute(start)}
  for j = 1, keep do parts[#parts + 1] = int(counts[j]) end
  return table.concat(parts, ' ')
end

--#section charge
-- The units count in the bucket that holds now, the ring shifted to it as the check shifts it,
-- past the limit if need be: requests are refused until enough buckets leave the window.
bucketed_window_charge = function(key, raw, cost, limit, b, n, p4)
  local cur = grid_start(rel(p4), b)
  local stored, shift = {}, n
  local code, at, rest = string.match(raw, '^(%d+) (%d+)(.*)$')
  if code == BUCKETED_WINDOW and #at > 9 then
    local start = rel(at)
    for c in string.gmatch(rest, '%d+') do stored[#stored + 1] = tonumber(c) end
    if cur <= start then
      cur, shift = start, 0
    else
      shift = floor_div(cur - start, b)
      if shift > n then shift = n end
    end
  end
  local parts = {BUCKETED_WINDOW, absolute(cur)}
  local keep = 1
  for j = 1, n do
    local c = 0
    if j > shift then c = stored[j - shift] or 0 end
    if j == 1 then
      -- A bucket holds at most 2^32 - 1, as the core's does: far past any limit.
      c = c + cost
      if c > 4294967295 then c = 4294967295 end
    end
    parts[j + 2] = int(c)
    if c > 0 then keep = j end
  end
  for j = #parts, keep + 3, -1 do parts[j] = nil end
  return table.concat(parts, ' '), sat(cur + n * b - now)
end

-- The hybrid store's sync: pushes each key's locally counted units and returns the key's global
-- state, all keys of one call (one Cluster slot) atomically, on Redis TIME.
--
-- KEYS[i]: the counter key of entry i.
-- ARGV[1]: nanoseconds added to Redis TIME (0 in production; see clock.lua).
-- ARGV[2]: unused.
-- ARGV[3 + 6(i-1)] ..= ARGV[8 + 6(i-1)]: entry i:
--   code   the algorithm (TOKEN_BUCKET, GCRA, FIXED_WINDOW or SLIDING_COUNTER);
--   units  units the instance admitted since its last sync, 0 to only read;
--   to_end for the windowed algorithms, ns from the instance's now to the end of the window the
--          units were counted in (0 or less: a window that has ended); for the buckets, ns from
--          the instance's now to when the latest of the units was admitted (0 or less);
--   a, b   FIXED_WINDOW: the window (ns) and 1 when windows start at a key's first request;
--          SLIDING_COUNTER: the window (ns) and 0;
--          TOKEN_BUCKET and GCRA: the period (ns) and the units it refills, so one unit takes
--          a / b ns;
--   ref    for clock-aligned windows, the start of some window near now (decimal ns since the
--          epoch); '-' otherwise.
--
-- Units belong to the window they were counted in, never to the next: a unit whose window is
-- neither Redis's current window nor (sliding counter) the one before it is dropped, since the
-- window it would count against is over.
--
-- Returns one string per entry:
--   FIXED_WINDOW:    "<count> <ns to the window's end>" (a count of 0 and 0 ns: no live window);
--   SLIDING_COUNTER: "<current> <previous> <ns to the current window's end>";
--   TOKEN_BUCKET, GCRA: "<backlog ns>": how far the key's theoretical arrival time lies after
--     now, which the instance turns back into its own state on its own clock.
--#include clock.lua
--#include helpers.lua

local out = {}
for i = 1, #KEYS do
  local base = 3 + 6 * (i - 1)
  local code = ARGV[base]
  local units = tonumber(ARGV[base + 1])
  local to_end = tonumber(ARGV[base + 2])
  local a = tonumber(ARGV[base + 3])
  local b = tonumber(ARGV[base + 4])
  local ref = ARGV[base + 5]
  local key = KEYS[i]
  local stored = redis.call('GET', key)
  local f = {}
  if stored then
    for w in string.gmatch(stored, '%S+') do f[#f + 1] = w end
    if f[1] ~= code then f = {} end
  end
  if code == FIXED_WINDOW then
    local W = a
    local cur_end, count = nil, 0
    local live_end = f[2] and rel(f[2])
    if ref ~= '-' then
      local r = rel(ref)
      cur_end = r + floor_div(now - r, W) * W + W
      if live_end == cur_end then count = tonumber(f[3]) end
    elseif live_end and live_end > now then
      cur_end, count = live_end, tonumber(f[3])
    end
    if units > 0 then
      local d_end = now + to_end
      if cur_end == nil then
        if to_end > 0 then cur_end, count = d_end, units end
      elseif math.abs(d_end - cur_end) * 2 < W then
        count = count + units
      end
    end
    if cur_end and count > 0 then
      redis.call('SET', key, code .. ' ' .. absolute(cur_end) .. ' ' .. int(count),
        'PX', ceil_div(cur_end - now, 1000000) + 1000)
      out[i] = int(count) .. ' ' .. int(cur_end - now)
    else
      out[i] = '0 0'
    end
  elseif code == SLIDING_COUNTER then
    local W = a
    local r = rel(ref)
    local start = r + floor_div(now - r, W) * W
    local cur, prev = 0, 0
    if f[2] then
      local s = rel(f[2])
      if s == start then
        cur, prev = tonumber(f[3]), tonumber(f[4])
      elseif s == start - W then
        prev = tonumber(f[3])
      end
    end
    if units > 0 then
      local d_end = now + to_end
      if math.abs(d_end - (start + W)) * 2 < W then
        cur = cur + units
      elseif math.abs(d_end - start) * 2 < W then
        prev = prev + units
      end
    end
    if cur + prev > 0 then
      redis.call('SET', key, code .. ' ' .. absolute(start) .. ' ' .. int(cur) .. ' ' .. int(prev),
        'PX', ceil_div(start + 2 * W - now, 1000000) + 1000)
    end
    out[i] = int(cur) .. ' ' .. int(prev) .. ' ' .. int(start + W - now)
  else
    -- TOKEN_BUCKET and GCRA: a theoretical arrival time, pushed later by each unit's share of
    -- the period. A backlog beyond the burst is debt the instances over-admitted; it is kept,
    -- so that they admit that much less afterwards.
    local tat = now
    if f[2] then tat = rel(f[2]) end
    if units > 0 then
      -- The units were admitted up to -to_end ago: the bucket has refilled since then.
      local at = now + math.min(to_end, 0)
      if tat < at then tat = at end
      tat = tat + mul_div(units, a, b, true)
      if tat > now then
        redis.call('SET', key, code .. ' ' .. absolute(tat),
          'PX', ceil_div(tat - now, 1000000) + 1000)
      end
    end
    if tat < now then tat = now end
    out[i] = int(tat - now)
  end
end
return out

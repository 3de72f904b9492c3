-- The hybrid store's sync: pushes each key's locally counted units, grants the instance its
-- claim on what the limit has left, and returns the key's global state, all keys of one call
-- (one Cluster slot) atomically, on Redis TIME.
--
-- KEYS[i]: the counter key of entry i.
-- ARGV[1]: nanoseconds added to Redis TIME (0 in production; see clock.lua).
-- ARGV[2]: this instance's id (no spaces).
-- ARGV[3]: how long (ms) a claim holds unless renewed by the instance's next sync.
-- ARGV[4]: the live instances, among which what is left is split.
-- ARGV[5 + 10(i-1)] ..= ARGV[14 + 10(i-1)]: entry i:
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
--          epoch); '-' otherwise;
--   limit  the units the key holds when nothing is used: the window's limit, the bucket's
--          capacity, GCRA's burst;
--   keep   units of the instance's previous grant it keeps for the requests it admits while
--          this call is on its way; the rest of that grant is given back;
--   want   units the instance expects to be asked for until its next sync;
--   share  the units an instance may admit on a key it has not synced yet (unreserved).
--
-- Units belong to the window they were counted in, never to the next: a unit whose window is
-- neither Redis's current window nor (sliding counter) the one before it is dropped, since the
-- window it would count against is over.
--
-- Claims. Each key carries, after a '|' in its stored value, when it was first synced (ms) and
-- every instance's claim: "id units expiry-ms". A claim is what an instance may still admit
-- before its next sync, so the units it will push are never counted by anyone else as free. An
-- instance's sync replaces its claim with `keep` plus a grant out of what the limit has left
-- once every claim is set aside: what it wants, or an even split between the live instances if
-- that is more, never more than is free. Units serve the key wherever they are used, so a grant
-- follows demand rather than fairness, and no unit waits in the claim of an instance that is
-- not asked for it. So what the instances may admit together never exceeds what the limit has
-- left.
--
-- While a key (or its window) is young, first synced less than a claim's time to live ago, a
-- live instance with no claim on it (not even an empty one) may not have synced it yet and be
-- admitting its first, unreserved share: that much is set aside for each such instance. Later,
-- an instance that never uses a key holds none of it. An instance that counts itself alone is
-- bounded by the limit alone and claims only what it keeps. A claim expires unless renewed, so
-- an instance that stops takes its claims with it; a claim is tied to its window and goes with
-- it.
--
-- Returns one string per entry, the grant last ('-': no live window to claim in):
--   FIXED_WINDOW:    "<count> <ns to the window's end> <grant>" (a count of 0 and 0 ns: no live
--                    window);
--   SLIDING_COUNTER: "<current> <previous> <ns to the current window's end> <grant>";
--   TOKEN_BUCKET, GCRA: "<backlog ns> <grant>": how far the key's theoretical arrival time lies
--     after now, which the instance turns back into its own state on its own clock.
--#include clock.lua
--#include helpers.lua

local me = ARGV[2]
local ms = S * 1000 + math.floor(now / 1000000)
local expiry = ms + tonumber(ARGV[3])
local instances = math.max(tonumber(ARGV[4]), 1)

-- What this instance may admit of `free` units until its next sync, wanting `want`.
local function grant_of(free, want)
  if free < 1 then return 0 end
  if instances == 1 then return free end
  return math.min(free, math.max(want, math.floor(free / instances), 1))
end

-- The stored value: the algorithm's fields, then ' | ' and the claims, if any.
local function store(key, fields, born, claims, px)
  redis.call('SET', key, fields .. ' | ' .. int(born) .. ' ' .. table.concat(claims, ' '), 'PX', px)
end

local out = {}
for i = 1, #KEYS do
  local base = 5 + 10 * (i - 1)
  local code = ARGV[base]
  local units = tonumber(ARGV[base + 1])
  local to_end = tonumber(ARGV[base + 2])
  local a = tonumber(ARGV[base + 3])
  local b = tonumber(ARGV[base + 4])
  local ref = ARGV[base + 5]
  local limit = tonumber(ARGV[base + 6])
  local keep = tonumber(ARGV[base + 7])
  local want = tonumber(ARGV[base + 8])
  local share = tonumber(ARGV[base + 9])
  local key = KEYS[i]
  local stored = redis.call('GET', key)
  local f, c = {}, {}
  if stored then
    local claims = false
    for w in string.gmatch(stored, '%S+') do
      if w == '|' then claims = true
      elseif claims then c[#c + 1] = w
      else f[#f + 1] = w end
    end
    if f[1] ~= code then f, c = {}, {} end
  end
  -- The other instances' live claims, and what they hold; this instance's is replaced below.
  -- When the key (or its window) was first synced: its claims count from then.
  local born = ms
  local held, claims = 0, {}
  local function read_claims()
    if c[1] then born = tonumber(c[1]) end
    for j = 2, #c - 2, 3 do
      local units_held, until_ms = tonumber(c[j + 1]), tonumber(c[j + 2])
      if c[j] ~= me and until_ms > ms then
        held = held + units_held
        claims[#claims + 1] = c[j] .. ' ' .. c[j + 1] .. ' ' .. c[j + 2]
      end
    end
  end
  -- This instance's grant out of what `used` leaves, and its new claim among `claims`.
  -- A lone instance is bounded by the limit alone: it reserves only what it keeps, so that an
  -- instance joining it finds the rest free.
  local function claim(used)
    local unsynced = 0
    if ms - born < tonumber(ARGV[3]) then unsynced = math.max(instances - 1 - #claims, 0) end
    local g = grant_of(limit - used - held - keep - unsynced * share, want)
    local mine = keep + g
    if instances == 1 then mine = keep end
    claims[#claims + 1] = me .. ' ' .. int(mine) .. ' ' .. int(expiry)
    return g
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
    -- Claims belong to the window they were made in.
    if cur_end and live_end == cur_end then read_claims() end
    if units > 0 then
      local d_end = now + to_end
      if cur_end == nil then
        if to_end > 0 then cur_end, count = d_end, units end
      elseif math.abs(d_end - cur_end) * 2 < W then
        count = count + units
      end
    end
    if cur_end then
      local g = claim(count)
      -- Stored even with nothing counted: the claims, this instance's at least, are kept.
      store(key, code .. ' ' .. absolute(cur_end) .. ' ' .. int(count), born, claims,
        ceil_div(cur_end - now, 1000000) + 1000)
      if count > 0 then
        out[i] = int(count) .. ' ' .. int(cur_end - now) .. ' ' .. int(g)
      else
        out[i] = '0 0 ' .. int(g)
      end
    else
      out[i] = '0 0 -'
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
        read_claims()
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
    -- The previous window counts for the part of it still inside the sliding window, rounded
    -- down as the core's estimate is.
    local g = claim(cur + mul_div(prev, start + W - now, W, false))
    store(key, code .. ' ' .. absolute(start) .. ' ' .. int(cur) .. ' ' .. int(prev), born, claims,
      ceil_div(start + 2 * W - now, 1000000) + 1000)
    out[i] = int(cur) .. ' ' .. int(prev) .. ' ' .. int(start + W - now) .. ' ' .. int(g)
  else
    -- TOKEN_BUCKET and GCRA: a theoretical arrival time, pushed later by each unit's share of
    -- the period. A backlog beyond the burst is debt the instances over-admitted; it is kept,
    -- so that they admit that much less afterwards.
    local tat = now
    if f[2] then tat = rel(f[2]) end
    read_claims()
    if units > 0 then
      -- The units were admitted up to -to_end ago: the bucket has refilled since then.
      local at = now + math.min(to_end, 0)
      if tat < at then tat = at end
      tat = tat + mul_div(units, a, b, true)
    end
    if tat < now then tat = now end
    -- One unit takes a / b ns to refill, so the backlog holds backlog * b / a units.
    local g = claim(mul_div(tat - now, b, a, true))
    store(key, code .. ' ' .. absolute(tat), born, claims,
      math.max(ceil_div(tat - now, 1000000), tonumber(ARGV[3])) + 1000)
    out[i] = int(tat - now) .. ' ' .. int(g)
  end
end
return out

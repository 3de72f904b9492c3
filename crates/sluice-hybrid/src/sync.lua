-- The hybrid store's sync: pushes each key's locally counted units, grants the instance its
-- claim on what the limit has left, and returns the key's global state, all keys of one call
-- (one Cluster slot) atomically, on Redis TIME.
--
-- KEYS[i]: the counter key of entry i.
-- ARGV[1]: nanoseconds added to Redis TIME (0 in production; see clock.lua).
-- ARGV[2]: this instance's id (no spaces).
-- ARGV[3]: how long (ms) a claim holds unless renewed by the instance's next sync.
-- ARGV[4]: the live instances, among which what is left is split.
-- ARGV[5]: P, the policies the entries name; each is sent once, however many keys follow it.
-- ARGV[6 + 6(p-1)] ..= ARGV[11 + 6(p-1)]: policy p:
--   code   the algorithm (TOKEN_BUCKET, GCRA, FIXED_WINDOW or SLIDING_COUNTER);
--   a, b   FIXED_WINDOW: the window (ns) and 1 when windows start at a key's first request;
--          SLIDING_COUNTER: the window (ns) and 0;
--          TOKEN_BUCKET and GCRA: the period (ns) and the units it refills, so one unit takes
--          a / b ns;
--   ref    for clock-aligned windows, the start of some window near now (decimal ns since the
--          epoch); '-' otherwise;
--   limit  the units the key holds when nothing is used: the window's limit, the bucket's
--          capacity, GCRA's burst;
--   share  the units an instance may admit on a key it has not synced yet (unreserved).
-- ARGV[6 + 6P]: the entries, packed: for each key, in order, ten signed 64-bit little-endian
-- integers (80 bytes):
--   p      its policy's number;
--   units  units the instance admitted since its last sync, 0 to only read; negative: units
--          given back;
--   to_end for the windowed algorithms, ns from the instance's now to the end of the window the
--          units were counted in (0 or less: a window that has ended); for the buckets, ns from
--          the instance's now to when the latest of the units was admitted (0 or less);
--   keep   units of the instance's previous grant it keeps for the requests it admits while
--          this call is on its way; the rest of that grant is given back;
--   want   units the instance expects to be asked for until its next sync;
--   at, born, f1, f2  the floor: the key's state as this instance's last sync of it answered
--          (see the reply), born 0 when it has none;
--   tag    the sync attempt that first sent these units (0: always count them).
-- ARGV[7 + 6P]: this attempt's number (0: none kept).
--
-- Attempts. A call that timed out may still run, and the instance sends its units again. Its
-- claim on a key stores, after its id and a '#', the highest attempt Redis has run on the key
-- ("id#attempt units expiry-ms"); units tagged with that attempt or an earlier one are counted
-- already, and skipped. (An instance that sends no attempt stores its bare id, as before.)
--
-- Floors. Redis may answer with less than it held before: restarted empty, failed over to a
-- replica that had not caught up, flushed. Every instance that synced a key knows what Redis held
-- then, and sends it back with each sync as a floor: before the units are added, the key's
-- state is raised to at least the floor, so that a key's usage never goes down while its window
-- (or its backlog) lasts. A floor is taken when Redis holds nothing for the key (or, for the
-- windows, nothing for the floor's window), or holds the same key as the floor was read from
-- (the same first sync, `born`); never over a key reset since (`reset.lua` stores a marker, which
-- starts a key with a new birth) or held under another algorithm. While Redis keeps its data a
-- floor never raises anything: a key's count in a window and a bucket's theoretical arrival
-- time only grow.
--
-- Units given back (a settled reservation, a refund) come as negative units: taken from the
-- window they name (or a bucket's backlog), never below zero, and never from a later window.
-- Since a count then goes down, the key takes a new birth (`born`: now, and after the one it
-- had), so that floors read before the refund, which would raise it back, no longer match it.
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
-- Returns one string: signed 64-bit little-endian integers, entry after entry, each entry's
-- grant (-1: no live window to claim in) followed by its floor's at and born:
--   FIXED_WINDOW:    count, ns to the window's end, grant, at, born (a count of 0 and 0 ns: no
--                    live window; then born is 0);
--   SLIDING_COUNTER: current, previous, ns to the current window's end, grant, at, born;
--   TOKEN_BUCKET, GCRA: backlog ns, grant, at, born: how far the key's theoretical arrival time
--     lies after now, which the instance turns back into its own state on its own clock.
-- `at` is the state's place on Redis's clock in whole microseconds since the epoch (exact in
-- Lua's numbers, and rounded down, so a floor is never above what it echoes): the window's end,
-- the current window's start, or the theoretical arrival time; `born` is when the key (or its
-- window) was first synced, in ms. The instance sends them back as its floor, with the counts
-- (f1, f2: the count, or the current and previous counts) of this reply.
-- As few as each algorithm needs.
--
-- Cost. Every key is read with one MGET per call (a thousand keys at a time) and written with
-- one SET each; each C call or number conversion in Lua costs Redis hundreds of instructions, so
-- a policy's parameters and its window's start are read once per call, and the numbers of the
-- entries and of the reply travel packed (Lua's struct library, which Redis and Valkey load for
-- every script): one argument and one C call per key in, one string out, where text would cost
-- an argument, a string and a conversion per number each way. The stored value's format is
-- unchanged by this layout, so instances of any layout share keys during a rolling upgrade.
--#include clock.lua
--#include helpers.lua

local me = ARGV[2]
local ms = S * 1000 + math.floor(now / 1000000)
local ttl = ARGV[3] + 0
local instances = math.max(ARGV[4] + 0, 1)
local find, sub = string.find, string.sub
-- What follows the instance's id in its claim, and the claim's expiry, as stored.
local until_text = ' ' .. int(ms + ttl)
-- Numbers become text once per call where they can: Lua formats a number through sprintf. Now,
-- as a new key's birth, and each time to live, which most keys of a policy share.
local ms_text, px_text = int(ms), {}
local S_us = S * 1000000

-- The birth a key takes when a refund lowers it: now, and always after the birth it had, so
-- that a floor read between two refunds in one millisecond does not match the second.
local function reborn(born) return int(math.max(ms, (tonumber(born) or 0) + 1)) end

-- A time relative to S in whole microseconds since the epoch, rounded down: a floor's `at`.
local function micros(t) return S_us + floor_div(t, 1000) end
-- A floor's `at` as a time relative to S.
local function from_micros(us) return (us - S_us) * 1000 end
-- Whether two times name the same window of length w: within half a window of each other.
local function same_window(t, u, w) return math.abs(t - u) * 2 < w end

-- The policies: their parameters, and what each needs of the time, once per call.
local P = ARGV[5] + 0
local attempt = tonumber(ARGV[7 + 6 * P] or '0') or 0
local code_of, a_of, b_of, limit_of, share_of, grid_of = {}, {}, {}, {}, {}, {}
for p = 1, P do
  local base = 6 + 6 * (p - 1)
  local code, a = ARGV[base], ARGV[base + 1] + 0
  code_of[p], a_of[p], b_of[p] = code, a, ARGV[base + 2] + 0
  limit_of[p], share_of[p] = ARGV[base + 4] + 0, ARGV[base + 5] + 0
  local ref = ARGV[base + 3]
  -- Clock-aligned windows: the start of the window now falls in (relative to S).
  if ref ~= '-' then grid_of[p] = grid_start(rel(ref), a) else grid_of[p] = false end
end

-- The claims part of a stored value, "<born> <id> <units> <expiry-ms> ...": when the key was
-- first synced (as stored), and the other instances' live claims as one string (each led by
-- a space), what they hold and how many they are, and the last attempt of this instance run on
-- the key (0: none). This instance's own claim is left out: the sync replaces it.
local function others_of(c)
  local sp = find(c, ' ', 1, true)
  if not sp then return c, 0, '', 0, 0 end
  local held, kept, n, own = 0, '', 0, 0
  local pos, len = sp + 1, #c
  while pos <= len do
    local a = find(c, ' ', pos, true)
    if not a then break end
    local b = find(c, ' ', a + 1, true)
    if not b then break end
    local e = find(c, ' ', b + 1, true) or len + 1
    local id = sub(c, pos, a - 1)
    local hash = find(id, '#', 1, true)
    local seq = 0
    if hash then id, seq = sub(id, 1, hash - 1), tonumber(sub(id, hash + 1)) or 0 end
    if id == me then
      if seq > own then own = seq end
    elseif sub(c, b + 1, e - 1) + 0 > ms then
      held = held + sub(c, a + 1, b - 1)
      kept = kept .. ' ' .. sub(c, pos, e - 1)
      n = n + 1
    end
    pos = e + 1
  end
  return sub(c, 1, sp - 1), held, kept, n, own
end

-- Whether an entry's units, first sent by attempt `tag`, are counted already: the key's last
-- attempt run before this call (`own`, read at the key's first entry in the call) is that one
-- or later.
local prior_of = {}
local function counted(key, own, tag)
  local prior = prior_of[key]
  if prior == nil then
    prior = own
    prior_of[key] = own
  end
  return tag > 0 and tag <= prior
end

-- This instance's grant out of what `used` leaves of `limit` once the other claims (`held`, by
-- `n` instances) and what it keeps are set aside, and the claims to store with its own. A lone
-- instance is bounded by the limit alone: it reserves only what it keeps, so that an instance
-- joining it finds the rest free. While the key is young, a live instance with no claim may be
-- admitting its first, unreserved share: that much is set aside for each.
local function claim(used, born, held, others, n, limit, keep, want, share, seq)
  local unsynced = 0
  if instances > 1 and ms - born < ttl then unsynced = math.max(instances - 1 - n, 0) end
  local free = limit - used - held - keep - unsynced * share
  local g, mine = 0, keep
  if free >= 1 then
    if instances == 1 then
      g = free
    else
      g = math.min(free, math.max(want, math.floor(free / instances), 1))
    end
  end
  if instances > 1 then mine = keep + g end
  if mine == 0 then mine = '0' else mine = int(mine) end
  local mine_at = ' ' .. me .. ' '
  if seq > 0 then mine_at = ' ' .. me .. '#' .. int(seq) .. ' ' end
  return g, born .. others .. mine_at .. mine .. until_text
end

-- Every key's value first, a thousand keys to a call; a key given twice reads, the second time,
-- what its first entry wrote.
local stored_of, written = {}, {}
local nk = #KEYS
for first = 1, nk, 1000 do
  local got = redis.call('MGET', unpack(KEYS, first, math.min(first + 999, nk)))
  for j = 1, #got do stored_of[first + j - 1] = got[j] end
end

local entries = ARGV[6 + 6 * P]
if #entries ~= 80 * nk then
  return redis.error_reply('sync: ' .. #entries .. ' bytes of entries for ' .. nk .. ' keys')
end
local unpack_entry = struct.unpack
local out = {}
local pos = 1
for i = 1, nk do
  local p, units, to_end, keep, want, f_at, f_born, f1, f2, tag
  p, units, to_end, keep, want, f_at, f_born, f1, f2, tag, pos =
    unpack_entry('<i8i8i8i8i8i8i8i8i8i8', entries, pos)
  local code, a, limit = code_of[p], a_of[p], limit_of[p]
  local key = KEYS[i]
  local stored = written[key] or stored_of[i]
  -- "<code> <x> [<y> [<z>]] | <claims>": x, y and z are read only under this entry's code; a
  -- value stored under another algorithm counts as fresh, claims and all.
  local x, y, z, c
  if stored then
    local bar = find(stored, ' | ', 1, true)
    local fields = stored
    if bar then fields, c = sub(stored, 1, bar - 1), sub(stored, bar + 3) end
    local p1 = find(fields, ' ', 1, true)
    if p1 and sub(fields, 1, p1 - 1) == code then
      local p2 = find(fields, ' ', p1 + 1, true)
      if p2 then
        x = sub(fields, p1 + 1, p2 - 1)
        local p3 = find(fields, ' ', p2 + 1, true)
        if p3 then y, z = sub(fields, p2 + 1, p3 - 1), sub(fields, p3 + 1) else y = sub(fields, p2 + 1) end
      else
        x = sub(fields, p1 + 1)
      end
    else
      c = nil
    end
  end
  -- When the key (or its window) was first synced, and the other instances' live claims; read
  -- only when the stored claims belong to the live window.
  local born, held, others, n, own = ms_text, 0, '', 0, 0
  -- Whether the instance's floor may be taken: Redis holds nothing for the key, or holds it
  -- under this algorithm (each algorithm then checks the window and the birth); never over a
  -- reset's marker or another algorithm's value.
  local floor_ok = f_born > 0 and (not stored or x ~= nil)
  local j = #out
  local value, px
  if code == FIXED_WINDOW then
    local W = a
    local cur_end, count = nil, 0
    local live_end = x and rel(x)
    if grid_of[p] then
      cur_end = grid_of[p] + W
      if live_end == cur_end then count = y + 0 end
    elseif live_end and live_end > now then
      cur_end, count = live_end, y + 0
    end
    -- Claims belong to the window they were made in.
    local held_here = c and cur_end and live_end == cur_end
    if held_here then born, held, others, n, own = others_of(c) end
    if counted(key, own, tag) then units = 0 end
    if floor_ok then
      local f_end = from_micros(f_at)
      if held_here then
        -- The same window of the same key: never less than the instance last saw in it.
        if tonumber(born) == f_born and same_window(f_end, cur_end, W) and f1 > count then
          count = f1
        end
      elseif cur_end == nil then
        -- No live window in Redis: the instance's, while it lasts, with its count and birth.
        if f_end > now then cur_end, count, born = f_end, f1, int(f_born) end
      elseif same_window(f_end, cur_end, W) then
        -- Redis lost the live window (a clock-aligned one): the instance's count of it.
        count, born = f1, int(f_born)
      end
    end
    if units > 0 then
      local d_end = now + to_end
      if cur_end == nil then
        if to_end > 0 then cur_end, count = d_end, units end
      elseif math.abs(d_end - cur_end) * 2 < W then
        count = count + units
      end
    elseif units < 0 and cur_end and math.abs(now + to_end - cur_end) * 2 < W then
      count, born = math.max(count + units, 0), reborn(born)
    end
    if cur_end then
      local g, claims = claim(count, born, held, others, n, limit, keep, want, share_of[p],
        math.max(own, attempt))
      -- Stored even with nothing counted: the claims, this instance's at least, are kept.
      value = code .. ' ' .. absolute(cur_end) .. ' ' .. int(count) .. ' | ' .. claims
      px = ceil_div(cur_end - now, 1000000) + 1000
      if count > 0 then out[j + 1], out[j + 2] = count, cur_end - now else out[j + 1], out[j + 2] = 0, 0 end
      out[j + 3], out[j + 4], out[j + 5] = g, micros(cur_end), born + 0
    else
      out[j + 1], out[j + 2], out[j + 3], out[j + 4], out[j + 5] = 0, 0, -1, 0, 0
    end
  elseif code == SLIDING_COUNTER then
    local W = a
    local start = grid_of[p]
    local cur, prev = 0, 0
    local held_here = false
    if x then
      local s = rel(x)
      if s == start then
        cur, prev = y + 0, z + 0
        held_here = true
        if c then born, held, others, n, own = others_of(c) end
      elseif s == start - W then
        prev = y + 0
      end
    end
    if counted(key, own, tag) then units = 0 end
    if floor_ok then
      local f_start = from_micros(f_at)
      if same_window(f_start, start, W) then
        -- The instance's counts of this window: taken over the same key's, or where Redis lost
        -- the window.
        if not held_here or tonumber(born) == f_born then
          if f1 > cur then cur = f1 end
          if f2 > prev then prev = f2 end
          if not held_here then born = int(f_born) end
        end
      elseif same_window(f_start, start - W, W) and not held_here then
        -- The instance last saw the window before, now the previous one: its count weighs.
        if f1 > prev then prev = f1 end
      end
    end
    if units > 0 then
      local d_end = now + to_end
      if math.abs(d_end - (start + W)) * 2 < W then
        cur = cur + units
      elseif math.abs(d_end - start) * 2 < W then
        prev = prev + units
      end
    elseif units < 0 then
      local d_end = now + to_end
      if math.abs(d_end - (start + W)) * 2 < W then
        cur, born = math.max(cur + units, 0), reborn(born)
      elseif math.abs(d_end - start) * 2 < W then
        prev, born = math.max(prev + units, 0), reborn(born)
      end
    end
    -- The previous window counts for the part of it still inside the sliding window, rounded
    -- down as the core's estimate is.
    local g, claims = claim(cur + mul_div(prev, start + W - now, W, false), born, held, others, n,
      limit, keep, want, share_of[p], math.max(own, attempt))
    value = code .. ' ' .. absolute(start) .. ' ' .. int(cur) .. ' ' .. int(prev) .. ' | ' .. claims
    px = ceil_div(start + 2 * W - now, 1000000) + 1000
    out[j + 1], out[j + 2], out[j + 3], out[j + 4] = cur, prev, start + W - now, g
    out[j + 5], out[j + 6] = micros(start), born + 0
  else
    -- TOKEN_BUCKET and GCRA: a theoretical arrival time, pushed later by each unit's share of
    -- the period. A backlog beyond the burst is debt the instances over-admitted; it is kept,
    -- so that they admit that much less afterwards.
    local b = b_of[p]
    local tat = now
    if x then tat = rel(x) end
    if c then born, held, others, n, own = others_of(c) end
    if counted(key, own, tag) then units = 0 end
    -- The theoretical arrival time the instance last saw, over the same key's or a lost one's.
    if floor_ok and (not stored or tonumber(born) == f_born) then
      local f_tat = from_micros(f_at)
      if f_tat > tat then tat = f_tat end
      if not stored then born = int(f_born) end
    end
    if units > 0 then
      -- The units were admitted up to -to_end ago: the bucket has refilled since then.
      local at = now + math.min(to_end, 0)
      if tat < at then tat = at end
      tat = tat + mul_div(units, a, b, true)
    elseif units < 0 then
      -- Given back: each unit's share of the period, rounded down (never more than taken).
      tat, born = tat - mul_div(-units, a, b, false), reborn(born)
    end
    if tat < now then tat = now end
    -- One unit takes a / b ns to refill, so the backlog holds backlog * b / a units.
    local g, claims = claim(mul_div(tat - now, b, a, true), born, held, others, n, limit, keep,
      want, share_of[p], math.max(own, attempt))
    value = code .. ' ' .. absolute(tat) .. ' | ' .. claims
    px = math.max(ceil_div(tat - now, 1000000), ttl) + 1000
    out[j + 1], out[j + 2], out[j + 3], out[j + 4] = tat - now, g, micros(tat), born + 0
  end
  if value then
    local t = px_text[px]
    if not t then
      t = int(px)
      px_text[px] = t
    end
    redis.call('SET', key, value, 'PX', t)
    written[key] = value
  end
end

-- The reply, packed a thousand integers at a time (unpack's limit is the Lua stack).
local parts, n, whole = {}, #out, '<' .. string.rep('i8', 1000)
for first = 1, n, 1000 do
  local last = math.min(first + 999, n)
  local format = whole
  if last - first < 999 then format = '<' .. string.rep('i8', last - first + 1) end
  parts[#parts + 1] = struct.pack(format, unpack(out, first, last))
end
return table.concat(parts)

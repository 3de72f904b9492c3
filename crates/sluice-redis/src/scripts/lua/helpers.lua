-- The helpers of the refund script and of the check script's general path: exact integer
-- division, timestamp conversion, and reading and writing a counter's stored value.

local E9 = 1000000000
--#include mul_div.lua

-- Floor division and remainder of integer-valued doubles, exact below 2^53 (b > 0).
local function divmod(a, b)
  local r = math.fmod(a, b)
  if r < 0 then r = r + b end
  return (a - r) / b, r
end

local function floor_div(a, b)
  local q = divmod(a, b)
  return q
end

local function ceil_div(a, b)
  local q, r = divmod(a, b)
  if r > 0 then q = q + 1 end
  return q
end

local function sat(x)
  if x < 0 then return 0 end
  return x
end

local function int(x)
  return string.format('%d', x)
end

-- A stored timestamp (decimal nanoseconds since the epoch) as ns relative to S.
local function rel(abs)
  if abs == nil or abs == false or abs == '' then return nil end
  local n = #abs
  if n <= 9 then return tonumber(abs) - S * E9 end
  return (tonumber(string.sub(abs, 1, n - 9)) - S) * E9 + tonumber(string.sub(abs, n - 8))
end

-- A stored timestamp as ns after now: exact for anything within 2^53 ns of now, since the
-- whole seconds and the nanoseconds are subtracted separately.
local function since_now(abs)
  local n = #abs
  if n <= 9 then return tonumber(abs) - S * E9 - now end
  return (tonumber(string.sub(abs, 1, n - 9)) - S) * E9 + (tonumber(string.sub(abs, n - 8)) - now)
end

-- A time relative to S as its stored form.
local function absolute(t)
  local q, r = divmod(t, E9)
  local s = S + q
  if s < 0 then return '0' end
  if s == 0 then return int(r) end
  return string.format('%d%09d', s, r)
end

-- The time d ns after now as its stored form, exact for any d below 2^53.
local function after_now(d)
  local q, r = divmod(d, E9)
  r = r + now
  if r >= E9 then q, r = q + 1, r - E9 end
  local s = S + q
  if s < 0 then return '0' end
  if s == 0 then return int(r) end
  return string.format('%d%09d', s, r)
end

local function parse_entry(e)
  local sp = string.find(e, ' ', 1, true)
  return rel(string.sub(e, 1, sp - 1)), tonumber(string.sub(e, sp + 1))
end

local function entry(at, units)
  return absolute(at) .. ' ' .. int(units)
end

-- Arguments of check i: algorithm, cost, p1..p4 and token.
local function check_args(i)
  local b = 3 + (i - 1) * 7
  return ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
    tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), ARGV[b + 5], ARGV[b + 6]
end

-- The start of the window that now falls in, for windows of length w placed on a grid through
-- the reference start r (relative).
local function grid_start(r, w)
  return r + floor_div(now - r, w) * w
end

-- A counter's stored value, "<alg> <x> [<y> [<z>]]" (the bucketed window: "<alg> <x> <c>..."),
-- decoded for algorithm alg, or nil when fresh (absent, or stored under another algorithm). GCRA and the queue keep their time as a
-- backlog b, ns after now (negative when past).
local function decode(alg, raw)
  if raw == nil then return nil end
  if alg == BUCKETED_WINDOW then
    -- "<alg> <newest bucket start> <count>...", counts newest first, older zeros left off.
    local a, start, rest = string.match(raw, '^(%d+) (%d+)(.*)$')
    if a ~= alg then return nil end
    local counts = {}
    for c in string.gmatch(rest, '%d+') do counts[#counts + 1] = tonumber(c) end
    return {start = rel(start), counts = counts}
  end
  local a, x, y, z = string.match(raw, '^(%d+) (%S+) ?(%S*) ?(%S*)$')
  if a ~= alg then return nil end
  if alg == TOKEN_BUCKET then return {tokens = tonumber(x), last = rel(y)} end
  if alg == GCRA or alg == LEAKY_QUEUE then return {b = since_now(x)} end
  if alg == FIXED_WINDOW then return {start = rel(x), count = tonumber(y)} end
  if alg == SLIDING_COUNTER then
    return {start = rel(x), current = tonumber(y), previous = tonumber(z)}
  end
  return nil
end

local function encode(alg, v)
  if alg == BUCKETED_WINDOW then
    local last = #v.counts
    while last > 1 and v.counts[last] == 0 do last = last - 1 end
    local parts = {alg, absolute(v.start)}
    for j = 1, last do parts[#parts + 1] = int(v.counts[j]) end
    return table.concat(parts, ' ')
  end
  if alg == TOKEN_BUCKET then return alg .. ' ' .. int(v.tokens) .. ' ' .. absolute(v.last) end
  if alg == GCRA or alg == LEAKY_QUEUE then return alg .. ' ' .. after_now(v.b) end
  if alg == FIXED_WINDOW then return alg .. ' ' .. absolute(v.start) .. ' ' .. int(v.count) end
  return alg .. ' ' .. absolute(v.start) .. ' ' .. int(v.current) .. ' ' .. int(v.previous)
end

-- A key's type and, for a string, its value: one GET in the common case, since a GET on the
-- sliding log's list fails with WRONGTYPE.
local function read_state(key)
  local r = redis.pcall('GET', key)
  if r == false or r == nil then return 'none', nil end
  if type(r) == 'table' then return redis.call('TYPE', key)['ok'], nil end
  return 'string', r
end

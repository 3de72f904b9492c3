-- The helpers of the refund and sync scripts: exact integer division, timestamp conversion, and
-- a check's arguments.

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

-- x, at most 2^53 - 1, the largest integer a double holds exactly: where a charge saturates a
-- count or a time ahead of now, rather than let it pass what the scripts compute exactly.
local function exact(x)
  if x > 9007199254740991 then return 9007199254740991 end
  return x
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

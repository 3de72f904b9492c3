//! The Lua scripts that decide and update counters inside Redis, one call per Cluster slot.
//!
//! Each script is a named constant, called by `EVALSHA` and loaded again transparently on
//! `NOSCRIPT` (see `connection.rs`). Both start by reading the time, and share helpers that
//! convert between the stored and the computed forms of timestamps.
//!
//! ## Cost per call
//!
//! `EVALSHA` runs a script's whole body on every call, so every `local function` and every table
//! in it is created anew and then collected. [`CHECK`] therefore decides a call of one check
//! (nearly every call) in straight-line code on locals: one `GET` (or a few list reads for the
//! sliding log), one `SET … PX`, no table, and no function but `mul_div` (token
//! bucket, sliding counter) and the log's entry parser. On Redis 7.0 each C function call or
//! string conversion in a script also costs a few hundred nanoseconds, so that path converts
//! numbers by arithmetic (`x + 0`), takes remainders with `%`, compares the algorithm code as a
//! string, and splits timestamps with `string.sub` rather than a pattern that backtracks. Calls
//! of several checks, which must thread each key's state from check to check, take the general
//! path after it, written with helpers and tables. The two paths decide identically; `tests/scripts.rs` runs both against the
//! core's pure functions on a frozen clock, nanosecond for nanosecond.
//!
//! ## Numbers in Lua
//!
//! Redis runs Lua 5.1, whose only number type is a double: integers are exact up to 2⁵³. A
//! timestamp in nanoseconds since the epoch (about 1.7·10¹⁸) is not, so the scripts never hold
//! one as a number:
//!
//! - timestamps are **stored** as decimal strings of nanoseconds since the epoch, exactly what
//!   `sluice_core::Timestamp` holds;
//! - they are **computed** on as nanoseconds relative to `S`, the whole second of Redis time the
//!   call runs in. A counter's timestamps lie within a window or two of now, so these numbers are
//!   exact, and every algorithm decides exactly as the core's pure functions do;
//! - every division is done on exact integers: the remainder first, then the exact quotient
//!   `(a - r) / b`. The fast path takes the remainder with Lua's `a % b`, an operator rather than
//!   a function call: it is `a - floor(a / b) · b`, exact for integers `0 ≤ a < 2⁵³` (the
//!   rounded quotient cannot cross an integer: the distance to the next one, at least `1 / b`,
//!   exceeds half an ulp of `a / b`), and for negative `a` when `b` is 10⁹ or 10⁶ (every multiple
//!   of those below 4·10¹⁸ is a double). A remainder of anything else, such as the distance from
//!   a reference window start, uses `math.fmod`, which is always exact;
//! - a product `a · b / c` that passes 2⁵³ (a refill at a high rate, a weighted count of a
//!   large sliding counter) is divided exactly in parts (`mul_div`);
//! - GCRA and the queue compare backlogs (how far their time lies after now), and compute
//!   `backlog + n·T > horizon` as `backlog > horizon - n·T`, so no sum passes 2⁵³;
//! - numbers written back to Redis go through `string.format('%d')` where they can be large,
//!   because Lua would print one as `1e+15`; concatenation only for TTLs in milliseconds.
//!
//! The Rust side keeps every parameter below 2⁵³ (see `encode.rs`): windows and periods up to
//! about 104 days (fixed windows up to about 417 days in whole microseconds, whose every number is
//! a multiple of 8 below 2⁵⁶), limits up to 9·10¹⁵, and GCRA's burst and the queue's capacity times their
//! interval (the longest backlog) below 2⁵³ ns too. Durations in replies beyond 2⁵³ ns, such as
//! the time a huge bucket takes to refill, are rounded; no decision depends on them.
//!
//! ## Layout of the arguments
//!
//! Both scripts take the same arguments:
//!
//! - `KEYS[i]`: the counter key of check `i` (`prefix:{identity}`, or `prefix:{tag}rest`; see
//!   `keys.rs`). A key may appear more than
//!   once; its later checks see what the earlier ones would leave.
//! - `ARGV[1]`: nanoseconds added to Redis `TIME`: 0 in production. A test hook, and the way to
//!   simulate an instance whose store clock is off.
//! - `ARGV[2]`: for [`CHECK`], `1` to commit when every check admits, `0` to only decide (peek).
//!   Unused by [`REFUND`].
//! - `ARGV[3 + 7(i-1)] ..= ARGV[9 + 7(i-1)]`: check `i`: algorithm code, cost, four parameters
//!   and a refund token (see `encode.rs` for each algorithm's parameters).
//!
//! ## What is stored
//!
//! One key per counter. Every algorithm but the sliding log keeps a string, `"<alg> <x> [<y>
//! [<z>]]"`: the algorithm code (a counter found under another algorithm counts as fresh, as in
//! the memory store) and up to three state fields. A string is read with one `GET` and written
//! with one `SET … PX`, state and TTL together. The sliding log keeps a list: a header holding
//! the total of its units, then one `"<nanos> <units>"` entry per distinct arrival time, oldest
//! first. Every write sets the key's TTL to when the counter is full again, plus a second, so
//! that idle counters vanish.

/// The time, shared by both scripts: Redis `TIME` plus the offset in `ARGV[1]`, as `S` (whole
/// seconds since the epoch) and `now` (nanoseconds after `S`). No function is defined here, so
/// that the check script's single-check path runs without creating one.
macro_rules! clock {
    () => {
        r#"
local clock = redis.call('TIME')
local S = clock[1] + 0
local now = clock[2] * 1000
if ARGV[1] ~= '0' then
  now = now + ARGV[1]
  local r = math.fmod(now, 1000000000)
  if r < 0 then r = r + 1000000000 end
  S = S + (now - r) / 1000000000
  now = r
end
"#
    };
}

/// `floor(a * b / c)`, or its ceiling when `up`, for non-negative integers below 2⁵³ and `c > 0`,
/// as a function expression. Exact whenever the result is below 2⁵³: a product that a double
/// cannot hold is split as `a = qa·c + ra`, `b = qb·c + rb`, and `ra · rb / c` is then divided
/// bit by bit (a rare path, at most 53 steps). Larger results, durations beyond 104 days, are
/// rounded; no decision depends on them.
macro_rules! mul_div {
    () => {
        r#"function(a, b, c, up)
  local p = a * b
  local q, r
  if p < 9007199254740992 then
    r = p % c
    q = (p - r) / c
  else
    local ra = a % c
    local rb = b % c
    q = (a - ra) / c * b + ra * ((b - rb) / c)
    local x, y = ra, rb
    if x > y then x, y = y, x end
    p = x * y
    if p < 9007199254740992 then
      r = p % c
      q = q + (p - r) / c
    else
      -- x * y = n * c + r, built from the top bit of x down; every step stays below 2^54.
      local bit = 1
      while bit * 2 <= x do bit = bit * 2 end
      local n = 0
      r = 0
      while bit >= 1 do
        n, r = n * 2, r * 2
        if r >= c then n, r = n + 1, r - c end
        if x >= bit then
          x = x - bit
          if r >= c - y then n, r = n + 1, r - (c - y) else r = r + y end
        end
        bit = bit / 2
      end
      q = q + n
    end
  end
  if up and r > 0 then q = q + 1 end
  return q
end"#
    };
}

/// The helpers of the refund script and of the check script's general path: exact integer
/// division, timestamp conversion, and reading and writing a counter's stored value.
macro_rules! helpers {
    () => {
        concat!(
            r#"
local E9 = 1000000000
local mul_div = "#,
            mul_div!(),
            r#"

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
  return tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
    tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), ARGV[b + 5], ARGV[b + 6]
end

-- The start of the window that now falls in, for windows of length w placed on a grid through
-- the reference start r (relative).
local function grid_start(r, w)
  return r + floor_div(now - r, w) * w
end

-- A counter's stored value, "<alg> <x> [<y> [<z>]]", decoded for algorithm alg, or nil when
-- fresh (absent, or stored under another algorithm). GCRA and the queue keep their time as a
-- backlog b, ns after now (negative when past).
local function decode(alg, raw)
  if raw == nil then return nil end
  local a, x, y, z = string.match(raw, '^(%d+) (%S+) ?(%S*) ?(%S*)$')
  if tonumber(a) ~= alg then return nil end
  if alg == 1 then return {tokens = tonumber(x), last = rel(y)} end
  if alg == 2 or alg == 3 then return {b = since_now(x)} end
  if alg == 4 then return {start = rel(x), count = tonumber(y)} end
  if alg == 6 then
    return {start = rel(x), current = tonumber(y), previous = tonumber(z)}
  end
  return nil
end

local function encode(alg, v)
  if alg == 1 then return '1 ' .. int(v.tokens) .. ' ' .. absolute(v.last) end
  if alg == 2 or alg == 3 then return int(alg) .. ' ' .. after_now(v.b) end
  if alg == 4 then return '4 ' .. absolute(v.start) .. ' ' .. int(v.count) end
  return '6 ' .. absolute(v.start) .. ' ' .. int(v.current) .. ' ' .. int(v.previous)
end

-- A key's type and, for a string, its value: one GET in the common case, since a GET on the
-- sliding log's list fails with WRONGTYPE.
local function read_state(key)
  local r = redis.pcall('GET', key)
  if r == false or r == nil then return 'none', nil end
  if type(r) == 'table' then return redis.call('TYPE', key)['ok'], nil end
  return 'string', r
end
"#
        )
    };
}

/// Decides a request's checks that fall in one slot, atomically, and commits them only if all
/// admit.
///
/// - `KEYS[i]`: the counter key of check `i`.
/// - `ARGV[1]`: the time offset in nanoseconds (0 in production).
/// - `ARGV[2]`: `1` to commit when every check admits; `0` to decide without writing (peek).
/// - `ARGV[3 + 7(i-1)]..`: check `i`: algorithm code (1 token bucket, 2 GCRA, 3 queue, 4 fixed
///   window, 5 sliding log, 6 sliding counter), cost, parameters `p1..p4`, unused token.
///
/// Returns one string of six fields per check, every field and check separated by a space:
/// allowed (1 or 0), remaining, `reset_after` in nanoseconds, `retry_after` in nanoseconds (-1
/// for never), delay in nanoseconds, and the refund token: the stored timestamp that identifies
/// what this check consumed (a window start or a log entry), which [`REFUND`] needs to give it
/// back, or `-` when nothing was consumed. One string rather than an array: the client parses a
/// reply value by value, and six values per check cost it more than the script's formatting.
pub(crate) const CHECK: &str = concat!(
    clock!(),
    r#"
-- One check, the common case: straight-line code on locals, with no table and no
-- function created (but mul_div, for the token bucket and the sliding counter). Each algorithm
-- decides exactly as its function in the general path below, and as the core.
if #KEYS == 1 then
  -- Every C function call and string conversion shows in the rate here, so numbers are
  -- converted by arithmetic (`x + 0`, one conversion; `tonumber` makes two, and a call) and the
  -- algorithm code is compared as a string.
  local key = KEYS[1]
  local alg = ARGV[3]
  local cost = ARGV[4] + 0
  local p1 = ARGV[5] + 0
  local p2 = ARGV[6] + 0
  local need = cost
  if need < 1 then need = 1 end
  -- Only an admitted check that consumes is written, and only when committing.
  local write = cost > 0 and ARGV[2] == '1'
  local allowed, remaining, reset, retry, delay, token = 0, 0, 0, 0, 0, ''
  -- What an admission stores (a string counter), with the reset its TTL follows.
  local value

  if alg == '2' or alg == '3' then
    -- GCRA (p1 burst, p2 interval) and the queue (p1 capacity, p2 interval, p3 maximum wait,
    -- p4 1 if blocked) keep one time: how far it lies after now is the backlog.
    local backlog = 0
    local raw = redis.pcall('GET', key)
    if type(raw) == 'string' then
      local pattern = '^2 (%d+)$'
      if alg == '3' then pattern = '^3 (%d+)$' end
      local at = string.match(raw, pattern)
      -- Seconds and nanoseconds apart, since a timestamp is too long for a double. (A pattern
      -- that splits them backtracks, and costs microseconds.) Nine digits or fewer would be a
      -- time in 1970, long past: the same as none.
      if at ~= nil and #at > 9 then
        backlog = (string.sub(at, 1, -10) - S) * 1000000000 + (string.sub(at, -9) - now)
        if backlog < 0 then backlog = 0 end
      end
    end
    local interval = p2
    if alg == '2' then
      local horizon = p1 * interval
      if need > p1 then
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
    else
      local max_wait = ARGV[7] + 0
      if ARGV[8] == '1' or need > p1 then
        retry = -1
      else
        local bound = (p1 - need) * interval
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
      remaining = p1 - queued
      if remaining < 0 then remaining = 0 end
      if max_wait < backlog then
        remaining = 0
      else
        local slack = max_wait - backlog
        local by_wait = (slack - slack % interval) / interval + 1
        if by_wait < remaining then remaining = by_wait end
      end
    end
    reset = backlog
    if allowed == 1 and write then
      -- now + backlog, exactly: whole seconds and nanoseconds apart.
      local r = backlog % 1000000000
      local s = S + (backlog - r) / 1000000000
      r = r + now
      if r >= 1000000000 then s, r = s + 1, r - 1000000000 end
      value = string.format('%s %d%09d', alg, s, r)
    end

  elseif alg == '1' then
    -- Token bucket: p1 capacity, p2 refill amount, p3 refill period.
    local cap, amount, per = p1, p2, ARGV[7] + 0
    local rate = amount
    if rate < 1 then rate = 1 end
    local mul_div = "#,
    mul_div!(),
    r#"
    local tokens, last = cap, now
    local raw = redis.pcall('GET', key)
    if type(raw) == 'string' then
      local t, at = string.match(raw, '^1 (%d+) (%d+)$')
      if t ~= nil and #at > 9 then
        tokens = t + 0
        last = (string.sub(at, 1, -10) - S) * 1000000000 + string.sub(at, -9)
      end
    end
    local elapsed = now - last
    if elapsed < 0 then elapsed = 0 end
    local earned = mul_div(elapsed, amount, per, false)
    if tokens + earned >= cap then
      tokens, last = cap, now
    else
      tokens = tokens + earned
      last = last + mul_div(earned, per, rate, true)
    end
    if need > cap then
      retry = -1
    elseif tokens < need then
      retry = last + mul_div(need - tokens, per, rate, true) - now
      if retry < 0 then retry = 0 end
    else
      allowed = 1
      tokens = tokens - cost
    end
    remaining = tokens
    if tokens < cap then
      reset = last + mul_div(cap - tokens, per, rate, true) - now
      if reset < 0 then reset = 0 end
    end
    if allowed == 1 and write then
      local r = last % 1000000000
      value = string.format('1 %d %d%09d', tokens, S + (last - r) / 1000000000, r)
    end

  elseif alg ~= '5' then
    -- Fixed window (p1 limit, p2 window, p3 1 if clock-aligned, p4 a window start) and sliding
    -- counter (p1 limit, p2 window, p4 a window start).
    local w = p2
    local start
    if alg ~= '4' or ARGV[7] == '1' then
      -- The window now falls in, on the grid through the reference start.
      local ref = ARGV[8]
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
    local raw = redis.pcall('GET', key)
    if alg == '4' then
      local vstart, count
      if type(raw) == 'string' then
        local at, c = string.match(raw, '^4 (%d+) (%d+)$')
        if at ~= nil and #at > 9 then
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
      remaining = p1 - count
      if remaining < 0 then remaining = 0 end
      if need > p1 then
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
        if write then value = '4 ' .. token .. ' ' .. string.format('%d', count) end
      end
    else
      local limit = p1
      local current, previous = 0, 0
      if type(raw) == 'string' then
        local at, c, p = string.match(raw, '^6 (%d+) (%d+) (%d+)$')
        if at ~= nil and #at > 9 then
          local vstart = (string.sub(at, 1, -10) - S) * 1000000000 + string.sub(at, -9)
          if start <= vstart then
            start, current, previous = vstart, c + 0, p + 0
          elseif start - vstart == w then
            previous = c + 0
          end
        end
      end
      local mul_div = "#,
    mul_div!(),
    r#"
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
        if write then value = string.format('6 %s %d %d', token, current, previous) end
      end
    end

  else
    -- Sliding log (p1 limit, p2 window): a list of a header (the total of its units) and one
    -- "<nanos> <units>" entry per arrival time, oldest first. LLEN tells its shape: 0 for no key,
    -- an error for a key of another type.
    local limit, w = p1, p2
    local len = redis.pcall('LLEN', key)
    local count, total, drop = 0, 0, 0
    local back_at, back_units, back_entry
    -- An entry's time (relative to S, or nil for a time in 1970) and units. The one function
    -- this path creates: the log already costs several list commands per call.
    local function parse(e)
      local at, units = string.match(e, '^(%d+) (%d+)$')
      if at == nil or #at <= 9 then return nil, units end
      return (string.sub(at, 1, -10) - S) * 1000000000 + string.sub(at, -9), units + 0
    end
    if type(len) == 'number' and len > 0 then
      count = len - 1
      local head = redis.call('LRANGE', key, 0, 1)
      total = tonumber(head[1]) or 0
      if count > 0 then
        -- Expired entries are a prefix: scan them only when the oldest has expired.
        local oldest = parse(head[2])
        if oldest == nil or oldest + w <= now then
          local i = 1
          local done = false
          while not done and i <= count do
            local chunk = redis.call('LRANGE', key, i, i + 63)
            for _, e in ipairs(chunk) do
              local at, units = parse(e)
              if at ~= nil and at + w > now then
                done = true
                break
              end
              total = total - units
              drop = drop + 1
            end
            i = i + 64
          end
        end
        if count > drop then
          if count == 1 then back_entry = head[2] else back_entry = redis.call('LINDEX', key, -1) end
          back_at, back_units = parse(back_entry)
        end
      end
    end
    remaining = limit - total
    if remaining < 0 then remaining = 0 end
    -- Until the newest entry expires.
    if back_at ~= nil and back_at + w > now then reset = back_at + w - now end
    if need > limit then
      retry = -1
    elseif need <= remaining then
      allowed = 1
      remaining = remaining - cost
      if cost > 0 then
        reset = w
        -- Requests at the same instant share an entry.
        local merge = back_at ~= nil and back_at >= now
        if merge then
          back_units = back_units + cost
        else
          back_at, back_units = now, cost
        end
        total = total + cost
        local r = back_at % 1000000000
        token = string.format('%d%09d', S + (back_at - r) / 1000000000, r)
        if write then
          local e = token .. ' ' .. string.format('%d', back_units)
          local header = string.format('%d', total)
          if type(len) ~= 'number' then redis.call('DEL', key) end
          if type(len) ~= 'number' or len == 0 then
            redis.call('RPUSH', key, header, e)
          else
            -- Keep the last expired entry (if any) as the slot of the new header.
            if drop > 0 then redis.call('LTRIM', key, drop, -1) end
            redis.call('LSET', key, 0, header)
            if merge then redis.call('LSET', key, -1, e) else redis.call('RPUSH', key, e) end
          end
          local m = reset % 1000000
          local ms = (reset - m) / 1000000 + 1000
          if m > 0 then ms = ms + 1 end
          redis.call('PEXPIRE', key, ms .. '')
        end
      end
    else
      -- Wait until enough of the oldest live entries expire.
      local freed = 0
      local found = false
      local i = 1 + drop
      while not found and i <= count do
        local chunk = redis.call('LRANGE', key, i, i + 63)
        for _, e in ipairs(chunk) do
          local at, units = parse(e)
          freed = freed + units
          retry = at + w - now
          if retry < 0 then retry = 0 end
          if remaining + freed >= need then found = true; break end
        end
        i = i + 64
      end
    end
  end

  if value ~= nil then
    -- SET replaces a value of any type, and sets the TTL in the same command.
    local m = reset % 1000000
    local ms = (reset - m) / 1000000 + 1000
    if m > 0 then ms = ms + 1 end
    redis.call('SET', key, value, 'PX', ms .. '')
  end
  if token == '' then token = '-' end
  return string.format('%d %d %d %d %d %s', allowed, remaining, reset, retry, delay, token)
end
"#,
    helpers!(),
    r#"
local commit = ARGV[2] == '1'
local n = #KEYS

-- Per key: its stored type, decoded state under the algorithm last used on it in this call,
-- whether an admitted check changed it, and the reset of that check (for the TTL).
local states = {}
local order = {}

local function load(key)
  local st = states[key]
  if st == nil then
    st = {dirty = false}
    st.kind, st.raw = read_state(key)
    states[key] = st
    order[#order + 1] = key
  end
  return st
end

-- The sliding log's state: the total of live units, how many stored entries have expired, the
-- newest entry, and entries appended by this call.
local function load_log(key, st, w)
  local v = {total = 0, drop = 0, count = 0, pending = {}, back_dirty = false}
  if st.kind ~= 'list' then return v end
  v.count = redis.call('LLEN', key) - 1
  v.total = tonumber(redis.call('LINDEX', key, 0)) or 0
  local i = 1
  local done = false
  while not done and i <= v.count do
    local chunk = redis.call('LRANGE', key, i, i + 63)
    for _, e in ipairs(chunk) do
      local at, units = parse_entry(e)
      if at + w > now then done = true; break end
      v.total = v.total - units
      v.drop = v.drop + 1
    end
    i = i + 64
  end
  if v.count > v.drop then
    v.back_at, v.back_units = parse_entry(redis.call('LINDEX', key, -1))
    v.back_stored = true
  end
  return v
end

local function token_bucket(v, cost, cap, amount, per)
  if v == nil then v = {tokens = cap, last = now} end
  local elapsed = sat(now - v.last)
  local earned = mul_div(elapsed, amount, per, false)
  local s
  if v.tokens + earned >= cap then
    s = {tokens = cap, last = now}
  else
    s = {tokens = v.tokens + earned, last = v.last + mul_div(earned, per, math.max(amount, 1), true)}
  end
  local function time_until(st, want)
    if st.tokens >= want then return 0 end
    local at = st.last + mul_div(want - st.tokens, per, math.max(amount, 1), true)
    return sat(at - now)
  end
  local need = math.max(cost, 1)
  if need > cap then return s, 0, s.tokens, time_until(s, cap), -1, 0 end
  if s.tokens < need then
    return s, 0, s.tokens, time_until(s, cap), time_until(s, need), 0
  end
  local after = {tokens = s.tokens - cost, last = s.last}
  return after, 1, after.tokens, time_until(after, cap), 0, 0
end

local function gcra(v, cost, burst, interval)
  local backlog = 0
  if v ~= nil and v.b > 0 then backlog = v.b end
  local horizon = burst * interval
  local need = math.max(cost, 1)
  local function free(b) return floor_div(sat(horizon - b), interval) end
  if need > burst then return v, 0, free(backlog), backlog, -1, 0 end
  -- The core's backlog + need * interval > horizon, without a sum that can pass 2^53.
  local slack = horizon - need * interval
  if backlog > slack then return v, 0, free(backlog), backlog, backlog - slack, 0 end
  local nb = backlog + cost * interval
  return {b = nb}, 1, free(nb), nb, 0, 0
end

local function queue(v, cost, limit, interval, max_wait, blocked)
  local delay = 0
  if v ~= nil and v.b > 0 then delay = v.b end
  local function free(b)
    local by_queue = sat(limit - ceil_div(b, interval))
    local by_wait = 0
    if max_wait >= b then by_wait = floor_div(max_wait - b, interval) + 1 end
    return math.min(by_queue, by_wait)
  end
  local need = math.max(cost, 1)
  if blocked == 1 or need > limit then return v, 0, free(delay), delay, -1, 0 end
  local bound = math.min((limit - need) * interval, max_wait)
  if delay > bound then return v, 0, free(delay), delay, delay - bound, 0 end
  local backlog = delay + cost * interval
  return {b = backlog}, 1, free(backlog), backlog, 0, delay
end

local function fixed_window(v, cost, limit, w, clock_aligned, ref)
  local start
  if clock_aligned == 1 then
    start = grid_start(rel(ref), w)
  elseif v ~= nil and now < v.start + w then
    start = v.start
  else
    start = now
  end
  local cur
  if v ~= nil and start <= v.start and v.count > 0 then
    cur = v
  else
    cur = {start = start, count = 0}
  end
  local to_end = sat(cur.start + w - now)
  local remaining = sat(limit - cur.count)
  local need = math.max(cost, 1)
  if need > limit then return cur, 0, remaining, to_end, -1, 0 end
  if need > remaining then return cur, 0, remaining, to_end, to_end, 0 end
  local after = {start = cur.start, count = cur.count + cost}
  local reset = to_end
  if after.count == 0 then reset = 0 end
  return after, 1, remaining - cost, reset, 0, 0
end

local function sliding_counter(v, cost, limit, w, ref)
  local start = grid_start(rel(ref), w)
  local s
  if v ~= nil and start <= v.start then
    s = v
  else
    local previous = 0
    if v ~= nil and start - v.start == w then previous = v.current end
    s = {start = start, current = 0, previous = previous}
  end
  local elapsed = math.min(sat(now - s.start), w - 1)
  local function weighted(previous)
    return mul_div(previous, w - math.min(elapsed, w), w, false)
  end
  local function reset_after(st)
    local to_next = w - elapsed
    if st.current == 0 and st.previous == 0 then return 0 end
    if st.current == 0 then return to_next end
    return to_next + w
  end
  local function first_fit(previous, room)
    if previous == 0 then return 0 end
    local bound = mul_div(room + 1, w, previous, true)
    local e = sat(w + 1 - bound)
    if e < w then return e end
    return nil
  end
  local estimate = weighted(s.previous) + s.current
  local remaining = sat(limit - estimate)
  local reset = reset_after(s)
  local need = math.max(cost, 1)
  if need > limit then return s, 0, remaining, reset, -1, 0 end
  if need > remaining then
    local retry
    if s.current + need <= limit then
      local e = first_fit(s.previous, limit - need - s.current)
      if e ~= nil then retry = sat(e - elapsed) end
    end
    if retry == nil then
      retry = (w - elapsed) + (first_fit(s.current, limit - need) or w)
    end
    return s, 0, remaining, reset, retry, 0
  end
  local after = {start = s.start, current = s.current + cost, previous = s.previous}
  return after, 1, remaining - cost, reset_after(after), 0, 0
end

local function sliding_log(key, v, cost, limit, w)
  local remaining = sat(limit - v.total)
  local need = math.max(cost, 1)
  local function last_expiry(extra)
    if extra then return w end
    if v.back_at ~= nil and v.back_at + w > now then return v.back_at + w - now end
    return 0
  end
  if need > limit then return v, 0, remaining, last_expiry(false), -1, 0 end
  if need <= remaining then
    local reset = last_expiry(cost > 0)
    if cost > 0 then
      if v.back_at ~= nil and v.back_at >= now then
        v.back_units = v.back_units + cost
        if #v.pending > 0 then
          v.pending[#v.pending].units = v.back_units
        else
          v.back_dirty = true
        end
      else
        v.pending[#v.pending + 1] = {at = now, units = cost}
        v.back_at = now
        v.back_units = cost
      end
      v.total = v.total + cost
    end
    return v, 1, remaining - cost, reset, 0, 0
  end
  -- Wait until enough of the oldest live entries expire.
  local freed = 0
  local retry = 0
  local found = false
  local i = 1 + v.drop
  while not found and i <= v.count do
    local chunk = redis.call('LRANGE', key, i, i + 63)
    for _, e in ipairs(chunk) do
      local at, units = parse_entry(e)
      freed = freed + units
      retry = sat(at + w - now)
      if remaining + freed >= need then found = true; break end
    end
    i = i + 64
  end
  if not found then
    for _, p in ipairs(v.pending) do
      freed = freed + p.units
      retry = sat(p.at + w - now)
      if remaining + freed >= need then break end
    end
  end
  return v, 0, remaining, last_expiry(false), retry, 0
end

local out = {}
local all = true
for i = 1, n do
  local key = KEYS[i]
  local alg, cost, p1, p2, p3, p4s = check_args(i)
  local p4 = tonumber(p4s)
  local st = load(key)
  local v = nil
  if st.alg == alg then
    v = st.v
  elseif alg == 5 then
    v = load_log(key, st, p2)
  else
    v = decode(alg, st.raw)
  end
  local nv, allowed, remaining, reset, retry, delay
  if alg == 1 then
    nv, allowed, remaining, reset, retry, delay = token_bucket(v, cost, p1, p2, p3)
  elseif alg == 2 then
    nv, allowed, remaining, reset, retry, delay = gcra(v, cost, p1, p2)
  elseif alg == 3 then
    nv, allowed, remaining, reset, retry, delay = queue(v, cost, p1, p2, p3, p4)
  elseif alg == 4 then
    nv, allowed, remaining, reset, retry, delay = fixed_window(v, cost, p1, p2, p3, p4s)
  elseif alg == 5 then
    nv, allowed, remaining, reset, retry, delay = sliding_log(key, v, cost, p1, p2)
  else
    nv, allowed, remaining, reset, retry, delay = sliding_counter(v, cost, p1, p2, p4s)
  end
  if st.alg ~= alg then
    -- The first check of this algorithm on the key: later ones thread through st.v.
    st.alg = alg
    st.v = v
    st.dirty = false
  end
  local token = ''
  if allowed == 1 and cost > 0 then
    st.v = nv
    st.dirty = true
    st.reset = reset
    if alg == 5 then token = absolute(nv.back_at)
    elseif alg == 4 or alg == 6 then token = absolute(nv.start) end
  end
  if allowed == 0 then all = false end
  if token == '' then token = '-' end
  out[#out + 1] = string.format('%d %d %d %d %d %s', allowed, remaining, reset, retry, delay, token)
end

if commit and all then
  for _, key in ipairs(order) do
    local st = states[key]
    if st.dirty then
      local v = st.v
      if st.alg == 5 then
        if st.kind ~= 'list' and st.kind ~= 'none' then redis.call('DEL', key) end
        if st.kind == 'list' then
          redis.call('LTRIM', key, 1 + v.drop, -1)
          if v.back_dirty then redis.call('LSET', key, -1, entry(v.back_at, v.back_units)) end
        end
        for _, p in ipairs(v.pending) do redis.call('RPUSH', key, entry(p.at, p.units)) end
        redis.call('LPUSH', key, int(v.total))
        redis.call('PEXPIRE', key, int(ceil_div(st.reset, 1000000) + 1000))
      else
        -- SET replaces a value of any type, and sets the TTL in the same command.
        redis.call('SET', key, encode(st.alg, v), 'PX', int(ceil_div(st.reset, 1000000) + 1000))
      end
    end
  end
end
return table.concat(out, ' ')
"#
);

/// Gives back what [`CHECK`] consumed on one slot, when another slot of the same request
/// refused it. Each check is undone in reverse order, as far as the counter still holds it: a
/// window that has ended, or a log entry that has expired, has nothing left to give back.
///
/// - `KEYS[i]`: the counter key of check `i`.
/// - `ARGV[1]`: the time offset in nanoseconds (0 in production).
/// - `ARGV[2]`: unused.
/// - `ARGV[3 + 7(i-1)]..`: check `i` as for [`CHECK`], with the token [`CHECK`] returned for it.
///
/// Returns the number of checks given back.
pub(crate) const REFUND: &str = concat!(
    clock!(),
    helpers!(),
    r#"
local undone = 0
for i = #KEYS, 1, -1 do
  local key = KEYS[i]
  local alg, cost, p1, p2, p3, p4s, token = check_args(i)
  local kind, raw = read_state(key)
  if cost > 0 and alg == 5 and kind == 'list' then
    local len = redis.call('LLEN', key)
    local idx = len - 1
    while idx >= 1 do
      local e = redis.call('LINDEX', key, idx)
      local sp = string.find(e, ' ', 1, true)
      local at = string.sub(e, 1, sp - 1)
      if at == token then
        local units = tonumber(string.sub(e, sp + 1)) - cost
        if units > 0 then
          redis.call('LSET', key, idx, at .. ' ' .. int(units))
        else
          redis.call('LSET', key, idx, '-')
          redis.call('LREM', key, 1, '-')
        end
        local total = sat((tonumber(redis.call('LINDEX', key, 0)) or 0) - cost)
        redis.call('LSET', key, 0, int(total))
        undone = undone + 1
        break
      end
      if rel(at) < rel(token) then break end
      idx = idx - 1
    end
  elseif cost > 0 and kind == 'string' then
    local v = decode(alg, raw)
    if v ~= nil then
      local changed = true
      if alg == 1 then
        local earned = mul_div(sat(now - v.last), p2, p3, false)
        local tokens = v.tokens + earned
        local last = v.last + mul_div(earned, p3, math.max(p2, 1), true)
        if tokens + cost >= p1 then
          v = {tokens = p1, last = now}
        else
          v = {tokens = tokens + cost, last = last}
        end
      elseif alg == 2 or alg == 3 then
        v.b = v.b - cost * p2
      elseif alg == 4 and absolute(v.start) == token then
        v.count = sat(v.count - cost)
      elseif alg == 6 and absolute(v.start) == token then
        v.current = sat(v.current - cost)
      elseif alg == 6 and absolute(v.start - p2) == token then
        v.previous = sat(v.previous - cost)
      else
        changed = false
      end
      if changed then
        redis.call('SET', key, encode(alg, v), 'KEEPTTL')
        undone = undone + 1
      end
    end
  end
end
return undone
"#
);

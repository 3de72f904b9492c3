-- The check script: decides a request's checks that fall in one slot, and commits them only if
-- all admit. `CHECK` in src/scripts/mod.rs documents its KEYS, ARGV and reply. The algorithm codes
-- (TOKEN_BUCKET, GCRA, ...) are locals of a prelude that Rust puts in front, and each
-- `--#include` line is replaced by the file it names, from this folder.

--#include clock.lua

-- One check, the common case: straight-line code on locals, with no table and no
-- function created (but mul_div, for the token bucket and the sliding counter). Each algorithm
-- decides exactly as its function in the general path below, and as the core. The bucketed
-- window takes the general path even alone: it sums and shifts up to 1,024 buckets, which a table
-- does best, and costs that loop whichever path runs it.
if #KEYS == 1 and ARGV[3] ~= BUCKETED_WINDOW then
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

  if alg == GCRA or alg == LEAKY_QUEUE then
    -- GCRA (p1 burst, p2 interval) and the queue (p1 capacity, p2 interval, p3 maximum wait,
    -- p4 1 if blocked) keep one time: how far it lies after now is the backlog.
    local backlog = 0
    local raw = redis.pcall('GET', key)
    if type(raw) == 'string' then
      local code, at = string.match(raw, '^(%d+) (%d+)$')
      -- Seconds and nanoseconds apart, since a timestamp is too long for a double. (A pattern
      -- that splits them backtracks, and costs microseconds.) Nine digits or fewer would be a
      -- time in 1970, long past: the same as none.
      if code == alg and #at > 9 then
        backlog = (string.sub(at, 1, -10) - S) * 1000000000 + (string.sub(at, -9) - now)
        if backlog < 0 then backlog = 0 end
      end
    end
    local interval = p2
    if alg == GCRA then
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

  elseif alg == TOKEN_BUCKET then
    -- Token bucket: p1 capacity, p2 refill amount, p3 refill period.
    local cap, amount, per = p1, p2, ARGV[7] + 0
    local rate = amount
    if rate < 1 then rate = 1 end
    --#include mul_div.lua
    local tokens, last = cap, now
    local raw = redis.pcall('GET', key)
    if type(raw) == 'string' then
      local code, t, at = string.match(raw, '^(%d+) (%d+) (%d+)$')
      if code == alg and #at > 9 then
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
      value = string.format('%s %d %d%09d', alg, tokens, S + (last - r) / 1000000000, r)
    end

  elseif alg ~= SLIDING_LOG then
    -- Fixed window (p1 limit, p2 window, p3 1 if clock-aligned, p4 a window start) and sliding
    -- counter (p1 limit, p2 window, p4 a window start).
    local w = p2
    local start
    if alg ~= FIXED_WINDOW or ARGV[7] == '1' then
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
    if alg == FIXED_WINDOW then
      local vstart, count
      if type(raw) == 'string' then
        local code, at, c = string.match(raw, '^(%d+) (%d+) (%d+)$')
        if code == alg and #at > 9 then
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
        if write then value = alg .. ' ' .. token .. ' ' .. string.format('%d', count) end
      end
    else
      local limit = p1
      local current, previous = 0, 0
      if type(raw) == 'string' then
        local code, at, c, p = string.match(raw, '^(%d+) (%d+) (%d+) (%d+)$')
        if code == alg and #at > 9 then
          local vstart = (string.sub(at, 1, -10) - S) * 1000000000 + string.sub(at, -9)
          if start <= vstart then
            start, current, previous = vstart, c + 0, p + 0
          elseif start - vstart == w then
            previous = c + 0
          end
        end
      end
      --#include mul_div.lua
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
        if write then value = string.format('%s %s %d %d', alg, token, current, previous) end
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

--#include helpers.lua

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

-- The bucketed window (limit, bucket length b, n buckets, ref a bucket start near now). The state
-- is the start of the newest bucket it holds and the counts, newest first: counts[j + 1] is the
-- bucket j lengths before it.
local function bucketed_window(v, cost, limit, b, n, ref)
  local cur = grid_start(rel(ref), b)
  local counts = {}
  local shift = 0
  if v == nil then
    shift = n
  elseif cur <= v.start then
    -- A clock behind the newest bucket counts as that bucket: no time passes.
    cur = v.start
  else
    shift = math.min(floor_div(cur - v.start, b), n)
  end
  local used = 0
  for j = 1, n do
    local c = 0
    if j > shift then c = v.counts[j - shift] or 0 end
    counts[j] = c
    used = used + c
  end
  -- Time from now until the bucket j lengths before the current one leaves the window.
  local function leaves(j) return sat(cur + (n - j) * b - now) end
  local function last_leaves()
    for j = 1, n do
      if counts[j] > 0 then return leaves(j - 1) end
    end
    return 0
  end
  local s = {start = cur, counts = counts}
  local remaining = sat(limit - used)
  local need = math.max(cost, 1)
  if need > limit then return s, 0, remaining, last_leaves(), -1, 0 end
  if need <= remaining then
    local reset = last_leaves()
    if cost > 0 then
      local after = {}
      for j = 1, n do after[j] = counts[j] end
      after[1] = after[1] + cost
      s = {start = cur, counts = after}
      reset = leaves(0)
    end
    return s, 1, remaining - cost, reset, 0, 0
  end
  -- Wait until enough of the oldest buckets leave to make room.
  local freed = 0
  local retry = leaves(0)
  for j = n, 1, -1 do
    freed = freed + counts[j]
    if remaining + freed >= need then
      retry = leaves(j - 1)
      break
    end
  end
  return s, 0, remaining, last_leaves(), retry, 0
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
  elseif alg == SLIDING_LOG then
    v = load_log(key, st, p2)
  else
    v = decode(alg, st.raw)
  end
  local nv, allowed, remaining, reset, retry, delay
  if alg == TOKEN_BUCKET then
    nv, allowed, remaining, reset, retry, delay = token_bucket(v, cost, p1, p2, p3)
  elseif alg == GCRA then
    nv, allowed, remaining, reset, retry, delay = gcra(v, cost, p1, p2)
  elseif alg == LEAKY_QUEUE then
    nv, allowed, remaining, reset, retry, delay = queue(v, cost, p1, p2, p3, p4)
  elseif alg == FIXED_WINDOW then
    nv, allowed, remaining, reset, retry, delay = fixed_window(v, cost, p1, p2, p3, p4s)
  elseif alg == SLIDING_LOG then
    nv, allowed, remaining, reset, retry, delay = sliding_log(key, v, cost, p1, p2)
  elseif alg == BUCKETED_WINDOW then
    nv, allowed, remaining, reset, retry, delay = bucketed_window(v, cost, p1, p2, p3, p4s)
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
    if alg == SLIDING_LOG then token = absolute(nv.back_at)
    elseif alg == FIXED_WINDOW or alg == SLIDING_COUNTER or alg == BUCKETED_WINDOW then
      token = absolute(nv.start)
    end
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
      if st.alg == SLIDING_LOG then
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

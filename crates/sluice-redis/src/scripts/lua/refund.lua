-- The refund script: gives back what the check script consumed on one slot, when another slot of
-- the same request refused it. `REFUND` in src/scripts/mod.rs documents its KEYS, ARGV and reply.
-- The algorithm codes are locals of a prelude that Rust puts in front, and each `--#include` line
-- is replaced by the file it names, from this folder.

--#include clock.lua
--#include helpers.lua


local undone = 0
for i = #KEYS, 1, -1 do
  local key = KEYS[i]
  local alg, cost, p1, p2, p3, p4s, token = check_args(i)
  local kind, raw = read_state(key)
  if cost > 0 and alg == SLIDING_LOG and kind == 'list' then
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
      if alg == TOKEN_BUCKET then
        local earned = mul_div(sat(now - v.last), p2, p3, false)
        local tokens = v.tokens + earned
        local last = v.last + mul_div(earned, p3, math.max(p2, 1), true)
        if tokens + cost >= p1 then
          v = {tokens = p1, last = now}
        else
          v = {tokens = tokens + cost, last = last}
        end
      elseif alg == GCRA or alg == LEAKY_QUEUE then
        v.b = v.b - cost * p2
      elseif alg == FIXED_WINDOW and absolute(v.start) == token then
        v.count = sat(v.count - cost)
      elseif alg == SLIDING_COUNTER and absolute(v.start) == token then
        v.current = sat(v.current - cost)
      elseif alg == SLIDING_COUNTER and absolute(v.start - p2) == token then
        v.previous = sat(v.previous - cost)
      elseif alg == BUCKETED_WINDOW then
        -- The bucket the check counted in, if the window still holds it.
        changed = false
        for j = 1, #v.counts do
          if absolute(v.start - (j - 1) * p2) == token then
            v.counts[j] = sat(v.counts[j] - cost)
            changed = true
            break
          end
        end
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

-- The token bucket, as `sluice_core::TokenBucket` decides it: p1 capacity, p2 refill amount, p3
-- refill period (ns). Stored as "<code> <tokens> <last>": whole tokens at `last`, an absolute
-- time in nanoseconds. The contract of each section is in check.lua and refund.lua.

--#section helpers
--#include mul_div.lua

--#section check
local cap, amount, per = p1, p2, p3 + 0
local rate = amount
if rate < 1 then rate = 1 end
local tokens, last = cap, now
if raw == nil then raw = redis.pcall('GET', key) end
if type(raw) == 'string' then
  local code, t, at = string.match(raw, '^(%d+) (%d+) (%d+)$')
  if code == TOKEN_BUCKET and #at > 9 then
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
if tokens < cap then
  reset = last + mul_div(cap - tokens, per, rate, true) - now
  if reset < 0 then reset = 0 end
end
if allowed == 1 and write then
  local r = last % 1000000000
  state = string.format('%s %d %d%09d', TOKEN_BUCKET, tokens, S + (last - r) / 1000000000, r)
end
remaining = tokens

--#section refund
-- The units go back into the bucket, brought up to now first, never past its capacity. The token
-- plays no part.
token_bucket_refund = function(key, raw, cost, cap, amount, per, p4, token)
  local code, t, at = string.match(raw, '^(%d+) (%d+) (%d+)$')
  if code ~= TOKEN_BUCKET then return nil end
  local tokens, last = tonumber(t), rel(at)
  local earned = mul_div(sat(now - last), amount, per, false)
  tokens = tokens + earned
  last = last + mul_div(earned, per, math.max(amount, 1), true)
  if tokens + cost >= cap then
    tokens, last = cap, now
  else
    tokens = tokens + cost
  end
  return TOKEN_BUCKET .. ' ' .. int(tokens) .. ' ' .. absolute(last)
end

--#section charge
-- The bucket, brought up to now as the check does, gives the units it holds; what it lacks is a
-- debt that its refill pays before it earns a token again: `last` moves on by the debt's refill
-- time, from now or from the debt before, and requests are refused until then.
token_bucket_charge = function(key, raw, cost, cap, amount, per, p4)
  local rate = math.max(amount, 1)
  local tokens, last = cap, now
  local code, t, at = string.match(raw, '^(%d+) (%d+) (%d+)$')
  if code == TOKEN_BUCKET and #at > 9 then tokens, last = tonumber(t), rel(at) end
  local earned = mul_div(sat(now - last), amount, per, false)
  if tokens + earned >= cap then
    tokens, last = cap, now
  else
    tokens = tokens + earned
    last = last + mul_div(earned, per, rate, true)
  end
  if tokens >= cost then
    tokens = tokens - cost
  else
    local debt = cost - tokens
    tokens = 0
    if last < now then last = now end
    last = now + exact(last - now + mul_div(debt, per, rate, true))
  end
  local reset = exact(sat(last + mul_div(cap - tokens, per, rate, true) - now))
  return TOKEN_BUCKET .. ' ' .. int(tokens) .. ' ' .. absolute(last), reset
end

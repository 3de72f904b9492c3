-- The refund script: gives back units to counters of one slot, or charges them more: what the
-- check script consumed, when another slot of the same request refused it; what a settled
-- reservation did not use, or used beyond what it reserved; and units an Envoy request gives
-- back (`is_negative_hits`). `REFUND` in src/scripts/mod.rs documents its KEYS, ARGV and reply.
-- The algorithm codes are locals of a prelude that Rust puts in front, each `--#include` line is
-- replaced by the file it names, from this folder, and the `--#algorithms` and `--#dispatch`
-- lines by what `load.rs` makes of the files in `algorithm/`, one per algorithm.
--
-- Each algorithm's `--#section refund` assigns `name_refund`:
--
--   name_refund(key, raw, cost, p1, p2, p3, p4, token) -> value, true or nil
--
-- which gives `cost` back to the counter as far as it still holds what the check consumed
-- (identified by `token`, the check's refund token, or by now when it is empty: the window that
-- holds now), never past what the counter can hold. `raw` is the key's string value ('' when it
-- holds none); p1..p3 are numbers (nil when not sent), p4 the argument as sent. It returns the
-- string value to store in place of `raw` (the TTL kept), true when it wrote the key itself, or
-- nil when there is nothing to give back.
--
-- Each algorithm's `--#section charge` assigns `name_charge`:
--
--   name_charge(key, raw, cost, p1, p2, p3, p4) -> value, reset or true
--
-- which takes `cost` from the counter at now whatever it holds, past its limit if need be (a
-- counter that holds none, or one of another algorithm, starts fresh), so that requests are
-- refused until the excess has drained. It returns the string value to store and the time until
-- the counter is full again (ns), which the key's TTL follows as after a check, or true when it
-- wrote the key itself.

--#include clock.lua
--#include helpers.lua

local n = #KEYS
local charges = ARGV[2]
local used = {}
for i = 1, n do used[ARGV[7 * i - 4]] = true end

--#algorithms refund
--#algorithms charge

local undone = 0
for i = n, 1, -1 do
  local key = KEYS[i]
  local alg, cost, p1, p2, p3, p4, token = check_args(i)
  if cost > 0 then
    local give_back, take
    --#dispatch give_back=_refund take=_charge
    local raw = redis.pcall('GET', key)
    if type(raw) ~= 'string' then raw = '' end
    if string.sub(charges, i, i) == 'c' then
      local value, reset = take(key, raw, cost, p1, p2, p3, p4)
      if value ~= true then
        local m = reset % 1000000
        local ms = (reset - m) / 1000000 + 1000
        if m > 0 then ms = ms + 1 end
        redis.call('SET', key, value, 'PX', int(ms))
      end
      undone = undone + 1
    else
      local value = give_back(key, raw, cost, p1, p2, p3, p4, token)
      if value == true then
        undone = undone + 1
      elseif value ~= nil then
        redis.call('SET', key, value, 'KEEPTTL')
        undone = undone + 1
      end
    end
  end
end
return undone

-- The refund script: gives back what the check script consumed on one slot, when another slot of
-- the same request refused it. `REFUND` in src/scripts/mod.rs documents its KEYS, ARGV and reply.
-- The algorithm codes are locals of a prelude that Rust puts in front, each `--#include` line is
-- replaced by the file it names, from this folder, and the `--#algorithms` and `--#dispatch`
-- lines by what `load.rs` makes of the files in `algorithm/`, one per algorithm.
--
-- Each algorithm's `--#section refund` assigns `name_refund`:
--
--   name_refund(key, raw, cost, p1, p2, p3, p4, token) -> value, true or nil
--
-- which gives `cost` back to the counter as far as it still holds what the check consumed
-- (identified by `token`, the check's refund token). `raw` is the key's string value ('' when it
-- holds none); p1..p3 are numbers (nil when not sent), p4 the argument as sent. It returns the
-- string value to store in place of `raw` (the TTL kept), true when it wrote the key itself, or
-- nil when there is nothing to give back.

--#include clock.lua
--#include helpers.lua

local n = #KEYS
local used = {}
for i = 1, n do used[ARGV[7 * i - 4]] = true end

--#algorithms refund

local undone = 0
for i = n, 1, -1 do
  local key = KEYS[i]
  local alg, cost, p1, p2, p3, p4, token = check_args(i)
  if cost > 0 then
    local give_back
    --#dispatch give_back=_refund
    local raw = redis.pcall('GET', key)
    if type(raw) ~= 'string' then raw = '' end
    local value = give_back(key, raw, cost, p1, p2, p3, p4, token)
    if value == true then
      undone = undone + 1
    elseif value ~= nil then
      redis.call('SET', key, value, 'KEEPTTL')
      undone = undone + 1
    end
  end
end
return undone

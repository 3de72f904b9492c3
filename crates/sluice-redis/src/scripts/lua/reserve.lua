-- The reserve script: decides a request's checks as the check script does and, when every one
-- admits, commits them and records the reservation, in one atomic call. Off a Cluster only,
-- where the record and the counters may share a script. `RESERVE` in src/scripts/mod.rs
-- documents its KEYS, ARGV and reply.

--#include clock.lua
--#include helpers.lua

local rec = KEYS[#KEYS]
if redis.call('EXISTS', rec) == 1 then
  return redis.error_reply('RESERVED a reservation of this id exists already')
end

-- The check script's body, in a function so that its returns come back here.
local function decide()
  local commit = ARGV[2] == '1'
  local n = #KEYS - 1
  --#include decide_checks.lua
end

local reply = decide()
local n = #KEYS - 1
-- Six fields per check: allowed first, the refund token last.
local fields = {}
for f in string.gmatch(reply, '[^ ]+') do fields[#fields + 1] = f end
for i = 1, n do
  if fields[6 * i - 5] ~= '1' then return reply end
end
local items = {}
for i = 1, n do
  local b = 7 * i - 4
  local token = fields[6 * i]
  if token == '-' then token = '' end
  items[#items + 1] = KEYS[i]
  for j = b, b + 5 do items[#items + 1] = ARGV[j] end
  items[#items + 1] = token
end
local ttl = tonumber(ARGV[7 * n + 3])
--#include write_reservation.lua
return reply

-- The body of the check script, shared with the reserve script: decides the checks `KEYS[1..n]`,
-- with their arguments from `ARGV[3]` on, commits them when `commit` is set and every check
-- admits, and returns the check script's reply. The including script reads the clock and sets
-- `commit` and `n` first. `check.lua` states what each section of an algorithm's file holds.

-- One check, the common case: its algorithm's blocks inline, with no function or table made
-- but the algorithm's own helpers.
if n == 1 then
  local key, alg = KEYS[1], ARGV[3]
  local cost = ARGV[4] + 0
  local need = cost
  if need < 1 then need = 1 end
  -- Only an admitted check that consumes is written, and only when committing.
  local write = cost > 0 and commit
  local raw, p1, p2, p3, p4 = nil, ARGV[5] + 0, ARGV[6] + 0, ARGV[7], ARGV[8]
  local allowed, remaining, reset, retry, delay, token, state = 0, 0, 0, 0, 0, '', nil
  --#decide_one
  if token == '' then token = '-' end
  return string.format('%d %d %d %d %d %s', allowed, remaining, reset, retry, delay, token)
end

-- The algorithms this call uses: EVALSHA runs the whole script on every call, so only theirs
-- are created.
local used = {}
for i = 1, n do used[ARGV[7 * i - 4]] = true end

--#decide_functions

-- Several checks: each key's state threads from check to check, and is written only when every
-- check admits. Per key, in order of first appearance: the algorithm of its latest check, what
-- that algorithm's admitted checks left (nil: as stored; a key's state under another algorithm
-- counts as fresh, and is dropped, as in the memory store), and, when one consumed, how to
-- store it and the reset of the latest admitted check, which the TTL follows.
local alg_of, state_of, store_of, reset_of, order = {}, {}, {}, {}, {}
local out = {}
local all = true
for i = 1, n do
  local key = KEYS[i]
  local b = 7 * i - 4
  local alg = ARGV[b]
  local cost = ARGV[b + 1] + 0
  local need = cost
  if need < 1 then need = 1 end
  local decide, store
  --#dispatch decide= store=_store
  if alg_of[key] == nil then order[#order + 1] = key end
  if alg_of[key] ~= alg then
    alg_of[key], state_of[key], store_of[key] = alg, nil, nil
  end
  local allowed, remaining, reset, retry, delay, token, state = decide(key, state_of[key], cost,
    need, ARGV[b + 2] + 0, ARGV[b + 3] + 0, ARGV[b + 4], ARGV[b + 5], true)
  if allowed == 1 and cost > 0 then
    state_of[key], store_of[key], reset_of[key] = state, store, reset
  end
  if allowed == 0 then all = false end
  if token == '' then token = '-' end
  out[i] = string.format('%d %d %d %d %d %s', allowed, remaining, reset, retry, delay, token)
end

if commit and all then
  for _, key in ipairs(order) do
    local store = store_of[key]
    if store ~= nil then store(key, state_of[key], reset_of[key]) end
  end
end
return table.concat(out, ' ')

-- A log of entries that each count for `w` ns after they were taken, as
-- `sluice_core::ExpiringLog` keeps it: the state of the sliding log (entries are requests, `w` is
-- its window) and of the concurrency limit (entries are holds, `w` is their ttl). Each of their
-- files includes these sections into its own (`--#include expiring_log.lua <section>`), after
-- setting the locals they read besides their contract's: `tag`, the header's mark that tells the
-- two algorithms' lists apart ('' for the log, 'c' for the holds), and for the check `limit` and
-- `w`. The refund and charge sections are the bodies of the algorithm's functions, whose
-- parameters name `w`.
--
-- Stored as a list: a header holding the tag and the total of its units, then one
-- "<nanos> <units>" entry per distinct time taken, oldest first; the refund token is the entry's
-- time. A list whose header is not the algorithm's (the other's) counts as a key of another
-- algorithm. Its state within one call is a table (`lg`) rather than a string, in array slots
-- only (a table with fields costs Redis a tenth more per call): [1] the total of live units, [2]
-- the entries stored, [3] how many of them have expired, [4] the newest entry's time (relative to
-- S, false for none), [5] its units, [6] its time as stored, [7] whether this call added to a
-- stored newest entry, [8] what the key holds ('list', 'none' or 'other'), then the entries this
-- call adds, three slots each (time, units, time as stored), which the store section writes. The
-- contract of each section is in check.lua and refund.lua.

--#section helpers
-- An entry's time (relative to S, or nil for a time in 1970), units, and time as stored.
local function log_entry(e)
  local at, units = string.match(e, '^(%d+) (%d+)$')
  if at == nil or #at <= 9 then return nil, units end
  return (string.sub(at, 1, -10) - S) * 1000000000 + string.sub(at, -9), units + 0, at
end

--#section check
local lg = raw
if lg == nil then
  -- LLEN tells the key's shape: 0 for no key, an error for a key of another type.
  local len = redis.pcall('LLEN', key)
  local kind = 'other'
  if type(len) == 'number' then
    kind = 'none'
    if len > 0 then kind = 'list' end
  end
  local head, total
  if kind == 'list' then
    head = redis.call('LRANGE', key, 0, 1)
    -- A list without this algorithm's header is the other's: it starts afresh.
    total = string.match(head[1], '^' .. tag .. '(%d+)$')
    if total == nil then kind = 'other' end
  end
  -- With room for one new entry, so that the table is not resized for it: Lua sizes a table by
  -- its constructor, nil slots included.
  lg = {0, 0, 0, false, 0, '', false, kind, nil, nil, nil}
  if kind == 'list' then
    local count = len - 1
    local drop = 0
    total = total + 0
    if count > 0 then
      -- Expired entries are a prefix: scan them only when the oldest has expired.
      local oldest = log_entry(head[2])
      if oldest == nil or oldest + w <= now then
        local i = 1
        local done = false
        while not done and i <= count do
          local chunk = redis.call('LRANGE', key, i, i + 63)
          for _, e in ipairs(chunk) do
            local at, units = log_entry(e)
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
        local back = head[2]
        if count > 1 then back = redis.call('LINDEX', key, -1) end
        local at, units, text = log_entry(back)
        lg[4], lg[5], lg[6] = at or false, units, text
      end
    end
    lg[1], lg[2], lg[3] = total, count, drop
  end
end
remaining = limit - lg[1]
if remaining < 0 then remaining = 0 end
-- Until the newest entry expires.
local back_at = lg[4]
if back_at and back_at + w > now then reset = back_at + w - now end
if need > limit then
  retry = -1
elseif need <= remaining then
  allowed = 1
  remaining = remaining - cost
  if cost > 0 then
    reset = w
    -- Entries taken at the same instant share one.
    if back_at and back_at >= now then
      lg[5] = lg[5] + cost
      if #lg > 8 then
        lg[#lg - 1] = lg[5]
      else
        lg[7] = true
      end
    else
      local r = now % 1000000000
      local text = string.format('%d%09d', S + (now - r) / 1000000000, r)
      lg[#lg + 1] = now
      lg[#lg + 1] = cost
      lg[#lg + 1] = text
      lg[4], lg[5], lg[6] = now, cost, text
    end
    lg[1] = lg[1] + cost
    token = lg[6]
  end
else
  -- Wait until enough of the oldest live entries expire: the stored ones, then this call's.
  -- A charge may have taken the log past its limit, so the room is what is left of the live
  -- units once some have expired, not `remaining` plus them.
  local freed = 0
  local found = false
  local i = 1 + lg[3]
  while not found and i <= lg[2] do
    local chunk = redis.call('LRANGE', key, i, i + 63)
    for _, e in ipairs(chunk) do
      local at, units = log_entry(e)
      freed = freed + units
      retry = at + w - now
      if retry < 0 then retry = 0 end
      if lg[1] - freed + need <= limit then found = true; break end
    end
    i = i + 64
  end
  if not found then
    for j = 9, #lg, 3 do
      freed = freed + lg[j + 1]
      retry = lg[j] + w - now
      if retry < 0 then retry = 0 end
      if lg[1] - freed + need <= limit then break end
    end
  end
end
state = lg

--#section store
-- Writes what the check left in its state: the header, the newest stored entry when this call
-- added to it, and this call's new entries, with the list's TTL `reset` ns (plus a second).
local lg = state
local header = tag .. string.format('%d', lg[1])
local first = 9
if lg[8] ~= 'list' then
  if lg[8] == 'other' then redis.call('DEL', key) end
  if #lg > 8 then
    redis.call('RPUSH', key, header, lg[11] .. ' ' .. string.format('%d', lg[10]))
    first = 12
  else
    redis.call('RPUSH', key, header)
  end
else
  -- Keep the last expired entry (if any) as the slot of the new header.
  if lg[3] > 0 then redis.call('LTRIM', key, lg[3], -1) end
  redis.call('LSET', key, 0, header)
  if lg[7] then
    redis.call('LSET', key, -1, lg[6] .. ' ' .. string.format('%d', lg[5]))
  end
end
for j = first, #lg, 3 do
  redis.call('RPUSH', key, lg[j + 2] .. ' ' .. string.format('%d', lg[j + 1]))
end
local m = reset % 1000000
local ms = (reset - m) / 1000000 + 1000
if m > 0 then ms = ms + 1 end
redis.call('PEXPIRE', key, ms .. '')

--#section refund
-- The body of the algorithm's `name_refund(key, raw, cost, limit, w, p3, p4, token)`: gives `cost`
-- back off the newest entries taken at or before the check's (`token`, its entry's time; an empty
-- token means now) that still count, newest first, and off the header's total; expired entries
-- give nothing back, and the other algorithm's list is left alone. Returns true when it gave any
-- back (it writes the list itself), nil otherwise.
local len = redis.pcall('LLEN', key)
if type(len) ~= 'number' or len < 2 then return nil end
local total = string.match(redis.call('LINDEX', key, 0), '^' .. tag .. '(%d+)$')
if total == nil then return nil end
local upto = now
if token ~= '' then upto = rel(token) end
local left, emptied = cost, false
for idx = -1, 1 - len, -1 do
  if left <= 0 then break end
  local e = redis.call('LINDEX', key, idx)
  local at, units = string.match(e, '^(%d+) (%d+)$')
  if at ~= nil then
    local t = rel(at)
    if t + w <= now then break end
    if t <= upto then
      units = tonumber(units)
      if units > left then
        redis.call('LSET', key, idx, at .. ' ' .. int(units - left))
        left = 0
      else
        redis.call('LSET', key, idx, '-')
        left, emptied = left - units, true
      end
    end
  end
end
if left == cost then return nil end
if emptied then redis.call('LREM', key, 0, '-') end
redis.call('LSET', key, 0, tag .. int(sat(tonumber(total) - (cost - left))))
return true

--#section charge
-- The body of the algorithm's `name_charge(key, raw, cost, limit, w, p3, p4)`: takes `cost` at now,
-- past the limit if need be (at the newest entry when that is not older, as the check records
-- entries taken at one instant), so that requests are refused until enough of the log expires.
-- A key of another algorithm, the other's list included, starts afresh. Returns true: it writes
-- the list itself, with the TTL a check's write would set.
local len = redis.pcall('LLEN', key)
local total
if type(len) == 'number' and len > 0 then
  total = string.match(redis.call('LINDEX', key, 0), '^' .. tag .. '(%d+)$')
  if total == nil then len = 'other' end
end
if type(len) ~= 'number' then
  redis.call('DEL', key)
  len = 0
end
local at, units
if len > 1 then
  at, units = string.match(redis.call('LINDEX', key, -1), '^(%d+) (%d+)$')
end
if len == 0 then
  redis.call('RPUSH', key, tag .. int(cost), after_now(0) .. ' ' .. int(cost))
else
  redis.call('LSET', key, 0, tag .. int(exact(tonumber(total) + cost)))
  if at ~= nil and rel(at) >= now then
    redis.call('LSET', key, -1, at .. ' ' .. int(exact(tonumber(units) + cost)))
  else
    redis.call('RPUSH', key, after_now(0) .. ' ' .. int(cost))
  end
end
redis.call('PEXPIRE', key, int(ceil_div(w, 1000000) + 1000))
return true

-- Writes the record of a reservation, shared by the reserve and record scripts: a list under
-- `rec`, "open" (or "settled", once claimed), the time its ttl ends (Redis time plus the offset,
-- absolute ns), then `items`, eight per check: its counter key, algorithm code, cost, p1..p4 as
-- the check script took them, and its refund token ('' for none). The key itself lives twice
-- the ttl, plus a second, so that a late settle finds it expired rather than unknown. The
-- including script reads the clock and helpers, and sets `rec`, `ttl` (ns) and `items` first.
redis.call('RPUSH', rec, 'open', after_now(ttl), unpack(items))
redis.call('PEXPIRE', rec, int(2 * ceil_div(ttl, 1000000) + 1000))

-- The concurrency limit, as `sluice_core::ConcurrencyLimit` decides it: p1 limit, p2 ttl (ns). Its
-- holds are kept, decided, released and charged as `expiring_log.lua` keeps a log, each counting
-- for the ttl, under a header marked 'c' (`tag`), which tells it from a sliding log's list; the
-- refund token is the hold's time, so a settle releases the hold its reservation took. A
-- refusal's retry is cut to a second (`ConcurrencyLimit::RETRY_HINT`). The contract of each
-- section is in check.lua and refund.lua.

--#section helpers
--#include expiring_log.lua helpers

--#section check
local limit, w, tag = p1, p2, 'c'
--#include expiring_log.lua check
-- A slot comes back as soon as a request in flight ends: advise trying again soon.
if retry > 1000000000 then retry = 1000000000 end

--#section store
local tag = 'c'
--#include expiring_log.lua store

--#section refund
concurrency_limit_refund = function(key, raw, cost, limit, w, p3, p4, token)
  local tag = 'c'
  --#include expiring_log.lua refund
end

--#section charge
concurrency_limit_charge = function(key, raw, cost, limit, w, p3, p4)
  local tag = 'c'
  --#include expiring_log.lua charge
end

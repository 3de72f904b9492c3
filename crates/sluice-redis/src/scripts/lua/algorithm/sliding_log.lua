-- The sliding log, as `sluice_core::SlidingLog` decides it: p1 limit, p2 window (ns). Its
-- entries are kept, decided, refunded and charged as `expiring_log.lua` keeps a log, each
-- counting for the window, under a header with no mark (`tag` ''). The contract of each section
-- is in check.lua and refund.lua.

--#section helpers
--#include expiring_log.lua helpers

--#section check
local limit, w, tag = p1, p2, ''
--#include expiring_log.lua check

--#section store
local tag = ''
--#include expiring_log.lua store

--#section refund
sliding_log_refund = function(key, raw, cost, limit, w, p3, p4, token)
  local tag = ''
  --#include expiring_log.lua refund
end

--#section charge
sliding_log_charge = function(key, raw, cost, limit, w, p3, p4)
  local tag = ''
  --#include expiring_log.lua charge
end

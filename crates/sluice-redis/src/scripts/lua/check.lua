-- The check script: decides a request's checks that fall in one slot, and commits them only if
-- all admit. `CHECK` in src/scripts/mod.rs documents its KEYS, ARGV and reply. The algorithm codes
-- (TOKEN_BUCKET, GCRA, ...) are locals of a prelude that Rust puts in front, each `--#include`
-- line is replaced by the file it names, from this folder, and the other `--#` lines by what
-- `load.rs` makes of the files in `algorithm/`, one per algorithm.
--
-- An algorithm's file holds blocks of straight-line Lua, each after a `--#section` line, which
-- are put into this script twice: inline, for a call of one check, and as functions, for a call
-- of several. Either way they decide exactly as the core's pure function does.
--
-- - `helpers` (optional): local functions the other two use.
-- - `check` decides one check of `cost` on `key`. It reads `raw`, the state this call's earlier
--   admitted checks of the algorithm left on the key, or nil to read it from Redis; `need` (the
--   cost, at least 1); `p1` and `p2` (numbers) and `p3` and `p4` (the arguments as sent); and
--   `write`, whether to make the state to store. It sets `allowed`, `remaining`, `reset`,
--   `retry`, `delay` (all 0 before), `token` (the refund token, '' before) and, when it admits
--   with a cost and `write` is set, `state`: what to store. It must not return.
-- - `store` (optional) writes `state` to `key`, with a TTL of `reset` ns plus a second. Without
--   it, `state` is a string, which `set_value.lua` stores.

--#include clock.lua

local commit = ARGV[2] == '1'
local n = #KEYS
--#include decide_checks.lua

//! The store's scripts on a frozen clock, for [`RedisStore::freeze_time`](crate::RedisStore::freeze_time).

use std::sync::{Mutex, PoisonError};

use sluice_core::Timestamp;

use crate::scripts::Script;

/// How a script reads Redis time (`clock.lua`), once in each script that reads it.
const TIME: &str = "redis.call('TIME')";

/// `script` with its reading of Redis `TIME` replaced by `at`, in whole microseconds as `TIME`
/// answers: seconds and microseconds as two strings. Everything else is the script's own, so a
/// frozen store decides exactly as a live one would at that instant. A script that does not
/// read the time is returned as it is. Each copy is made once per script and instant and kept
/// for the life of the process; a test freezes a store at one instant or a few.
pub(crate) fn frozen_script(script: &'static Script, at: Timestamp) -> &'static Script {
    /// Each copy beside the SHA of the script it copies and its instant in microseconds.
    static COPIES: Mutex<Vec<(&'static str, u64, &'static Script)>> = Mutex::new(Vec::new());
    if !script.body.contains(TIME) {
        return script;
    }
    let micros = at.as_nanos() / 1_000;
    let mut copies = COPIES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, _, copy)) = copies
        .iter()
        .find(|(sha, at, _)| *sha == script.sha && *at == micros)
    {
        return copy;
    }
    let clock = format!("{{'{}', '{}'}}", micros / 1_000_000, micros % 1_000_000);
    let body = script.body.replace(TIME, &clock);
    let sha = redis::Script::new(&body).get_hash().to_owned();
    let copy: &'static Script = Box::leak(Box::new(Script { body, sha }));
    copies.push((&script.sha, micros, copy));
    copy
}

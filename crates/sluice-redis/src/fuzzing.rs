//! The check script's reply decoder on raw bytes, for fuzzing: whatever Redis (or something
//! posing as it) answers, decoding yields decisions or an error, never a panic.

/// Parses `resp` as a RESP value and decodes it as the check script's reply for checks with
/// these limits. Returns how many decisions came out, or `None` when it was refused.
pub fn check_reply(resp: &[u8], limits: &[u64]) -> Option<usize> {
    let value = redis::parse_redis_value(resp).ok()?;
    crate::scripts::reply::decode_replies(value, limits.iter().copied())
        .ok()
        .map(|replies| replies.len())
}

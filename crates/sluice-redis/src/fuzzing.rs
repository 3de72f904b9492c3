//! The store's reply reader and the check script's reply decoder on raw bytes, for fuzzing:
//! whatever Redis (or something posing as it) answers, reading and decoding yield decisions or
//! an error, never a panic.

/// Reads `resp` as the store's own connection reads a reply ([`crate::pipe`]), and decodes it as
/// the check script's reply for checks with these limits. Returns how many decisions came out,
/// or `None` when it was refused or is not whole.
pub fn check_reply(resp: &[u8], limits: &[u64]) -> Option<usize> {
    let (value, _) = crate::pipe::parse_reply(resp).ok()??;
    crate::scripts::reply::decode_replies(value.ok()?, limits.iter().copied())
        .ok()
        .map(|replies| replies.len())
}

/// Whether the store's reply reader and the `redis` crate's parser agree on `resp`: whatever
/// whole reply the reader takes from its front, the crate reads the same bytes as the same value
/// (or the same error's code).
pub fn reply_readers_agree(resp: &[u8]) -> bool {
    let Ok(Some((ours, used))) = crate::pipe::parse_reply(resp) else {
        return true;
    };
    match (
        ours,
        redis::parse_redis_value(&resp[..used]).and_then(|v| v.extract_error()),
    ) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => a.code() == b.code(),
        _ => false,
    }
}

//! Bounds on what one request may carry. Anything larger is refused with a reason, so that a
//! client cannot make the service allocate without bound.

/// The most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries in one descriptor.
pub const MAX_ENTRIES: usize = 32;
/// The longest domain, entry key or entry value, in characters.
pub const MAX_FIELD_LEN: usize = 1024;
/// The largest HTTP request body, in bytes.
pub const MAX_BODY: usize = 64 * 1024;
/// The largest cost one request may ask for.
pub const MAX_COST: u64 = 1 << 32;

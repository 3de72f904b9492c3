//! Settling a request's reservation whatever becomes of its answer: [`PendingSettle`], the
//! reservation not yet settled, and [`SettlingBody`], the answer that settles it when it ends or
//! is dropped. The gateway's token budgets and the tower layer's concurrency limits share them.

mod pending_settle;
mod settling_body;

pub use pending_settle::{PendingSettle, spawn};
pub use settling_body::{InFull, SettlingBody, UsageMeter};

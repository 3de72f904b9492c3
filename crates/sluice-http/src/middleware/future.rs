//! The future a [`SharedLimit`](super::SharedLimit) service returns.

use std::future::Future;
use std::pin::Pin;

/// Decides the request, then either answers it or waits for the inner service. Boxed, because
/// it awaits the store and possibly a delay before the inner call.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

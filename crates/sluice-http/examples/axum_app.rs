//! An axum app limited in process by `SharedLimitLayer`: 5 requests per 10 seconds per client,
//! keyed by the `x-api-key` header when there is one and by client IP otherwise.
//!
//! ```sh
//! cargo run -p sluice-http --example axum_app
//! for i in $(seq 7); do curl -si localhost:3000/hello | head -1; done
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use sluice_core::{MemoryStore, Policy, SlidingLog};
use sluice_http::SharedLimitLayer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::from(SlidingLog::new(5, Duration::from_secs(10))?);
    let layer = SharedLimitLayer::with_policy(policy, Arc::new(MemoryStore::new()), |parts, ip| {
        let api_key = parts.headers.get("x-api-key").and_then(|v| v.to_str().ok());
        Some(api_key.map_or_else(|| format!("ip:{ip}"), |k| format!("key:{k}")))
    });
    // Every clone of the router, one per connection, shares the one limiter inside the layer.
    let app = Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

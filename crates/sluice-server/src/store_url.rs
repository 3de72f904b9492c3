//! `--store`: which store to use, as a URL.

use std::sync::Arc;

use sluice_core::{DynStore, MemoryStore};

/// The `--store` value could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreUrlError {
    /// A scheme Sluice does not know.
    #[error("unknown store `{0}`; expected `memory` or `memory://?max_keys=N`")]
    Unknown(String),
    /// A bad parameter.
    #[error("bad store parameter in `{url}`: {reason}")]
    BadParameter {
        /// The URL.
        url: String,
        /// What was wrong.
        reason: String,
    },
}

/// Opens the store `url` names.
pub async fn open(url: &str) -> Result<Arc<dyn DynStore>, StoreUrlError> {
    let (scheme, rest) = url.split_once("://").unwrap_or((url, ""));
    match scheme {
        "memory" => {
            let mut builder = MemoryStore::builder();
            let query = rest.strip_prefix('?').unwrap_or(rest);
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                match pair.split_once('=') {
                    Some(("max_keys", n)) => {
                        let n: usize = n.parse().map_err(|_| StoreUrlError::BadParameter {
                            url: url.to_owned(),
                            reason: format!("max_keys `{n}` is not a whole number"),
                        })?;
                        builder = builder.max_keys(n);
                    }
                    _ => {
                        return Err(StoreUrlError::BadParameter {
                            url: url.to_owned(),
                            reason: format!("unknown parameter `{pair}`; memory takes max_keys"),
                        });
                    }
                }
            }
            Ok(Arc::new(builder.build()))
        }
        _ => Err(StoreUrlError::Unknown(url.to_owned())),
    }
}

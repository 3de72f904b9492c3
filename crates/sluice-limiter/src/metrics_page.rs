//! The `/metrics` page as scrapes are served it: one page shared by the scrapes that come while
//! an answer of it is still being sent (for [`PAGE_FRESH_FOR`] at most), and at most
//! [`MAX_PAGES`] distinct pages held at once.
//!
//! A page is as large as the series (11 MB with 12,000 detailed label values before they were
//! cut to [`MAX_LABEL_VALUE_BYTES`](crate::MAX_LABEL_VALUE_BYTES)), and an answer holds its page
//! until the client has read it: rendered for each scrape, 100 clients that asked and never
//! read held 100 pages (RSS from 153 MiB to 1,367 MiB). Here a page is one reference-counted
//! buffer, and a scrape that comes while another answer still holds a page less than a second
//! old is answered with that same page; once every answer of it has been sent, the next scrape
//! renders a new one, so that scrapes one after another see the counters move. A page held by
//! an answer stays counted until the last one is sent or dropped; while [`MAX_PAGES`] are held,
//! a scrape that would need another gets the newest page, however old, rather than render one
//! more: clients that never read can make the counters others see stale, never refuse them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

/// How long a page still being sent serves the scrapes that come meanwhile. Prometheus scrapes
/// every 15 s or so: a page a second old is as fresh as its scrape.
pub const PAGE_FRESH_FOR: Duration = Duration::from_secs(1);

/// Distinct pages held at once, by the last render and the answers still being sent. Only
/// clients that stall on their answers across as many seconds keep this many alive.
pub const MAX_PAGES: usize = 4;

/// The metrics pages of one limiter.
#[derive(Debug, Default)]
pub struct MetricsPages {
    /// The last page and when it was rendered.
    last: Mutex<Option<(Instant, Arc<Page>)>>,
    /// Pages alive: held by `last` or by any answer.
    alive: Arc<AtomicUsize>,
}

impl MetricsPages {
    /// The page to answer a scrape with: the last one while an answer still holds it and it is
    /// fresh, or however old while [`MAX_PAGES`] are held; else a new one from `render`
    /// (rendered while holding the lock, so that concurrent scrapes wait for one render instead
    /// of each making its own). A last page no answer holds is replaced, so a new page never
    /// makes more pages alive than [`MAX_PAGES`].
    pub fn page(&self, render: impl FnOnce() -> String) -> Bytes {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if let Some((at, page)) = &*last {
            // More than this reference: an answer is still being sent.
            if Arc::strong_count(page) > 1
                && (now.duration_since(*at) < PAGE_FRESH_FOR
                    || self.alive.load(Ordering::Acquire) >= MAX_PAGES)
            {
                return Bytes::from_owner(Shared(Arc::clone(page)));
            }
        }
        // The last page is no longer handed out; it lives on only in the answers holding it.
        *last = None;
        let page = Arc::new(Page::new(render(), &self.alive));
        *last = Some((now, Arc::clone(&page)));
        Bytes::from_owner(Shared(page))
    }
}

/// One rendered page, counted as alive until dropped.
#[derive(Debug)]
struct Page {
    text: String,
    alive: Arc<AtomicUsize>,
}

impl Page {
    fn new(text: String, alive: &Arc<AtomicUsize>) -> Self {
        alive.fetch_add(1, Ordering::AcqRel);
        Page {
            text,
            alive: Arc::clone(alive),
        }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A page as one answer's body holds it.
struct Shared(Arc<Page>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.text.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_page_is_shared_while_held_and_fresh_and_at_most_max_pages_are_held() {
        let pages = MetricsPages::default();
        let mut renders = 0;
        let mut render = || {
            renders += 1;
            format!("page {renders}")
        };
        let first = pages.page(&mut render);
        assert_eq!(pages.page(&mut render), first, "held: shared");
        drop(first);
        assert_eq!(
            pages.page(&mut render),
            "page 2".as_bytes(),
            "sent: rendered anew"
        );
        let mut held = Vec::new();
        for n in 3..3 + MAX_PAGES {
            tokio::time::advance(PAGE_FRESH_FOR).await;
            let page = pages.page(&mut render);
            assert_eq!(page, format!("page {n}").as_bytes());
            held.push(page);
        }
        tokio::time::advance(PAGE_FRESH_FOR).await;
        assert_eq!(
            pages.page(&mut render),
            format!("page {}", 2 + MAX_PAGES).as_bytes(),
            "with every page held, the newest is shared however old: no page more"
        );
        held.remove(0);
        assert_eq!(
            pages.page(&mut render),
            format!("page {}", 3 + MAX_PAGES).as_bytes(),
            "a page given back makes room"
        );
        drop(held);
        assert_eq!(pages.alive.load(Ordering::Acquire), 1, "only the last page");
    }
}

//! One service's life from start to stop, shared by `sluice serve` and `sluice proxy`, so that
//! a front end says only which listeners serve which router.
//!
//! [`Lifecycle`] opens nothing by itself: the front end opens its store (the composition root,
//! `sluice-stores`, knows every kind) and asks it to follow the rules with that store (every
//! reload logged), to bind each listener (a port in use is an error that names the address), to
//! serve a router or the admin endpoints on it with the connection limits, and to sample the
//! dashboard's activity. Every task it spawns
//! watches one stop signal, so [`Lifecycle::shutdown`] stops them all and waits for the requests
//! in flight; it is the handle tests stop and await. [`run`] is the whole life as a binary
//! lives it: start, wait for SIGTERM or Ctrl-C ([`stop_signal`]), then stop within a deadline.
//!
//! ```
//! # async fn demo() -> Result<(), sluice_http::lifecycle::BindError> {
//! use sluice_http::lifecycle::Lifecycle;
//! use sluice_http::serve::ConnectionLimits;
//!
//! let mut service = Lifecycle::new(ConnectionLimits::default());
//! let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
//! let addr = service.listen("127.0.0.1:0".parse().unwrap(), app).await?;
//! println!("serving on {addr}");
//! service.shutdown().await;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_limiter::{Limiter, OpenStore, StartError};
use sluice_rules::{LoadOptions, Reloader, Watcher};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::h1_server::Fields;
use crate::serve::{
    ConnectionLimits, HttpService, ResponseBody, serve_connections, serve_connections_with,
};

/// How often the dashboard's activity history takes a sample.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// A listener could not be bound: the address is named, since a service binds several.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct BindError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// Why it could not be bound (in use, not an address of this host, not permitted).
    pub source: std::io::Error,
}

/// A bound listener, not yet served, and the address it listens on.
#[derive(Debug)]
pub struct Bound {
    /// The listener.
    pub listener: TcpListener,
    /// Where it listens: the port the system chose when port 0 was asked for.
    pub addr: SocketAddr,
}

/// Binds `addr`, or says which address could not be bound and why.
pub async fn bind(addr: SocketAddr) -> Result<Bound, BindError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })?;
    let addr = listener.local_addr().unwrap_or(addr);
    Ok(Bound { listener, addr })
}

/// A service's listeners and background tasks under one stop signal, from start to stop.
#[derive(Debug)]
pub struct Lifecycle {
    /// Turns true once, to stop every task; dropping it stops them too, so a start that fails
    /// half way leaves nothing serving.
    stop: watch::Sender<bool>,
    /// The listeners' accept loops and the background tasks: stopping waits for each.
    tasks: Vec<JoinHandle<()>>,
    /// The timeouts and caps of every listener served through here.
    limits: ConnectionLimits,
    /// The rule files' watcher: the rules follow their files for as long as the service runs.
    watcher: Option<Watcher>,
}

impl Lifecycle {
    /// Nothing bound or spawned yet; every listener will be served under `limits`.
    pub fn new(limits: ConnectionLimits) -> Self {
        Lifecycle {
            stop: watch::Sender::new(false),
            tasks: Vec::new(),
            limits,
            watcher: None,
        }
    }

    /// The limits every listener is served under.
    pub fn limits(&self) -> ConnectionLimits {
        self.limits
    }

    /// Turns true when the service stops: for a task that runs a loop of its own (a gRPC
    /// listener, an xDS subscription) and is given to [`spawn`](Self::spawn).
    pub fn stopped(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Runs `task` until it returns; stopping waits for it, so it should watch
    /// [`stopped`](Self::stopped).
    pub fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.push(tokio::spawn(task));
    }

    /// Loads the rules at `config` as `load` says (refusing any that `opened` cannot hold, then
    /// and on every reload), reloads them when their files change, logs every reload, and
    /// returns the limiter over them; the files are followed until the service stops.
    pub fn follow_files(
        &mut self,
        config: Vec<PathBuf>,
        load: LoadOptions,
        opened: OpenStore,
        debounce: Duration,
    ) -> Result<Arc<Limiter>, StartError> {
        let watched = Limiter::watching(config, load, opened, debounce)?;
        self.watcher = Some(watched.watcher);
        Ok(watched.limiter)
    }

    /// A limiter whose rules are pushed to the returned reloader by whoever follows them (an
    /// xDS subscription), with every reload logged; none are in force until the first push.
    pub fn follow_pushed(load: LoadOptions, opened: OpenStore) -> (Arc<Limiter>, Arc<Reloader>) {
        let reloader = Reloader::pushed(load, opened.supports_check());
        sluice_limiter::log_reloads(&reloader);
        let limiter = Arc::new(Limiter::with_open_store(
            reloader.clone(),
            opened,
            Arc::new(sluice_limiter::Metrics::new()),
        ));
        (limiter, reloader)
    }

    /// Serves `service` on `bound` (HTTP/1.1 and h2) until the service stops, and returns the
    /// address it listens on.
    pub fn serve<S, B>(&mut self, bound: Bound, service: S) -> SocketAddr
    where
        S: HttpService<B>,
        B: ResponseBody,
    {
        let stopped = self.stopped();
        self.spawn(serve_connections(
            bound.listener,
            service,
            stopped,
            self.limits,
        ));
        bound.addr
    }

    /// Serves `bound` as [`serve`](Self::serve) does, each connection with the service
    /// `for_peer` makes for its peer ([`serve_connections_with`]): its requests carry no
    /// `PeerAddr`, and those `fields` says are read without their fields carry none.
    pub fn serve_with<F, S, B>(&mut self, bound: Bound, for_peer: F, fields: Fields) -> SocketAddr
    where
        F: Fn(SocketAddr) -> S + Send + 'static,
        S: HttpService<B>,
        B: ResponseBody,
    {
        let stopped = self.stopped();
        self.spawn(serve_connections_with(
            bound.listener,
            for_peer,
            fields,
            stopped,
            self.limits,
        ));
        bound.addr
    }

    /// Binds `addr` and serves `service` on it, as [`serve`](Self::serve); returns the address
    /// bound.
    pub async fn listen<S, B>(
        &mut self,
        addr: SocketAddr,
        service: S,
    ) -> Result<SocketAddr, BindError>
    where
        S: HttpService<B>,
        B: ResponseBody,
    {
        let bound = bind(addr).await?;
        Ok(self.serve(bound, service))
    }

    /// Binds `addr` and serves the admin endpoints there ([`crate::admin::router`]), any other
    /// path answered `404` with a problem body; returns the address bound.
    #[cfg(feature = "axum")]
    pub async fn serve_admin(
        &mut self,
        addr: SocketAddr,
        state: crate::admin::AdminState,
    ) -> Result<SocketAddr, BindError> {
        let app = crate::admin::router(state).fallback(|| async {
            crate::problem::Problem::new(
                http::StatusCode::NOT_FOUND,
                "no such endpoint on the admin listener",
            )
        });
        self.listen(addr, app).await
    }

    /// Reads the runtime overrides `limiter`'s store shares (if it does), so that the first request is
    /// decided under them, and follows them until the service stops: every instance enforces
    /// a change within a second (`sluice_limiter::Overrides::follow`). A store that cannot be
    /// read now is read again on every poll; until then the instance has none, and `/readyz`
    /// and the metrics say so.
    pub async fn follow_overrides(&mut self, limiter: &Arc<Limiter>) {
        let overrides = Arc::clone(limiter.overrides());
        if let Err(e) = overrides.sync_now().await {
            tracing::warn!(error = %e, "cannot read the runtime overrides at start; retrying");
        }
        // On a store that does not share them, the loop only notices expiries.
        self.tasks
            .push(tokio::spawn(overrides.follow(self.stopped())));
    }

    /// Samples `limiter`'s activity once a second for the dashboard's history, until the
    /// service stops.
    pub fn sample(&mut self, limiter: &Arc<Limiter>) {
        let sampler = sluice_limiter::activity::sample_every(limiter, SAMPLE_EVERY, self.stopped());
        self.tasks.push(sampler);
    }

    /// Stops accepting connections, lets the requests in flight finish, and returns once every
    /// task has ended.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }

    /// Stops as [`shutdown`](Self::shutdown) does, but waits at most `deadline` for the
    /// requests in flight; then the tasks still running are cancelled and a warning says so.
    pub async fn stop_within(self, deadline: Duration) {
        tracing::info!("shutting down: finishing requests in flight");
        let running: Vec<_> = self.tasks.iter().map(JoinHandle::abort_handle).collect();
        if tokio::time::timeout(deadline, self.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                ?deadline,
                "connections still open after the shutdown deadline; closing them"
            );
            for task in running {
                task.abort();
            }
        }
    }
}

/// Runs a service for its whole life: awaits `start`, serves until `shutdown` resolves (in the
/// binary, [`stop_signal`]), then stops within `deadline`, whatever the clients hold open.
/// Returns the start's error if it fails.
pub async fn run<S, E>(
    start: impl Future<Output = Result<S, E>>,
    shutdown: impl Future<Output = ()>,
    deadline: Duration,
) -> Result<(), E>
where
    S: Into<Lifecycle>,
{
    let service = start.await?.into();
    shutdown.await;
    service.stop_within(deadline).await;
    Ok(())
}

/// Resolves on SIGTERM (how an orchestrator stops a process) or Ctrl-C.
pub async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;
    use tokio::sync::oneshot;

    use super::*;

    /// A service whose one route is entered, says so, and never answers.
    fn held(entered: oneshot::Sender<()>) -> axum::Router {
        let entered = Arc::new(std::sync::Mutex::new(Some(entered)));
        axum::Router::new().route(
            "/",
            axum::routing::get(move || async move {
                if let Some(tell) = entered.lock().ok().and_then(|mut e| e.take()) {
                    let _ = tell.send(());
                }
                std::future::pending::<&str>().await
            }),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_never_ends_holds_the_stop_only_until_the_deadline() {
        let limits = ConnectionLimits {
            header_read: Duration::from_secs(3600),
            ..ConnectionLimits::default()
        };
        let mut service = Lifecycle::new(limits);
        let (tell, entered) = oneshot::channel();
        let addr = service
            .listen(SocketAddr::from(([127, 0, 0, 1], 0)), held(tell))
            .await
            .unwrap();
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        entered.await.unwrap();

        let before = tokio::time::Instant::now();
        service.stop_within(Duration::from_secs(30)).await;
        assert_eq!(before.elapsed(), Duration::from_secs(30));
    }

    /// 200 kept-alive HTTP/1.1 clients each send a `POST` as the service stops: every one is
    /// answered before its connection closes, and the stop ends with the drain. (Closed at
    /// once, all 200 saw the connection end without an answer.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stopping_answers_every_request_sent_on_a_kept_alive_connection() {
        let limits = ConnectionLimits {
            drain: Duration::from_secs(5),
            ..ConnectionLimits::default()
        };
        let mut service = Lifecycle::new(limits);
        let app =
            axum::Router::new().route("/", axum::routing::post(|body: String| async { body }));
        let addr = service
            .listen(SocketAddr::from(([127, 0, 0, 1], 0)), app)
            .await
            .unwrap();
        let post = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nsent";
        let (unanswered, statuses) =
            sluice_testing::stopping::sent_while_stopping(addr, 200, post, service.shutdown())
                .await;
        assert_eq!(unanswered, 0, "of 200 requests sent while stopping");
        assert!(
            statuses.iter().all(|s| s == "http/1.1 200 ok"),
            "{statuses:?}"
        );
    }

    #[tokio::test]
    async fn run_serves_from_its_start_until_shutdown() {
        let (stop, shutdown) = oneshot::channel::<()>();
        let (bound, asked) = (
            Arc::new(std::sync::Mutex::new(None)),
            SocketAddr::from(([127, 0, 0, 1], 0)),
        );
        let told = bound.clone();
        let start = async move {
            let mut service = Lifecycle::new(ConnectionLimits::default());
            let app = axum::Router::new().route("/", axum::routing::get(|| async { "up" }));
            let addr = service.listen(asked, app).await?;
            *told.lock().unwrap() = Some(addr);
            let _ = stop.send(());
            Ok::<_, BindError>(service)
        };
        run(
            start,
            async { shutdown.await.unwrap() },
            Duration::from_secs(30),
        )
        .await
        .unwrap();
        let addr = bound.lock().unwrap().unwrap();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "still accepting on {addr} after run returned"
        );
    }

    #[tokio::test]
    async fn a_port_in_use_is_refused_with_its_address() {
        let taken = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let mut service = Lifecycle::new(ConnectionLimits::default());
        let error = service
            .listen(taken.addr, axum::Router::new())
            .await
            .unwrap_err();
        assert_eq!(error.addr, taken.addr);
        assert!(
            error
                .to_string()
                .starts_with(&format!("cannot listen on {}: ", taken.addr)),
            "{error}"
        );
    }
}

//! Binding, the connection loop and graceful shutdown, plus the router. On shutdown: stop
//! accepting, let in-flight requests finish within the grace period, report.
//!
//! Our own accept loop rather than `axum::serve`: it caps open connections (making room by closing
//! connections that have not sent a request head, see `connections`), caps them per peer, checks
//! every request head before hyper parses it (`connection`), bounds how long a client may take to
//! send its headers, and bounds the drain, none of which `axum::serve` offers. At bind it raises the
//! soft limit on open files to what `max_connections` needs, as far as the hard limit allows.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use hyper_util::rt::{TokioIo, TokioTimer};
use laya::decision::DecisionOptions;
use laya::request::RequestLimits;
use layad_config::Config;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::Backend;
use crate::checkpoints::{Checkpoints, ServedCheckpoints};
use crate::decisions::Decisions;
use crate::error::LayadError;
use crate::http::admission::Admission;
use crate::http::app::App;
use crate::http::connection::{ConnectionService, GuardedIo};
use crate::http::connections::{Connections, Registered};
use crate::http::middleware::{self, Frame, HostCheck};
use crate::http::protocol::MAX_HEADERS;
use crate::http::response::ApiError;
use crate::http::routes;
use crate::live::LiveSettings;
use crate::metrics::Metrics;

/// How the drain after a shutdown signal went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Whether every connection finished within the grace period.
    pub drained: bool,
    /// Connections still open when the grace period ended (their requests are abandoned).
    pub abandoned_connections: usize,
}

/// A bound server, ready to run.
pub struct Server {
    listener: TcpListener,
    router: Router,
    max_connections: usize,
    max_connections_per_client: usize,
    header_timeout: Duration,
    shutdown_grace: Duration,
    live: Arc<LiveSettings>,
    served: Arc<ServedCheckpoints>,
}

impl Server {
    /// Binds `config.server.listen` and builds the app around `checkpoints` and `backend`.
    pub async fn bind(
        config: &Config,
        checkpoints: Arc<Checkpoints>,
        backend: Arc<dyn Backend>,
    ) -> Result<Self, LayadError> {
        let addr = config.server.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| LayadError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| LayadError::Bind { addr, source })?;
        let server = &config.server;
        raise_open_files_limit(server.max_connections);
        let live = Arc::new(LiveSettings::new(config));
        // `jev` plays choices over 100 options by elimination even when no group is configured.
        let tournament_group = config
            .compat
            .output
            .tournament_group(config.compat.tournament_group as usize);
        let checkpoints = Arc::new(ServedCheckpoints::new(checkpoints));
        let app = App {
            admission: Admission::new(config.api_key.clone(), server.max_body_bytes, server.body_timeout)
                .with_max_concurrent(server.max_concurrent),
            decisions: Decisions::new(
                Arc::clone(&checkpoints),
                Arc::clone(&backend),
                DecisionOptions {
                    upstream: config.compat.upstream,
                    auto_task: server.auto_task,
                    limits: RequestLimits {
                        max_token_budget: config.compat.max_token_budget,
                        // Tournament mode raises the cap: a wide choice is read in groups.
                        max_choice_options: if tournament_group != 0 && config.compat.upstream.differences().tournaments
                        {
                            laya::tournament::MAX_TOURNAMENT_CHOICE_OPTIONS
                        } else {
                            laya::request::MAX_CHOICE_OPTIONS
                        },
                    },
                    default_checkpoint: config.compat.default_checkpoint,
                    output: config.compat.output,
                    tournament_group,
                },
                server.request_timeout,
                Arc::clone(&live),
            ),
            metrics: Metrics::new(Arc::clone(&backend)),
            backend,
            checkpoints,
            live: Arc::clone(&live),
        };
        let served = Arc::clone(&app.checkpoints);
        // The `Host` check guards loopback binds only: elsewhere the name is the client's business.
        let host_check = local
            .ip()
            .is_loopback()
            .then(|| Arc::new(HostCheck::new(&server.allowed_hosts)));
        Ok(Self {
            listener,
            router: router(
                Arc::new(app),
                Frame {
                    host_check,
                    output: config.compat.output,
                },
            ),
            max_connections: server.max_connections,
            max_connections_per_client: server.max_connections_per_client,
            header_timeout: server.body_timeout,
            shutdown_grace: server.shutdown_grace,
            live,
            served,
        })
    }

    /// The settings a reload changes while this server runs.
    pub fn live(&self) -> Arc<LiveSettings> {
        Arc::clone(&self.live)
    }

    /// The served checkpoint set, which a reload that adds or removes extra checkpoints swaps.
    pub fn checkpoints(&self) -> Arc<ServedCheckpoints> {
        Arc::clone(&self.served)
    }

    /// The address actually bound (the port, when `listen` asked for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then drains for at most `server.shutdown_grace`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> ShutdownReport {
        let connections = Connections::new(self.max_connections, self.max_connections_per_client);
        let tracker = TaskTracker::new();
        let stop = CancellationToken::new();
        let mut accept_errors = 0u32;
        tokio::pin!(shutdown);
        loop {
            // While every connection carries a request, new clients wait in the kernel's backlog
            // instead of holding memory here; a connection that only waits can be closed for one.
            tokio::select! {
                () = &mut shutdown => break,
                () = connections.room() => {}
            }
            let (stream, peer) = tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and similar: wait rather than spin, keep serving.
                        accept_errors = accept_errors.saturating_add(1);
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100).saturating_mul(accept_errors.min(10))).await;
                        continue;
                    }
                },
            };
            accept_errors = 0;
            // No room after all (a waiting connection started a request meanwhile): close this one.
            let Some(registered) = connections.admit(peer.ip()) else {
                continue;
            };
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
            tracker.spawn(connection_task(
                stream,
                self.router.clone(),
                registered,
                self.header_timeout,
                stop.clone(),
            ));
        }
        drop(self.listener);
        stop.cancel();
        tracker.close();
        let in_flight = tracker.len();
        tracing::info!(connections = in_flight, grace = ?self.shutdown_grace, "stopped accepting; draining");
        let drained = tokio::time::timeout(self.shutdown_grace, tracker.wait()).await.is_ok();
        let report = ShutdownReport {
            drained,
            abandoned_connections: tracker.len(),
        };
        if drained {
            tracing::info!("all connections finished");
        } else {
            tracing::warn!(
                connections = report.abandoned_connections,
                "grace period over; abandoning connections"
            );
        }
        report
    }
}

/// Serves one connection until it closes; once `stop` is cancelled, idle keep-alive connections close
/// and a request in progress finishes. The table may close it while it waits for a request head.
/// Holds its place in the table until then.
async fn connection_task(
    stream: TcpStream,
    router: Router,
    registered: Registered,
    header_timeout: Duration,
    stop: CancellationToken,
) {
    let connection = Arc::clone(registered.connection());
    let service = ConnectionService::new(router, Arc::clone(&connection));
    let io = GuardedIo::new(stream, Arc::clone(&connection));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_headers(MAX_HEADERS);
    let served = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(served);
    let result = tokio::select! {
        result = served.as_mut() => result,
        () = connection.evicted() => {
            tracing::debug!("closed a connection that had sent no request head, to make room");
            return;
        }
        () = stop.cancelled() => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
    drop(registered);
}

/// Raises the soft limit on open files (as far as the hard limit allows) to what `max_connections`
/// client sockets need beside worker sockets, pipes and files; warns when it cannot.
fn raise_open_files_limit(max_connections: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let wanted = max_connections as u64 + 256;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= wanted {
        return;
    }
    let raised = wanted.min(hard);
    if raised > soft
        && let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, raised, hard)
    {
        tracing::warn!(%error, soft, hard, "cannot raise the open-files limit");
        return;
    }
    if raised < wanted {
        tracing::warn!(
            limit = raised,
            max_connections,
            "the open-files limit is below what server.max_connections needs; raise it (ulimit -n) or lower max_connections"
        );
    }
}

/// Every route, FastAPI's 404/405/307 behaviour, and the per-request frame around them.
pub fn router(app: Arc<App>, frame: Frame) -> Router {
    let mut router = Router::new().route(routes::SYSTEMONE, post(routes::systemone::systemone));
    // 0.3.20 has no batch route: there the path is unknown (404), as upstream answers.
    if app.decisions.upstream().differences().batch_route {
        router = router.route(routes::BATCH, post(routes::batch::batch));
    }
    router
        .route(routes::MODELS, get(routes::models::list))
        .route(routes::HEALTH, get(routes::health::health))
        .route(routes::LIVEZ, get(routes::health::livez))
        .route(routes::READYZ, get(routes::health::readyz))
        .route(routes::METRICS, get(routes::metrics::metrics))
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .fallback(routes::not_found)
        .layer(axum::middleware::from_fn_with_state(frame, middleware::frame))
        .with_state(app)
}

//! Binding, the connection loop and graceful shutdown, plus the router. On shutdown: stop
//! accepting, let in-flight requests finish within the grace period, report.
//!
//! Our own accept loop rather than `axum::serve`: it caps open connections, bounds how long a
//! client may take to send its headers, and bounds the drain, none of which `axum::serve` offers.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use laya::decision::DecisionOptions;
use layad_config::Config;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::Backend;
use crate::checkpoints::Checkpoints;
use crate::decisions::Decisions;
use crate::error::LayadError;
use crate::http::admission::Admission;
use crate::http::app::App;
use crate::http::middleware::{self, HostCheck};
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
    header_timeout: Duration,
    shutdown_grace: Duration,
    live: Arc<LiveSettings>,
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
        let live = Arc::new(LiveSettings::new(config));
        let app = App {
            admission: Admission::new(config.api_key.clone(), server.max_body_bytes, server.body_timeout),
            decisions: Decisions::new(
                Arc::clone(&checkpoints),
                Arc::clone(&backend),
                DecisionOptions {
                    auto_task: server.auto_task,
                },
                server.request_timeout,
                Arc::clone(&live),
            ),
            metrics: Metrics::new(Arc::clone(&backend)),
            backend,
            checkpoints,
            live: Arc::clone(&live),
        };
        // The `Host` check guards loopback binds only: elsewhere the name is the client's business.
        let host_check = local
            .ip()
            .is_loopback()
            .then(|| Arc::new(HostCheck::new(&server.allowed_hosts)));
        Ok(Self {
            listener,
            router: router(Arc::new(app), host_check),
            max_connections: server.max_connections,
            header_timeout: server.body_timeout,
            shutdown_grace: server.shutdown_grace,
            live,
        })
    }

    /// The settings a reload changes while this server runs.
    pub fn live(&self) -> Arc<LiveSettings> {
        Arc::clone(&self.live)
    }

    /// The address actually bound (the port, when `listen` asked for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then drains for at most `server.shutdown_grace`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> ShutdownReport {
        let connections = Arc::new(Semaphore::new(self.max_connections));
        let tracker = TaskTracker::new();
        let stop = CancellationToken::new();
        let mut accept_errors = 0u32;
        tokio::pin!(shutdown);
        loop {
            // The permit is taken before accepting, so past the cap clients wait in the kernel's
            // backlog instead of holding memory here.
            let permit = tokio::select! {
                () = &mut shutdown => break,
                permit = Arc::clone(&connections).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
            };
            let stream = tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _peer)) => stream,
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
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
            let service = TowerToHyperService::new(self.router.clone());
            tracker.spawn(connection_task(
                stream,
                service,
                permit,
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
/// and a request in progress finishes. Holds its connection `permit` until then.
async fn connection_task(
    stream: TcpStream,
    service: TowerToHyperService<Router>,
    permit: OwnedSemaphorePermit,
    header_timeout: Duration,
    stop: CancellationToken,
) {
    let _permit = permit;
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = stop.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Every route, FastAPI's 404/405/307 behaviour, and the per-request frame around them.
pub fn router(app: Arc<App>, host_check: Option<Arc<HostCheck>>) -> Router {
    Router::new()
        .route(routes::SYSTEMONE, post(routes::systemone::systemone))
        .route(routes::MODELS, get(routes::models::list))
        .route(routes::HEALTH, get(routes::health::health))
        .route(routes::LIVEZ, get(routes::health::livez))
        .route(routes::READYZ, get(routes::health::readyz))
        .route(routes::METRICS, get(routes::metrics::metrics))
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .fallback(routes::not_found)
        .layer(axum::middleware::from_fn_with_state(host_check, middleware::frame))
        .with_state(app)
}

//! The supervisor's gRPC client for one worker socket: connects over the Unix socket, refuses a worker
//! that speaks another protocol revision, and sorts failures into retryable and not.
//!
//! [`WorkerClient::connect_spawned`] also makes the worker prove it is the process the supervisor
//! started: the socket's peer (`SO_PEERCRED` on Linux, `LOCAL_PEERPID` on macOS) must be that pid on
//! every connection the channel opens, and Describe must echo the nonce it was started with.

use std::path::{Path, PathBuf};

use futures::{Stream, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::engine::{Row, RowOutput};
use crate::pb::worker_client::WorkerClient as GeneratedClient;
use crate::pb::{self, PROTOCOL_VERSION, REQUEST_ID_METADATA};

/// Handle on one worker. Cloning is cheap (one shared HTTP/2 connection) and clones may be used
/// concurrently; the worker runs the forwards one batch at a time in arrival order.
#[derive(Clone, Debug)]
pub struct WorkerClient {
    inner: GeneratedClient<Channel>,
    socket: PathBuf,
}

/// The answer to one forward.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardResult {
    /// One output per request row, in order.
    pub outputs: Vec<RowOutput>,
    /// Wall time of the engine's forward on the worker, in microseconds.
    pub device_us: u64,
    /// Time the batch waited on the worker behind earlier batches, in microseconds.
    pub queue_us: u64,
}

/// What the supervisor knows of a worker it started, for the worker to prove before it is used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpawnedWorker {
    /// The process id of the child: the process listening on the socket must be this one.
    pub pid: u32,
    /// The nonce on its command line (`--spawn-nonce`), which its Describe must echo.
    pub nonce: String,
}

/// The socket's peer is another process than the worker that was started.
#[derive(Debug, thiserror::Error)]
#[error("the process listening on it is {found}, not the worker started as pid {expected}")]
struct PeerMismatch {
    expected: u32,
    found: String,
}

/// Why a call to a worker failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answers on the socket (no worker yet, or it exited). Retryable.
    #[error("cannot connect to worker socket {socket}: {reason}")]
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// The transport's error, with its causes.
        reason: String,
    },
    /// The worker speaks another protocol; it must not be used.
    #[error("worker at {socket} {detail}; this supervisor speaks layad.worker.v1 revision {PROTOCOL_VERSION}")]
    VersionMismatch {
        /// The socket path.
        socket: PathBuf,
        /// What the worker said (its revision, or that it lacks the v1 service).
        detail: String,
    },
    /// Something answers on the socket, but not the worker that was started (another pid, or a
    /// Describe without its nonce). It must never be used; waiting will not change that.
    #[error("worker socket {socket} is not answered by the worker this supervisor started: {detail}")]
    NotOurWorker {
        /// The socket path.
        socket: PathBuf,
        /// What did not match.
        detail: String,
    },
    /// The worker refused the request as malformed (INVALID_ARGUMENT); the message names the problem.
    /// Sending it again, anywhere, fails the same way.
    #[error("worker refused the request: {0}")]
    InvalidArgument(String),
    /// The worker is gone, draining, failed or unreachable (UNAVAILABLE or a transport error). The
    /// request did not produce an answer; it may be retried on another worker.
    #[error("worker unavailable: {0}")]
    Unavailable(String),
    /// Any other failure reported by the worker (INTERNAL for an engine error, …).
    #[error("worker failed ({code:?}): {message}")]
    Worker {
        /// The gRPC status code.
        code: Code,
        /// The worker's message.
        message: String,
    },
    /// The worker's reply breaks the protocol (e.g. a row count that differs from the request).
    #[error("malformed reply from worker: {0}")]
    Protocol(String),
}

impl ClientError {
    /// True when the request produced no answer because the worker could not take it: another
    /// worker may run it.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClientError::Connect { .. } | ClientError::Unavailable(_))
    }
}

impl From<Status> for ClientError {
    fn from(status: Status) -> Self {
        let message = status.message().to_owned();
        // A call the connection broke under never produced an answer, whatever code tonic gave it:
        // UNKNOWN or CANCELLED when the worker died, INTERNAL ("h2 protocol error: http2 error")
        // when a stopping worker's server reset the stream or went away with the request unread,
        // UNAVAILABLE when it refused the stream. It is a lost job, to be run elsewhere.
        if let Some(cause) = transport_failure(&status) {
            return ClientError::Unavailable(format!("connection to the worker lost: {}", error_chain(cause)));
        }
        match status.code() {
            Code::InvalidArgument => ClientError::InvalidArgument(message),
            Code::Unavailable => ClientError::Unavailable(message),
            code => ClientError::Worker { code, message },
        }
    }
}

/// The transport error behind `status`, if the call failed because the connection broke rather
/// than because the worker answered with an error. tonic keeps the error a status was made from as
/// its source; a status the worker sent is read from the response's trailers and has none, so an
/// engine's INTERNAL stays a worker failure.
fn transport_failure(status: &Status) -> Option<&(dyn std::error::Error + 'static)> {
    if !matches!(
        status.code(),
        Code::Unknown | Code::Cancelled | Code::Internal | Code::Unavailable
    ) {
        return None;
    }
    std::error::Error::source(status)
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The peer mismatch behind `error`, if that is why connecting failed.
fn peer_mismatch<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a PeerMismatch> {
    let mut source = Some(error);
    while let Some(error) = source {
        if let Some(mismatch) = error.downcast_ref::<PeerMismatch>() {
            return Some(mismatch);
        }
        // An io::Error's `source()` skips the error it wraps: look inside.
        if let Some(mismatch) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<PeerMismatch>())
        {
            return Some(mismatch);
        }
        source = error.source();
    }
    None
}

/// Opens `path` and, when `expected` is given, checks that the listening process is that pid.
async fn open_socket(path: PathBuf, expected: Option<u32>) -> std::io::Result<TokioIo<UnixStream>> {
    let stream = UnixStream::connect(path).await?;
    if let Some(expected) = expected {
        let found = stream.peer_cred()?.pid();
        if found.and_then(|pid| u32::try_from(pid).ok()) != Some(expected) {
            let found = found.map_or_else(|| "a process of unknown pid".to_owned(), |pid| format!("pid {pid}"));
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                PeerMismatch { expected, found },
            ));
        }
    }
    Ok(TokioIo::new(stream))
}

impl WorkerClient {
    /// Connects to the worker listening on `socket` and checks its protocol revision.
    pub async fn connect_uds(socket: impl AsRef<Path>) -> Result<Self, ClientError> {
        Self::connect(socket.as_ref(), None).await
    }

    /// Connects to the worker the supervisor started as `spawned`: like
    /// [`WorkerClient::connect_uds`], and the process listening must be `spawned.pid` (checked on
    /// every connection the channel opens) and its Describe must echo `spawned.nonce`; otherwise
    /// [`ClientError::NotOurWorker`].
    pub async fn connect_spawned(socket: impl AsRef<Path>, spawned: &SpawnedWorker) -> Result<Self, ClientError> {
        Self::connect(socket.as_ref(), Some(spawned)).await
    }

    async fn connect(socket: &Path, spawned: Option<&SpawnedWorker>) -> Result<Self, ClientError> {
        let socket = socket.to_owned();
        let connect_error = |error: &(dyn std::error::Error + 'static)| match peer_mismatch(error) {
            Some(mismatch) => ClientError::NotOurWorker {
                socket: socket.clone(),
                detail: mismatch.to_string(),
            },
            None => ClientError::Connect {
                socket: socket.clone(),
                reason: error_chain(error),
            },
        };
        // The URI is required by the HTTP layer but never resolved: the connector below opens the socket.
        let endpoint = Endpoint::try_from("http://worker.invalid").map_err(|e| connect_error(&e))?;
        let path = socket.clone();
        let expected = spawned.map(|s| s.pid);
        let channel = endpoint
            .connect_with_connector(tower::service_fn(move |_| open_socket(path.clone(), expected)))
            .await
            .map_err(|e| connect_error(&e))?;
        let client = WorkerClient {
            inner: GeneratedClient::new(channel),
            socket,
        };
        let info = match client.inner.clone().describe(pb::DescribeRequest {}).await {
            Ok(reply) => reply.into_inner(),
            Err(status) if status.code() == Code::Unimplemented => {
                return Err(ClientError::VersionMismatch {
                    socket: client.socket,
                    detail: format!("does not implement layad.worker.v1.Worker ({})", status.message()),
                });
            }
            Err(status) => return Err(status.into()),
        };
        if info.protocol_version != PROTOCOL_VERSION {
            return Err(ClientError::VersionMismatch {
                socket: client.socket,
                detail: format!("speaks layad.worker.v1 revision {}", info.protocol_version),
            });
        }
        if let Some(spawned) = spawned
            && (info.spawn_nonce != spawned.nonce || info.pid != spawned.pid)
        {
            return Err(ClientError::NotOurWorker {
                socket: client.socket,
                detail: format!(
                    "its Describe says pid {} with spawn nonce {:?}; the worker started was pid {} with another nonce",
                    info.pid, info.spawn_nonce, spawned.pid
                ),
            });
        }
        Ok(client)
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// What the worker runs, its state, limits, warm-up timings and memory.
    pub async fn describe(&self) -> Result<pb::WorkerInfo, ClientError> {
        Ok(self.inner.clone().describe(pb::DescribeRequest {}).await?.into_inner())
    }

    /// Runs `rows` on `checkpoint` in one batch (a copy of them: for warm-ups, tests and tools; the
    /// request path hands its rows over with [`Self::forward_for`]).
    pub async fn forward(&self, checkpoint: &str, rows: &[Row]) -> Result<ForwardResult, ClientError> {
        self.forward_for(checkpoint, rows.to_vec(), &[]).await
    }

    /// Runs `rows` on `checkpoint` in one batch for the jobs `request_ids` (in batch order), sent
    /// as [`REQUEST_ID_METADATA`] for the worker's log lines. An id that is not a valid metadata
    /// value (the supervisor's are visible ASCII) is left out rather than failing the forward.
    /// The rows move into the message: their ids are not copied again before the socket.
    pub async fn forward_for(
        &self,
        checkpoint: &str,
        rows: Vec<Row>,
        request_ids: &[&str],
    ) -> Result<ForwardResult, ClientError> {
        let sent = rows.len();
        let mut request = tonic::Request::new(pb::ForwardRequest {
            checkpoint: checkpoint.to_owned(),
            rows: rows.into_iter().map(pb::Row::from).collect(),
        });
        for id in request_ids {
            if let Ok(value) = id.parse() {
                request.metadata_mut().append(REQUEST_ID_METADATA, value);
            }
        }
        let reply = self.inner.clone().forward(request).await?.into_inner();
        if reply.rows.len() != sent {
            return Err(ClientError::Protocol(format!(
                "{} outputs for a forward of {sent} rows",
                reply.rows.len(),
            )));
        }
        Ok(ForwardResult {
            outputs: reply.rows.into_iter().map(RowOutput::from).collect(),
            device_us: reply.device_us,
            queue_us: reply.queue_us,
        })
    }

    /// The worker's state now, then every change; the stream ends when the worker stops serving.
    pub async fn watch(
        &self,
    ) -> Result<impl Stream<Item = Result<pb::WorkerStatus, ClientError>> + use<>, ClientError> {
        let stream = self.inner.clone().watch(pb::WatchRequest {}).await?.into_inner();
        Ok(stream.map(|item| item.map_err(ClientError::from)))
    }

    /// Stops the worker taking new forwards; returns once those in flight are answered.
    pub async fn drain(&self) -> Result<pb::DrainReply, ClientError> {
        Ok(self.inner.clone().drain(pb::DrainRequest {}).await?.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_a_stopping_worker_reset_or_went_away_under_is_a_lost_job() {
        // What a worker's server does to a call it has not read when it shuts down (GOAWAY or
        // RST_STREAM with NO_ERROR): tonic reports INTERNAL "h2 protocol error", the reload storm's
        // one 500 of issue 39.
        let reset = Status::from_error(Box::new(h2::Error::from(h2::Reason::NO_ERROR)));
        assert_eq!(reset.code(), Code::Internal);
        assert!(reset.message().starts_with("h2 protocol error"), "{}", reset.message());
        let error = ClientError::from(reset);
        assert!(error.is_retryable(), "{error}");
        // A refused stream and a broken pipe, likewise.
        for lost in [
            Status::from_error(Box::new(h2::Error::from(h2::Reason::REFUSED_STREAM))),
            Status::from_error(Box::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))),
        ] {
            let error = ClientError::from(lost);
            assert!(error.is_retryable(), "{error}");
        }
    }

    #[test]
    fn statuses_the_worker_sent_keep_their_meaning() {
        // Read from the trailers, they carry no transport error: an engine failure is a failure,
        // a malformed request is refused, a draining worker is retryable.
        let failed = ClientError::from(Status::internal("forward failed: out of memory"));
        assert!(
            matches!(
                failed,
                ClientError::Worker {
                    code: Code::Internal,
                    ..
                }
            ),
            "{failed}"
        );
        assert!(!failed.is_retryable());
        assert!(!ClientError::from(Status::unknown("engine said so")).is_retryable());
        assert!(matches!(
            ClientError::from(Status::invalid_argument("row too long")),
            ClientError::InvalidArgument(_)
        ));
        assert!(ClientError::from(Status::unavailable("worker is draining")).is_retryable());
    }
}

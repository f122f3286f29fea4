//! One client connection as hyper sees it. [`GuardedIo`] holds back each request head until it is
//! whole and passes `http::protocol`'s checks, then lets exactly that request's body through; a
//! refused head reaches hyper as a stand-in request that [`ConnectionService`] answers with the
//! refusal's JSON `detail` and `Connection: close`, so every answer goes out through hyper, in order.
//! Together they tell the connection table when a request is in progress.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::http::{HeaderValue, Request, Response, header};
use axum::response::IntoResponse;
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::service::Service;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http::connections::Connection;
use crate::http::protocol::{self, Framing, MAX_HEAD_BYTES, MAX_TARGET_BYTES};
use crate::http::response::ApiError;

/// What hyper reads in place of a refused head: a request the service answers with the refusal.
const STAND_IN_HEAD: &[u8] = b"GET / HTTP/1.1\r\nhost: refused.invalid\r\nconnection: close\r\n\r\n";

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 4096;

/// The byte stream of one connection, with each request head checked before hyper sees it.
#[derive(Debug)]
pub struct GuardedIo<S> {
    stream: S,
    connection: Arc<Connection>,
    /// Received and not yet given to hyper.
    received: BytesMut,
    /// Where the search for the end of the head goes on (the bytes before it have no empty line).
    scanned: usize,
    state: ReadState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadState {
    /// Collecting a head.
    Head,
    /// Giving hyper `left` more bytes of an accepted head (or the stand-in), then `then`.
    Release { left: usize, then: After },
    /// Giving hyper `left` more body bytes.
    Body { left: u64 },
    /// After a chunked body's head: everything goes through (its response closes the connection).
    Passthrough,
    /// Nothing more for hyper, which closes the connection once the stand-in's answer (marked
    /// `Connection: close`) is written. Not end of stream: hyper drops a connection whose client
    /// seems gone without answering.
    Held,
    /// End of stream for hyper.
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    Body(Framing),
    Close,
}

impl<S> GuardedIo<S> {
    /// Wraps `stream`, the connection `connection` of the table.
    pub fn new(stream: S, connection: Arc<Connection>) -> Self {
        Self {
            stream,
            connection,
            received: BytesMut::new(),
            scanned: 0,
            state: ReadState::Head,
        }
    }
}

impl<S: AsyncRead + Unpin> GuardedIo<S> {
    /// Reads more from the socket into `received`; 0 at end of stream.
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.received.reserve(READ_CHUNK);
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.received)
    }

    /// Looks at the head collected so far: the next state once it is whole (or refused), `None`
    /// while more is needed. The head is parsed only once an empty line has arrived, so a client
    /// sending it byte by byte costs a scan, not a parse, per byte.
    fn examine_head(&mut self) -> Option<ReadState> {
        // Empty lines before a request line are ignored (RFC 9112 §2.2).
        let blank = self.received.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
        if blank > 0 {
            let _ = self.received.split_to(blank);
            self.scanned = 0;
        }
        let result = match find_empty_line(&self.received, self.scanned) {
            Some(end) => {
                self.scanned = end;
                protocol::check_head(&self.received)
            }
            None => {
                self.scanned = self.received.len();
                too_large_so_far(&self.received).map_or(Ok(None), Err)
            }
        };
        match result {
            Ok(None) => None,
            Ok(Some(head)) => {
                self.scanned = 0;
                self.connection.begin_request();
                if head.framing == Framing::Chunked {
                    self.connection.close_after_response();
                }
                Some(ReadState::Release {
                    left: head.len,
                    then: After::Body(head.framing),
                })
            }
            Err(refusal) => {
                tracing::debug!(status = refusal.status.as_u16(), detail = %refusal.detail, "request head refused");
                self.connection.refuse(refusal);
                self.connection.begin_request();
                self.received = BytesMut::from(STAND_IN_HEAD);
                Some(ReadState::Release {
                    left: STAND_IN_HEAD.len(),
                    then: After::Close,
                })
            }
        }
    }
}

/// The position just past the first empty line in `data`, searching from `from` (a few bytes
/// back, in case the line ending was split between reads).
fn find_empty_line(data: &[u8], from: usize) -> Option<usize> {
    let start = from.saturating_sub(3);
    data[start..].windows(2).enumerate().find_map(|(i, pair)| match pair {
        [b'\n', b'\n'] => Some(start + i + 2),
        [b'\n', b'\r'] if data.get(start + i + 2) == Some(&b'\n') => Some(start + i + 3),
        _ => None,
    })
}

/// An unfinished head that already cannot fit refuses itself without waiting for the rest.
fn too_large_so_far(data: &[u8]) -> Option<protocol::Refusal> {
    let request_line_open = !data.contains(&b'\n');
    let too_long = (request_line_open && data.len() > MAX_TARGET_BYTES + 64) || data.len() > MAX_HEAD_BYTES;
    if too_long {
        // The checks on partial heads say which limit it is.
        return protocol::check_head(data).err();
    }
    None
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedIo<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match this.state {
                ReadState::Closed => return Poll::Ready(Ok(())),
                ReadState::Held => return Poll::Pending,
                ReadState::Head => {
                    if let Some(next) = this.examine_head() {
                        this.state = next;
                        continue;
                    }
                    let Poll::Ready(filled) = this.fill(cx) else {
                        // Everything sent so far is read and no head is whole: a slow or idle client.
                        this.connection.stalled();
                        return Poll::Pending;
                    };
                    if filled? == 0 {
                        // The client closed; a partial head is dropped.
                        this.state = ReadState::Closed;
                    }
                }
                ReadState::Release { left, then } => {
                    let n = left.min(out.remaining()).min(this.received.len());
                    out.put_slice(&this.received.split_to(n));
                    this.state = if n < left {
                        ReadState::Release { left: left - n, then }
                    } else {
                        match then {
                            After::Close => ReadState::Held,
                            After::Body(Framing::Empty | Framing::Length(0)) => ReadState::Head,
                            After::Body(Framing::Length(len)) => ReadState::Body { left: len },
                            After::Body(Framing::Chunked) => ReadState::Passthrough,
                        }
                    };
                    return Poll::Ready(Ok(()));
                }
                ReadState::Body { left } => {
                    if this.received.is_empty() && ready!(this.fill(cx))? == 0 {
                        this.state = ReadState::Closed;
                        continue;
                    }
                    let n = (left.min(out.remaining() as u64) as usize).min(this.received.len());
                    out.put_slice(&this.received.split_to(n));
                    let left = left - n as u64;
                    this.state = if left == 0 {
                        ReadState::Head
                    } else {
                        ReadState::Body { left }
                    };
                    return Poll::Ready(Ok(()));
                }
                ReadState::Passthrough => {
                    if this.received.is_empty() && ready!(this.fill(cx))? == 0 {
                        this.state = ReadState::Closed;
                        continue;
                    }
                    let n = out.remaining().min(this.received.len());
                    out.put_slice(&this.received.split_to(n));
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GuardedIo<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, data)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// The router for one connection: answers a refused head in place of the stand-in request, closes
/// the connection after a chunked request, and counts each request until its response is written.
#[derive(Clone, Debug)]
pub struct ConnectionService {
    router: TowerToHyperService<Router>,
    connection: Arc<Connection>,
}

impl ConnectionService {
    /// `router`'s service on `connection`.
    pub fn new(router: Router, connection: Arc<Connection>) -> Self {
        Self {
            router: TowerToHyperService::new(router),
            connection,
        }
    }
}

impl Service<Request<Incoming>> for ConnectionService {
    type Response = Response<GuardedBody>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        // Counted since its head arrived; the guard ends it when the response is written or dropped.
        let guard = RequestGuard(Arc::clone(&self.connection));
        let refusal = self.connection.take_refusal();
        let routed = refusal.is_none().then(|| self.router.call(request));
        Box::pin(async move {
            let mut response = match (routed, refusal) {
                (Some(routed), _) => routed.await?,
                (None, Some(refusal)) => ApiError::new(refusal.status, refusal.detail).into_response(),
                (None, None) => ApiError::inference_failed().into_response(),
            };
            if guard.0.closes_after_response() {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response.map(|body| GuardedBody { body, _guard: guard }))
        })
    }
}

/// Ends a request's count when dropped.
#[derive(Debug)]
struct RequestGuard(Arc<Connection>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

/// A response body that ends its request's count once hyper has written (or dropped) it.
#[derive(Debug)]
pub struct GuardedBody {
    body: Body,
    _guard: RequestGuard,
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::http::connections::Connections;

    /// Feeds `chunks` through a guarded duplex stream and returns everything hyper would read.
    async fn hyper_reads(chunks: &[&[u8]]) -> (Vec<u8>, Arc<Connection>, Arc<Connections>) {
        let table = Connections::new(4, 4);
        let registered = table.admit(IpAddr::V4(Ipv4Addr::LOCALHOST)).expect("admitted");
        let connection = Arc::clone(registered.connection());
        std::mem::forget(registered);
        let (mut client, server) = tokio::io::duplex(1 << 20);
        for chunk in chunks {
            client.write_all(chunk).await.expect("write");
        }
        drop(client);
        let mut io = GuardedIo::new(server, Arc::clone(&connection));
        let mut read = Vec::new();
        // After a refusal nothing more comes, and no end of stream either.
        let _ = tokio::time::timeout(std::time::Duration::from_millis(200), io.read_to_end(&mut read)).await;
        (read, connection, table)
    }

    #[tokio::test]
    async fn heads_pass_once_whole_and_exactly_their_bodies_follow() {
        let first = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
        let second = b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n";
        // Split in awkward places, with blank lines before the second request.
        let (read, connection, _table) =
            hyper_reads(&[&first[..20], &first[20..49], &first[49..], b"\r\n", &second[..]]).await;
        assert_eq!(read, [&first[..], &second[..]].concat());
        // Both heads arrived; no response was written here.
        assert!(!connection.waiting());
        assert!(!connection.closes_after_response());
    }

    #[tokio::test]
    async fn a_refused_head_becomes_the_stand_in_and_nothing_after_it_passes() {
        let bad = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let (read, connection, _table) = hyper_reads(&[&bad[..]]).await;
        assert_eq!(read, STAND_IN_HEAD);
        let refusal = connection.take_refusal().expect("refusal recorded");
        assert_eq!(refusal.status.as_u16(), 400);
        assert!(refusal.detail.contains("both Content-Length and Transfer-Encoding"));
    }

    #[tokio::test]
    async fn a_trickled_head_over_the_limit_is_refused_before_it_ends() {
        let line = format!("GET /{}", "a".repeat(MAX_TARGET_BYTES + 200));
        let bytes = line.as_bytes();
        let chunks: Vec<&[u8]> = bytes.chunks(100).collect();
        let (read, connection, _table) = hyper_reads(&chunks).await;
        assert_eq!(read, STAND_IN_HEAD);
        assert_eq!(connection.take_refusal().expect("refusal").status.as_u16(), 414);
    }

    #[tokio::test]
    async fn after_a_chunked_body_everything_passes_and_the_response_closes() {
        let chunked = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        let (read, connection, _table) = hyper_reads(&[&chunked[..]]).await;
        assert_eq!(read, chunked);
        assert!(connection.closes_after_response());
    }

    #[test]
    fn the_end_of_a_head_is_found_across_reads() {
        assert_eq!(find_empty_line(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nrest", 0), Some(27));
        assert_eq!(find_empty_line(b"GET / HTTP/1.0\n\n", 0), Some(16));
        assert_eq!(find_empty_line(b"GET / HTTP/1.1\r\nHost: x\r\n\r", 0), None);
        assert_eq!(find_empty_line(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 26), Some(27));
    }
}

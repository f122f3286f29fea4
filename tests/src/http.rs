//! The one HTTP/1.1 client of the tests and benchmarks: raw bytes on a fresh TCP connection, so a
//! test can send what a real client library never would (odd framing, no `Host`, an unfinished
//! chunked body) and see exactly what the server answered.
//!
//! The request is written alongside the reading of the answer, and the write half stays open until
//! the answer is read: the server may answer before it has read the whole body, and a half-closed
//! socket would tell hyper that the client left.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How a request's body goes on the wire.
#[derive(Clone, Debug)]
pub enum Framing {
    /// `Content-Length` of the real body (unless a header already declares one).
    Length,
    /// `Transfer-Encoding: chunked`, in chunks of this many bytes, terminated.
    Chunked(usize),
    /// Chunked, but the terminating chunk is never sent and the connection stays open.
    ChunkedUnfinished(usize),
}

/// A raw HTTP/1.1 request (`Connection: close`).
#[derive(Clone, Debug)]
pub struct Request {
    /// `GET`, `POST`, …
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Extra headers, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// How the body is framed.
    pub framing: Framing,
    /// Send no `Host` header.
    pub no_host: bool,
}

impl Request {
    /// `method path` with no headers and no body.
    pub fn new(method: &str, path: &str) -> Self {
        Self {
            method: method.into(),
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
            framing: Framing::Length,
            no_host: false,
        }
    }

    /// Adds `headers`.
    pub fn headers(mut self, headers: &[(&str, &str)]) -> Self {
        self.headers
            .extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: &[u8]) -> Self {
        self.body = body.to_vec();
        self
    }

    /// Sets the framing.
    pub fn framing(mut self, framing: Framing) -> Self {
        self.framing = framing;
        self
    }

    fn has(&self, name: &str) -> bool {
        self.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
    }

    /// The bytes to write.
    fn wire(&self, addr: SocketAddr) -> Vec<u8> {
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method, self.path);
        if !self.no_host && !self.has("host") {
            head.push_str(&format!("Host: {addr}\r\n"));
        }
        head.push_str("Connection: close\r\n");
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        let mut out = Vec::new();
        match self.framing {
            Framing::Length => {
                if !self.has("content-length") && (!self.body.is_empty() || self.method != "GET") {
                    head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
                }
                head.push_str("\r\n");
                out.extend_from_slice(head.as_bytes());
                out.extend_from_slice(&self.body);
            }
            Framing::Chunked(size) | Framing::ChunkedUnfinished(size) => {
                head.push_str("Transfer-Encoding: chunked\r\n\r\n");
                out.extend_from_slice(head.as_bytes());
                for chunk in self.body.chunks(size.max(1)) {
                    out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    out.extend_from_slice(chunk);
                    out.extend_from_slice(b"\r\n");
                }
                if matches!(self.framing, Framing::Chunked(_)) {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
            }
        }
        out
    }
}

/// An HTTP response.
#[derive(Clone, Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body bytes (de-chunked).
    pub body: Vec<u8>,
}

impl Response {
    /// The first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    /// The `detail` of an error body.
    pub fn detail(&self) -> String {
        self.json()["detail"].as_str().unwrap_or_default().to_owned()
    }
}

/// Sends `request` on a new connection and reads one response.
pub async fn exchange(addr: SocketAddr, request: &Request) -> std::io::Result<Response> {
    exchange_raw(addr, request.wire(addr)).await
}

/// Writes `wire` as it is (any bytes at all) on a new connection and reads one response.
pub async fn exchange_raw(addr: SocketAddr, wire: Vec<u8>) -> std::io::Result<Response> {
    let stream = TcpStream::connect(addr).await?;
    let (mut reader, mut writer) = stream.into_split();
    let writer_task = tokio::spawn(async move {
        // The server may answer and close before reading everything; that is what some tests check.
        let _ = writer.write_all(&wire).await;
        // Dropping the write half would half-close the socket: keep it until the task is aborted.
        std::future::pending::<()>().await;
        drop(writer);
    });
    let response = read_response(&mut reader).await;
    writer_task.abort();
    response
}

/// [`exchange`], panicking when there is no answer within 20 s or it is not HTTP.
pub async fn send(addr: SocketAddr, request: &Request) -> Response {
    match tokio::time::timeout(Duration::from_secs(20), exchange(addr, request)).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => panic!("{} {}: {e}", request.method, request.path),
        Err(_) => panic!("no response within 20 s to {} {}", request.method, request.path),
    }
}

/// `method path` with `headers` and a `Content-Length` body, on a fresh connection.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    exchange(addr, &Request::new(method, path).headers(headers).body(body)).await
}

/// `GET path`.
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    request(addr, "GET", path, &[], b"").await
}

/// `POST path` with a JSON body.
pub async fn post_json(addr: SocketAddr, path: &str, body: &[u8]) -> std::io::Result<Response> {
    request(addr, "POST", path, &[("content-type", "application/json")], body).await
}

fn malformed(what: &str, seen: &[u8]) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("{what}: {:?}", String::from_utf8_lossy(seen)),
    )
}

/// Reads one response: the head, then a `Content-Length` body, a chunked one, or up to end-of-file.
async fn read_response(reader: &mut (impl AsyncReadExt + Unpin)) -> std::io::Result<Response> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = reader.read(&mut chunk).await?;
        if n == 0 {
            return Err(malformed("connection closed before a response", &buffer));
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed("bad status line", status_line.as_bytes()))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = buffer[head_end + 4..].to_vec();
    let length = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    match length {
        Some(length) if !chunked => {
            while body.len() < length {
                let n = reader.read(&mut chunk).await?;
                if n == 0 {
                    return Err(malformed("connection closed inside the body", &body));
                }
                body.extend_from_slice(&chunk[..n]);
            }
            body.truncate(length);
        }
        _ => {
            // `Connection: close`: the body ends with the connection.
            while let Ok(n) = reader.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
            if chunked {
                body = dechunk(&body).ok_or_else(|| malformed("bad chunked body", &body))?;
            }
        }
    }
    Ok(Response { status, headers, body })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(
            std::str::from_utf8(&data[..line_end]).ok()?.split(';').next()?.trim(),
            16,
        )
        .ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

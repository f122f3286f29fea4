//! The HTTP/1.1 layer over real TCP: request heads RFC 9112 says to refuse (400, 414, 431) get an
//! answer with a JSON `detail`, a refused head closes its connection, keep-alive still works after good
//! requests, and clients that trickle their headers cannot keep a whole request from being answered.

mod http_support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_support::TestServer;
use layad_system_tests::exchange_raw;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn raw(addr: SocketAddr, wire: &str) -> layad_system_tests::Response {
    tokio::time::timeout(Duration::from_secs(10), exchange_raw(addr, wire.as_bytes().to_vec()))
        .await
        .expect("answered in time")
        .expect("an HTTP answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_errors_are_json_and_name_the_problem() {
    let server = TestServer::start(|_| {}).await;
    let body = r#"{"questions": {}}"#;
    let long_path = format!("/{}", "a".repeat(9000));
    let big_header = "b".repeat(70_000);
    let cases = [
        (
            format!("GET {long_path} HTTP/1.1\r\nHost: localhost\r\n\r\n"),
            414,
            "request target is",
        ),
        (
            format!("GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: {big_header}\r\n\r\n"),
            431,
            "request head is larger than 65536 bytes",
        ),
        (
            format!("POST /v1/systemone HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1x\r\n\r\n{body}"),
            400,
            "Content-Length '1x' is not a number of bytes",
        ),
        (
            format!(
                "POST /v1/systemone HTTP/1.1\r\nHost: localhost\r\nContent-Length: 17\r\nContent-Length: 17\r\n\r\n{body}"
            ),
            400,
            "Content-Length is given 2 times; send it once",
        ),
        (
            format!(
                "POST /v1/systemone HTTP/1.1\r\nHost: localhost\r\nContent-Length: 17\r\nTransfer-Encoding: chunked\r\n\r\n11\r\n{body}\r\n0\r\n\r\n"
            ),
            400,
            "both Content-Length and Transfer-Encoding are given",
        ),
        (
            "GET /health HTTP/1.1\r\n\r\n".to_owned(),
            400,
            "an HTTP/1.1 request needs a Host header",
        ),
        (
            "GET /health HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\n\r\n".to_owned(),
            400,
            "Host is given 2 times",
        ),
        (
            "GET /health HTTP/1.1\r\nHost: localhost\r\nBad Header: x\r\n\r\n".to_owned(),
            400,
            "malformed request head: invalid header name",
        ),
    ];
    for (wire, status, detail) in cases {
        let response = raw(server.addr, &wire).await;
        let shown: String = wire.chars().take(80).collect();
        assert_eq!(response.status, status, "{shown:?}: {}", response.text());
        assert_eq!(response.header("content-type"), Some("application/json"), "{shown:?}");
        assert!(response.detail().contains(detail), "{shown:?}: {}", response.detail());
        assert_eq!(response.header("connection"), Some("close"), "{shown:?}");
    }
    // HTTP/1.0 needs no Host.
    let old = raw(server.addr, "GET /livez HTTP/1.0\r\n\r\n").await;
    assert_eq!(old.status, 200, "{}", old.text());
}

/// Reads one `Content-Length` response from `stream`, leaving the connection open; bytes past it
/// (the next pipelined response) stay in `data` for the next call.
async fn read_one(stream: &mut TcpStream, data: &mut Vec<u8>) -> (u16, String) {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("content-length");
            if data.len() >= end + 4 + length {
                let status = head[9..12].parse().expect("status");
                let body = String::from_utf8_lossy(&data[end + 4..end + 4 + length]).into_owned();
                data.drain(..end + 4 + length);
                return (status, body);
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("an answer within 10 s")
            .expect("read");
        assert!(n > 0, "connection closed early: {:?}", String::from_utf8_lossy(data));
        data.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_carries_several_requests_with_bodies() {
    let server = TestServer::start(|_| {}).await;
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    let mut data = Vec::new();
    let body = r#"{"state": "x", "questions": {}}"#;
    for _ in 0..3 {
        let request = format!(
            "POST /v1/systemone HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.expect("write");
        let (status, _) = read_one(&mut stream, &mut data).await;
        assert_eq!(status, 200);
        stream
            .write_all(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .expect("write");
        assert_eq!(read_one(&mut stream, &mut data).await.0, 200);
    }
    // Two requests in one write (pipelined) are answered in order.
    stream
        .write_all(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\nGET /nothing HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_one(&mut stream, &mut data).await.0, 200);
    assert_eq!(read_one(&mut stream, &mut data).await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_trickle_their_headers_cannot_starve_a_whole_request() {
    let server = TestServer::start(|c| {
        c.server.max_connections = 16;
        c.server.max_connections_per_client = 8;
    })
    .await;
    // 40 connections that send half a head and stop: far more than the cap, from the same address
    // as the probes below.
    let mut slow = Vec::new();
    for _ in 0..40 {
        if let Ok(mut stream) = TcpStream::connect(server.addr).await {
            let _ = stream.write_all(b"GET /health HTTP/1.1\r\nHost: loc").await;
            slow.push(stream);
        }
    }
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        let started = Instant::now();
        let response = raw(
            server.addr,
            "GET /livez HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(response.status, 200);
        worst = worst.max(started.elapsed());
    }
    assert!(worst < Duration::from_secs(2), "slowest probe took {worst:?}");
    // The slow ones were closed to make room: reading gives end of file, not an answer.
    let mut closed = 0;
    for stream in &mut slow {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(50), stream.read(&mut byte)).await {
            closed += 1;
        }
    }
    assert!(closed >= 24, "only {closed} of 40 slow connections were closed");
}

//! The HTTP front: the listener and its graceful shutdown, admission of request bodies, one module per
//! endpoint group, and the one table from failures to answers. The wire contract is upstream
//! `laya[serve]==0.3.20`'s (see docs/http-api.md).
//!
//! Layout: [`server`] (bind, accept, drain, the router), [`connections`] (the open connections, who
//! waits and who carries a request, caps per server and per peer), [`connection`] (one connection's
//! bytes: heads held back until whole and checked by [`protocol`]), [`app`] (what every handler
//! shares), [`middleware`] (request id, the `Host` check, `Server-Timing`, the request log line),
//! [`admission`] (bearer key, body size and deadline, `Content-Encoding`), [`routes`] (the
//! endpoints), [`response`] (JSON answers and `ApiError`, the one table from failures to answers).

pub mod admission;
pub mod app;
pub mod connection;
pub mod connections;
pub mod middleware;
pub mod protocol;
pub mod response;
pub mod routes;
pub mod server;

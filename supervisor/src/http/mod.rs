//! The HTTP front: the listener and its graceful shutdown, admission of request bodies, one module per
//! endpoint group, and the one table from failures to answers. The wire contract is upstream
//! `laya[serve]==0.3.20`'s (see docs/http-api.md).
//!
//! Layout: [`server`] (bind, accept, drain, the router), [`app`] (what every handler shares),
//! [`middleware`] (request id, the `Host` check, `Server-Timing`, the request log line),
//! [`admission`] (bearer key, body size and deadline, `Content-Encoding`), [`routes`] (the
//! endpoints), [`response`] (JSON answers and `ApiError`, the one table from failures to answers).

pub mod admission;
pub mod app;
pub mod middleware;
pub mod response;
pub mod routes;
pub mod server;

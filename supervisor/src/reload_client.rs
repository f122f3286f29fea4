//! `layad reload`'s side of a reload: which server to signal (`--listen`, else the running instance
//! that was started with the same configuration file, found by its record in the socket directory,
//! else `server.listen`), then SIGHUP to the pid its `/health` gives and the outcome from `/health`.

use std::net::SocketAddr;
use std::path::Path;

use layad_config::Config;

use crate::process::runtime_dir::{InstanceRecord, running_instances};
use crate::process::socket_base;

/// The server a reload goes to, and how it was found (for messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its address.
    pub listen: SocketAddr,
    /// How it was chosen, e.g. `server.listen` or `the instance started with /etc/layad.toml (pid 42)`.
    pub found_by: String,
}

/// Finds the server to reload: `listen` when given; else the one running instance started with
/// `config_file` (an absolute path compares equal to the record's); else `config.server.listen`.
/// Several instances with the same file are an error naming them.
pub fn find_server(config: &Config, config_file: Option<&Path>, listen: Option<SocketAddr>) -> Result<Target, String> {
    if let Some(listen) = listen {
        return Ok(Target {
            listen,
            found_by: "--listen".to_owned(),
        });
    }
    choose(
        config.server.listen,
        config_file,
        running_instances(&socket_base(config)),
    )
}

fn choose(configured: SocketAddr, config_file: Option<&Path>, running: Vec<InstanceRecord>) -> Result<Target, String> {
    let file = config_file.map(|f| std::fs::canonicalize(f).unwrap_or_else(|_| f.to_owned()));
    let same: Vec<&InstanceRecord> = running.iter().filter(|r| r.config == file).collect();
    let started_with = file
        .as_ref()
        .map_or_else(|| "no configuration file".to_owned(), |f| f.display().to_string());
    match same.as_slice() {
        [one] => Ok(Target {
            listen: one.listen,
            found_by: format!("the instance started with {started_with} (pid {})", one.pid),
        }),
        [] => Ok(Target {
            listen: configured,
            found_by: if running.is_empty() {
                "server.listen".to_owned()
            } else {
                let others: Vec<String> = running.iter().map(describe).collect();
                format!(
                    "server.listen; no running instance was started with {started_with} (running: {})",
                    others.join(", ")
                )
            },
        }),
        several => {
            let listed: Vec<String> = several.iter().map(|r| describe(r)).collect();
            Err(format!(
                "{} instances run with {started_with}: {}; choose one with --listen",
                several.len(),
                listed.join(", ")
            ))
        }
    }
}

fn describe(record: &InstanceRecord) -> String {
    format!("pid {} on {}", record.pid, record.listen)
}

/// `GET /health` of the local server at `listen`.
async fn local_health(target: &Target) -> Result<serde_json::Value, String> {
    use http_body_util::{BodyExt, Empty};
    let mut addr = target.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("no layad answers on {addr} ({}): {e}", target.found_by))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    tokio::spawn(connection);
    let request = hyper::Request::get("/health")
        .header(hyper::header::HOST, "localhost")
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("{addr} did not answer HTTP: {e}"))?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{addr}/health: {e}"))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| format!("{addr}/health is not layad's: {e}"))
}

/// Sends SIGHUP to the server at `target` and returns the changes its `/health` reports, or why the
/// reload was refused.
pub async fn signal_reload(target: &Result<Target, String>) -> Result<Vec<String>, String> {
    let target = target.as_ref().map_err(Clone::clone)?;
    let listen = target.listen;
    let attempt = |health: &serde_json::Value| health["reload"]["attempt"].as_u64().unwrap_or(0);
    let before = local_health(target).await?;
    let pid = before["pid"]
        .as_u64()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| format!("{listen}/health does not give a pid; is it layad?"))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGHUP)
        .map_err(|e| format!("cannot signal layad (pid {pid}): {e}"))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let health = local_health(target).await?;
        if attempt(&health) > attempt(&before) {
            let reload = &health["reload"];
            if let Some(error) = reload["error"].as_str() {
                return Err(format!("refused; the running configuration stays: {error}"));
            }
            let changes = reload["changes"].as_array().cloned().unwrap_or_default();
            return Ok(changes.iter().filter_map(|c| c.as_str().map(str::to_owned)).collect());
        }
    }
    Err(format!(
        "SIGHUP sent to pid {pid}, but /health reported no reload within 30 s"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: u32, port: u16, config: Option<&str>) -> InstanceRecord {
        InstanceRecord {
            pid,
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            config: config.map(Into::into),
        }
    }

    #[test]
    fn the_instance_started_with_the_same_file_is_chosen() {
        let configured = SocketAddr::from(([127, 0, 0, 1], 8642));
        let running = vec![
            record(10, 9001, Some("/srv/a.toml")),
            record(11, 9002, Some("/srv/b.toml")),
        ];
        let target = choose(configured, Some(Path::new("/srv/b.toml")), running.clone()).expect("found");
        assert_eq!(target.listen.port(), 9002);
        assert!(target.found_by.contains("pid 11"), "{}", target.found_by);
        let fallback = choose(configured, None, running.clone()).expect("fallback");
        assert_eq!(fallback.listen, configured);
        assert!(
            fallback.found_by.contains("pid 10 on 127.0.0.1:9001"),
            "{}",
            fallback.found_by
        );
        let twins = vec![record(10, 9001, None), record(11, 9002, None)];
        let error = choose(configured, None, twins).expect_err("ambiguous");
        assert!(error.contains("2 instances") && error.contains("--listen"), "{error}");
        assert_eq!(
            choose(configured, None, Vec::new()).expect("none").found_by,
            "server.listen"
        );
    }
}

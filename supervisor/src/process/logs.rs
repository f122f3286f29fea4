//! The bridge from a worker's stderr to the supervisor's log: every line is re-emitted through
//! `tracing`, tagged with pool, worker and pid, and the last lines are kept for crash reports.
//!
//! Workers log JSON lines (tracing-subscriber's json format); anything else, such as a panic message,
//! is passed on verbatim at WARN. Reading continues until end-of-file, so no line is lost on a crash.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// How many of a worker's last stderr lines are kept for `/health` and crash reports.
pub const TAIL_LINES: usize = 20;

/// The last stderr lines of one worker, shared between the reader task and whoever reports on it.
#[derive(Clone, Debug, Default)]
pub struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    /// The kept lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().map(|t| t.iter().cloned().collect()).unwrap_or_default()
    }

    fn push(&self, line: String) {
        if let Ok(mut tail) = self.0.lock() {
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    }
}

/// Who a log line belongs to.
#[derive(Clone, Debug)]
pub struct LogTags {
    /// Pool name.
    pub pool: String,
    /// Worker id inside the supervisor, e.g. `gpu/0`.
    pub worker: String,
    /// Process id.
    pub pid: u32,
}

/// Reads `stderr` to its end, re-emitting each line and keeping the tail. Returns at end-of-file.
pub async fn stderr_task(stderr: impl AsyncRead + Unpin, tags: LogTags, tail: StderrTail) {
    let mut lines = BufReader::new(stderr).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                emit(&line, &tags);
                tail.push(line);
            }
            Ok(None) => break,
            Err(error) => {
                tracing::warn!(pool = %tags.pool, worker = %tags.worker, pid = tags.pid, %error, "cannot read worker stderr");
                break;
            }
        }
    }
}

fn emit(line: &str, tags: &LogTags) {
    let (pool, worker, pid) = (tags.pool.as_str(), tags.worker.as_str(), tags.pid);
    let Ok(Value::Object(mut record)) = serde_json::from_str::<Value>(line) else {
        tracing::warn!(target: "layad::worker", pool, worker, pid, "{line}");
        return;
    };
    let level = record
        .get("level")
        .and_then(Value::as_str)
        .unwrap_or("INFO")
        .to_ascii_uppercase();
    // Workers flatten event fields into the record (`flatten_event`); a nested `fields` object is
    // accepted too. The worker's own timestamp is dropped: the re-emitted line gets ours.
    if let Some(Value::Object(nested)) = record.remove("fields") {
        record.extend(nested);
    }
    lift_span_fields(&mut record);
    for key in [
        "timestamp",
        "level",
        "target",
        "span",
        "spans",
        "threadName",
        "threadId",
    ] {
        record.remove(key);
    }
    let message = match record.remove("message") {
        Some(Value::String(m)) => m,
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let fields = if record.is_empty() {
        String::new()
    } else {
        Value::Object(record).to_string()
    };
    match level.as_str() {
        "ERROR" => tracing::error!(target: "layad::worker", pool, worker, pid, fields, "{message}"),
        "WARN" => tracing::warn!(target: "layad::worker", pool, worker, pid, fields, "{message}"),
        "DEBUG" => tracing::debug!(target: "layad::worker", pool, worker, pid, fields, "{message}"),
        "TRACE" => tracing::trace!(target: "layad::worker", pool, worker, pid, fields, "{message}"),
        _ => tracing::info!(target: "layad::worker", pool, worker, pid, fields, "{message}"),
    }
}

/// Moves the fields of the spans a worker's line was logged in (its `spans` list, outermost first)
/// into the record, where they survive re-emission: a forward's `request_id` above all. The event's
/// own fields win over a span's of the same name.
fn lift_span_fields(record: &mut serde_json::Map<String, Value>) {
    let Some(Value::Array(spans)) = record.remove("spans") else {
        return;
    };
    for span in spans {
        let Value::Object(fields) = span else { continue };
        for (key, value) in fields {
            if key != "name" && !record.contains_key(&key) {
                record.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_logged_in_a_forward_span_keeps_its_request_id() {
        let line = r#"{"level":"INFO","message":"engine ran","rows":2,"spans":[{"name":"forward","request_id":"abc123/0,abc124"}]}"#;
        let Ok(Value::Object(mut record)) = serde_json::from_str::<Value>(line) else {
            panic!("a JSON object");
        };
        lift_span_fields(&mut record);
        assert_eq!(record.get("request_id"), Some(&Value::from("abc123/0,abc124")));
        assert_eq!(record.get("rows"), Some(&Value::from(2)));
        assert!(
            !record.contains_key("spans") && !record.contains_key("name"),
            "{record:?}"
        );
    }

    #[tokio::test]
    async fn keeps_every_line_to_the_end_and_only_the_last_ones() {
        let text: String = (0..30)
            .map(|i| format!("{{\"level\":\"INFO\",\"message\":\"line {i}\"}}\n"))
            .collect::<String>()
            + "thread 'engine' panicked at src/engine.rs:1:1\n";
        let tail = StderrTail::default();
        let tags = LogTags {
            pool: "gpu".to_owned(),
            worker: "gpu/0".to_owned(),
            pid: 1,
        };
        stderr_task(text.as_bytes(), tags, tail.clone()).await;
        let lines = tail.lines();
        assert_eq!(lines.len(), TAIL_LINES);
        assert!(lines[0].contains("line 11"), "{lines:?}");
        assert_eq!(lines[TAIL_LINES - 1], "thread 'engine' panicked at src/engine.rs:1:1");
    }
}

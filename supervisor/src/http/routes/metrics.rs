//! `GET /metrics`: the exposition of `crate::metrics`, in the format the scraper asks for.
//!
//! Prometheus asks for OpenMetrics (`Accept: application/openmetrics-text…`) and gets what
//! prometheus-client renders. Everything else (curl, `promtool check metrics`, agents that only
//! read the classic format) gets the Prometheus text format 0.0.4: there a counter family is named
//! after its sample (`layad_requests_total`), so the OpenMetrics family name (`layad_requests`)
//! would leave the samples without `HELP` and `TYPE`, which `promtool check metrics` refuses.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::http::app::App;
use crate::http::response::ApiError;

/// The `Content-Type` of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders every metric, reading the pools' state now.
pub async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let text = match app.metrics.render() {
        Ok(text) => text,
        Err(e) => {
            tracing::error!(error = %e, "cannot render metrics");
            return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "metrics could not be rendered").into_response();
        }
    };
    let (text, content_type) = if wants_openmetrics(&headers) {
        (text, crate::metrics::CONTENT_TYPE)
    } else {
        (prometheus_text(&text), PROMETHEUS_TEXT)
    };
    let mut response = (StatusCode::OK, text).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Whether `Accept` names OpenMetrics at all (Prometheus lists it first; a client that lists it
/// reads it, whatever its weight).
fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .any(|value| String::from_utf8_lossy(value.as_bytes()).contains("application/openmetrics-text"))
}

/// The Prometheus text format (0.0.4) of an OpenMetrics exposition of counters, gauges and
/// histograms: counter families take their sample's `_total` name in `HELP` and `TYPE`, `unknown`
/// becomes `untyped`, and `# UNIT` and `# EOF` (which 0.0.4 does not have) are left out. Samples
/// are written the same way in both formats.
pub fn prometheus_text(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let descriptor = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|prefix| line.strip_prefix(prefix).map(|rest| (prefix, rest)));
        match descriptor {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(if prefix == "# TYPE " && tail == "unknown" {
                    "untyped"
                } else {
                    tail
                });
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_take_their_sample_name_and_openmetrics_only_lines_go() {
        let openmetrics = "# HELP layad_requests Answers by status\n# TYPE layad_requests counter\n\
             layad_requests_total{status=\"200\"} 3\n\
             # HELP layad_queue_wait_seconds Waits\n# TYPE layad_queue_wait_seconds histogram\n\
             # UNIT layad_queue_wait_seconds seconds\n\
             layad_queue_wait_seconds_bucket{le=\"+Inf\"} 1\nlayad_queue_wait_seconds_count 1\n\
             # HELP layad_odd Odd\n# TYPE layad_odd unknown\nlayad_odd 1\n# EOF\n";
        assert_eq!(
            prometheus_text(openmetrics),
            "# HELP layad_requests_total Answers by status\n# TYPE layad_requests_total counter\n\
             layad_requests_total{status=\"200\"} 3\n\
             # HELP layad_queue_wait_seconds Waits\n# TYPE layad_queue_wait_seconds histogram\n\
             layad_queue_wait_seconds_bucket{le=\"+Inf\"} 1\nlayad_queue_wait_seconds_count 1\n\
             # HELP layad_odd Odd\n# TYPE layad_odd untyped\nlayad_odd 1\n"
        );
    }

    #[test]
    fn only_an_accept_naming_openmetrics_gets_it() {
        let accept = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::ACCEPT, HeaderValue::from_static(value));
            wants_openmetrics(&headers)
        };
        // Prometheus 2.42's scrape header.
        assert!(accept(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
             text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        ));
        assert!(!accept("*/*"));
        assert!(!accept("text/plain"));
        assert!(!wants_openmetrics(&HeaderMap::new()));
    }
}

//! What goes into a service file whichever the manager: the command line, the environment, the stop
//! timeout, paths as safe text, and the templates' `@NAME@` placeholders filled in.

use std::path::Path;
use std::time::Duration;

use layad_config::Config;

use crate::install::options::{ServiceError, ServiceOptions};

/// Extra time beyond the drain and the workers' stop timeout before the manager kills layad.
const STOP_MARGIN: Duration = Duration::from_secs(5);

/// How long the manager waits after SIGTERM: the drain, the workers' stop, and a margin.
pub(super) fn stop_timeout(config: &Config) -> u64 {
    let total = config.server.shutdown_grace + config.workers.stop_timeout + STOP_MARGIN;
    total.as_secs() + u64::from(total.subsec_nanos() > 0)
}

/// `layad serve [--config FILE]`, program first.
pub(super) fn program_arguments(options: &ServiceOptions) -> Result<Vec<String>, ServiceError> {
    let mut args = vec![text("the layad executable", &options.program)?, "serve".to_owned()];
    if let Some(config) = &options.config {
        args.push("--config".to_owned());
        args.push(text("the config file", config)?);
    }
    Ok(args)
}

/// The environment the service gets: the Hugging Face cache location, nothing secret.
pub(super) fn environment(options: &ServiceOptions) -> Result<Vec<(&'static str, String)>, ServiceError> {
    let mut vars = vec![("HF_HOME", text("HF_HOME", &options.hf_home)?)];
    if let Some(cache) = &options.hf_hub_cache {
        vars.push(("HF_HUB_CACHE", text("HF_HUB_CACHE", cache)?));
    }
    Ok(vars)
}

/// A path as text that is safe inside a service file.
pub(super) fn text(what: &'static str, path: &Path) -> Result<String, ServiceError> {
    let value = path.to_string_lossy().into_owned();
    if value.contains(['\n', '\r', '\0']) {
        return Err(ServiceError::UnsafeValue { what, value });
    }
    Ok(value)
}

/// Replaces each `@NAME@` in `template`; a line holding only a placeholder whose value is empty is
/// dropped. Every placeholder must have a value and every value a placeholder.
pub(super) fn fill(template: &str, values: &[(&str, String)]) -> Result<String, ServiceError> {
    let wanted = placeholders(template);
    if let Some(name) = wanted.iter().find(|name| !values.iter().any(|(n, _)| n == *name)) {
        return Err(ServiceError::Template(format!("placeholder @{name}@ has no value")));
    }
    if let Some((name, _)) = values.iter().find(|(name, _)| !wanted.contains(name)) {
        return Err(ServiceError::Template(format!("no placeholder @{name}@")));
    }
    let mut out = String::with_capacity(template.len() + 256);
    for line in template.lines() {
        let placeholder_only = values.iter().find(|(name, _)| line.trim() == format!("@{name}@"));
        if let Some((_, value)) = placeholder_only {
            if !value.is_empty() {
                out.push_str(value);
                out.push('\n');
            }
            continue;
        }
        let mut line = line.to_owned();
        for (name, value) in values {
            line = line.replace(&format!("@{name}@"), value);
        }
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

/// The `@NAME@` placeholders of a template (names of capitals and `_`), in order.
pub(super) fn placeholders(template: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find('@') {
        let after = &rest[start + 1..];
        let len = after
            .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
            .unwrap_or(after.len());
        if len > 0 && after[len..].starts_with('@') {
            found.push(&after[..len]);
            rest = &after[len + 1..];
        } else {
            rest = after;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_drops_empty_placeholder_lines_and_substitutes_inline() {
        let out = fill("a=@A@\n@B@\nc\n", &[("A", "1".to_owned()), ("B", String::new())]).expect("fill");
        assert_eq!(out, "a=1\nc\n");
        let out = fill("@B@\n", &[("B", "x\ny".to_owned())]).expect("fill");
        assert_eq!(out, "x\ny\n");
        assert!(fill("@MISSING@\n", &[]).is_err());
        assert!(fill("none\n", &[("EXTRA", String::new())]).is_err());
        // Values are not scanned: an address with @ is just text.
        let out = fill("to @A@\n", &[("A", "me@EXAMPLE@com".to_owned())]).expect("fill");
        assert_eq!(out, "to me@EXAMPLE@com\n");
    }

    #[test]
    fn stop_timeout_covers_drain_and_worker_stop() {
        let config = Config::default();
        // 30 s grace + 10 s worker stop + 5 s margin.
        assert_eq!(stop_timeout(&config), 45);
    }
}

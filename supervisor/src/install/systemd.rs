//! systemd (Linux): the unit from `deploy/systemd/layad.{user,system}.service.in` and the
//! `systemctl` commands that enable, start, stop and show it, as a user or a system unit.

use std::path::PathBuf;

use layad_config::Config;

use crate::install::contents::{environment, fill, program_arguments, stop_timeout, text};
use crate::install::options::{SYSTEMD_UNIT, Scope, ServiceError, ServiceOptions};
use crate::install::steps::{ManagerCommand, Step};

/// The user unit's template.
pub(super) const USER_UNIT_TEMPLATE: &str = include_str!("../../../deploy/systemd/layad.user.service.in");
/// The system unit's template.
pub(super) const SYSTEM_UNIT_TEMPLATE: &str = include_str!("../../../deploy/systemd/layad.system.service.in");

/// `systemctl` or `systemctl --user`, then `args`.
fn systemctl(options: &ServiceOptions, args: &[&str], must_succeed: bool) -> ManagerCommand {
    let mut all = Vec::new();
    if options.scope == Scope::User {
        all.push("--user".to_owned());
    }
    all.extend(args.iter().map(|a| (*a).to_owned()));
    ManagerCommand {
        program: "systemctl".to_owned(),
        args: all,
        must_succeed,
    }
}

/// After the unit is written: reload the units, enable it, then `restart` rather than
/// `enable --now`: a reinstall must replace a running old instance, and restart starts a stopped one.
pub(super) fn load_steps(options: &ServiceOptions) -> Vec<Step> {
    vec![
        Step::Run(systemctl(options, &["daemon-reload"], true)),
        Step::Run(systemctl(options, &["enable", SYSTEMD_UNIT], true)),
        Step::Run(systemctl(options, &["restart", SYSTEMD_UNIT], true)),
    ]
}

/// Stop and disable the unit (it may not be there), remove its file at `path`, reload the units.
pub(super) fn unload_steps(options: &ServiceOptions, path: PathBuf) -> Vec<Step> {
    vec![
        Step::Run(systemctl(options, &["disable", "--now", SYSTEMD_UNIT], false)),
        Step::Remove { path },
        Step::Run(systemctl(options, &["daemon-reload"], true)),
    ]
}

/// `systemctl [--user] status --no-pager layad.service`.
pub(super) fn status_command(options: &ServiceOptions) -> ManagerCommand {
    systemctl(options, &["status", "--no-pager", SYSTEMD_UNIT], false)
}

pub(super) fn render(options: &ServiceOptions, config: &Config) -> Result<String, ServiceError> {
    let exec_start: Vec<String> = program_arguments(options)?
        .iter()
        .map(|a| systemd_quote(a, true))
        .collect();
    let environment: Vec<String> = environment(options)?
        .iter()
        .map(|(name, value)| format!("Environment={}", systemd_quote(&format!("{name}={value}"), false)))
        .collect();
    let mut values = vec![
        ("EXEC_START", exec_start.join(" ")),
        ("ENVIRONMENT", environment.join("\n")),
        ("TIMEOUT_STOP", format!("{}s", stop_timeout(config))),
    ];
    let template = match options.scope {
        Scope::User => USER_UNIT_TEMPLATE,
        Scope::System => {
            let user = options
                .run_as
                .as_ref()
                .map_or_else(String::new, |u| format!("User={}", systemd_quote(u, false)));
            // `-`: a cache directory that does not exist yet must not stop the service starting.
            let mut writable = vec![text("HF_HOME", &options.hf_home)?];
            if let Some(cache) = &options.hf_hub_cache {
                writable.push(text("HF_HUB_CACHE", cache)?);
            }
            let writable: Vec<String> = writable
                .iter()
                .map(|p| systemd_quote(&format!("-{p}"), false))
                .collect();
            values.push(("USER", user));
            values.push(("READ_WRITE_PATHS", writable.join(" ")));
            SYSTEM_UNIT_TEMPLATE
        }
    };
    fill(template, &values)
}

/// A word for a systemd unit file: `%` doubled (specifiers), and in a command line `$` doubled
/// (variable expansion); quoted with `"` when it holds blanks, quotes or backslashes.
fn systemd_quote(word: &str, command_line: bool) -> String {
    let mut escaped = word.replace('%', "%%");
    if command_line {
        escaped = escaped.replace('$', "$$");
    }
    if escaped.is_empty() || escaped.contains(|c: char| c.is_whitespace() || "\"'\\".contains(c)) {
        format!("\"{}\"", escaped.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        escaped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_templates_name_their_placeholders() {
        let placeholders = crate::install::contents::placeholders;
        assert_eq!(
            placeholders(USER_UNIT_TEMPLATE),
            ["EXEC_START", "ENVIRONMENT", "TIMEOUT_STOP"]
        );
        assert_eq!(
            placeholders(SYSTEM_UNIT_TEMPLATE),
            ["USER", "EXEC_START", "ENVIRONMENT", "TIMEOUT_STOP", "READ_WRITE_PATHS"]
        );
    }

    #[test]
    fn systemd_words_are_escaped() {
        assert_eq!(systemd_quote("/usr/bin/layad", true), "/usr/bin/layad");
        assert_eq!(systemd_quote("/a b/c", true), "\"/a b/c\"");
        assert_eq!(systemd_quote("50%", false), "50%%");
        assert_eq!(systemd_quote("$HOME", true), "$$HOME");
        assert_eq!(systemd_quote("$HOME", false), "$HOME");
        assert_eq!(systemd_quote("a\"b", false), "\"a\\\"b\"");
    }
}

//! launchd (macOS): the plist from `deploy/launchd/ai.layad.plist.in` and the `launchctl` commands
//! that load, unload and show the job, in the user's `gui/<uid>` domain or the `system` one.

use std::path::PathBuf;
use std::time::Duration;

use layad_config::Config;

use crate::install::contents::{environment, fill, program_arguments, stop_timeout, text};
use crate::install::options::{LAUNCHD_LABEL, Scope, ServiceError, ServiceOptions};
use crate::install::steps::{ManagerCommand, Step};

/// The plist template.
pub(super) const PLIST_TEMPLATE: &str = include_str!("../../../deploy/launchd/ai.layad.plist.in");

/// `gui/<uid>` or `system`: the launchd domain.
fn domain(options: &ServiceOptions) -> String {
    match options.scope {
        Scope::User => format!("gui/{}", options.uid),
        Scope::System => "system".to_owned(),
    }
}

/// `<domain>/ai.layad`: the job.
fn target(options: &ServiceOptions) -> String {
    format!("{}/{LAUNCHD_LABEL}", domain(options))
}

fn launchctl(args: &[&str], must_succeed: bool) -> ManagerCommand {
    ManagerCommand {
        program: "launchctl".to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        must_succeed,
    }
}

/// How much longer than its `ExitTimeOut` an old job may take to disappear from launchd.
const GONE_MARGIN: Duration = Duration::from_secs(10);

/// Before anything is written: a user agent needs the user's `gui/<uid>` domain, which exists only
/// while the user is logged in at the Mac's screen; over SSH there is none, and bootstrap would fail
/// after the files were written.
pub(super) fn preconditions(options: &ServiceOptions) -> Vec<Step> {
    if options.scope == Scope::System {
        return Vec::new();
    }
    let domain = domain(options);
    vec![Step::Require {
        command: launchctl(&["print", &domain], true),
        hint: format!(
            "launchd has no {domain} domain: user {uid} is not logged in at this Mac's screen (an SSH session has none), and a launchd agent runs in that login session. Log in at the Mac (or through Screen Sharing) and run this again, or install a daemon that starts at boot instead: sudo layad service install --system",
            uid = options.uid
        ),
    }]
}

/// After the plist at `file` is written: unload the old job first so the new plist takes effect
/// (it may not be loaded), wait until it has stopped, then enable and load it.
pub(super) fn load_steps(options: &ServiceOptions, config: &Config, file: &str) -> Vec<Step> {
    let target = target(options);
    vec![
        Step::Run(launchctl(&["bootout", &target], false)),
        // bootout returns while the old layad may still be draining (up to its ExitTimeOut);
        // bootstrapping meanwhile fails with "Bootstrap failed: 5: Input/output error".
        Step::WaitUntilGone {
            command: launchctl(&["print", &target], false),
            timeout: Duration::from_secs(stop_timeout(config)) + GONE_MARGIN,
        },
        Step::Run(launchctl(&["enable", &target], true)),
        Step::Run(launchctl(&["bootstrap", &domain(options), file], true)),
    ]
}

/// Unload the job (it may not be loaded) and remove its plist at `path`.
pub(super) fn unload_steps(options: &ServiceOptions, path: PathBuf) -> Vec<Step> {
    vec![
        Step::Run(launchctl(&["bootout", &target(options)], false)),
        Step::Remove { path },
    ]
}

/// `launchctl print <domain>/ai.layad`.
pub(super) fn status_command(options: &ServiceOptions) -> ManagerCommand {
    launchctl(&["print", &target(options)], false)
}

pub(super) fn render(options: &ServiceOptions, config: &Config) -> Result<String, ServiceError> {
    let string = |indent: &str, value: &str| format!("{indent}<string>{}</string>", xml_escape(value));
    let arguments: Vec<String> = program_arguments(options)?
        .iter()
        .map(|arg| string("        ", arg))
        .collect();
    let environment: Vec<String> = environment(options)?
        .iter()
        .map(|(name, value)| format!("        <key>{name}</key>\n{}", string("        ", value)))
        .collect();
    let user_name = match (&options.scope, &options.run_as) {
        (Scope::System, Some(user)) => format!("    <key>UserName</key>\n{}", string("    ", user)),
        _ => String::new(),
    };
    let log_file = text("the log file", &options.log_file())?;
    fill(
        PLIST_TEMPLATE,
        &[
            ("LABEL", LAUNCHD_LABEL.to_owned()),
            ("USER_NAME", user_name),
            ("PROGRAM_ARGUMENTS", arguments.join("\n")),
            ("ENVIRONMENT", environment.join("\n")),
            ("EXIT_TIMEOUT", stop_timeout(config).to_string()),
            ("LOG_FILE", xml_escape(&log_file)),
        ],
    )
}

/// `&`, `<`, `>`, `"`, `'` as XML entities.
fn xml_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_names_its_placeholders() {
        assert_eq!(
            crate::install::contents::placeholders(PLIST_TEMPLATE),
            [
                "LABEL",
                "USER_NAME",
                "PROGRAM_ARGUMENTS",
                "ENVIRONMENT",
                "EXIT_TIMEOUT",
                "LOG_FILE",
                "LOG_FILE"
            ]
        );
    }

    #[test]
    fn xml_is_escaped() {
        assert_eq!(xml_escape("a&b<c>\"'"), "a&amp;b&lt;c&gt;&quot;&apos;");
    }
}

//! What an operation does, as a list of [`Step`]s: create a directory, write or remove a file, run a
//! `launchctl`/`systemctl` command. `--dry-run` prints them; otherwise [`perform`] does them in order.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::install::options::{Scope, ServiceError, ServiceOptions};

/// A `launchctl` or `systemctl` invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagerCommand {
    /// `launchctl` or `systemctl`.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Whether a failure stops the operation (`bootout` of a job that is not loaded may fail).
    pub must_succeed: bool,
}

impl fmt::Display for ManagerCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.program)?;
        for arg in &self.args {
            if arg.is_empty() || arg.contains(|c: char| c.is_whitespace() || "'\"\\$`".contains(c)) {
                write!(f, " '{}'", arg.replace('\'', r"'\''"))?;
            } else {
                write!(f, " {arg}")?;
            }
        }
        Ok(())
    }
}

/// What a command printed and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandOutput {
    /// Exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl CommandOutput {
    pub(super) fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs manager commands; [`SystemRunner`] runs them for real, tests record them.
pub trait Runner {
    /// Runs `command` to completion.
    fn run(&mut self, command: &ManagerCommand) -> Result<CommandOutput, ServiceError>;
}

/// How often [`Step::WaitUntilGone`] asks again.
const GONE_POLL: Duration = Duration::from_millis(250);

/// Runs commands as child processes, found on `PATH`.
#[derive(Debug, Default)]
pub struct SystemRunner {
    /// `PATH` to find and run the commands with; `None`: layad's own. (Tests put a stand-in
    /// `launchctl` first.)
    pub search_path: Option<OsString>,
}

impl Runner for SystemRunner {
    fn run(&mut self, command: &ManagerCommand) -> Result<CommandOutput, ServiceError> {
        let mut child = std::process::Command::new(&command.program);
        if let Some(path) = &self.search_path {
            child.env("PATH", path);
        }
        let output = child
            .args(&command.args)
            .output()
            .map_err(|source| ServiceError::Spawn {
                program: command.program.clone(),
                source,
            })?;
        Ok(CommandOutput {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// One thing an operation does, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create a directory (and its parents), owned by `owner` when given.
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Account to hand it to (a launchd daemon's log directory), if not the installer.
        owner: Option<String>,
    },
    /// Write a file with mode 0644, replacing it in one rename.
    Write {
        /// The file.
        path: PathBuf,
        /// Its full content.
        contents: String,
    },
    /// Delete a file if it exists.
    Remove {
        /// The file.
        path: PathBuf,
    },
    /// Run a manager command.
    Run(ManagerCommand),
    /// Stop, changing nothing, unless `command` succeeds; `hint` says what is wrong and what to do.
    Require {
        /// The check.
        command: ManagerCommand,
        /// What its failure means.
        hint: String,
    },
    /// Run `command` until it fails (launchd no longer knows the old job), at most `timeout`.
    WaitUntilGone {
        /// The question (`launchctl print <domain>/<label>`).
        command: ManagerCommand,
        /// The longest wait.
        timeout: Duration,
    },
}

/// What an operation did, or would do with `--dry-run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Things the user should know (variables not passed on, key file permissions, boot start).
    pub notes: Vec<String>,
}

impl fmt::Display for ServiceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (create, write, remove, run) = if self.dry_run {
            ("would create", "would write", "would remove", "would run")
        } else {
            ("created", "wrote", "removed", "ran")
        };
        for step in &self.steps {
            match step {
                Step::CreateDir { path, owner: None } => writeln!(f, "{create} directory {}", path.display())?,
                Step::CreateDir {
                    path,
                    owner: Some(owner),
                } => writeln!(f, "{create} directory {} (owner {owner})", path.display())?,
                Step::Write { path, contents } => {
                    writeln!(f, "{write} {} (mode 644):", path.display())?;
                    write!(f, "{contents}")?;
                    if !contents.ends_with('\n') {
                        writeln!(f)?;
                    }
                }
                Step::Remove { path } => writeln!(f, "{remove} {}", path.display())?,
                Step::Run(command) if command.must_succeed => writeln!(f, "{run}: {command}")?,
                Step::Run(command) => {
                    writeln!(f, "{run}: {command}   (a failure here is expected if it is not loaded)")?
                }
                Step::Require { command, .. } => {
                    writeln!(f, "{run}: {command}   (your login session's launchd domain must exist)")?
                }
                Step::WaitUntilGone { command, timeout } => writeln!(
                    f,
                    "{run}: {command}   (until it fails: the old job has exited; at most {} s)",
                    timeout.as_secs()
                )?,
            }
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

/// What `layad service status` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceStatus {
    /// Where the plist or unit file is expected.
    pub service_file: PathBuf,
    /// Whether it is there.
    pub installed: bool,
    /// The command that asked the manager.
    pub command: ManagerCommand,
    /// What the manager said (`launchctl print` / `systemctl status`).
    pub output: CommandOutput,
}

impl fmt::Display for ServiceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.installed { "installed" } else { "not installed" };
        writeln!(f, "{}: {state}", self.service_file.display())?;
        writeln!(f, "$ {}", self.command)?;
        write!(f, "{}{}", self.output.stdout, self.output.stderr)
    }
}

/// Performs `steps` in order unless this is a dry run.
pub(super) fn perform(
    options: &ServiceOptions,
    command: &'static str,
    steps: Vec<Step>,
    notes: Vec<String>,
    runner: &mut dyn Runner,
) -> Result<ServiceReport, ServiceError> {
    if !options.dry_run {
        if options.scope == Scope::System && options.uid != 0 {
            return Err(ServiceError::NeedsRoot {
                path: options.service_file(),
                command,
            });
        }
        for step in &steps {
            perform_step(step, runner)?;
        }
    }
    Ok(ServiceReport {
        dry_run: options.dry_run,
        steps,
        notes,
    })
}

fn perform_step(step: &Step, runner: &mut dyn Runner) -> Result<(), ServiceError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ServiceError::Io { path, source }
    };
    match step {
        Step::CreateDir { path, owner } => {
            // The directories this creates, outermost first: those are the ones to hand over.
            let created: Vec<&Path> = {
                let mut missing: Vec<&Path> = path.ancestors().take_while(|p| !p.exists()).collect();
                missing.reverse();
                missing
            };
            std::fs::create_dir_all(path).map_err(io(path))?;
            if let Some(owner) = owner {
                let user = nix::unistd::User::from_name(owner)
                    .ok()
                    .flatten()
                    .ok_or_else(|| ServiceError::Environment(format!("no account named {owner}")))?;
                for dir in created {
                    std::os::unix::fs::chown(dir, Some(user.uid.as_raw()), Some(user.gid.as_raw())).map_err(io(dir))?;
                }
            }
        }
        Step::Write { path, contents } => {
            let temporary = path.with_extension("layad-new");
            std::fs::write(&temporary, contents).map_err(io(&temporary))?;
            // launchd refuses a plist that group or others can write.
            std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o644)).map_err(io(&temporary))?;
            std::fs::rename(&temporary, path).map_err(io(path))?;
        }
        Step::Remove { path } => match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(path)(e)),
            _ => {}
        },
        Step::Require { command, hint } => {
            let output = runner.run(command)?;
            if !output.success() {
                return Err(ServiceError::Precondition {
                    command: command.to_string(),
                    stderr: output.stderr.trim().to_owned(),
                    hint: hint.clone(),
                });
            }
        }
        Step::WaitUntilGone { command, timeout } => {
            let started = Instant::now();
            while runner.run(command)?.success() {
                if started.elapsed() >= *timeout {
                    return Err(ServiceError::StillThere {
                        command: command.to_string(),
                        seconds: timeout.as_secs(),
                    });
                }
                std::thread::sleep(GONE_POLL);
            }
        }
        Step::Run(command) => {
            let output = runner.run(command)?;
            if command.must_succeed && !output.success() {
                return Err(ServiceError::Command {
                    command: command.to_string(),
                    status: output
                        .code
                        .map_or("killed by a signal".to_owned(), |c| format!("exit code {c}")),
                    stderr: output.stderr.trim().to_owned(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers every command with `code`, counting them.
    struct Always {
        code: i32,
        ran: usize,
    }

    impl Runner for Always {
        fn run(&mut self, _: &ManagerCommand) -> Result<CommandOutput, ServiceError> {
            self.ran += 1;
            Ok(CommandOutput {
                code: Some(self.code),
                stdout: String::new(),
                stderr: "Could not find domain for user gui: 501".to_owned(),
            })
        }
    }

    #[test]
    fn waiting_for_the_old_job_gives_up_after_its_timeout_and_says_so() {
        let command = ManagerCommand {
            program: "launchctl".to_owned(),
            args: vec!["print".to_owned(), "gui/501/ai.layad".to_owned()],
            must_succeed: false,
        };
        let wait = Step::WaitUntilGone {
            command,
            timeout: Duration::from_secs(1),
        };
        let mut still_there = Always { code: 0, ran: 0 };
        let started = Instant::now();
        let error = perform_step(&wait, &mut still_there).expect_err("never gone");
        assert!(started.elapsed() >= Duration::from_secs(1));
        assert!(still_there.ran >= 4, "asked {} times", still_there.ran);
        assert!(
            error.to_string().starts_with(
                "the old job is still there after 1 s (`launchctl print gui/501/ai.layad` still finds it)"
            ),
            "{error}"
        );
        let mut gone = Always { code: 113, ran: 0 };
        perform_step(&wait, &mut gone).expect("gone at once");
        assert_eq!(gone.ran, 1);
    }

    #[test]
    fn commands_print_as_a_shell_would_take_them() {
        let command = ManagerCommand {
            program: "launchctl".to_owned(),
            args: vec![
                "bootstrap".to_owned(),
                "gui/501".to_owned(),
                "/Users/a b/x.plist".to_owned(),
            ],
            must_succeed: true,
        };
        assert_eq!(command.to_string(), "launchctl bootstrap gui/501 '/Users/a b/x.plist'");
    }
}

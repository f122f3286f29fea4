//! `layad service install|uninstall|status`: layad as a launchd job (macOS) or a systemd unit
//! (Linux) that starts at login or boot and restarts after a failure, from the templates in `deploy/`.
//!
//! Both flavours are generated on any OS (so both are tested on Linux); only running `launchctl` or
//! `systemctl` is tied to the OS. Everything an install does is a list of [`Step`]s, which
//! `--dry-run` prints instead of performing. The API key is never written into a service file: the
//! service reads it from `server.api_key_file`.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use layad_config::{Config, ConfigError, Flags, Sources};

/// The launchd label, and the plist's file name without `.plist`.
pub const LAUNCHD_LABEL: &str = "ai.layad";
/// The systemd unit name.
pub const SYSTEMD_UNIT: &str = "layad.service";

const PLIST_TEMPLATE: &str = include_str!("../../deploy/launchd/ai.layad.plist.in");
const USER_UNIT_TEMPLATE: &str = include_str!("../../deploy/systemd/layad.user.service.in");
const SYSTEM_UNIT_TEMPLATE: &str = include_str!("../../deploy/systemd/layad.system.service.in");

/// Extra time beyond the drain and the workers' stop timeout before the manager kills layad.
const STOP_MARGIN: Duration = Duration::from_secs(5);
/// How often a reinstall asks launchd whether the old job is gone.
const GONE_POLL: Duration = Duration::from_millis(250);
/// How much longer than its `ExitTimeOut` an old job may take to disappear from launchd.
const GONE_MARGIN: Duration = Duration::from_secs(10);

/// Which service manager the files are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Manager {
    /// macOS launchd: a plist, `launchctl`.
    Launchd,
    /// Linux systemd: a unit file, `systemctl`.
    Systemd,
}

impl Manager {
    /// The manager of the OS layad was built for, if it has one layad supports.
    pub fn native() -> Option<Self> {
        if cfg!(target_os = "macos") {
            Some(Manager::Launchd)
        } else if cfg!(target_os = "linux") {
            Some(Manager::Systemd)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Manager::Launchd => "launchd",
            Manager::Systemd => "systemd",
        }
    }
}

/// Whose service it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The installing user's: a launchd agent (runs while they are logged in) or a systemd user unit.
    User,
    /// The machine's (`--system`, as root): a launchd daemon or a systemd system unit, started at boot.
    System,
}

/// Everything install, uninstall and status need; [`ServiceOptions::from_env`] fills it from the
/// running process, tests fill it by hand.
#[derive(Clone, Debug)]
pub struct ServiceOptions {
    /// launchd or systemd.
    pub manager: Manager,
    /// User or system service.
    pub scope: Scope,
    /// The config file the service passes to `layad serve --config` (made absolute by `from_env`).
    pub config: Option<PathBuf>,
    /// Print what would be written and run; change nothing.
    pub dry_run: bool,
    /// Absolute path of the `layad` executable the service runs.
    pub program: PathBuf,
    /// Home directory of the user the files belong to (user scope: agent/unit and log paths).
    pub home: PathBuf,
    /// User id of the installing user (launchd's `gui/<uid>` domain; 0 is needed for `--system`).
    pub uid: u32,
    /// System scope: the account the service runs as (`User=` / `UserName`); `None` = root.
    pub run_as: Option<String>,
    /// `HF_HOME` given to the service: where the Hugging Face cache is.
    pub hf_home: PathBuf,
    /// `HF_HUB_CACHE` given to the service, when the installing shell sets one.
    pub hf_hub_cache: Option<PathBuf>,
    /// Names of `LAYA_API_KEY` and `LAYAD_*` variables set where install runs: the service does not
    /// inherit them, which the report says.
    pub shell_variables: Vec<String>,
}

impl ServiceOptions {
    /// Options for this process: the native manager, the running `layad`, the user from the
    /// environment (`SUDO_USER` becomes the account of a `--system` service), `HF_HOME` (or
    /// huggingface_hub's default for that user).
    pub fn from_env(config: Option<PathBuf>, system: bool, dry_run: bool) -> Result<Self, ServiceError> {
        let manager = Manager::native().ok_or(ServiceError::Unsupported {
            os: std::env::consts::OS,
        })?;
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let config = match config {
            Some(path) => Some(std::fs::canonicalize(&path).map_err(|source| ServiceError::Io { path, source })?),
            None => None,
        };
        let program = std::env::current_exe()
            .and_then(std::fs::canonicalize)
            .map_err(|e| ServiceError::Environment(format!("cannot find the running layad executable: {e}")))?;
        let run_as = std::env::var("SUDO_USER")
            .ok()
            .filter(|u| system && !u.is_empty() && u != "root");
        let account_home = run_as
            .as_deref()
            .and_then(|name| nix::unistd::User::from_name(name).ok().flatten())
            .map(|user| user.dir);
        let home = account_home
            .or_else(|| var("HOME"))
            .ok_or_else(|| ServiceError::Environment("HOME is not set".to_owned()))?;
        let hf_home = var("HF_HOME")
            .or_else(|| {
                // Under sudo the shell's XDG_CACHE_HOME belongs to root, not to the account.
                let xdg = if run_as.is_some() { None } else { var("XDG_CACHE_HOME") };
                xdg.map(|xdg| xdg.join("huggingface"))
            })
            .unwrap_or_else(|| home.join(".cache").join("huggingface"));
        let shell_variables = std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .filter(|name| {
                name == layad_config::load::API_KEY_VAR
                    || (name.starts_with(layad_config::load::ENV_PREFIX) && name != layad_config::load::CONFIG_FILE_VAR)
            })
            .collect();
        Ok(Self {
            manager,
            scope: if system { Scope::System } else { Scope::User },
            config,
            dry_run,
            program,
            home,
            uid: nix::unistd::getuid().as_raw(),
            run_as,
            hf_home,
            hf_hub_cache: var("HF_HUB_CACHE"),
            shell_variables,
        })
    }

    /// Where the plist or unit file goes.
    pub fn service_file(&self) -> PathBuf {
        match (self.manager, self.scope) {
            (Manager::Launchd, Scope::User) => self
                .home
                .join("Library/LaunchAgents")
                .join(format!("{LAUNCHD_LABEL}.plist")),
            (Manager::Launchd, Scope::System) => {
                Path::new("/Library/LaunchDaemons").join(format!("{LAUNCHD_LABEL}.plist"))
            }
            (Manager::Systemd, Scope::User) => self.home.join(".config/systemd/user").join(SYSTEMD_UNIT),
            (Manager::Systemd, Scope::System) => Path::new("/etc/systemd/system").join(SYSTEMD_UNIT),
        }
    }

    /// launchd: the file stdout and stderr go to (systemd sends them to the journal).
    pub fn log_file(&self) -> PathBuf {
        match self.scope {
            Scope::User => self.home.join("Library/Logs/layad/layad.log"),
            Scope::System => PathBuf::from("/Library/Logs/layad/layad.log"),
        }
    }

    /// `gui/<uid>` or `system`: the launchd domain.
    fn launchd_domain(&self) -> String {
        match self.scope {
            Scope::User => format!("gui/{}", self.uid),
            Scope::System => "system".to_owned(),
        }
    }

    /// `systemctl` or `systemctl --user`, then `args`.
    fn systemctl(&self, args: &[&str], must_succeed: bool) -> ManagerCommand {
        let mut all = Vec::new();
        if self.scope == Scope::User {
            all.push("--user".to_owned());
        }
        all.extend(args.iter().map(|a| (*a).to_owned()));
        ManagerCommand {
            program: "systemctl".to_owned(),
            args: all,
            must_succeed,
        }
    }

    fn launchctl(&self, args: &[&str], must_succeed: bool) -> ManagerCommand {
        ManagerCommand {
            program: "launchctl".to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            must_succeed,
        }
    }
}

/// Why a service operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// This OS has neither launchd nor systemd support in layad.
    #[error("layad service supports macOS (launchd) and Linux (systemd), not {os}")]
    Unsupported {
        /// The OS layad was built for.
        os: &'static str,
    },
    /// A real install was asked for files of another OS's manager (dry runs work everywhere).
    #[error("this is {os}: {manager} services cannot be installed or queried here (--dry-run shows the files)")]
    ForeignManager {
        /// The manager asked for.
        manager: &'static str,
        /// The OS this runs on.
        os: &'static str,
    },
    /// `--system` without root.
    #[error("--system writes {path} and needs root: run `sudo layad service {command} --system`", path = path.display())]
    NeedsRoot {
        /// The file that needs root to write.
        path: PathBuf,
        /// `install` or `uninstall`.
        command: &'static str,
    },
    /// The config file the service would use does not load.
    #[error("the service would fail to start: {0}")]
    Config(#[from] ConfigError),
    /// A value that cannot go into a service file safely (a newline would start a new directive).
    #[error("{what} {value:?} contains a line break or NUL and cannot go into a service file")]
    UnsafeValue {
        /// What the value is.
        what: &'static str,
        /// The value.
        value: String,
    },
    /// A template in `deploy/` and the code filling it disagree (a bug in layad).
    #[error("service template: {0} (a bug in layad)")]
    Template(String),
    /// Something about the running process could not be found out.
    #[error("{0}")]
    Environment(String),
    /// A file operation failed.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// `launchctl` or `systemctl` could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A condition for installing does not hold (e.g. no launchd GUI session over SSH).
    #[error("{hint}\n(`{command}` failed: {stderr})")]
    Precondition {
        /// The command that checked it.
        command: String,
        /// What it printed on stderr.
        stderr: String,
        /// What is wrong and what to do instead.
        hint: String,
    },
    /// The old launchd job did not go away in time.
    #[error(
        "the old job is still there after {seconds} s (`{command}` still finds it): it has not finished stopping; run the install again once it has"
    )]
    StillThere {
        /// The command that found it.
        command: String,
        /// How long it was waited for.
        seconds: u64,
    },
    /// A manager command that must succeed failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status, in words.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
}

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
    fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs manager commands; [`SystemRunner`] runs them for real, tests record them.
pub trait Runner {
    /// Runs `command` to completion.
    fn run(&mut self, command: &ManagerCommand) -> Result<CommandOutput, ServiceError>;
}

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

/// The service file's path and content for `options`, without touching anything.
pub fn render(options: &ServiceOptions) -> Result<(PathBuf, String), ServiceError> {
    let config = load_config(options)?;
    Ok((options.service_file(), contents(options, &config)?))
}

/// The plist or unit text for `options` running with `config`.
fn contents(options: &ServiceOptions, config: &Config) -> Result<String, ServiceError> {
    match options.manager {
        Manager::Launchd => render_plist(options, config),
        Manager::Systemd => render_unit(options, config),
    }
}

/// Installs (or reinstalls) and starts the service; with `dry_run`, only reports what it would do.
pub fn install(options: &ServiceOptions) -> Result<ServiceReport, ServiceError> {
    if !options.dry_run {
        native_only(options)?;
    }
    install_with(options, &mut SystemRunner::default())
}

/// [`install`] with commands run by `runner`.
pub fn install_with(options: &ServiceOptions, runner: &mut dyn Runner) -> Result<ServiceReport, ServiceError> {
    let config = load_config(options)?;
    let path = options.service_file();
    let contents = contents(options, &config)?;
    let mut steps = Vec::new();
    if (options.manager, options.scope) == (Manager::Launchd, Scope::User) {
        // gui/<uid> exists only while the user is logged in at the Mac's screen; over SSH there is
        // none, and bootstrap would fail after the files were written.
        let domain = options.launchd_domain();
        steps.push(Step::Require {
            command: options.launchctl(&["print", &domain], true),
            hint: format!(
                "launchd has no {domain} domain: user {uid} is not logged in at this Mac's screen (an SSH session has none), and a launchd agent runs in that login session. Log in at the Mac (or through Screen Sharing) and run this again, or install a daemon that starts at boot instead: sudo layad service install --system",
                uid = options.uid
            ),
        });
    }
    steps.push(Step::CreateDir {
        path: parent(&path),
        owner: None,
    });
    let account = options.run_as.clone().filter(|_| options.scope == Scope::System);
    match (options.manager, options.scope) {
        // launchd does not create the directory of StandardOutPath.
        (Manager::Launchd, _) => steps.push(Step::CreateDir {
            path: parent(&options.log_file()),
            owner: account,
        }),
        // Under ProtectSystem=strict a cache directory that does not exist cannot be created
        // later, and ReadWritePaths= only opens one that does.
        (Manager::Systemd, Scope::System) => {
            for dir in std::iter::once(&options.hf_home).chain(&options.hf_hub_cache) {
                steps.push(Step::CreateDir {
                    path: dir.clone(),
                    owner: account.clone(),
                });
            }
        }
        (Manager::Systemd, Scope::User) => {}
    }
    steps.push(Step::Write {
        path: path.clone(),
        contents,
    });
    let file = path.display().to_string();
    match options.manager {
        Manager::Launchd => {
            let domain = options.launchd_domain();
            let target = format!("{domain}/{LAUNCHD_LABEL}");
            // Unload the old job first so the new plist takes effect; it may not be loaded.
            steps.push(Step::Run(options.launchctl(&["bootout", &target], false)));
            // bootout returns while the old layad may still be draining (up to its ExitTimeOut);
            // bootstrapping meanwhile fails with "Bootstrap failed: 5: Input/output error".
            steps.push(Step::WaitUntilGone {
                command: options.launchctl(&["print", &target], false),
                timeout: Duration::from_secs(stop_timeout(&config)) + GONE_MARGIN,
            });
            steps.push(Step::Run(options.launchctl(&["enable", &target], true)));
            steps.push(Step::Run(options.launchctl(&["bootstrap", &domain, &file], true)));
        }
        Manager::Systemd => {
            steps.push(Step::Run(options.systemctl(&["daemon-reload"], true)));
            // `enable` then `restart` rather than `enable --now`: a reinstall must replace a
            // running old instance, and restart starts a stopped one.
            steps.push(Step::Run(options.systemctl(&["enable", SYSTEMD_UNIT], true)));
            steps.push(Step::Run(options.systemctl(&["restart", SYSTEMD_UNIT], true)));
        }
    }
    let notes = install_notes(options, &config);
    perform(options, "install", steps, notes, runner)
}

/// Stops the service and removes its file; with `dry_run`, only reports what it would do.
pub fn uninstall(options: &ServiceOptions) -> Result<ServiceReport, ServiceError> {
    if !options.dry_run {
        native_only(options)?;
    }
    uninstall_with(options, &mut SystemRunner::default())
}

/// [`uninstall`] with commands run by `runner`.
pub fn uninstall_with(options: &ServiceOptions, runner: &mut dyn Runner) -> Result<ServiceReport, ServiceError> {
    let path = options.service_file();
    let steps = match options.manager {
        Manager::Launchd => {
            let target = format!("{}/{LAUNCHD_LABEL}", options.launchd_domain());
            vec![
                Step::Run(options.launchctl(&["bootout", &target], false)),
                Step::Remove { path },
            ]
        }
        Manager::Systemd => vec![
            Step::Run(options.systemctl(&["disable", "--now", SYSTEMD_UNIT], false)),
            Step::Remove { path },
            Step::Run(options.systemctl(&["daemon-reload"], true)),
        ],
    };
    let notes = match options.manager {
        Manager::Launchd => vec![format!(
            "the log {} is kept; delete it yourself if you no longer want it",
            options.log_file().display()
        )],
        Manager::Systemd => Vec::new(),
    };
    perform(options, "uninstall", steps, notes, runner)
}

/// Asks the manager about the service (`launchctl print` / `systemctl status`).
pub fn status(options: &ServiceOptions) -> Result<ServiceStatus, ServiceError> {
    native_only(options)?;
    status_with(options, &mut SystemRunner::default())
}

/// Refuses to run another OS's manager commands here.
fn native_only(options: &ServiceOptions) -> Result<(), ServiceError> {
    if Manager::native() == Some(options.manager) {
        Ok(())
    } else {
        Err(ServiceError::ForeignManager {
            manager: options.manager.name(),
            os: std::env::consts::OS,
        })
    }
}

/// [`status`] with the command run by `runner`.
pub fn status_with(options: &ServiceOptions, runner: &mut dyn Runner) -> Result<ServiceStatus, ServiceError> {
    let command = match options.manager {
        Manager::Launchd => options.launchctl(
            &["print", &format!("{}/{LAUNCHD_LABEL}", options.launchd_domain())],
            false,
        ),
        Manager::Systemd => options.systemctl(&["status", "--no-pager", SYSTEMD_UNIT], false),
    };
    let service_file = options.service_file();
    let output = runner.run(&command)?;
    Ok(ServiceStatus {
        installed: service_file.is_file(),
        service_file,
        command,
        output,
    })
}

/// Performs `steps` in order unless this is a dry run.
fn perform(
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

/// The directory a service file or log file lives in.
fn parent(path: &Path) -> PathBuf {
    path.parent().map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
}

/// The configuration the service will run with: the file, no `LAYAD_*` variables (the service does
/// not inherit the installing shell's), no `LAYA_API_KEY`. Loading it here refuses to install a
/// service that would only crash-loop.
fn load_config(options: &ServiceOptions) -> Result<Config, ServiceError> {
    let sources = Sources {
        file: options.config.clone(),
        env: Vec::new(),
        flags: Flags::default(),
    };
    Ok(Config::load(&sources)?)
}

/// How long the manager waits after SIGTERM: the drain, the workers' stop, and a margin.
fn stop_timeout(config: &Config) -> u64 {
    let total = config.server.shutdown_grace + config.workers.stop_timeout + STOP_MARGIN;
    total.as_secs() + u64::from(total.subsec_nanos() > 0)
}

/// `layad serve [--config FILE]`, program first.
fn program_arguments(options: &ServiceOptions) -> Result<Vec<String>, ServiceError> {
    let mut args = vec![text("the layad executable", &options.program)?, "serve".to_owned()];
    if let Some(config) = &options.config {
        args.push("--config".to_owned());
        args.push(text("the config file", config)?);
    }
    Ok(args)
}

/// The environment the service gets: the Hugging Face cache location, nothing secret.
fn environment(options: &ServiceOptions) -> Result<Vec<(&'static str, String)>, ServiceError> {
    let mut vars = vec![("HF_HOME", text("HF_HOME", &options.hf_home)?)];
    if let Some(cache) = &options.hf_hub_cache {
        vars.push(("HF_HUB_CACHE", text("HF_HUB_CACHE", cache)?));
    }
    Ok(vars)
}

/// A path as text that is safe inside a service file.
fn text(what: &'static str, path: &Path) -> Result<String, ServiceError> {
    let value = path.to_string_lossy().into_owned();
    if value.contains(['\n', '\r', '\0']) {
        return Err(ServiceError::UnsafeValue { what, value });
    }
    Ok(value)
}

fn render_plist(options: &ServiceOptions, config: &Config) -> Result<String, ServiceError> {
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

fn render_unit(options: &ServiceOptions, config: &Config) -> Result<String, ServiceError> {
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

/// Replaces each `@NAME@` in `template`; a line holding only a placeholder whose value is empty is
/// dropped. Every placeholder must have a value and every value a placeholder.
fn fill(template: &str, values: &[(&str, String)]) -> Result<String, ServiceError> {
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
fn placeholders(template: &str) -> Vec<&str> {
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

/// What the installing user should know.
fn install_notes(options: &ServiceOptions, config: &Config) -> Vec<String> {
    let mut notes = Vec::new();
    if options.config.is_none() {
        notes.push("no --config: the service runs with the built-in defaults (config/README.md)".to_owned());
    }
    let api_key_var = layad_config::load::API_KEY_VAR;
    if options.shell_variables.iter().any(|v| v == api_key_var) {
        notes.push(match &config.server.api_key_file {
            Some(file) => format!(
                "{api_key_var} is set in this shell; the service does not get it and reads the key from {} (server.api_key_file)",
                file.display()
            ),
            None => format!(
                "{api_key_var} is set in this shell but is not written into the service file, so the service runs without a key: put the key in a file only you can read (chmod 600) and set server.api_key_file in the config"
            ),
        });
    }
    let layad_vars: Vec<&str> = options
        .shell_variables
        .iter()
        .filter(|v| *v != api_key_var)
        .map(String::as_str)
        .collect();
    if !layad_vars.is_empty() {
        notes.push(format!(
            "{} set in this shell but the service does not inherit it: put the setting in the config file",
            layad_vars.join(", ")
        ));
    }
    if let Some(file) = &config.server.api_key_file
        && let Ok(meta) = std::fs::metadata(file)
        && meta.permissions().mode() & 0o077 != 0
    {
        notes.push(format!(
            "the key file {} can be read by other users: chmod 600 it",
            file.display()
        ));
    }
    match (options.manager, options.scope) {
        (Manager::Launchd, Scope::User) => notes.push(format!(
            "a launchd agent runs while you are logged in; logs go to {}",
            options.log_file().display()
        )),
        (Manager::Launchd, Scope::System) => notes.push(format!("logs go to {}", options.log_file().display())),
        (Manager::Systemd, Scope::User) => {
            let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(options.uid))
                .ok()
                .flatten()
                .map(|user| user.name);
            if let Some(user) = user
                && !Path::new("/var/lib/systemd/linger").join(&user).exists()
            {
                notes.push(format!(
                    "a user service starts when you log in; to start it at boot run `loginctl enable-linger {user}`"
                ));
            }
            notes.push("logs: journalctl --user -u layad".to_owned());
        }
        (Manager::Systemd, Scope::System) => notes.push("logs: journalctl -u layad".to_owned()),
    }
    notes
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
    fn templates_name_their_placeholders() {
        assert_eq!(
            placeholders(PLIST_TEMPLATE),
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

    #[test]
    fn xml_is_escaped() {
        assert_eq!(xml_escape("a&b<c>\"'"), "a&amp;b&lt;c&gt;&quot;&apos;");
    }

    #[test]
    fn stop_timeout_covers_drain_and_worker_stop() {
        let config = Config::default();
        // 30 s grace + 10 s worker stop + 5 s margin.
        assert_eq!(stop_timeout(&config), 45);
    }

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

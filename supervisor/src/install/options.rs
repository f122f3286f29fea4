//! What an install, uninstall or status works with: the service manager, user or system scope, the
//! files' places and the program, environment and account the service runs with; and what can fail.

use std::path::{Path, PathBuf};

use layad_config::ConfigError;

/// The launchd label, and the plist's file name without `.plist`.
pub const LAUNCHD_LABEL: &str = "ai.layad";
/// The systemd unit name.
pub const SYSTEMD_UNIT: &str = "layad.service";

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

    pub(super) fn name(self) -> &'static str {
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

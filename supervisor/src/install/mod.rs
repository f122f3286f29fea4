//! `layad service install|uninstall|status`: layad as a launchd job (macOS) or a systemd unit
//! (Linux) that starts at login or boot and restarts after a failure, from the templates in `deploy/`.
//!
//! Both flavours are generated on any OS (so both are tested on Linux); only running `launchctl` or
//! `systemctl` is tied to the OS. Everything an install does is a list of [`Step`]s, which
//! `--dry-run` prints instead of performing. The API key is never written into a service file: the
//! service reads it from `server.api_key_file`.
//!
//! Layout: [`options`] (manager, scope, paths; errors), [`steps`] (what an operation does, and doing
//! it), [`contents`] (what any service file holds), [`launchd`] and [`systemd`] (their files and
//! commands). This module holds the three operations.

pub mod contents;
pub mod launchd;
pub mod options;
pub mod steps;
pub mod systemd;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use layad_config::{Config, Flags, Sources};

pub use options::{LAUNCHD_LABEL, Manager, SYSTEMD_UNIT, Scope, ServiceError, ServiceOptions};
pub use steps::{CommandOutput, ManagerCommand, Runner, ServiceReport, ServiceStatus, Step, SystemRunner};

use steps::perform;

/// The service file's path and content for `options`, without touching anything.
pub fn render(options: &ServiceOptions) -> Result<(PathBuf, String), ServiceError> {
    let config = load_config(options)?;
    Ok((options.service_file(), contents(options, &config)?))
}

/// The plist or unit text for `options` running with `config`.
fn contents(options: &ServiceOptions, config: &Config) -> Result<String, ServiceError> {
    match options.manager {
        Manager::Launchd => launchd::render(options, config),
        Manager::Systemd => systemd::render(options, config),
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
    let mut steps = match options.manager {
        Manager::Launchd => launchd::preconditions(options),
        Manager::Systemd => Vec::new(),
    };
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
    steps.extend(match options.manager {
        Manager::Launchd => launchd::load_steps(options, &config, &file),
        Manager::Systemd => systemd::load_steps(options),
    });
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
        Manager::Launchd => launchd::unload_steps(options, path),
        Manager::Systemd => systemd::unload_steps(options, path),
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
        Manager::Launchd => launchd::status_command(options),
        Manager::Systemd => systemd::status_command(options),
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

//! `layad service install|uninstall|status` as steps: `--dry-run` prints the files and commands and
//! touches nothing; a real user-scope install (into a temporary home, with `launchctl`/`systemctl`
//! recorded instead of run) writes exactly what the dry run showed and runs the commands in order.
//! A launchd reinstall against a stand-in `launchctl` process waits for the old job to be gone
//! before it bootstraps, and over SSH (no GUI domain) stops before writing anything.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use layad::install::{
    CommandOutput, Manager, ManagerCommand, Runner, Scope, ServiceError, ServiceOptions, Step, SystemRunner, install,
    install_with, render, status_with, uninstall_with,
};

/// Records commands and answers each with the exit code `fail` gives it (0 by default).
#[derive(Default)]
struct Recorder {
    ran: Vec<String>,
    fail: Vec<(&'static str, i32)>,
}

impl Runner for Recorder {
    fn run(&mut self, command: &ManagerCommand) -> Result<CommandOutput, ServiceError> {
        let line = command.to_string();
        let code = self
            .fail
            .iter()
            .find(|(needle, _)| line.contains(needle))
            .map_or(0, |(_, code)| *code);
        self.ran.push(line);
        Ok(CommandOutput {
            code: Some(code),
            stdout: "state = running\n".to_owned(),
            stderr: if code == 0 { String::new() } else { "boom".to_owned() },
        })
    }
}

/// A runner for dry runs, which must not run anything.
struct Forbidden;

impl Runner for Forbidden {
    fn run(&mut self, command: &ManagerCommand) -> Result<CommandOutput, ServiceError> {
        panic!("a dry run ran {command}");
    }
}

fn options(manager: Manager, home: &Path, dry_run: bool) -> ServiceOptions {
    ServiceOptions {
        manager,
        scope: Scope::User,
        config: None,
        dry_run,
        program: PathBuf::from("/opt/layad/bin/layad"),
        home: home.to_path_buf(),
        uid: 501,
        run_as: None,
        hf_home: home.join(".cache/huggingface"),
        hf_hub_cache: None,
        shell_variables: vec!["LAYA_API_KEY".to_owned(), "LAYAD_SERVER__LISTEN".to_owned()],
    }
}

/// Every path under `dir`.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path.clone());
            }
            found.push(path);
        }
    }
    found
}

#[test]
fn a_dry_run_prints_the_file_and_commands_and_changes_nothing() {
    for manager in [Manager::Launchd, Manager::Systemd] {
        let home = tempfile::tempdir().expect("tempdir");
        let options = options(manager, home.path(), true);
        let report = install_with(&options, &mut Forbidden).expect("dry run");
        assert!(
            tree(home.path()).is_empty(),
            "{manager:?}: the dry run wrote {:?}",
            tree(home.path())
        );

        let (path, contents) = render(&options).expect("render");
        let printed = report.to_string();
        assert!(
            printed.contains(&format!("would write {} (mode 644):\n{contents}", path.display())),
            "{printed}"
        );
        let expected_commands: &[&str] = match manager {
            Manager::Launchd => &[
                "would run: launchctl print gui/501   (your login session's launchd domain must exist)",
                "would run: launchctl bootout gui/501/ai.layad",
                "would run: launchctl print gui/501/ai.layad   (until it fails: the old job has exited; at most 55 s)",
                "would run: launchctl enable gui/501/ai.layad",
                "would run: launchctl bootstrap gui/501 ",
            ],
            Manager::Systemd => &[
                "would run: systemctl --user daemon-reload",
                "would run: systemctl --user enable layad.service",
                "would run: systemctl --user restart layad.service",
            ],
        };
        let mut at = 0;
        for command in expected_commands {
            let found = printed[at..]
                .find(command)
                .unwrap_or_else(|| panic!("{command} missing in:\n{printed}"));
            at += found + command.len();
        }
        assert!(
            printed.contains("note: LAYA_API_KEY is set in this shell but is not written"),
            "{printed}"
        );
        assert!(
            printed.contains("note: LAYAD_SERVER__LISTEN set in this shell"),
            "{printed}"
        );

        let report = uninstall_with(&options, &mut Forbidden).expect("dry uninstall");
        assert!(report.to_string().contains(&format!("would remove {}", path.display())));
        assert!(tree(home.path()).is_empty());
    }
}

#[test]
fn a_systemd_user_install_writes_what_the_dry_run_showed() {
    let home = tempfile::tempdir().expect("tempdir");
    let dry = install_with(&options(Manager::Systemd, home.path(), true), &mut Forbidden).expect("dry run");
    let options = options(Manager::Systemd, home.path(), false);
    let mut recorder = Recorder::default();
    let report = install_with(&options, &mut recorder).expect("install");
    assert_eq!(report.steps, dry.steps, "the dry run shows exactly what install does");

    let unit = home.path().join(".config/systemd/user/layad.service");
    let (_, expected) = render(&options).expect("render");
    assert_eq!(std::fs::read_to_string(&unit).expect("unit written"), expected);
    assert_eq!(
        std::fs::metadata(&unit).expect("meta").permissions().mode() & 0o777,
        0o644
    );
    assert_eq!(
        recorder.ran,
        [
            "systemctl --user daemon-reload",
            "systemctl --user enable layad.service",
            "systemctl --user restart layad.service",
        ]
    );
    assert!(
        report
            .to_string()
            .contains("ran: systemctl --user restart layad.service")
    );

    let status = status_with(&options, &mut recorder).expect("status");
    assert!(status.installed);
    assert_eq!(
        status.command.to_string(),
        "systemctl --user status --no-pager layad.service"
    );
    assert!(status.to_string().contains("state = running"));

    let mut recorder = Recorder::default();
    uninstall_with(&options, &mut recorder).expect("uninstall");
    assert!(!unit.exists());
    assert_eq!(
        recorder.ran,
        [
            "systemctl --user disable --now layad.service",
            "systemctl --user daemon-reload"
        ]
    );
}

#[test]
fn a_launchd_agent_install_bootstraps_after_unloading_the_old_job() {
    let home = tempfile::tempdir().expect("tempdir");
    let options = options(Manager::Launchd, home.path(), false);
    // bootout fails when no job is loaded (a first install): that must not stop the install; then
    // launchd does not know the job (113), so there is nothing to wait for.
    let mut recorder = Recorder {
        fail: vec![("bootout", 3), ("print gui/501/ai.layad", 113)],
        ..Recorder::default()
    };
    install_with(&options, &mut recorder).expect("install");
    let plist = home.path().join("Library/LaunchAgents/ai.layad.plist");
    assert!(plist.is_file());
    assert!(
        home.path().join("Library/Logs/layad").is_dir(),
        "launchd does not create the log directory"
    );
    assert_eq!(
        recorder.ran,
        [
            "launchctl print gui/501".to_owned(),
            "launchctl bootout gui/501/ai.layad".to_owned(),
            "launchctl print gui/501/ai.layad".to_owned(),
            "launchctl enable gui/501/ai.layad".to_owned(),
            format!("launchctl bootstrap gui/501 {}", plist.display()),
        ]
    );

    let mut recorder = Recorder::default();
    uninstall_with(&options, &mut recorder).expect("uninstall");
    assert!(!plist.exists());
    assert_eq!(recorder.ran, ["launchctl bootout gui/501/ai.layad"]);
}

#[test]
fn a_failing_manager_command_stops_with_its_message() {
    let home = tempfile::tempdir().expect("tempdir");
    let options = options(Manager::Systemd, home.path(), false);
    let mut recorder = Recorder {
        fail: vec![("restart", 1)],
        ..Recorder::default()
    };
    let err = install_with(&options, &mut recorder).expect_err("restart failed");
    let message = err.to_string();
    assert!(
        message.contains("`systemctl --user restart layad.service` failed (exit code 1): boom"),
        "{message}"
    );
}

#[test]
fn a_config_that_does_not_load_installs_nothing() {
    let home = tempfile::tempdir().expect("tempdir");
    let config = home.path().join("layad.toml");
    std::fs::write(&config, "[server]\nlisen = \"0.0.0.0:1\"\n").expect("config");
    let mut options = options(Manager::Systemd, home.path(), false);
    options.config = Some(config.clone());
    let err = install_with(&options, &mut Forbidden).expect_err("bad config");
    assert!(matches!(err, ServiceError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("server.lisen"), "{err}");
    assert_eq!(tree(home.path()), [config]);
}

#[test]
fn the_other_systems_manager_is_only_ever_a_dry_run() {
    let foreign = match Manager::native() {
        Some(Manager::Launchd) => Manager::Systemd,
        _ => Manager::Launchd,
    };
    let home = tempfile::tempdir().expect("tempdir");
    let err = install(&options(foreign, home.path(), false)).expect_err("foreign manager");
    assert!(matches!(err, ServiceError::ForeignManager { .. }), "{err:?}");
    assert!(tree(home.path()).is_empty());
    let report = install(&options(foreign, home.path(), true)).expect("a dry run works anywhere");
    assert!(report.steps.iter().any(|s| matches!(s, Step::Write { .. })));
}

#[test]
fn a_system_install_prepares_the_cache_for_the_service_account() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut options = options(Manager::Systemd, home.path(), true);
    options.scope = Scope::System;
    options.run_as = Some("ada".to_owned());
    options.hf_hub_cache = Some(PathBuf::from("/srv/models/hub"));
    let report = install_with(&options, &mut Forbidden).expect("dry run");
    for dir in [options.hf_home.clone(), PathBuf::from("/srv/models/hub")] {
        assert!(
            report.steps.contains(&Step::CreateDir {
                path: dir.clone(),
                owner: Some("ada".to_owned()),
            }),
            "{dir:?} missing from {:?}",
            report.steps
        );
    }
    let printed = report.to_string();
    assert!(
        printed.contains("would write /etc/systemd/system/layad.service"),
        "{printed}"
    );
    assert!(printed.contains("would run: systemctl daemon-reload\n"), "{printed}");
    assert!(
        printed.contains("would run: systemctl restart layad.service\n"),
        "{printed}"
    );
    assert!(tree(home.path()).is_empty());
}

#[test]
fn a_system_install_without_root_says_to_use_sudo_and_changes_nothing() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut options = options(Manager::Systemd, home.path(), false);
    options.scope = Scope::System;
    let err = install_with(&options, &mut Forbidden).expect_err("uid 501 is not root");
    assert!(err.to_string().contains("sudo layad service install --system"), "{err}");
    let err = uninstall_with(&options, &mut Forbidden).expect_err("uid 501 is not root");
    assert!(
        err.to_string().contains("sudo layad service uninstall --system"),
        "{err}"
    );
    assert!(tree(home.path()).is_empty());
}

/// A stand-in for macOS's `launchctl`, keeping launchd's state in files beside it: `console` (user
/// 501 is logged in at the screen, so gui/501 exists), `loaded` (the job is loaded) and `stopping`
/// (how many more `print`s still find a job that bootout is stopping). Like launchd, bootstrap
/// fails with error 5 while the old job is still stopping. Every call is appended to `calls`.
const FAKE_LAUNCHCTL: &str = r#"#!/bin/sh
dir="${0%/*}"
echo "$*" >> "$dir/calls"
stopping=$(cat "$dir/stopping" 2>/dev/null || echo 0)
case "$1 $2" in
"print gui/501")
    [ -e "$dir/console" ] && exit 0
    echo "Could not find domain for user gui: 501" >&2; exit 113 ;;
"print gui/501/ai.layad")
    if [ "$stopping" -gt 0 ]; then echo $((stopping - 1)) > "$dir/stopping"; echo "state = stopping"; exit 0; fi
    [ -e "$dir/loaded" ] && { echo "state = running"; exit 0; }
    echo 'Could not find service "ai.layad" in domain for user gui: 501' >&2; exit 113 ;;
"bootout gui/501/ai.layad")
    [ -e "$dir/loaded" ] || { echo "Boot-out failed: 3: No such process" >&2; exit 3; }
    rm "$dir/loaded"; echo 3 > "$dir/stopping"; exit 0 ;;
"enable gui/501/ai.layad") exit 0 ;;
"bootstrap gui/501")
    [ "$stopping" -gt 0 ] && { echo "Bootstrap failed: 5: Input/output error" >&2; exit 5; }
    touch "$dir/loaded"; exit 0 ;;
esac
echo "unexpected: $*" >&2; exit 64
"#;

/// A directory holding the stand-in `launchctl` and its state.
fn fake_launchctl() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let program = dir.path().join("launchctl");
    std::fs::write(&program, FAKE_LAUNCHCTL).expect("write launchctl");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// Runs commands with `dir` first on `PATH`.
fn first_on_path(dir: &Path) -> SystemRunner {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path));
    SystemRunner {
        search_path: Some(std::env::join_paths(dirs).expect("PATH")),
    }
}

fn calls(fake: &Path) -> Vec<String> {
    std::fs::read_to_string(fake.join("calls"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_launchd_reinstall_waits_for_the_old_job_before_bootstrapping() {
    let fake = fake_launchctl();
    std::fs::write(fake.path().join("console"), "").expect("console");
    std::fs::write(fake.path().join("loaded"), "").expect("loaded");
    let home = tempfile::tempdir().expect("tempdir");
    let options = options(Manager::Launchd, home.path(), false);
    let mut launchctl = first_on_path(fake.path());
    install_with(&options, &mut launchctl).expect("reinstall");
    let plist = home.path().join("Library/LaunchAgents/ai.layad.plist");
    assert!(plist.is_file());
    assert_eq!(
        calls(fake.path()),
        [
            "print gui/501".to_owned(),
            "bootout gui/501/ai.layad".to_owned(),
            // Three answers "still stopping", then launchd no longer knows it.
            "print gui/501/ai.layad".to_owned(),
            "print gui/501/ai.layad".to_owned(),
            "print gui/501/ai.layad".to_owned(),
            "print gui/501/ai.layad".to_owned(),
            "enable gui/501/ai.layad".to_owned(),
            format!("bootstrap gui/501 {}", plist.display()),
        ]
    );
    assert!(fake.path().join("loaded").exists(), "the new job is loaded");

    // The stand-in is faithful: bootstrapping at once, as install used to, fails as launchd does.
    std::fs::write(fake.path().join("stopping"), "3").expect("stopping");
    let bootstrap = ManagerCommand {
        program: "launchctl".to_owned(),
        args: vec![
            "bootstrap".to_owned(),
            "gui/501".to_owned(),
            plist.display().to_string(),
        ],
        must_succeed: true,
    };
    let output = launchctl.run(&bootstrap).expect("run");
    assert_eq!(
        (output.code, output.stderr.trim()),
        (Some(5), "Bootstrap failed: 5: Input/output error")
    );
}

#[test]
fn over_ssh_a_launchd_agent_install_says_to_log_in_or_use_system_and_writes_nothing() {
    // No console login: launchd has no gui/501 domain.
    let fake = fake_launchctl();
    let home = tempfile::tempdir().expect("tempdir");
    let options = options(Manager::Launchd, home.path(), false);
    let mut launchctl = first_on_path(fake.path());
    let error = install_with(&options, &mut launchctl).expect_err("no GUI session");
    assert!(matches!(error, ServiceError::Precondition { .. }), "{error:?}");
    let message = error.to_string();
    for needle in [
        "launchd has no gui/501 domain",
        "an SSH session has none",
        "sudo layad service install --system",
        "Could not find domain for user gui: 501",
    ] {
        assert!(message.contains(needle), "{needle:?} missing: {message}");
    }
    assert_eq!(calls(fake.path()), ["print gui/501"]);
    assert!(tree(home.path()).is_empty(), "nothing written: {:?}", tree(home.path()));
}

//! The systemd units `layad service install` writes, generated on any OS: the directives a
//! restartable, drained, hardened service needs, no API key, and `systemd-analyze verify` passing
//! where that tool is installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use layad::install::{Manager, Scope, ServiceOptions, render};

fn options(scope: Scope, home: &Path, config: Option<PathBuf>) -> ServiceOptions {
    ServiceOptions {
        manager: Manager::Systemd,
        scope,
        config,
        dry_run: true,
        // An executable that exists, so `systemd-analyze verify` can check ExecStart.
        program: std::env::current_exe().expect("test executable"),
        home: home.to_path_buf(),
        uid: 1000,
        run_as: None,
        hf_home: home.join(".cache/hugging face"),
        hf_hub_cache: None,
        shell_variables: vec!["LAYA_API_KEY".to_owned()],
    }
}

/// `(section, key, value)` for every directive.
fn directives(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let (key, value) = line.split_once('=').expect("key=value");
        out.push((section.clone(), key.to_owned(), value.to_owned()));
    }
    out
}

fn value<'a>(directives: &'a [(String, String, String)], section: &str, key: &str) -> Vec<&'a str> {
    directives
        .iter()
        .filter(|(s, k, _)| s == section && k == key)
        .map(|(_, _, v)| v.as_str())
        .collect()
}

fn config_with_key(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("api-key"), "s3cret-key-value").expect("key");
    let config = dir.join("layad.toml");
    std::fs::write(&config, "[server]\napi_key_file = \"api-key\"\n").expect("config");
    config
}

#[test]
fn the_user_unit_restarts_on_failure_and_drains_on_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config_with_key(dir.path());
    let home = dir.path().join("home");
    let options = options(Scope::User, &home, Some(config.clone()));
    let (path, text) = render(&options).expect("render");
    assert_eq!(path, home.join(".config/systemd/user/layad.service"));
    let d = directives(&text);

    assert_eq!(value(&d, "Service", "Type"), ["exec"]);
    let program = options.program.to_str().expect("utf-8");
    assert_eq!(
        value(&d, "Service", "ExecStart"),
        [format!("{program} serve --config {}", config.display()).as_str()]
    );
    assert_eq!(value(&d, "Service", "Restart"), ["on-failure"]);
    assert_eq!(value(&d, "Service", "RestartSec"), ["5s"]);
    assert_eq!(value(&d, "Service", "KillSignal"), ["SIGTERM"]);
    // 30 s shutdown grace + 10 s worker stop timeout + 5 s.
    assert_eq!(value(&d, "Service", "TimeoutStopSec"), ["45s"]);
    let hf_home = format!("\"HF_HOME={}\"", home.join(".cache/hugging face").display());
    assert_eq!(value(&d, "Service", "Environment"), [hf_home.as_str()]);
    assert_eq!(value(&d, "Service", "NoNewPrivileges"), ["yes"]);
    assert!(
        value(&d, "Service", "ProtectSystem").is_empty(),
        "needs user namespaces in a user unit"
    );
    assert_eq!(value(&d, "Install", "WantedBy"), ["default.target"]);
    assert!(!text.contains("s3cret") && !text.contains("LAYA_API_KEY"));

    verify(&text, dir.path(), Scope::User);
}

#[test]
fn the_system_unit_is_hardened_and_can_write_only_the_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let mut options = options(Scope::System, &home, None);
    options.run_as = Some("nobody-here".to_owned());
    options.hf_hub_cache = Some(PathBuf::from("/srv/models/hub"));
    let (path, text) = render(&options).expect("render");
    assert_eq!(path, Path::new("/etc/systemd/system/layad.service"));
    let d = directives(&text);

    assert_eq!(value(&d, "Service", "User"), ["nobody-here"]);
    assert_eq!(value(&d, "Service", "Restart"), ["on-failure"]);
    for (key, expected) in [
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "read-only"),
        ("ProtectKernelTunables", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("CapabilityBoundingSet", ""),
        ("CacheDirectory", "layad"),
    ] {
        assert_eq!(value(&d, "Service", key), [expected], "{key}");
    }
    let cache = home.join(".cache/hugging face");
    assert_eq!(
        value(&d, "Service", "ReadWritePaths"),
        [format!("\"-{}\" -/srv/models/hub", cache.display()).as_str()]
    );
    assert_eq!(value(&d, "Unit", "After"), ["network-online.target"]);
    assert_eq!(value(&d, "Install", "WantedBy"), ["multi-user.target"]);

    // verify looks the account up, so check the unit as it would run as root.
    options.run_as = None;
    let (_, as_root) = render(&options).expect("render");
    assert!(value(&directives(&as_root), "Service", "User").is_empty());
    verify(&as_root, dir.path(), Scope::System);
}

#[test]
fn specifiers_and_variables_in_paths_stay_literal() {
    let mut options = options(Scope::User, Path::new("/home/ada"), None);
    options.program = PathBuf::from("/opt/100%/$layad");
    options.hf_home = PathBuf::from("/data/50%");
    let (_, text) = render(&options).expect("render");
    let d = directives(&text);
    assert_eq!(value(&d, "Service", "ExecStart"), ["/opt/100%%/$$layad serve"]);
    assert_eq!(value(&d, "Service", "Environment"), ["HF_HOME=/data/50%%"]);
}

#[test]
fn a_path_with_a_line_break_is_refused() {
    let mut options = options(Scope::User, Path::new("/home/ada"), None);
    options.hf_home = PathBuf::from("/data\nExecStartPre=/bin/sh");
    let err = render(&options).expect_err("a newline would add a directive");
    assert!(err.to_string().contains("line break"), "{err}");
}

/// `systemd-analyze verify` on the unit when the tool is installed; a note otherwise.
fn verify(text: &str, dir: &Path, scope: Scope) {
    let units = dir.join(format!("units-{scope:?}"));
    std::fs::create_dir_all(&units).expect("mkdir");
    let unit = units.join("layad.service");
    std::fs::write(&unit, text).expect("write unit");
    let runtime = dir.join("runtime");
    std::fs::create_dir_all(&runtime).expect("mkdir");
    let mut command = Command::new("systemd-analyze");
    if scope == Scope::User {
        // A user manager needs a runtime directory even to verify.
        command.arg("--user").env("XDG_RUNTIME_DIR", &runtime);
    }
    let output = match command.arg("verify").arg(&unit).output() {
        Ok(output) => output,
        Err(_) => {
            eprintln!("note: systemd-analyze is not installed here; skipped `systemd-analyze verify`");
            return;
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "systemd-analyze verify failed:\n{stderr}");
    // verify exits 0 on unknown keys and bad values; they show up as warnings naming the unit.
    let about_unit: Vec<&str> = stderr.lines().filter(|l| l.contains("layad.service")).collect();
    assert!(
        about_unit.is_empty(),
        "warnings about the unit:\n{}",
        about_unit.join("\n")
    );
}

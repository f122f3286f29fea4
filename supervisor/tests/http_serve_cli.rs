//! The `layad` binary's commands that need no worker: `check`, `--version`, and a misspelled key
//! refused by both `check` and `serve` with a message naming it and the file. (`serve` with workers
//! is covered by the system tests in tests/.)

use std::path::Path;
use std::process::{Command, Output};

fn layad() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_layad"));
    // Only the fixture cache, whatever the environment running the tests holds.
    command
        .env("HF_HOME", layad_system_tests::goldens::fixtures_dir().join("hf-cache"))
        .env_remove("HF_HUB_CACHE")
        .env_remove("LAYA_API_KEY")
        .env_remove("LAYAD_CONFIG");
    for (name, _) in std::env::vars() {
        if name.starts_with("LAYAD_") || name.starts_with("LAYA_") {
            command.env_remove(name);
        }
    }
    command
}

fn run(command: &mut Command) -> Output {
    command.output().expect("layad runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn version_is_printed() {
    let output = run(layad().arg("--version"));
    assert!(output.status.success());
    assert_eq!(
        text(&output.stdout).trim(),
        format!("layad {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn check_opens_every_checkpoint_of_the_defaults() {
    let output = run(layad().arg("check"));
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", text(&output.stderr));
    assert!(stdout.contains("configuration: built-in defaults"), "{stdout}");
    assert!(stdout.contains("listen    127.0.0.1:8642"), "{stdout}");
    for name in ["english", "multilingual", "typed-decisions"] {
        assert!(stdout.contains(&format!("{name}: ok")), "{name}: {stdout}");
    }
    assert!(
        stdout.contains("revision  7a1e5eed0f1c7ee5c0de5eed0f1c7ee5c0de0320"),
        "{stdout}"
    );
}

#[test]
fn check_fails_when_a_checkpoint_is_missing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("layad.toml");
    std::fs::write(&config, "[checkpoints]\nenglish = \"no-such-dir\"\n").expect("write");
    let output = run(layad().arg("check").arg("--config").arg(&config));
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("english: FAILED"), "{stdout}");
    assert!(
        stdout.contains(&dir.path().join("no-such-dir").display().to_string()),
        "{stdout}"
    );
    assert!(stdout.contains("multilingual: ok"), "{stdout}");
}

fn misspelled_config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("layad.toml");
    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:0\"\n[[pool]]\nname = \"gpu\"\nworkerz = 2\n",
    )
    .expect("write");
    config
}

#[test]
fn a_misspelled_key_fails_check_and_serve_naming_key_and_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = misspelled_config(dir.path());
    let expected = format!("pool[0].workerz (in {})", config.display());
    let check = run(layad().arg("check").arg("--config").arg(&config));
    assert_eq!(check.status.code(), Some(1));
    assert!(text(&check.stdout).contains(&expected), "{}", text(&check.stdout));
    let serve = run(layad().arg("serve").arg("--config").arg(&config));
    assert_eq!(serve.status.code(), Some(1));
    assert!(text(&serve.stderr).contains(&expected), "{}", text(&serve.stderr));
    // The same file through LAYAD_CONFIG.
    let serve = run(layad().arg("serve").env("LAYAD_CONFIG", &config));
    assert!(text(&serve.stderr).contains(&expected), "{}", text(&serve.stderr));
}

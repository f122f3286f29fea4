//! The launchd plist `layad service install` writes, generated on any OS: it parses as a plist,
//! carries the keys launchd needs with the right values, and never holds the API key.

use std::path::{Path, PathBuf};
use std::process::Command;

use layad::install::{LAUNCHD_LABEL, Manager, Scope, ServiceOptions, render};
use plist::{Dictionary, Value};

/// A config with a non-default shutdown grace and a key file, in a directory whose name needs
/// escaping in XML.
fn config_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sub = dir.path().join("keys & <configs>");
    std::fs::create_dir(&sub).expect("mkdir");
    std::fs::write(sub.join("api-key"), "s3cret-key-value\n").expect("key");
    let config = sub.join("layad.toml");
    std::fs::write(
        &config,
        "[server]\nshutdown_grace = \"20s\"\napi_key_file = \"api-key\"\n",
    )
    .expect("config");
    (dir, config)
}

fn options(scope: Scope, home: &Path, config: &Path) -> ServiceOptions {
    ServiceOptions {
        manager: Manager::Launchd,
        scope,
        config: Some(config.to_path_buf()),
        dry_run: true,
        program: PathBuf::from("/opt/layad/bin/layad"),
        home: home.to_path_buf(),
        uid: 501,
        run_as: None,
        hf_home: home.join(".cache/huggingface"),
        hf_hub_cache: None,
        shell_variables: vec!["LAYA_API_KEY".to_owned()],
    }
}

fn parse(text: &str) -> Dictionary {
    let value = Value::from_reader_xml(text.as_bytes()).expect("the plist parses");
    value.into_dictionary().expect("a dictionary at the top")
}

fn string<'a>(dict: &'a Dictionary, key: &str) -> &'a str {
    dict.get(key)
        .and_then(Value::as_string)
        .unwrap_or_else(|| panic!("{key} is not a string"))
}

#[test]
fn the_user_agent_carries_every_required_key() {
    let (dir, config) = config_dir();
    let home = Path::new("/Users/ada");
    let (path, text) = render(&options(Scope::User, home, &config)).expect("render");
    assert_eq!(path, home.join("Library/LaunchAgents/ai.layad.plist"));
    let plist = parse(&text);

    assert_eq!(string(&plist, "Label"), LAUNCHD_LABEL);
    let arguments: Vec<&str> = plist
        .get("ProgramArguments")
        .and_then(Value::as_array)
        .expect("ProgramArguments")
        .iter()
        .map(|v| v.as_string().expect("string argument"))
        .collect();
    let config_text = config.to_str().expect("utf-8");
    assert_eq!(arguments, ["/opt/layad/bin/layad", "serve", "--config", config_text]);
    assert_eq!(plist.get("RunAtLoad").and_then(Value::as_boolean), Some(true));
    let keep_alive = plist
        .get("KeepAlive")
        .and_then(Value::as_dictionary)
        .expect("KeepAlive dict");
    assert_eq!(
        keep_alive.get("SuccessfulExit").and_then(Value::as_boolean),
        Some(false)
    );
    assert_eq!(
        plist.get("ThrottleInterval").and_then(Value::as_signed_integer),
        Some(10)
    );
    // 20 s shutdown grace + 10 s worker stop timeout + 5 s.
    assert_eq!(plist.get("ExitTimeOut").and_then(Value::as_signed_integer), Some(35));
    assert_eq!(string(&plist, "ProcessType"), "Interactive");
    let log = "/Users/ada/Library/Logs/layad/layad.log";
    assert_eq!(string(&plist, "StandardOutPath"), log);
    assert_eq!(string(&plist, "StandardErrorPath"), log);
    let environment = plist
        .get("EnvironmentVariables")
        .and_then(Value::as_dictionary)
        .expect("EnvironmentVariables");
    let names: Vec<&str> = environment.keys().map(String::as_str).collect();
    assert_eq!(names, ["HF_HOME"], "only the cache location, nothing secret");
    assert_eq!(string(environment, "HF_HOME"), "/Users/ada/.cache/huggingface");
    assert!(plist.get("UserName").is_none());

    assert!(!text.contains("s3cret"), "the key must not be in the plist");
    assert!(!text.contains("LAYA_API_KEY"));
    assert!(text.contains("keys &amp; &lt;configs&gt;"), "paths are XML-escaped");
    assert!(!text.contains('@'), "every placeholder filled");
    plutil_lint(&text, dir.path());
}

#[test]
fn the_system_daemon_runs_as_the_account_and_logs_under_library() {
    let (dir, config) = config_dir();
    let home = Path::new("/Users/ada");
    let mut options = options(Scope::System, home, &config);
    options.run_as = Some("ada".to_owned());
    options.uid = 0;
    options.hf_hub_cache = Some(PathBuf::from("/Volumes/models/hub"));
    let (path, text) = render(&options).expect("render");
    assert_eq!(path, Path::new("/Library/LaunchDaemons/ai.layad.plist"));
    let plist = parse(&text);
    assert_eq!(string(&plist, "UserName"), "ada");
    assert_eq!(string(&plist, "StandardErrorPath"), "/Library/Logs/layad/layad.log");
    let environment = plist
        .get("EnvironmentVariables")
        .and_then(Value::as_dictionary)
        .expect("EnvironmentVariables");
    assert_eq!(string(environment, "HF_HUB_CACHE"), "/Volumes/models/hub");
    assert_eq!(string(environment, "HF_HOME"), "/Users/ada/.cache/huggingface");
    plutil_lint(&text, dir.path());
}

#[test]
fn without_a_config_the_service_runs_the_defaults() {
    let (_dir, config) = config_dir();
    let mut options = options(Scope::User, Path::new("/Users/ada"), &config);
    options.config = None;
    let (_, text) = render(&options).expect("render");
    let plist = parse(&text);
    let arguments = plist.get("ProgramArguments").and_then(Value::as_array).expect("array");
    assert_eq!(arguments.len(), 2);
    // 30 s default grace + 10 s + 5 s.
    assert_eq!(plist.get("ExitTimeOut").and_then(Value::as_signed_integer), Some(45));
}

/// `plutil -lint` when the tool exists (macOS); elsewhere a note, never a failure.
fn plutil_lint(text: &str, dir: &Path) {
    let file = dir.join("ai.layad.plist");
    std::fs::write(&file, text).expect("write plist");
    match Command::new("plutil").arg("-lint").arg(&file).output() {
        Ok(output) => assert!(
            output.status.success(),
            "plutil -lint: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(_) => eprintln!("note: plutil is not installed here; checked with the plist crate only"),
    }
}

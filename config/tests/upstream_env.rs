//! Upstream `laya-serve`'s `LAYA_*` variables: what each one sets, the precedence (file < `LAYA_*`
//! < `LAYAD_*` < flags), the values that refuse to start, those ignored with a warning, and the
//! notes logged at start-up.

use std::path::PathBuf;
use std::time::Duration;

use laya::output::OutputProfile;
use laya::routing::CheckpointName;
use laya::upstream::Upstream;
use layad_config::{CheckpointSource, Config, ConfigError, Device, Flags, Note, NoteLevel, Problem, Sources};

/// A temporary directory holding `layad.toml` with `text`.
struct ConfigFile {
    dir: tempfile::TempDir,
}

impl ConfigFile {
    fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("layad.toml"), text).expect("write config");
        Self { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("layad.toml")
    }
}

fn load(
    file: Option<&ConfigFile>,
    env: &[(&str, &str)],
    listen: Option<&str>,
) -> Result<(Config, Vec<Note>), ConfigError> {
    Config::load_with_notes(&Sources {
        file: file.map(ConfigFile::path),
        env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        flags: Flags {
            listen: listen.map(|l| l.parse().expect("flag address")),
        },
    })
}

fn loaded(file: Option<&ConfigFile>, env: &[(&str, &str)]) -> (Config, Vec<Note>) {
    load(file, env, None).unwrap_or_else(|e| panic!("{e}"))
}

fn only_problem(result: Result<(Config, Vec<Note>), ConfigError>) -> Problem {
    let error = result.expect_err("the configuration must be refused");
    assert_eq!(error.problems().len(), 1, "{error}");
    error.problems()[0].clone()
}

fn note<'a>(notes: &'a [Note], variable: &str) -> &'a Note {
    notes
        .iter()
        .find(|n| n.variable == variable)
        .unwrap_or_else(|| panic!("no note for {variable}: {notes:?}"))
}

const POOLS: &str = "[[pool]]\nname = \"a\"\ndevice = \"cpu\"\nthreads = 2\n[[pool]]\nname = \"b\"\n";

#[test]
fn a_laya_serve_environment_sets_the_matching_keys_and_each_is_noted() {
    let file = ConfigFile::new(POOLS);
    let (config, notes) = loaded(
        Some(&file),
        &[
            ("LAYA_HOST", "0.0.0.0"),
            ("LAYA_PORT", " 8000 "),
            ("LAYA_DEVICE", "CUDA"),
            ("LAYA_THREADS", "3"),
            ("LAYA_MODELS", "en, ml"),
            ("LAYA_AUTO_TASK", "yes"),
            ("LAYA_LOG_LEVEL", "WARNING"),
            ("LAYA_DEFAULT_MODEL", "English"),
            ("LAYA_JEV_STRICT", "1"),
            ("LAYA_TOURNAMENT_GROUP", "16"),
            ("LAYA_MAX_TOKEN_BUDGET", "4096"),
            ("LAYA_BODY_READ_TIMEOUT", "2.5"),
            ("LAYA_MAX_CONCURRENT", "16"),
            ("LAYA_API_KEY", "s3cret-key"),
        ],
    );
    assert_eq!(config.server.listen, "0.0.0.0:8000".parse().expect("addr"));
    for pool in &config.pools {
        assert_eq!((pool.device, pool.threads), (Device::Cuda, 3), "{}", pool.name);
    }
    assert_eq!(config.checkpoints.english, CheckpointSource::HfCache);
    assert_eq!(config.checkpoints.multilingual, CheckpointSource::HfCache);
    // Unlisted: still served, as upstream serves it (loaded on its first request), by a copy of
    // each pool that served it, which starts unloaded.
    assert_eq!(config.checkpoints.typed_decisions, CheckpointSource::HfCache);
    let pools: Vec<(&str, Vec<&str>, bool)> = config
        .pools
        .iter()
        .map(|p| {
            let names = config.pool_checkpoints(p).into_iter().map(|c| c.as_str()).collect();
            (p.name.as_str(), names, p.start_unloaded)
        })
        .collect();
    assert_eq!(
        pools,
        [
            ("a", vec!["english", "multilingual"], false),
            ("a-typed-decisions", vec!["typed-decisions"], true),
            ("b", vec!["english", "multilingual"], false),
            ("b-typed-decisions", vec!["typed-decisions"], true),
        ]
    );
    assert!(config.server.auto_task);
    assert_eq!(config.logging.filter, "warn");
    assert_eq!(config.compat.default_checkpoint, Some(CheckpointName::English));
    assert_eq!(config.compat.output, OutputProfile::JevStrict);
    assert_eq!(config.compat.tournament_group, 16);
    assert_eq!(config.compat.max_token_budget, 4096);
    assert_eq!(config.server.body_timeout, Duration::from_millis(2500));
    assert_eq!(config.server.max_concurrent, Some(16));
    assert_eq!(config.api_key.as_ref().map(|k| k.expose()), Some("s3cret-key"));

    for variable in [
        "LAYA_HOST",
        "LAYA_DEVICE",
        "LAYA_THREADS",
        "LAYA_MODELS",
        "LAYA_AUTO_TASK",
        "LAYA_LOG_LEVEL",
        "LAYA_DEFAULT_MODEL",
        "LAYA_JEV_STRICT",
        "LAYA_TOURNAMENT_GROUP",
        "LAYA_MAX_TOKEN_BUDGET",
        "LAYA_BODY_READ_TIMEOUT",
        "LAYA_MAX_CONCURRENT",
        "LAYA_API_KEY",
    ] {
        assert_eq!(note(&notes, variable).level, NoteLevel::Info, "{variable}: {notes:?}");
    }
    assert!(
        note(&notes, "LAYA_HOST")
            .message
            .contains("LAYA_HOST=0.0.0.0 LAYA_PORT=8000: server.listen = 0.0.0.0:8000"),
        "{notes:?}"
    );
    assert!(
        note(&notes, "LAYA_MODELS").message.contains(
            "english, multilingual load at start; typed-decisions (pool a-typed-decisions), typed-decisions (pool \
             b-typed-decisions) load on their first request"
        ),
        "{notes:?}"
    );
    assert!(
        notes.iter().all(|n| !n.message.contains("s3cret")),
        "the key is never shown"
    );
    // Under 0.4.15 the group is answered: logged as used, not warned about.
    let tournament: Vec<&Note> = notes.iter().filter(|n| n.variable == "LAYA_TOURNAMENT_GROUP").collect();
    assert!(
        tournament.iter().all(|n| n.level != NoteLevel::Warn) && !tournament.is_empty(),
        "{notes:?}"
    );
}

#[test]
fn laya_variables_beat_the_file_and_lose_to_layad_variables_and_flags() {
    let file = ConfigFile::new(
        "[server]\nlisten = \"127.0.0.1:9000\"\nbody_timeout = \"3s\"\n[compat]\nmax_token_budget = 1024\n",
    );
    // LAYA_PORT alone keeps the file's host.
    let (config, _) = loaded(Some(&file), &[("LAYA_PORT", "8000"), ("LAYA_MAX_TOKEN_BUDGET", "2048")]);
    assert_eq!(config.server.listen, "127.0.0.1:8000".parse().expect("addr"));
    assert_eq!(config.compat.max_token_budget, 2048);

    let (config, notes) = loaded(
        Some(&file),
        &[
            ("LAYA_PORT", "8000"),
            ("LAYAD_SERVER__LISTEN", "127.0.0.1:7000"),
            ("LAYA_BODY_READ_TIMEOUT", "20"),
            ("LAYAD_SERVER__BODY_TIMEOUT", "4s"),
        ],
    );
    assert_eq!(config.server.listen, "127.0.0.1:7000".parse().expect("addr"));
    assert_eq!(config.server.body_timeout, Duration::from_secs(4));
    let port = note(&notes, "LAYA_PORT");
    assert_eq!(port.level, NoteLevel::Warn);
    assert!(
        port.message.contains("environment variable LAYAD_SERVER__LISTEN"),
        "{}",
        port.message
    );

    let (config, notes) = load(Some(&file), &[("LAYA_PORT", "8000")], Some("127.0.0.1:6000")).expect("loads");
    assert_eq!(config.server.listen, "127.0.0.1:6000".parse().expect("addr"));
    assert!(note(&notes, "LAYA_PORT").message.contains("flag --listen"), "{notes:?}");

    // The default host stays loopback when only the port is given.
    let (config, _) = loaded(None, &[("LAYA_PORT", "8000")]);
    assert_eq!(config.server.listen, "127.0.0.1:8000".parse().expect("addr"));
}

#[test]
fn values_upstream_refuses_to_start_with_are_refused_naming_the_variable() {
    for (variable, value, key, text) in [
        (
            "LAYA_PORT",
            "99999",
            "server.listen",
            "invalid LAYA_PORT '99999': must be an integer 1-65535",
        ),
        (
            "LAYA_PORT",
            "http",
            "server.listen",
            "invalid LAYA_PORT 'http': must be an integer 1-65535",
        ),
        (
            "LAYA_HOST",
            "example.org",
            "server.listen",
            "'example.org' is not an IP address",
        ),
        (
            "LAYA_LOG_LEVEL",
            "loud",
            "logging.filter",
            "invalid LAYA_LOG_LEVEL 'loud': must be one of critical, debug, error, info, trace, warning",
        ),
        (
            "LAYA_DEFAULT_MODEL",
            "french",
            "compat.default_checkpoint",
            "invalid LAYA_DEFAULT_MODEL 'french': unknown model 'french'",
        ),
        (
            "LAYA_MODELS",
            "english,klingon",
            "checkpoints",
            "unknown model 'klingon'",
        ),
        ("LAYA_DEVICE", "xpu", "pool.device", "'xpu': layad's workers run on"),
    ] {
        let problem = only_problem(load(None, &[(variable, value)], None));
        assert_eq!(problem.key, key, "{variable}={value}");
        assert_eq!(problem.origin, format!("environment variable {variable}"));
        assert!(problem.message.contains(text), "{variable}={value}: {problem}");
    }
}

#[test]
fn values_upstream_ignores_keep_the_lower_layer_and_warn_and_blank_means_unset() {
    let file = ConfigFile::new("[server]\nbody_timeout = \"3s\"\n[[pool]]\nname = \"a\"\nthreads = 2\n");
    let (config, notes) = loaded(
        Some(&file),
        &[
            ("LAYA_THREADS", "-1"),
            ("LAYA_BODY_READ_TIMEOUT", "inf"),
            ("LAYA_MAX_CONCURRENT", "many"),
            ("LAYA_MAX_TOKEN_BUDGET", "0"),
            ("LAYA_TOURNAMENT_GROUP", "101"),
            ("LAYA_PORT", "  "),
            ("LAYA_HOST", ""),
        ],
    );
    assert_eq!(config.pools[0].threads, 2);
    assert_eq!(config.server.body_timeout, Duration::from_secs(3));
    assert_eq!(config.server.max_concurrent, None);
    assert_eq!(config.compat.max_token_budget, 8192);
    assert_eq!(config.compat.tournament_group, 0);
    assert_eq!(config.server.listen, "127.0.0.1:8642".parse().expect("addr"));
    for variable in [
        "LAYA_THREADS",
        "LAYA_BODY_READ_TIMEOUT",
        "LAYA_MAX_CONCURRENT",
        "LAYA_MAX_TOKEN_BUDGET",
        "LAYA_TOURNAMENT_GROUP",
    ] {
        assert_eq!(note(&notes, variable).level, NoteLevel::Warn, "{variable}");
    }
    assert!(
        notes
            .iter()
            .all(|n| n.variable != "LAYA_PORT" && n.variable != "LAYA_HOST"),
        "{notes:?}"
    );

    // Above what a worker holds: capped, with a warning.
    let (config, notes) = loaded(None, &[("LAYA_MAX_TOKEN_BUDGET", "16384")]);
    assert_eq!(config.compat.max_token_budget, 8192);
    assert_eq!(note(&notes, "LAYA_MAX_TOKEN_BUDGET").level, NoteLevel::Warn);
}

#[test]
fn variables_without_a_layad_meaning_are_warned_about() {
    let (config, notes) = loaded(
        None,
        &[
            ("LAYA_MAX_LOADED", "1"),
            ("LAYA_CPU_AMP", "bf16"),
            ("LAYA_ROOT_PATH", "/laya"),
        ],
    );
    assert_eq!(config, Config::default());
    for variable in ["LAYA_MAX_LOADED", "LAYA_CPU_AMP", "LAYA_ROOT_PATH"] {
        let n = note(&notes, variable);
        assert_eq!(n.level, NoteLevel::Warn, "{variable}");
        assert!(n.message.contains("no effect"), "{variable}: {}", n.message);
    }
    let (_, none) = loaded(None, &[]);
    assert!(none.is_empty(), "{none:?}");
}

#[test]
fn jev_strict_follows_the_switch_spellings_and_only_under_0_4_15() {
    for (value, want) in [
        ("1", OutputProfile::JevStrict),
        ("On", OutputProfile::JevStrict),
        ("true", OutputProfile::JevStrict),
        ("0", OutputProfile::Laya),
        ("no", OutputProfile::Laya),
    ] {
        let (config, _) = loaded(None, &[("LAYA_JEV_STRICT", value)]);
        assert_eq!(config.compat.output, want, "{value}");
    }
    let file = ConfigFile::new("[compat]\noutput = \"jev-strict\"\n");
    assert_eq!(loaded(Some(&file), &[]).0.compat.output, OutputProfile::JevStrict);
    assert_eq!(
        loaded(Some(&file), &[("LAYA_JEV_STRICT", "0")]).0.compat.output,
        OutputProfile::Laya
    );

    // 0.3.20 has no strict projection: the variable is ignored with a warning, the key refused.
    let old = ConfigFile::new("[compat]\nupstream = \"0.3.20\"\n");
    let (config, notes) = loaded(Some(&old), &[("LAYA_JEV_STRICT", "1")]);
    assert_eq!(
        (config.compat.upstream, config.compat.output),
        (Upstream::V0_3_20, OutputProfile::Laya)
    );
    assert_eq!(note(&notes, "LAYA_JEV_STRICT").level, NoteLevel::Warn);
    let both = ConfigFile::new("[compat]\nupstream = \"0.3.20\"\noutput = \"jev-strict\"\n");
    let problem = only_problem(load(Some(&both), &[], None));
    assert_eq!(problem.key, "compat.output");

    // `jev` builds on the strict projection: 0.4.15 only. LAYA_JEV_STRICT, like every LAYA_*
    // variable, wins over the file, so a unit that sets it serves upstream's projection.
    let jev = ConfigFile::new("[compat]\noutput = \"jev\"\n");
    assert_eq!(loaded(Some(&jev), &[]).0.compat.output, OutputProfile::Jev);
    assert_eq!(
        loaded(Some(&jev), &[("LAYA_JEV_STRICT", "1")]).0.compat.output,
        OutputProfile::JevStrict
    );
    let old_jev = ConfigFile::new("[compat]\nupstream = \"0.3.20\"\noutput = \"jev\"\n");
    let problem = only_problem(load(Some(&old_jev), &[], None));
    assert_eq!(problem.key, "compat.output");
    let unknown = ConfigFile::new("[compat]\noutput = \"jev-lax\"\n");
    assert_eq!(only_problem(load(Some(&unknown), &[], None)).key, "compat.output");
}

#[test]
fn a_tournament_group_from_the_file_is_validated_and_warned_about_only_under_0_3_20() {
    let file = ConfigFile::new("[compat]\ntournament_group = 1\n");
    let problem = only_problem(load(Some(&file), &[], None));
    assert_eq!(problem.key, "compat.tournament_group");
    let file = ConfigFile::new("[compat]\nupstream = \"0.4.15\"\ntournament_group = 16\n");
    let (config, notes) = loaded(Some(&file), &[]);
    assert_eq!(config.compat.tournament_group, 16);
    assert!(notes.is_empty(), "{notes:?}");
    let file = ConfigFile::new("[compat]\nupstream = \"0.3.20\"\ntournament_group = 16\n");
    let (_, notes) = loaded(Some(&file), &[]);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0].level, NoteLevel::Warn);
    assert!(notes[0].message.contains("no tournament mode"), "{notes:?}");
}

fn extra(source: &str, subfolder: Option<&str>) -> layad_config::ExtraSource {
    layad_config::ExtraSource {
        source: source.to_owned(),
        subfolder: subfolder.map(str::to_owned),
    }
}

#[test]
fn extra_checkpoints_come_from_the_file_and_laya_extra_models_in_upstreams_syntax() {
    let file =
        ConfigFile::new("[checkpoints.extra]\nlegal = [\"me/laya-bundle\", \"legal\"]\nmine = \"/srv/old-mine\"\n");
    let (config, notes) = loaded(
        Some(&file),
        &[(
            "LAYA_EXTRA_MODELS",
            r#"{"Mine": "/srv/mine", "papers": "me/laya-papers", "EN": ["me/laya-ft", null]}"#,
        )],
    );
    let served: Vec<(&str, CheckpointSource)> = config
        .served_checkpoints()
        .into_iter()
        .map(|(name, source)| (name.as_str(), source))
        .collect();
    assert_eq!(
        served,
        [
            // A built-in's alias re-points it, as upstream's `Router._add` does.
            ("english", CheckpointSource::Registered(extra("me/laya-ft", None))),
            ("multilingual", CheckpointSource::HfCache),
            ("typed-decisions", CheckpointSource::HfCache),
            (
                "legal",
                CheckpointSource::Registered(extra("me/laya-bundle", Some("legal")))
            ),
            // The variable's entry replaces the file's, however the name is spelt.
            ("mine", CheckpointSource::Registered(extra("/srv/mine", None))),
            ("papers", CheckpointSource::Registered(extra("me/laya-papers", None))),
        ]
    );
    let note = note(&notes, "LAYA_EXTRA_MODELS");
    assert_eq!(note.level, NoteLevel::Info);
    assert!(note.message.contains("mine = /srv/mine"), "{}", note.message);
    // LAYA_MODELS and LAYA_DEFAULT_MODEL may name a registered checkpoint; unlisted ones are served
    // on demand, by a pool that starts unloaded.
    let (config, _) = loaded(
        None,
        &[
            ("LAYA_EXTRA_MODELS", r#"{"mine": "/srv/mine", "other": "/srv/other"}"#),
            ("LAYA_MODELS", "english,Mine"),
            ("LAYA_DEFAULT_MODEL", "mine"),
        ],
    );
    let names: Vec<&str> = config
        .served_checkpoints()
        .into_iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(names, ["english", "multilingual", "typed-decisions", "mine", "other"]);
    let at_start: Vec<&str> = config
        .pools
        .iter()
        .filter(|p| !p.start_unloaded)
        .flat_map(|p| config.pool_checkpoints(p))
        .map(|c| c.as_str())
        .collect();
    assert_eq!(at_start, ["english", "mine"]);
    assert_eq!(config.compat.default_checkpoint.map(|c| c.as_str()), Some("mine"));
}

#[test]
fn laya_preload_off_starts_every_pool_unloaded_as_upstream_loads_on_first_use() {
    let (config, notes) = loaded(None, &[("LAYA_PRELOAD", "0")]);
    assert!(config.pools.iter().all(|p| p.start_unloaded), "{:?}", config.pools);
    assert_eq!(note(&notes, "LAYA_PRELOAD").level, NoteLevel::Info);
    let (config, notes) = loaded(None, &[("LAYA_PRELOAD", "1")]);
    assert_eq!(config, Config::default());
    assert_eq!(note(&notes, "LAYA_PRELOAD").level, NoteLevel::Info);
}

#[test]
fn a_bad_laya_extra_models_refuses_to_start_naming_the_problem() {
    for (value, says) in [
        (
            "[1, 2]",
            "invalid LAYA_EXTRA_MODELS: a JSON object {name: source}, got list",
        ),
        ("{nope", "invalid LAYA_EXTRA_MODELS: not a JSON object"),
        (
            r#"{"mine": 3}"#,
            "invalid LAYA_EXTRA_MODELS: source for 'mine' must be a repo id",
        ),
        (
            r#"{"a/b": "/srv/x"}"#,
            "invalid LAYA_EXTRA_MODELS: invalid checkpoint name 'a/b'",
        ),
        (r#"{"auto": "/srv/x"}"#, "'auto' means automatic routing"),
    ] {
        let problem = only_problem(load(None, &[("LAYA_EXTRA_MODELS", value)], None));
        assert_eq!(problem.key, "checkpoints.extra", "{value}");
        assert_eq!(problem.origin, "environment variable LAYA_EXTRA_MODELS", "{value}");
        assert!(problem.message.contains(says), "{value}: {}", problem.message);
    }
    // In the file: an invalid name, two spellings of one name, a pool naming an unknown one.
    let file = ConfigFile::new("[checkpoints.extra]\n\"My Model\" = \"/srv/x\"\n");
    let problem = only_problem(load(Some(&file), &[], None));
    assert_eq!(problem.key, "checkpoints.extra.My Model");
    assert!(
        problem.message.starts_with("invalid checkpoint name 'My Model'"),
        "{}",
        problem.message
    );
    let file = ConfigFile::new("[checkpoints.extra]\nMine = \"/srv/x\"\nmine = \"/srv/y\"\n");
    let problem = only_problem(load(Some(&file), &[], None));
    assert!(
        problem.message.contains("names the same checkpoint as"),
        "{}",
        problem.message
    );
    let file = ConfigFile::new(
        "[[pool]]\nname = \"p\"\ncheckpoints = [\"english\", \"multilingual\", \"typed-decisions\", \"mine\"]\n",
    );
    let problem = only_problem(load(Some(&file), &[], None));
    assert_eq!(problem.key, "pool[0].checkpoints");
    assert!(
        problem
            .message
            .contains("\"mine\" is no built-in checkpoint and no [checkpoints.extra] entry")
    );
}

#[test]
fn laya_idle_unload_seconds_sets_every_pools_idle_unload_as_upstream_reads_it() {
    let (config, notes) = loaded(None, &[("LAYA_IDLE_UNLOAD_SECONDS", " 2.5 ")]);
    assert_eq!(config.pools[0].idle_unload, Duration::from_millis(2500));
    assert_eq!(note(&notes, "LAYA_IDLE_UNLOAD_SECONDS").level, NoteLevel::Info);
    for (value, window) in [("-3", Duration::ZERO), ("0", Duration::ZERO)] {
        let (config, _) = loaded(None, &[("LAYA_IDLE_UNLOAD_SECONDS", value)]);
        assert_eq!(config.pools[0].idle_unload, window, "{value}");
    }
    let (config, notes) = loaded(None, &[("LAYA_IDLE_UNLOAD_SECONDS", "soon")]);
    assert_eq!(config.pools[0].idle_unload, Duration::ZERO);
    let warned = notes.iter().find(|n| n.level == NoteLevel::Warn).expect("warned");
    assert!(
        warned.message.contains("invalid LAYA_IDLE_UNLOAD_SECONDS 'soon'"),
        "{}",
        warned.message
    );
    let file = ConfigFile::new("[[pool]]\nname = \"p\"\nidle_unload = \"30s\"\n");
    let (config, _) = loaded(Some(&file), &[]);
    assert_eq!(config.pools[0].idle_unload, Duration::from_secs(30));
}

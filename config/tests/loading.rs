//! Loading the configuration: layering order, errors that name the key and its origin, validation,
//! relative paths, the API key, and the shipped examples and README staying true.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use laya::routing::CheckpointName;
use laya::upstream::Upstream;
use layad_config::{
    AneExecutor, CheckpointSource, Config, ConfigError, Device, Dtype, Flags, LogFormat, PoolConfig, Problem,
    QueueOrder, Sources, WorkerKind,
};

fn examples_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples"))
}

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

fn sources(file: Option<PathBuf>, env: &[(&str, &str)], listen: Option<&str>) -> Sources {
    Sources {
        file,
        env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        flags: Flags {
            listen: listen.map(|l| l.parse().expect("flag address")),
        },
    }
}

fn load(file: Option<&ConfigFile>, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::load(&sources(file.map(ConfigFile::path), env, None))
}

/// The single problem of a failed load.
fn only_problem(result: Result<Config, ConfigError>) -> Problem {
    let error = result.expect_err("the configuration must be refused");
    let problems = error.problems();
    assert_eq!(problems.len(), 1, "{error}");
    problems[0].clone()
}

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("address")
}

#[test]
fn no_file_gives_the_embedded_defaults() {
    let config = load(None, &[]).expect("defaults load");
    assert_eq!(config, Config::default());
    assert_eq!(config.server.listen, addr("127.0.0.1:8642"));
    assert_eq!(config.served_checkpoints().len(), 3);
    assert!(
        config
            .served_checkpoints()
            .iter()
            .all(|(_, source)| *source == CheckpointSource::HfCache)
    );
    assert_eq!(config.pools.len(), 1);
    let pool = &config.pools[0];
    assert_eq!(
        (pool.name.as_str(), pool.workers, pool.device),
        ("gpu", 1, Device::Auto)
    );
    assert_eq!(config.pool_checkpoints(pool), CheckpointName::ALL.to_vec());
    assert_eq!(config.server.max_body_bytes, 2 * 1024 * 1024);
    assert!(config.api_key.is_none());
}

#[test]
fn layers_apply_in_order_defaults_file_env_flags() {
    let file = ConfigFile::new(
        "[server]\nlisten = \"127.0.0.1:1001\"\nbody_timeout = \"3s\"\n[workers]\nstartup_timeout = \"5m\"\n",
    );
    let env = [
        ("LAYAD_SERVER__LISTEN", "127.0.0.1:1002"),
        ("LAYAD_WORKERS__STARTUP_TIMEOUT", "90s"),
    ];
    let file_only = Config::load(&sources(Some(file.path()), &[], None)).expect("file");
    assert_eq!(file_only.server.listen, addr("127.0.0.1:1001"));
    assert_eq!(file_only.server.body_timeout, Duration::from_secs(3));
    assert_eq!(
        file_only.server.request_timeout,
        Duration::from_secs(30),
        "default kept"
    );

    let with_env = Config::load(&sources(Some(file.path()), &env, None)).expect("env");
    assert_eq!(with_env.server.listen, addr("127.0.0.1:1002"));
    assert_eq!(with_env.workers.startup_timeout, Duration::from_secs(90));
    assert_eq!(with_env.server.body_timeout, Duration::from_secs(3), "file value kept");

    let with_flag = Config::load(&sources(Some(file.path()), &env, Some("127.0.0.1:1003"))).expect("flag");
    assert_eq!(with_flag.server.listen, addr("127.0.0.1:1003"));
    assert_eq!(with_flag.workers.startup_timeout, Duration::from_secs(90));
}

#[test]
fn environment_values_are_typed_and_nested() {
    let config = load(
        None,
        &[
            ("LAYAD_SERVER__AUTO_TASK", "true"),
            ("LAYAD_SERVER__MAX_BODY_BYTES", "4096"),
            ("LAYAD_SERVER__ALLOWED_HOSTS", "[layad.internal, other.example]"),
            ("LAYAD_LOGGING__FORMAT", "json"),
            ("LAYAD_LOGGING__FILTER", "info,layad=debug"),
            ("LAYAD_CHECKPOINTS__TYPED_DECISIONS", "off"),
            ("LAYAD_CONFIG", "/not/a/key/but/the/file/name"),
            ("UNRELATED", "ignored"),
        ],
    )
    .expect("env loads");
    assert!(config.server.auto_task);
    assert_eq!(config.server.max_body_bytes, 4096);
    assert_eq!(config.server.allowed_hosts, ["layad.internal", "other.example"]);
    assert_eq!(config.logging.format, LogFormat::Json);
    assert_eq!(config.logging.filter, "info,layad=debug");
    assert_eq!(config.checkpoints.typed_decisions, CheckpointSource::Off);
    assert_eq!(config.served_checkpoints().len(), 2);
}

#[test]
fn one_variable_replaces_every_pool() {
    let pools = r#"[{name = "a", device = "cpu", workers = 2}, {name = "b", workers = 0}]"#;
    let problem = only_problem(load(None, &[("LAYAD_POOL", pools)]));
    assert_eq!(problem.key, "pool[1].workers");
    assert_eq!(problem.origin, "environment variable LAYAD_POOL");

    let pools = r#"[{name = "a", device = "cpu", workers = 2}]"#;
    let config = load(None, &[("LAYAD_POOL", pools)]).expect("loads");
    assert_eq!(config.pools.len(), 1);
    assert_eq!((config.pools[0].device, config.pools[0].workers), (Device::Cpu, 2));
}

#[test]
fn pools_in_a_file_replace_the_default_pool() {
    let config = Config::load(&sources(Some(examples_dir().join("two-pools.toml")), &[], None)).expect("loads");
    let names: Vec<&str> = config.pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["english", "others"]);
    let english = &config.pools[0];
    assert_eq!((english.workers, english.threads, english.device), (2, 1, Device::Cpu));
    assert_eq!(config.pool_checkpoints(english), [CheckpointName::English]);
    // Keys a pool leaves out take the per-pool defaults.
    let others = &config.pools[1];
    let defaults = PoolConfig::named("others");
    assert_eq!(
        (others.workers, others.max_rows, others.queue_capacity, others.dtype),
        (
            defaults.workers,
            defaults.max_rows,
            defaults.queue_capacity,
            defaults.dtype
        )
    );
}

#[test]
fn unknown_key_in_the_file_is_named_with_the_file() {
    let file = ConfigFile::new("[server]\nlisen = \"127.0.0.1:1\"\n");
    let problem = only_problem(load(Some(&file), &[]));
    assert_eq!(problem.key, "server.lisen");
    assert_eq!(problem.origin, file.path().display().to_string());
    assert!(problem.message.contains("unknown key"), "{problem}");
    assert!(problem.message.contains("listen"), "lists the known keys: {problem}");
    assert!(
        problem
            .to_string()
            .contains(&format!("server.lisen (in {})", file.path().display())),
        "{problem}"
    );
}

#[test]
fn unknown_keys_in_a_pool_and_at_the_top_are_named() {
    let file = ConfigFile::new("[[pool]]\nname = \"gpu\"\nworkerz = 2\n");
    let problem = only_problem(load(Some(&file), &[]));
    assert_eq!(
        (problem.key.as_str(), problem.origin.clone()),
        ("pool[0].workerz", file.path().display().to_string())
    );

    let file = ConfigFile::new("[servr]\nlisten = \"127.0.0.1:1\"\n");
    let problem = only_problem(load(Some(&file), &[]));
    assert_eq!(problem.key, "servr");
    assert_eq!(problem.origin, file.path().display().to_string());
}

#[test]
fn unknown_key_in_the_environment_names_the_variable() {
    let problem = only_problem(load(None, &[("LAYAD_SERVER__LISEN", "127.0.0.1:1")]));
    assert_eq!(problem.key, "server.lisen");
    assert_eq!(problem.origin, "environment variable LAYAD_SERVER__LISEN");
}

#[test]
fn bad_values_name_key_origin_and_what_was_expected() {
    let file = ConfigFile::new("[server]\nlisten = \"localhost:80\"\n");
    let problem = only_problem(load(Some(&file), &[]));
    assert_eq!(problem.key, "server.listen");
    assert_eq!(problem.origin, file.path().display().to_string());

    let file = ConfigFile::new("[[pool]]\nname = \"gpu\"\ndevice = \"tpu\"\n");
    let problem = only_problem(load(Some(&file), &[]));
    assert_eq!(problem.key, "pool[0].device");
    assert!(
        problem.message.contains("tpu") && problem.message.contains("metal"),
        "{problem}"
    );

    let file = ConfigFile::new("[server]\nrequest_timeout = 30\n");
    let problem = only_problem(load(Some(&file), &[]));
    assert_eq!(problem.key, "server.request_timeout");
    assert!(problem.message.contains("\"30s\""), "explains the unit: {problem}");

    let problem = only_problem(load(None, &[("LAYAD_SERVER__BODY_TIMEOUT", "soon")]));
    assert_eq!(problem.key, "server.body_timeout");
    assert_eq!(problem.origin, "environment variable LAYAD_SERVER__BODY_TIMEOUT");

    let file = ConfigFile::new(
        "[[pool]]\nname = \"gpu\"\ncheckpoints = [\"english\", \"multilingual\", \"typed-decisions\", \"french\"]\n",
    );
    let problem = only_problem(load(Some(&file), &[]));
    assert_eq!(problem.key, "pool[0].checkpoints");
    assert!(
        problem
            .message
            .contains("\"french\" is no built-in checkpoint and no [checkpoints.extra] entry"),
        "{problem}"
    );

    let file = ConfigFile::new("[[pool]]\nworkers = 2\n");
    let problem = only_problem(load(Some(&file), &[]));
    assert_eq!(problem.key, "pool[0].name");
    assert!(problem.message.contains("required"), "{problem}");
}

#[test]
fn a_syntax_error_names_the_file_and_line() {
    let file = ConfigFile::new("[server\nlisten = 1\n");
    let problem = only_problem(load(Some(&file), &[]));
    assert_eq!(problem.key, "");
    assert_eq!(problem.origin, file.path().display().to_string());
    assert!(problem.message.contains("line 1"), "{problem}");
}

#[test]
fn a_missing_config_file_is_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("nope.toml");
    match Config::load(&sources(Some(missing.clone()), &[], None)) {
        Err(ConfigError::Unreadable { path, .. }) => assert_eq!(path, missing),
        other => panic!("expected Unreadable, got {other:?}"),
    }
}

#[test]
fn cross_key_problems_are_all_reported() {
    let file = ConfigFile::new(
        r#"
[server]
max_body_bytes = 0
[checkpoints]
multilingual = "off"
[[pool]]
name = "a"
workers = 0
checkpoints = ["english", "multilingual"]
[[pool]]
name = "a"
checkpoints = ["english", "english"]
[workers]
restart_backoff_initial = "1m"
restart_backoff_max = "1s"
"#,
    );
    let error = load(Some(&file), &[]).expect_err("refused");
    let keys: Vec<&str> = error.problems().iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "server.max_body_bytes",
            "pool[0].workers",
            "pool[0].checkpoints",
            "pool[1].name",
            "pool[1].checkpoints",
            "pool",
            "workers.restart_backoff_max",
        ],
        "{error}"
    );
    assert!(
        error
            .problems()
            .iter()
            .all(|p| p.origin == file.path().display().to_string()),
        "{error}"
    );
    let text = error.to_string();
    assert!(text.contains("\"multilingual\" is \"off\""), "{text}");
    assert!(
        text.contains("\"typed-decisions\" is served (see [checkpoints]) but no [[pool]] lists it"),
        "{text}"
    );
}

#[test]
fn a_value_from_the_environment_is_blamed_on_the_variable() {
    let problem = only_problem(load(None, &[("LAYAD_SERVER__MAX_CONNECTIONS", "0")]));
    assert_eq!(problem.key, "server.max_connections");
    assert_eq!(problem.origin, "environment variable LAYAD_SERVER__MAX_CONNECTIONS");
}

#[test]
fn serving_nothing_is_refused() {
    let problem = only_problem(load(
        None,
        &[
            ("LAYAD_CHECKPOINTS__ENGLISH", "off"),
            ("LAYAD_CHECKPOINTS__MULTILINGUAL", "off"),
            ("LAYAD_CHECKPOINTS__TYPED_DECISIONS", "off"),
        ],
    ));
    assert_eq!(problem.key, "checkpoints");
}

#[test]
fn relative_paths_follow_the_file_that_wrote_them() {
    let file = ConfigFile::new("[checkpoints]\nenglish = \"ckpt/english\"\n[workers]\nsocket_dir = \"run\"\n");
    let config = load(
        Some(&file),
        &[
            ("LAYAD_CHECKPOINTS__MULTILINGUAL", "from-env"),
            ("LAYAD_WORKERS__BINARY_DIR", "/opt/layad"),
        ],
    )
    .expect("loads");
    assert_eq!(
        config.checkpoints.english,
        CheckpointSource::Directory(file.dir.path().join("ckpt/english"))
    );
    assert_eq!(config.workers.socket_dir, Some(file.dir.path().join("run")));
    let cwd = std::env::current_dir().expect("cwd");
    assert_eq!(
        config.checkpoints.multilingual,
        CheckpointSource::Directory(cwd.join("from-env"))
    );
    assert_eq!(config.workers.binary_dir, Some(PathBuf::from("/opt/layad")));
    assert_eq!(config.checkpoints.typed_decisions, CheckpointSource::HfCache);
}

#[test]
fn the_api_key_comes_from_laya_api_key_or_a_file_never_both() {
    let config = load(None, &[("LAYA_API_KEY", "secret")]).expect("loads");
    assert_eq!(config.api_key.as_ref().map(|k| k.expose()), Some("secret"));
    assert!(!format!("{config:?}").contains("secret"), "Debug must not show the key");

    // Upstream: set but empty means no key.
    assert!(load(None, &[("LAYA_API_KEY", "")]).expect("loads").api_key.is_none());

    let file = ConfigFile::new("[server]\napi_key_file = \"key.txt\"\n");
    std::fs::write(file.dir.path().join("key.txt"), "from-file\n").expect("write key");
    let config = load(Some(&file), &[]).expect("loads");
    assert_eq!(config.api_key.as_ref().map(|k| k.expose()), Some("from-file"));

    let problem = only_problem(load(Some(&file), &[("LAYA_API_KEY", "secret")]));
    assert_eq!(problem.key, "server.api_key_file");
    assert!(problem.message.contains("LAYA_API_KEY"), "{problem}");

    std::fs::write(file.dir.path().join("key.txt"), "\n").expect("write key");
    let problem = only_problem(load(Some(&file), &[]));
    assert!(problem.message.contains("is empty"), "{problem}");

    std::fs::remove_file(file.dir.path().join("key.txt")).expect("remove key");
    let problem = only_problem(load(Some(&file), &[]));
    assert!(problem.message.contains("cannot read"), "{problem}");
}

#[test]
fn every_example_loads() {
    let mut loaded = 0;
    for entry in std::fs::read_dir(examples_dir()).expect("examples") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        Config::load(&sources(Some(path.clone()), &[], None)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        loaded += 1;
    }
    assert!(loaded >= 5, "{loaded} examples");
}

#[test]
fn the_defaults_example_is_exactly_the_defaults() {
    let config = Config::load(&sources(Some(examples_dir().join("defaults.toml")), &[], None)).expect("loads");
    assert_eq!(config, Config::default());
}

#[test]
fn the_local_checkpoints_example_points_at_real_directories() {
    let config = Config::load(&sources(Some(examples_dir().join("local-checkpoints.toml")), &[], None)).expect("loads");
    for (name, source) in config.served_checkpoints() {
        match source {
            CheckpointSource::Directory(dir) => {
                assert!(
                    dir.join("rl_agent_config.json").is_file(),
                    "{}: {}",
                    name.as_str(),
                    dir.display()
                )
            }
            other => panic!("{}: {other:?}", name.as_str()),
        }
    }
}

/// Every key of the schema, dotted (`server.listen`, `pool.workers`), from a fully populated config.
fn every_key() -> Vec<String> {
    let mut config = Config::default();
    config.server.api_key_file = Some(PathBuf::from("k"));
    config.server.max_concurrent = Some(16);
    config.workers.binary_dir = Some(PathBuf::from("b"));
    config.workers.socket_dir = Some(PathBuf::from("s"));
    config.pools[0].checkpoints = Some(vec![CheckpointName::English]);
    config.pools[0].max_questions = Some(1);
    config.pools[0].max_tokens = Some(128);
    config.pools[0].artifacts = Some(PathBuf::from("a"));
    config.pools[0].dtype = Some(Dtype::F16);
    config.pools[0].require_device = true;
    config.pools[0].start_unloaded = true;
    let value = toml::Value::try_from(&config).expect("serializes");
    let mut keys = Vec::new();
    fn walk(prefix: &str, value: &toml::Value, keys: &mut Vec<String>) {
        match value {
            toml::Value::Table(table) => {
                for (k, v) in table {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, keys);
                }
            }
            toml::Value::Array(items) if items.iter().all(toml::Value::is_table) && !items.is_empty() => {
                walk(prefix, &items[0], keys)
            }
            _ => keys.push(prefix.to_owned()),
        }
    }
    walk("", &value, &mut keys);
    keys
}

#[test]
fn the_readme_documents_every_key() {
    let readme_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&readme_path).expect("config/README.md");
    let keys = every_key();
    assert!(keys.len() >= 30, "{keys:?}");
    let missing: Vec<&String> = keys.iter().filter(|k| !readme.contains(&format!("`{k}`"))).collect();
    assert!(missing.is_empty(), "config/README.md does not document {missing:?}");
}

#[test]
fn a_neural_engine_pool_needs_its_artifacts_and_no_device() {
    // Allowed on every platform: off macOS the pool is reported unavailable at run time (or runs
    // the candle executor), which a config check cannot know in advance.
    let file = ConfigFile::new("[[pool]]\nname = \"ane\"\nworker = \"ane\"\ndevice = \"cpu\"\n");
    let error = load(Some(&file), &[]).expect_err("refused");
    let keys: Vec<&str> = error.problems().iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["pool[0].device", "pool[0].artifacts"], "{error}");
}

#[test]
fn a_neural_engine_pool_runs_f16_unless_told_and_refuses_f32_with_core_ml() {
    // Without dtype an ane pool gets what its Core ML graphs compute in, not the gpu pools' f32 (which
    // the worker refused at every start: a restart loop on a Mac).
    let ane = "[[pool]]\nname = \"ane\"\nworker = \"ane\"\nartifacts = \"a\"\n";
    let config = load(Some(&ConfigFile::new(ane)), &[]).expect("valid");
    let pool = &config.pools[0];
    assert_eq!((pool.worker, pool.dtype), (WorkerKind::Ane, None));
    assert_eq!(pool.effective_dtype(), Dtype::F16);
    assert_eq!(PoolConfig::named("gpu").effective_dtype(), Dtype::F32);

    let problem = only_problem(load(Some(&ConfigFile::new(&format!("{ane}dtype = \"f32\"\n"))), &[]));
    assert_eq!(problem.key, "pool[0].dtype");
    assert!(
        problem.message.contains("Core ML graphs compute in f16") && problem.message.contains("executor = \"candle\""),
        "{problem}"
    );
    // The candle executor runs the same graphs in f32 on the CPU.
    let candle = format!("{ane}dtype = \"f32\"\nexecutor = \"candle\"\n");
    let config = load(Some(&ConfigFile::new(&candle)), &[]).expect("valid");
    assert_eq!(
        (config.pools[0].executor, config.pools[0].effective_dtype()),
        (AneExecutor::Candle, Dtype::F32)
    );
}

#[test]
fn int8_is_for_cpu_gpu_pools_only() {
    let cpu = "[[pool]]\nname = \"fast\"\ndevice = \"cpu\"\ndtype = \"int8\"\n";
    let config = load(Some(&ConfigFile::new(cpu)), &[]).expect("valid");
    assert_eq!(
        (config.pools[0].worker, config.pools[0].effective_dtype()),
        (WorkerKind::Gpu, Dtype::Int8)
    );
    assert_eq!(Dtype::Int8.as_str(), "int8");
    // auto: the worker runs int8 on the CPU.
    let auto = "[[pool]]\nname = \"fast\"\ndtype = \"int8\"\n";
    assert!(load(Some(&ConfigFile::new(auto)), &[]).is_ok());

    for device in ["metal", "cuda"] {
        let gpu = format!("[[pool]]\nname = \"g\"\ndevice = \"{device}\"\ndtype = \"int8\"\n");
        let problem = only_problem(load(Some(&ConfigFile::new(&gpu)), &[]));
        assert_eq!(problem.key, "pool[0].dtype");
        assert!(
            problem.message.contains("runs on the CPU only") && problem.message.contains(device),
            "{problem}"
        );
    }
    let ane = "[[pool]]\nname = \"ane\"\nworker = \"ane\"\nartifacts = \"a\"\ndtype = \"int8\"\n";
    let problem = only_problem(load(Some(&ConfigFile::new(ane)), &[]));
    assert_eq!(problem.key, "pool[0].dtype");
    assert!(
        problem.message.contains("does not apply to an \"ane\" pool"),
        "{problem}"
    );
    // Other spellings are not int8.
    let problem = only_problem(load(Some(&ConfigFile::new(&cpu.replace("int8", "i8"))), &[]));
    assert!(problem.message.contains("int8"), "{problem}");
}

#[test]
fn routing_limits_and_buckets_are_checked() {
    let file =
        ConfigFile::new("[[pool]]\nname = \"short\"\nmax_questions = 0\nbuckets = [96, 64]\nartifacts = \"a\"\n");
    let error = load(Some(&file), &[]).expect_err("refused");
    let keys: Vec<&str> = error.problems().iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        ["pool[0].artifacts", "pool[0].max_questions", "pool[0].buckets"],
        "{error}"
    );
    let file = ConfigFile::new(
        "[[pool]]\nname = \"short\"\nmax_questions = 1\nmax_tokens = 128\nbuckets = [64, 96, 128]\nbatch_wait = \"2ms\"\n[scheduling]\nspill = false\n",
    );
    let config = load(Some(&file), &[]).expect("valid");
    assert_eq!(config.pools[0].buckets, [64, 96, 128]);
    assert_eq!(config.pools[0].batch_wait, std::time::Duration::from_millis(2));
    assert!(!config.scheduling.spill);
}

#[test]
fn queue_order_and_aging_are_read_and_checked() {
    let defaults = load(None, &[]).expect("defaults");
    assert_eq!(defaults.scheduling.order, QueueOrder::ShortestFirst);
    assert_eq!(defaults.scheduling.aging, 10.0);
    let file = ConfigFile::new("[scheduling]\norder = \"arrival\"\naging = 4\n");
    let config = load(Some(&file), &[]).expect("valid");
    assert_eq!(
        (config.scheduling.order, config.scheduling.aging),
        (QueueOrder::Arrival, 4.0)
    );
    let problem = only_problem(load(None, &[("LAYAD_SCHEDULING__ORDER", "random")]));
    assert_eq!(problem.key, "scheduling.order");
    assert!(problem.message.contains("shortest-first"), "{problem}");
    let file = ConfigFile::new("[scheduling]\naging = 0.5\n");
    let problem = only_problem(load(Some(&file), &[]));
    assert_eq!(problem.key, "scheduling.aging");
    assert!(problem.message.contains("from 1 to 1000"), "{problem}");
}

#[test]
fn the_upstream_profile_defaults_to_0_4_15_and_refuses_unknown_releases() {
    let config = load(None, &[]).expect("loads");
    assert_eq!(config.compat.upstream, Upstream::V0_4_15);
    assert_eq!(
        (config.compat.default_checkpoint, config.compat.max_token_budget),
        (None, 8192)
    );

    let file =
        ConfigFile::new("[compat]\nupstream = \"0.3.20\"\ndefault_checkpoint = \"english\"\nmax_token_budget = 2048\n");
    let config = load(Some(&file), &[]).expect("loads");
    assert_eq!(config.compat.upstream, Upstream::V0_3_20);
    assert_eq!(config.compat.default_checkpoint, Some(CheckpointName::English));
    assert_eq!(config.compat.max_token_budget, 2048);

    let problem = only_problem(load(None, &[("LAYAD_COMPAT__UPSTREAM", "0.4.14")]));
    assert_eq!(problem.key, "compat.upstream");
    assert!(problem.message.contains("\"0.4.14\""), "{}", problem.message);
    let problem = only_problem(load(None, &[("LAYAD_COMPAT__MAX_TOKEN_BUDGET", "9000")]));
    assert_eq!(problem.key, "compat.max_token_budget");
    let problem = only_problem(load(None, &[("LAYAD_COMPAT__DEFAULT_CHECKPOINT", "englisch")]));
    assert_eq!(problem.key, "compat.default_checkpoint");
}

#[test]
fn aliases_name_a_checkpoint_and_must_be_new_names() {
    let file = ConfigFile::new(
        "[checkpoints.extra]\nmine = \"/srv/mine\"\n[checkpoints.aliases]\nlaya-421m = \"english\"\n\"Me/Laya\" = \"Mine\"\nbig = \"multi\"\n",
    );
    let config = load(Some(&file), &[]).expect("loads");
    let mine = CheckpointName::register("mine").expect("valid");
    assert_eq!(
        config.checkpoints.alias_table(),
        [
            ("me/laya".to_owned(), mine),
            ("big".to_owned(), CheckpointName::Multilingual),
            ("laya-421m".to_owned(), CheckpointName::English),
        ]
    );
    for (table, key, says) in [
        (
            "english = \"multilingual\"",
            "checkpoints.aliases.english",
            "alias 'english' is already the checkpoint 'english'; an alias must be a new name",
        ),
        (
            "en = \"multilingual\"",
            "checkpoints.aliases.en",
            "alias 'en' is already upstream's alias of 'english'",
        ),
        (
            "auto = \"english\"",
            "checkpoints.aliases.auto",
            "a request for automatic routing",
        ),
        (
            "laya-421m = \"englsh\"",
            "checkpoints.aliases.laya-421m",
            "\"englsh\" is no checkpoint: name a built-in",
        ),
        ("\"-x\" = \"english\"", "checkpoints.aliases.-x", "invalid alias '-x'"),
    ] {
        let file = ConfigFile::new(&format!("[checkpoints.aliases]\n{table}\n"));
        let problem = only_problem(load(Some(&file), &[]));
        assert_eq!(problem.key, key, "{table}: {problem}");
        assert!(problem.message.contains(says), "{table}: {problem}");
    }
    // An alias of an extra checkpoint's name is refused too, naming the extra entry.
    let file =
        ConfigFile::new("[checkpoints.extra]\nmine = \"/srv/mine\"\n[checkpoints.aliases]\nMINE = \"english\"\n");
    let problem = only_problem(load(Some(&file), &[]));
    assert!(
        problem.message.contains("the checkpoint 'mine' of [checkpoints.extra]"),
        "{problem}"
    );
}

#[test]
fn require_device_is_for_gpu_pools_asking_for_a_gpu() {
    let file = ConfigFile::new("[[pool]]\nname = \"g\"\ndevice = \"cuda\"\nrequire_device = true\n");
    let config = load(Some(&file), &[]).expect("loads");
    assert!(config.pools[0].require_device);
    for pool in [
        "device = \"cpu\"\nrequire_device = true",
        "device = \"auto\"\nrequire_device = true",
        "worker = \"ane\"\nartifacts = \"a\"\nrequire_device = true",
    ] {
        let file = ConfigFile::new(&format!("[[pool]]\nname = \"p\"\n{pool}\n"));
        let problem = only_problem(load(Some(&file), &[]));
        assert_eq!(problem.key, "pool[0].require_device", "{pool}: {problem}");
        assert!(
            problem
                .message
                .starts_with("applies to \"gpu\" pools with device = \"metal\" or \"cuda\""),
            "{problem}"
        );
    }
}

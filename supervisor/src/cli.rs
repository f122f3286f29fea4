//! The command line: `layad serve`, `layad check`, `layad fetch`, `layad service install|uninstall|
//! status` and `layad --version`; each command loads the configuration and reports problems readably.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use layad_config::{CheckpointSource, Config, Flags, NoteLevel, Sources};
use layad_hub::FetchOptions;

use crate::checkpoints::Checkpoints;
use crate::error::LayadError;
use crate::pool::capabilities::Capabilities;

/// Serve the Laya typed-decision models behind the Jev-compatible `POST /v1/systemone` API.
#[derive(Debug, Parser)]
#[command(name = "layad", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve HTTP until SIGTERM or SIGINT, then drain in-flight requests and exit 0.
    Serve(ServeArgs),
    /// Validate the configuration and open every served checkpoint; exit 0 if all is well, else 1.
    Check(CheckArgs),
    /// Make the running server re-read its configuration (SIGHUP) and report how it went.
    Reload(ReloadArgs),
    /// Download checkpoints into the Hugging Face cache (shared with upstream laya).
    Fetch(FetchArgs),
    /// Run layad as a launchd (macOS) or systemd (Linux) service.
    #[command(subcommand)]
    Service(ServiceCommand),
}

/// `layad fetch` arguments.
#[derive(Debug, Args)]
pub struct FetchArgs {
    /// Checkpoints to download: english, multilingual, typed-decisions (or an alias), or all.
    #[arg(default_value = "all", value_name = "CHECKPOINT")]
    pub checkpoints: Vec<String>,
    /// Use only what is cached; fail naming what is missing (also HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub offline: bool,
}

/// `layad service` subcommands.
#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Write the launchd plist or systemd unit and start the service.
    Install(ServiceArgs),
    /// Stop the service and remove its file.
    Uninstall(ServiceArgs),
    /// Show what launchd or systemd says about the service.
    Status(ServiceArgs),
}

/// Flags shared by the `layad service` subcommands.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// Configuration file the service will use.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A system service (launchd daemon, system unit) instead of the user's.
    #[arg(long)]
    pub system: bool,
    /// Print exactly what would be written and run, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `layad serve` flags.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML configuration file (see config/README.md); without one, the built-in defaults.
    #[arg(long, env = layad_config::load::CONFIG_FILE_VAR, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:8642 (overrides server.listen).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Never download a missing checkpoint (also HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub offline: bool,
    /// Log lines as `pretty` text or one `json` object per line (overrides logging.format).
    #[arg(long, value_name = "FORMAT", value_parser = ["pretty", "json"])]
    pub log_format: Option<String>,
}

/// `layad check` flags.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// TOML configuration file (see config/README.md); without one, the built-in defaults.
    #[arg(long, env = layad_config::load::CONFIG_FILE_VAR, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `layad reload` flags.
#[derive(Debug, Args)]
pub struct ReloadArgs {
    /// TOML configuration file (see config/README.md); without one, the built-in defaults.
    #[arg(long, env = layad_config::load::CONFIG_FILE_VAR, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The address of the server to reload; by default the running instance started with the same
    /// configuration file (found in the socket directory), else `server.listen`.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Check(args) => check(args),
        Command::Reload(args) => reload(args),
        Command::Fetch(args) => fetch(args),
        Command::Service(command) => service(command),
    }
}

/// `layad fetch`: downloads into the Hugging Face cache with progress on stderr.
fn fetch(args: FetchArgs) -> ExitCode {
    let mut names = Vec::new();
    for arg in &args.checkpoints {
        if arg.eq_ignore_ascii_case("all") {
            names.extend(laya::routing::CheckpointName::ALL);
        } else if let Some(name) = laya::routing::CheckpointName::from_name_or_alias(arg) {
            names.push(name);
        } else {
            eprintln!("layad fetch: unknown checkpoint {arg:?}; use english, multilingual, typed-decisions or all");
            return ExitCode::from(2);
        }
    }
    names.dedup();
    let result = FetchOptions::from_env().and_then(|mut options| {
        options.offline |= args.offline;
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build();
        let runtime = runtime.map_err(|e| layad_hub::FetchError::Io {
            path: options.cache_dir.clone(),
            source: e,
        })?;
        runtime.block_on(layad_hub::fetch(&names, &options))
    });
    match result {
        Ok(fetched) => {
            for checkpoint in fetched {
                println!(
                    "{}: {} ({} bytes downloaded)",
                    checkpoint.name.as_str(),
                    checkpoint.location.dir.display(),
                    checkpoint.transferred_bytes()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("layad fetch: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `layad service install|uninstall|status`.
fn service(command: ServiceCommand) -> ExitCode {
    let (ServiceCommand::Install(args) | ServiceCommand::Uninstall(args) | ServiceCommand::Status(args)) = &command;
    let options = match crate::install::ServiceOptions::from_env(args.config.clone(), args.system, args.dry_run) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("layad service: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match command {
        ServiceCommand::Install(_) => crate::install::install(&options).map(|r| (r.to_string(), true)),
        ServiceCommand::Uninstall(_) => crate::install::uninstall(&options).map(|r| (r.to_string(), true)),
        ServiceCommand::Status(_) => {
            crate::install::status(&options).map(|s| (s.to_string(), s.output.code == Some(0)))
        }
    };
    match outcome {
        Ok((text, ok)) => {
            print!("{text}");
            if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            eprintln!("layad service: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    let sources = Sources::with_process_env(args.config, Flags { listen: args.listen });
    let (mut config, notes) = match Config::load_with_notes(&sources) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("layad: {e}");
            return ExitCode::FAILURE;
        }
    };
    match args.log_format.as_deref() {
        Some("json") => config.logging.format = layad_config::LogFormat::Json,
        Some(_) => config.logging.format = layad_config::LogFormat::Pretty,
        None => {}
    }
    if let Err(e) = crate::telemetry::init_logging(&config.logging) {
        eprintln!("layad: {e}");
        return ExitCode::FAILURE;
    }
    // Upstream's LAYA_* variables: each one used is logged, each without effect warned about.
    for note in &notes {
        match note.level {
            NoteLevel::Info => tracing::info!(variable = note.variable, "{}", note.message),
            NoteLevel::Warn => tracing::warn!(variable = note.variable, "{} (config/README.md)", note.message),
        }
    }
    match serde_json::to_string(&config) {
        // The API key is not part of the serialized configuration, so this cannot leak it.
        Ok(text) => tracing::info!(config = %text, api_key = config.api_key.is_some(), "configuration"),
        Err(e) => tracing::warn!(error = %e, "cannot render the configuration"),
    }
    let options = crate::RunOptions {
        reload_from: Some(sources),
        offline: args.offline,
    };
    let served = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(LayadError::Runtime)
        .and_then(|runtime| runtime.block_on(crate::run(config, options, crate::shutdown::shutdown_signal())));
    match served {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("layad: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `layad reload`: checks the configuration here first (a broken file is reported without
/// bothering the server), then finds the server (`--listen`, else the running instance started with
/// this configuration file, else `server.listen`), sends it SIGHUP (its pid from `/health`) and
/// waits for `/health` to report the outcome.
fn reload(args: ReloadArgs) -> ExitCode {
    let sources = Sources::with_process_env(args.config.clone(), Flags::default());
    let config = match Config::load(&sources) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("layad reload: not sent, the configuration has errors:\n{e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("layad reload: {e}");
            return ExitCode::FAILURE;
        }
    };
    let target = crate::reload_client::find_server(&config, args.config.as_deref(), args.listen);
    match runtime.block_on(crate::reload_client::signal_reload(&target)) {
        Ok(changes) => {
            println!(
                "reloaded: {}",
                if changes.is_empty() {
                    "nothing changed".to_owned()
                } else {
                    changes.join("; ")
                }
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("layad reload: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `layad check`: the configuration, then one block per checkpoint; exit 1 on any problem.
fn check(args: CheckArgs) -> ExitCode {
    let sources = Sources::with_process_env(args.config.clone(), Flags::default());
    let (config, notes) = match Config::load_with_notes(&sources) {
        Ok(loaded) => loaded,
        Err(e) => {
            println!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match &args.config {
        Some(file) => println!("configuration: {} ok", file.display()),
        None => println!("configuration: built-in defaults (no --config) ok"),
    }
    for note in &notes {
        let label = match note.level {
            NoteLevel::Info => "upstream ",
            NoteLevel::Warn => "warning  ",
        };
        println!("  {label} {}", note.message);
    }
    println!("  listen    {}", config.server.listen);
    let auth = match (&config.api_key, &config.server.api_key_file) {
        (None, _) => "none (anyone who can connect may call /v1/systemone)".to_owned(),
        (Some(_), Some(file)) => format!("bearer key from {}", file.display()),
        (Some(_), None) => format!("bearer key from {}", layad_config::load::API_KEY_VAR),
    };
    println!("  auth      {auth}");
    let binary_dir = config.workers.binary_dir();
    for pool in &config.pools {
        let names: Vec<&str> = config.pool_checkpoints(pool).iter().map(|c| c.as_str()).collect();
        println!(
            "  pool      {}: {} x {} worker, device {}, dtype {}, threads {}, serves {}",
            pool.name,
            pool.workers,
            pool.worker.as_str(),
            pool.device.as_str(),
            pool.effective_dtype().as_str(),
            pool.threads,
            names.join(", ")
        );
        let takes = Capabilities::from_config(pool);
        println!(
            "  takes     {}{}{}",
            takes.describe(),
            if takes.buckets.is_empty() {
                String::new()
            } else {
                format!(", buckets {:?}", takes.buckets)
            },
            if takes.max_rows > 1 {
                format!(", batches up to {} rows", takes.max_rows)
            } else {
                String::new()
            }
        );
        if let Some(why) = (crate::worker_kind::spec(pool.worker).unavailable_here)(pool) {
            println!("  warning   {why}");
        }
        // Reported, not failed: a missing worker binary is a build step, not a config mistake.
        match &binary_dir {
            Ok(dir) => {
                let binary = dir.join(pool.worker.binary_name());
                let found = if binary.is_file() { "found" } else { "NOT FOUND" };
                println!("  worker    {} ({found})", binary.display());
            }
            Err(e) => println!("  worker    cannot locate the worker binaries: {e}"),
        }
    }
    if config
        .served_checkpoints()
        .iter()
        .any(|(_, source)| *source == CheckpointSource::HfCache)
    {
        match laya::checkpoint::hf_hub_cache_dir() {
            Some(cache) => println!("Hugging Face cache: {}", cache.display()),
            None => println!("Hugging Face cache: none (set HF_HUB_CACHE or HF_HOME)"),
        }
    }
    let mut failed = 0;
    for (name, result) in Checkpoints::open_each(&config) {
        match result {
            Ok(c) => {
                let e = &c.encoder;
                println!("{}: ok", name.as_str());
                println!("  files     {}", c.location.dir.display());
                println!(
                    "  revision  {}",
                    c.location.revision().unwrap_or("(not from a snapshot)")
                );
                println!(
                    "  weights   sha256 {} ({} tensors, {} bytes)",
                    c.weights.sha256,
                    c.weights.tensors.len(),
                    c.weights.size
                );
                println!(
                    "  encoder   {} layers x {} hidden, {} heads, vocab {}; max_len {}, head_max_len {}",
                    e.num_hidden_layers,
                    e.hidden_size,
                    e.num_attention_heads,
                    e.vocab_size,
                    c.agent.max_len,
                    c.agent.head_max_len
                );
                for clamped in &c.agent.temperatures.clamped {
                    println!(
                        "  warning   temperature {}={} is applied as {}",
                        clamped.entry, clamped.raw, clamped.applied
                    );
                }
            }
            Err(e) => {
                failed += 1;
                println!("{}: FAILED\n  {e}", name.as_str());
            }
        }
    }
    for name in laya::routing::CheckpointName::ALL {
        if *config.checkpoints.source(name) == CheckpointSource::Off {
            println!("{}: off (requests routed to it are answered 503)", name.as_str());
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

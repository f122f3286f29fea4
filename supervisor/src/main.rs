//! `layad`: the supervisor binary. Today it carries `layad check`, which finds and opens every
//! published checkpoint in the Hugging Face cache and reports what it found; `serve` follows.

use std::process::ExitCode;

use laya::checkpoint::{Checkpoint, find_in_hf_cache, hf_hub_cache_dir};
use laya::routing::CheckpointName;

const USAGE: &str = "usage: layad check | layad --version

  check      find english, multilingual and typed-decisions in the Hugging Face cache
             (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub), open every file,
             and report revision, weights SHA-256 and shapes; exit 1 if any checkpoint fails";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["--version" | "-V"] => {
            println!("layad {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        ["check"] => check(),
        ["--help" | "-h" | "help"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// Opens every published checkpoint from the Hugging Face cache and prints one block each.
fn check() -> ExitCode {
    let Some(cache) = hf_hub_cache_dir() else {
        eprintln!("error: no Hugging Face cache: set HF_HUB_CACHE or HF_HOME (or HOME)");
        return ExitCode::FAILURE;
    };
    println!("Hugging Face cache: {}", cache.display());
    let mut failed = 0;
    for name in CheckpointName::ALL {
        match find_in_hf_cache(&cache, name).and_then(Checkpoint::open) {
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
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

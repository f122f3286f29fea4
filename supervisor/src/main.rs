//! `layad`: the supervisor binary. Parsing and the commands live in `layad::cli`, so the binary
//! stays a two-line shell around the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    layad::cli::run(layad::cli::Cli::parse())
}

//! The `dsh` command line: parses flags, environment and `dsh.toml`, runs one subcommand, and turns
//! any failure into one line on stderr and a non-zero exit code.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = dsh_actors::cli::Cli::parse();
    dsh_actors::cli::main(cli)
}

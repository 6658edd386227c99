//! The `dsh` command line: parses flags, environment and `dsh.toml`, runs one subcommand, and turns
//! any failure into one line on stderr and a non-zero exit code.
//!
//! Diagnostics: `DSH_LOG` takes a `tracing` filter (`DSH_LOG=warn`, `DSH_LOG=dsh_actors=debug`) and
//! writes to stderr. Unset, nothing is logged. Message content is only ever logged at `trace`.

use std::process::ExitCode;

use clap::Parser;

/// jemalloc, not glibc's malloc: with glibc, every agent thread's arena grows one `mprotect` call
/// per fresh page (with its page faults, `sysmalloc` was 36 % of the agent threads' samples in a
/// 10,000-agent burst) and frees that cross threads take the owning arena's lock (18 % of the
/// unpinned workers' samples); BENCHMARKS.md, "jemalloc and smaller commit groups". Only the binary
/// chooses: the libraries leave the allocator to whoever embeds them.
#[cfg(all(target_os = "linux", not(target_env = "musl")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // SAFETY: this is the first statement of `main`: no other thread exists yet (the tokio runtime
    // and the tracing subscriber are started below), so nothing can read the environment while the
    // key variables are removed from it and their bytes wiped.
    let key = unsafe { dsh_cli::secret::take_api_key() };
    let cli = match dsh_cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Read as text only to name the subcommand in the hint (arguments may be any bytes).
            let args: Vec<String> = std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            return dsh_cli::usage::report(&e, &args);
        }
    };
    if let Ok(filter) = std::env::var("DSH_LOG") {
        match tracing_subscriber::EnvFilter::try_new(&filter) {
            Ok(filter) => tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .init(),
            Err(e) => {
                eprintln!(
                    "dsh: DSH_LOG: {}",
                    dsh_cli::text::error_line(&e.to_string())
                );
                return ExitCode::from(64);
            }
        }
    }
    dsh_cli::main(cli, key)
}

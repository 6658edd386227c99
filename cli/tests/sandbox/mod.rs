//! The working directory a command-line test runs the built `dsh` binary in, and what a finished
//! run left: shared by `cli.rs` and `store_cli.rs`, so both run the binary the same way, with none
//! of the developer's environment leaking in.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The `dsh` binary: cargo builds it for this package's integration tests (or `DSH_BIN` names one).
pub fn dsh_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("DSH_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => PathBuf::from(env!("CARGO_BIN_EXE_dsh")),
    })
}

/// Environment variables that would leak the developer's setup into a test (besides every other
/// `DSH_*`, which `scrub` removes too).
const SCRUBBED_VARS: [&str; 9] = [
    "DSH_LOG",
    "DSH_DATA_DIR",
    "DSH_PROVIDER",
    "DSH_BASE_URL",
    "DSH_MODEL",
    "DSH_CONFIG",
    "DEEPSEEK_API_KEY",
    "OPENAI_API_KEY",
    "DEEPSEEK_BASE_URL",
];

/// Removes the developer's setup from `cmd`'s environment: the variables above and every `DSH_*`.
pub fn scrub(cmd: &mut Command) {
    for var in SCRUBBED_VARS {
        cmd.env_remove(var);
    }
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with("DSH_") {
            cmd.env_remove(var);
        }
    }
}

/// A working directory for one test, with the default data directory `./.dsh` inside it.
pub struct Sandbox {
    /// Removed when the sandbox is dropped.
    pub dir: tempfile::TempDir,
}

impl Sandbox {
    /// A fresh, empty working directory.
    pub fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// The working directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The default data directory inside it.
    pub fn data_dir(&self) -> PathBuf {
        self.path().join(".dsh")
    }

    /// `dsh ARGS` in the working directory, without colours, stdin or the developer's setup.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(dsh_bin());
        cmd.args(args)
            .current_dir(self.path())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        scrub(&mut cmd);
        cmd
    }

    /// Runs `dsh ARGS` to its end.
    pub fn run(&self, args: &[&str]) -> Run {
        Run::from(self.command(args).output().expect("dsh runs"))
    }
}

/// What a finished `dsh` process left.
#[derive(Debug)]
pub struct Run {
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Everything printed on stdout.
    pub stdout: String,
    /// Everything printed on stderr.
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

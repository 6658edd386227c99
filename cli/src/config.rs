//! Configuration: flags over environment over `dsh.toml` over defaults, resolved once; and
//! `CliError`, the one-line failure every subcommand reports.
//!
//! clap has already merged each flag with its environment variable (`--data-dir` / `DSH_DATA_DIR`,
//! ...). `Config::resolve` fills what is still unset from the configuration file — `--config FILE`
//! (`DSH_CONFIG`), else `./dsh.toml` when it exists — and then from the defaults. The file is read
//! strictly: an unknown key or a value of the wrong type is an error naming the key, never ignored,
//! because a typo in a key would otherwise silently change nothing. A relative `data_dir` in the file
//! is taken relative to the file's directory.
//!
//! Keys of `dsh.toml` (all optional):
//!
//! | key | type | meaning |
//! |---|---|---|
//! | `data_dir` | string | where the store lives (default `./.dsh`) |
//! | `provider` | string | `openai` (default), `sim` or `script` |
//! | `base_url` | string | OpenAI-compatible endpoint (default DeepSeek's) |
//! | `model` | string | model id |
//! | `max_tokens` | integer ≥ 1 | output cap per request |
//! | `system` | string | the system prompt |
//! | `shell` | boolean | give the model the `shell` tool (default false) |
//! | `[sim]` | table | the simulated model (`dsh::llm::sim::SimConfig`: `seed`, `ttft_ms`, `tokens_per_sec`, `reply_tokens_min`, `reply_tokens_max`, `tool_call_probability`, `max_tool_steps`, `reasoning`) |
//! | `[openai]` | table | `connect_timeout_ms`, `idle_timeout_ms` |
//! | `retry_timeout_ms` | integer ≥ 1 | bound on the whole retry sequence of one model request (default 600000, 10 min) |
//! | `[compaction]` | table | SPEC §15: `context_window` (integer ≥ 1; else the table of known models, else no automatic compaction), `threshold_ratio` (0.8), `retain_ratio` (0.16), `auto` (true) |
//! | `[mcp_servers.NAME]` | table | an MCP server (SPEC §16): `command`, `args`, `env`, `cwd` (stdio) or `url`, `bearer_token_env` (streamable HTTP), and `startup_timeout_ms`, `call_timeout_ms` (`dsh_mcp::ServerEntry`); a relative `cwd` is taken relative to the file's directory |

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use dsh::llm::openai::TIMEOUT_MS_MAX;
use dsh::llm::sim::{SimConfig, SimProvider};
use dsh::session::compaction::CompactionSettings;
use serde::Deserialize;

use crate::GlobalArgs;
use crate::secret::StartupKey;
use crate::text::echo;

/// Why a command failed. Printed as one line; `exit_code` picks the status.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A bad invocation: flag, argument or environment (exit 64).
    #[error("{0}")]
    Usage(String),
    /// A configuration file that cannot be read or is malformed (exit 64).
    #[error("config {path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key.
        reason: String,
    },
    /// Anything else that failed (exit 1).
    #[error("{0}")]
    Failed(String),
    /// The reader of stdout went away (`dsh show ID | head`): not a failure, nothing to print.
    #[error("the output was closed")]
    OutputClosed,
}

impl CliError {
    /// The exit status for this error: 64 for usage and configuration, 1 for a failure, 0 for a
    /// closed output.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage(_) | CliError::Config { .. } => ExitCode::from(64),
            CliError::Failed(_) => ExitCode::FAILURE,
            CliError::OutputClosed => ExitCode::SUCCESS,
        }
    }

    /// A failure to write the command's output: `OutputClosed` for a closed pipe, else `Failed`.
    pub fn output(what: &str, e: std::io::Error) -> CliError {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            CliError::OutputClosed
        } else {
            CliError::Failed(format!("{what}: {e}"))
        }
    }
}

/// The providers the command line can build.
pub const PROVIDERS: [&str; 3] = ["openai", "sim", "script"];

/// The configuration file read when `--config` is not given (in the working directory).
pub const CONFIG_FILE_NAME: &str = "dsh.toml";

/// Timeouts of the `openai` provider (`[openai]` in `dsh.toml`); `None` keeps the provider's default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiTimeouts {
    /// `connect_timeout_ms`: bound on establishing a connection.
    pub connect_timeout_ms: Option<u64>,
    /// `idle_timeout_ms`: bound on each wait for the server.
    pub idle_timeout_ms: Option<u64>,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the store lives.
    pub data_dir: PathBuf,
    /// The store URL of this command's `--store` / `DSH_STORE` (`Config::store_url`); `None`: the
    /// SQLite store in `data_dir`.
    pub store: Option<String>,
    /// `None`: the default, `openai`. Invariant: when set, one of `PROVIDERS`.
    pub provider: Option<String>,
    /// The OpenAI-compatible endpoint, when configured.
    pub base_url: Option<String>,
    /// The model id, when configured.
    pub model: Option<String>,
    /// Output cap per request from `dsh.toml` (a `--max-tokens` flag overrides it).
    pub max_tokens: Option<u64>,
    /// System prompt from `dsh.toml` (a `--system` flag overrides it).
    pub system: Option<String>,
    /// `shell = true` in `dsh.toml` (`--shell` also enables it).
    pub shell: bool,
    /// The simulated model; validated.
    pub sim: SimConfig,
    /// The `openai` provider's timeouts.
    pub openai: OpenAiTimeouts,
    /// `retry_timeout_ms` in `dsh.toml`: bound on one request's retry sequence (a
    /// `--retry-timeout-ms` flag overrides it; unset: `DEFAULT_SEQUENCE_MS_MAX`).
    pub retry_timeout_ms: Option<u64>,
    /// The configuration file that was read, if any.
    pub file: Option<PathBuf>,
    /// `[mcp_servers.NAME]` entries, checked, in name order.
    pub mcp_servers: Vec<dsh_mcp::ServerConfig>,
    /// The API key taken from the environment at start-up (`secret::take_api_key`); `resolve`
    /// leaves it `Unset` and `main` fills it in.
    pub api_key: StartupKey,
    /// `[compaction]`: when and how agents compact (SPEC §15).
    pub compaction: CompactionSettings,
}

/// What `dsh.toml` held, every key optional.
#[derive(Debug, Default)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    provider: Option<String>,
    base_url: Option<String>,
    model: Option<String>,
    max_tokens: Option<u64>,
    system: Option<String>,
    shell: Option<bool>,
    sim: Option<SimConfig>,
    openai: Option<OpenAiTimeouts>,
    retry_timeout_ms: Option<u64>,
    mcp_servers: Vec<dsh_mcp::ServerConfig>,
    compaction: Option<CompactionSettings>,
}

/// The `[compaction]` table of `dsh.toml` (SPEC §15), every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompactionFile {
    context_window: Option<u64>,
    threshold_ratio: Option<f64>,
    retain_ratio: Option<f64>,
    auto: Option<bool>,
}

const KEYS: [&str; 12] = [
    "data_dir",
    "provider",
    "base_url",
    "model",
    "max_tokens",
    "system",
    "shell",
    "sim",
    "openai",
    "retry_timeout_ms",
    "mcp_servers",
    "compaction",
];

impl Config {
    /// Resolves flags and environment (parsed by clap) over `dsh.toml` over defaults.
    ///
    /// # Errors
    /// `CliError::Config` when the configuration file is unreadable or malformed (naming the key);
    /// `CliError::Usage` for an unknown provider given by flag or environment.
    pub fn resolve(global: &GlobalArgs) -> Result<Config, CliError> {
        let (file_path, explicit) = match &global.config {
            Some(p) => (Some(p.clone()), true),
            None => {
                let p = PathBuf::from(CONFIG_FILE_NAME);
                (p.is_file().then_some(p), false)
            }
        };
        let file = match &file_path {
            Some(path) => read_file(path, explicit)?,
            None => FileConfig::default(),
        };
        let flag = |v: &Option<String>| v.clone().filter(|s| !s.trim().is_empty());
        let provider = flag(&global.provider).or(file.provider);
        if let Some(p) = &provider
            && !PROVIDERS.contains(&p.as_str())
        {
            return Err(CliError::Usage(format!(
                "unknown provider `{p}`: expected openai, sim or script"
            )));
        }
        let data_dir = global
            .data_dir
            .clone()
            .filter(|p| !p.as_os_str().is_empty())
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(".dsh"));
        Ok(Config {
            data_dir,
            store: None,
            provider,
            base_url: flag(&global.base_url).or(file.base_url),
            model: flag(&global.model).or(file.model),
            max_tokens: file.max_tokens,
            system: file.system,
            shell: file.shell.unwrap_or(false),
            sim: file.sim.unwrap_or_default(),
            openai: file.openai.unwrap_or_default(),
            retry_timeout_ms: file.retry_timeout_ms,
            mcp_servers: file.mcp_servers,
            compaction: file.compaction.unwrap_or_default(),
            file: file_path,
            api_key: StartupKey::Unset,
        })
    }

    /// The store this command uses: `--store` / `DSH_STORE` when given, else the data directory.
    ///
    /// # Errors
    /// `CliError::Usage`, one line, for a URL that is neither `sqlite:DIR` nor `postgres://…`.
    pub fn store_url(&self) -> Result<StoreUrl, CliError> {
        StoreUrl::parse(self.store.as_deref(), &self.data_dir)
    }

    /// The provider in force: the configured one or `openai`.
    pub fn provider_name(&self) -> &str {
        self.provider.as_deref().unwrap_or("openai")
    }
}

/// Where sessions are stored (`--store URL` / `DSH_STORE`, SPEC §13, §14).
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite:DIR` (an empty `DIR`, or no URL: the data directory).
    Sqlite(PathBuf),
    /// `postgres://…` or `postgresql://…`: several nodes on one database.
    Postgres(String),
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Sqlite(dir) => write!(f, "sqlite:{}", dir.display()),
            // The URL may carry a password.
            StoreUrl::Postgres(_) => f.write_str("postgres://…"),
        }
    }
}

impl StoreUrl {
    /// Parses a store URL; `None` or blank is the SQLite store in `data_dir`.
    ///
    /// # Errors
    /// `CliError::Usage` for any other scheme.
    pub fn parse(url: Option<&str>, data_dir: &Path) -> Result<StoreUrl, CliError> {
        let Some(url) = url.map(str::trim).filter(|s| !s.is_empty()) else {
            return Ok(StoreUrl::Sqlite(data_dir.to_path_buf()));
        };
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres(url.to_string()));
        }
        match url.strip_prefix("sqlite:") {
            Some(dir) if !dir.is_empty() => Ok(StoreUrl::Sqlite(PathBuf::from(dir))),
            Some(_) => Ok(StoreUrl::Sqlite(data_dir.to_path_buf())),
            None => Err(CliError::Usage(format!(
                "--store: `{}` is not a store URL: expected sqlite:DIR or postgres://…",
                crate::text::echo(url)
            ))),
        }
    }
}

fn read_file(path: &Path, explicit: bool) -> Result<FileConfig, CliError> {
    let fail = |reason: String| CliError::Config {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        if explicit && e.kind() == std::io::ErrorKind::NotFound {
            fail("no such file".to_string())
        } else {
            fail(format!("cannot read it: {e}"))
        }
    })?;
    let base = path.parent().unwrap_or(Path::new(""));
    parse(&text, base).map_err(fail)
}

/// Parses the text of a `dsh.toml` exactly as `dsh` reads one (relative paths against `base`), and
/// returns only the verdict: the entry point of the `dsh_toml` fuzz target and its corpus replay.
///
/// # Errors
/// The one-line reason `dsh` would print.
#[doc(hidden)]
pub fn check_file_text(text: &str, base: &Path) -> Result<(), String> {
    parse(text, base).map(|_| ())
}

/// Parses the text of a configuration file; relative paths are taken relative to `base`.
fn parse(text: &str, base: &Path) -> Result<FileConfig, String> {
    let table = parse_toml(text)?;
    let mut out = FileConfig::default();
    for (key, value) in table {
        let bad = |expected: &str, value: &toml::Value| {
            format!(
                "key `{}`: expected {expected}, got {}",
                echo(&key),
                shown(value)
            )
        };
        match key.as_str() {
            "data_dir" => {
                let s =
                    non_empty_string(&value).ok_or_else(|| bad("a non-empty string", &value))?;
                out.data_dir = Some(base.join(s));
            }
            "provider" => {
                let s = non_empty_string(&value).ok_or_else(|| bad("a string", &value))?;
                if !PROVIDERS.contains(&s) {
                    return Err(format!(
                        "key `provider`: unknown provider `{}`: expected openai, sim or script",
                        echo(s)
                    ));
                }
                out.provider = Some(s.to_string());
            }
            "base_url" => {
                let s =
                    non_empty_string(&value).ok_or_else(|| bad("a non-empty string", &value))?;
                out.base_url = Some(s.to_string());
            }
            "model" => {
                let s =
                    non_empty_string(&value).ok_or_else(|| bad("a non-empty string", &value))?;
                out.model = Some(s.to_string());
            }
            "max_tokens" => {
                let n = value
                    .as_integer()
                    .and_then(|n| u64::try_from(n).ok())
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| bad("a positive integer", &value))?;
                out.max_tokens = Some(n);
            }
            "retry_timeout_ms" => {
                let n = value
                    .as_integer()
                    .and_then(|n| u64::try_from(n).ok())
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| bad("a positive integer (milliseconds)", &value))?;
                out.retry_timeout_ms = Some(n);
            }
            "system" => {
                let s = value.as_str().ok_or_else(|| bad("a string", &value))?;
                out.system = Some(s.to_string());
            }
            "shell" => {
                let b = value.as_bool().ok_or_else(|| bad("a boolean", &value))?;
                out.shell = Some(b);
            }
            "sim" => {
                if !value.is_table() {
                    return Err(bad("a table", &value));
                }
                let sim: SimConfig = table_of("sim", value)?;
                SimProvider::new(sim.clone()).map_err(|e| format!("key `sim`: {e}"))?;
                out.sim = Some(sim);
            }
            "openai" => {
                if !value.is_table() {
                    return Err(bad("a table", &value));
                }
                let openai = read_openai(value)?;
                out.openai = Some(openai);
            }
            "compaction" => {
                if !value.is_table() {
                    return Err(bad("a table", &value));
                }
                let c: CompactionFile = table_of("compaction", value)?;
                let defaults = CompactionSettings::default();
                let settings = CompactionSettings {
                    context_window: c.context_window,
                    threshold_ratio: c.threshold_ratio.unwrap_or(defaults.threshold_ratio),
                    retain_ratio: c.retain_ratio.unwrap_or(defaults.retain_ratio),
                    auto: c.auto.unwrap_or(defaults.auto),
                };
                settings
                    .validate()
                    .map_err(|e| format!("key `compaction`: {e}"))?;
                out.compaction = Some(settings);
            }
            "mcp_servers" => {
                if !value.is_table() {
                    return Err(bad("a table", &value));
                }
                out.mcp_servers = read_mcp_servers(value, base)?;
            }
            other => {
                return Err(format!(
                    "unknown key `{}` (known keys: {})",
                    echo(other),
                    KEYS.join(", ")
                ));
            }
        }
    }
    Ok(out)
}

/// Parses the text of a configuration file as a TOML table; a syntax error names its line.
fn parse_toml(text: &str) -> Result<toml::Table, String> {
    toml::from_str(text).map_err(|e: toml::de::Error| {
        let message = one_line(e.message());
        match e.span() {
            Some(span) => {
                let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                format!("line {line}: {message}")
            }
            None => message,
        }
    })
}

/// Reads the `[openai]` table: its timeouts, each within `1..=TIMEOUT_MS_MAX`.
fn read_openai(value: toml::Value) -> Result<OpenAiTimeouts, String> {
    let openai: OpenAiTimeouts = table_of("openai", value)?;
    for (name, ms) in [
        ("connect_timeout_ms", openai.connect_timeout_ms),
        ("idle_timeout_ms", openai.idle_timeout_ms),
    ] {
        if let Some(ms) = ms
            && (ms == 0 || ms > TIMEOUT_MS_MAX)
        {
            return Err(format!(
                "key `openai.{name}`: {ms} is out of range 1..={TIMEOUT_MS_MAX}"
            ));
        }
    }
    Ok(openai)
}

/// Reads the `[mcp_servers]` table: one checked entry per server, in name order. A relative `cwd`
/// is taken relative to `base` (the file's directory).
fn read_mcp_servers(value: toml::Value, base: &Path) -> Result<Vec<dsh_mcp::ServerConfig>, String> {
    let toml::Value::Table(entries) = value else {
        return Ok(Vec::new());
    };
    let mut servers = Vec::new();
    for (name, entry) in entries {
        if !entry.is_table() {
            return Err(format!(
                "key `mcp_servers.{}`: expected a table, got {}",
                echo(&name),
                shown(&entry)
            ));
        }
        let mut entry: dsh_mcp::ServerEntry = table_of(&format!("mcp_servers.{name}"), entry)?;
        entry.cwd = entry.cwd.map(|cwd| base.join(cwd));
        servers.push(entry.check(&name).map_err(|e| echo(&e.to_string()))?);
    }
    Ok(servers)
}

/// Reads table `name` as a `T`. A bad entry is named by its dotted key (`sim.seed`) with serde's
/// reason, which names the bad value: each entry is tried alone to find the one at fault.
fn table_of<T: serde::de::DeserializeOwned>(name: &str, value: toml::Value) -> Result<T, String> {
    let entries = match &value {
        toml::Value::Table(t) => t.clone(),
        _ => toml::Table::new(),
    };
    value.try_into().map_err(|whole: toml::de::Error| {
        for (key, entry) in entries {
            let mut alone = toml::Table::new();
            alone.insert(key.clone(), entry);
            if let Err(e) = toml::Value::Table(alone).try_into::<T>() {
                return format!(
                    "key `{name}.{}`: {}",
                    echo(&key),
                    echo(&one_line(e.message()))
                );
            }
        }
        format!("key `{name}`: {}", echo(&one_line(whole.message())))
    })
}

/// A value as an error message shows it: scalars as written in TOML (capped), tables and arrays by
/// kind.
fn shown(value: &toml::Value) -> String {
    match value {
        toml::Value::Table(_) => "a table".to_string(),
        toml::Value::Array(_) => "an array".to_string(),
        scalar => format!("{} {}", scalar.type_str(), echo(&scalar.to_string())),
    }
}

fn non_empty_string(value: &toml::Value) -> Option<&str> {
    value.as_str().filter(|s| !s.trim().is_empty())
}

fn one_line(s: &str) -> String {
    s.trim().replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<FileConfig, String> {
        parse(text, Path::new("/cfg"))
    }

    #[test]
    fn every_key_is_read() {
        let c = parsed(
            r#"
data_dir = "state"
provider = "sim"
base_url = "http://127.0.0.1:9"
model = "m"
max_tokens = 100
system = "be brief"
shell = true
retry_timeout_ms = 60000
[sim]
seed = 7
ttft_ms = 0
[openai]
idle_timeout_ms = 5000
"#,
        )
        .expect("valid config");
        assert_eq!(c.data_dir, Some(PathBuf::from("/cfg/state")));
        assert_eq!(c.provider.as_deref(), Some("sim"));
        assert_eq!(c.base_url.as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(c.model.as_deref(), Some("m"));
        assert_eq!(c.max_tokens, Some(100));
        assert_eq!(c.system.as_deref(), Some("be brief"));
        assert_eq!(c.shell, Some(true));
        assert_eq!(c.retry_timeout_ms, Some(60_000));
        let sim = c.sim.expect("sim");
        assert_eq!((sim.seed, sim.ttft_ms), (7, 0));
        assert_eq!(sim.tokens_per_sec, SimConfig::default().tokens_per_sec);
        assert_eq!(
            c.openai,
            Some(OpenAiTimeouts {
                connect_timeout_ms: None,
                idle_timeout_ms: Some(5000)
            })
        );
        let abs = parsed("data_dir = \"/abs\"").expect("valid");
        assert_eq!(abs.data_dir, Some(PathBuf::from("/abs")));
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (
                "modle = \"x\"",
                "unknown key `modle` (known keys: data_dir, provider, base_url, model, max_tokens, system, shell, sim, openai, retry_timeout_ms, mcp_servers, compaction)",
            ),
            (
                "max_tokens = \"ten\"",
                "key `max_tokens`: expected a positive integer, got string \"ten\"",
            ),
            (
                "max_tokens = 0",
                "key `max_tokens`: expected a positive integer, got integer 0",
            ),
            (
                "shell = 1",
                "key `shell`: expected a boolean, got integer 1",
            ),
            (
                "provider = \"gpt\"",
                "key `provider`: unknown provider `gpt`: expected openai, sim or script",
            ),
            (
                "data_dir = \"\"",
                "key `data_dir`: expected a non-empty string, got string \"\"",
            ),
            ("sim = 3", "key `sim`: expected a table, got integer 3"),
            (
                "[openai]\nidle_timeout_ms = 0",
                "key `openai.idle_timeout_ms`: 0 is out of range 1..=2147483647",
            ),
            (
                "[sim]\nreply_tokens_min = 9\nreply_tokens_max = 2",
                "key `sim`: reply_tokens_min 9 is above reply_tokens_max 2",
            ),
            (
                "[compaction]\nthreshold_ratio = 1.5",
                "key `compaction`: threshold_ratio must be in (0, 1], got 1.5",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parsed(text).err().as_deref(), Some(want), "{text}");
        }
        let err = parsed("[sim]\nsed = 1").expect_err("unknown sim key");
        assert!(
            err.starts_with("key `sim.sed`: unknown field `sed`"),
            "{err}"
        );
        assert_eq!(
            parsed("[sim]\nttft_ms = 1\nseed = \"x\"").err().as_deref(),
            Some("key `sim.seed`: invalid type: string \"x\", expected u64")
        );
        assert_eq!(
            parsed("[openai]\nidle_timeout_ms = -5").err().as_deref(),
            Some("key `openai.idle_timeout_ms`: invalid value: integer `-5`, expected u64")
        );
        let err = parsed("model = \"a\"\nthis is not toml").expect_err("syntax");
        assert!(err.starts_with("line 2: "), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn mcp_servers_are_read_and_checked() {
        let c = parsed(
            r#"
[mcp_servers.every]
command = "node"
args = ["index.js", "stdio"]
env = { A = "1" }
cwd = "servers"
call_timeout_ms = 5000
[mcp_servers.web]
url = "https://example.invalid/mcp"
bearer_token_env = "WEB_TOKEN"
"#,
        )
        .expect("valid config");
        let names: Vec<&str> = c.mcp_servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["every", "web"]);
        assert_eq!(
            c.mcp_servers[0].transport,
            dsh_mcp::Transport::Stdio {
                command: "node".into(),
                args: vec!["index.js".into(), "stdio".into()],
                env: [("A".to_string(), "1".to_string())].into(),
                cwd: Some(PathBuf::from("/cfg/servers")),
            }
        );
        assert_eq!(
            c.mcp_servers[0].call_timeout,
            std::time::Duration::from_millis(5000)
        );
        assert_eq!(
            c.mcp_servers[1].transport,
            dsh_mcp::Transport::Http {
                url: "https://example.invalid/mcp".into(),
                bearer_token_env: Some("WEB_TOKEN".into()),
            }
        );
    }

    #[test]
    fn a_bad_mcp_server_entry_is_one_line_naming_the_key() {
        let cases = [
            (
                "mcp_servers = 1",
                "key `mcp_servers`: expected a table, got integer 1",
            ),
            (
                "[mcp_servers]\nevery = 1",
                "key `mcp_servers.every`: expected a table, got integer 1",
            ),
            (
                "[mcp_servers.every]\nargs = []",
                "key `mcp_servers.every`: give `command` (stdio) or `url` (HTTP)",
            ),
            (
                "[mcp_servers.every]\ncommand = \"node\"\nargs = \"x\"",
                "key `mcp_servers.every.args`: invalid type: string \"x\", expected a sequence",
            ),
            (
                "[mcp_servers.every]\ncommand = \"node\"\ncomand = \"x\"",
                "key `mcp_servers.every.comand`: unknown field `comand`, expected one of `command`, `args`, `env`, `cwd`, `url`, `bearer_token_env`, `startup_timeout_ms`, `call_timeout_ms`",
            ),
            (
                "[mcp_servers.web]\nurl = \"ftp://x\"",
                "key `mcp_servers.web.url`: must start with http:// or https://",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parsed(text).err().as_deref(), Some(want), "{text}");
        }
    }
}

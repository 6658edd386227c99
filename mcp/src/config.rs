//! The configuration of one MCP server (`[mcp_servers.NAME]` in `dsh.toml`), checked once.
//!
//! `ServerEntry` is the entry as written (serde, unknown keys refused), `ServerConfig` the checked
//! form the connection uses. Checking names the key at fault, so the command line can print one
//! error line such as ``key `mcp_servers.time.args`: ...``.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The startup timeout when an entry gives none: connecting, the handshake and the first tool list.
pub const DEFAULT_STARTUP_TIMEOUT_MS: u64 = 30_000;
/// The call timeout when an entry gives none.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 120_000;
/// The largest timeout an entry may give (one day), so a typo cannot mean "never".
pub const TIMEOUT_MS_MAX: u64 = 86_400_000;
/// The longest server name: it prefixes every tool name the model sees.
pub const NAME_BYTES_MAX: usize = 32;

/// The environment variables that hold dsh's own API keys: never inherited by a server, only passed
/// when its entry's `env` names them.
pub const API_KEY_VARIABLES: [&str; 2] = ["DEEPSEEK_API_KEY", "OPENAI_API_KEY"];

/// One `[mcp_servers.NAME]` entry as written. Exactly one of `command` and `url` must be set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerEntry {
    /// The program to start (stdio transport).
    pub command: Option<String>,
    /// Its arguments.
    pub args: Option<Vec<String>>,
    /// Variables added to (or replacing) the inherited environment of the process.
    pub env: Option<BTreeMap<String, String>>,
    /// The working directory of the process (default: dsh's).
    pub cwd: Option<PathBuf>,
    /// The endpoint of a streamable HTTP server.
    pub url: Option<String>,
    /// The environment variable holding the bearer token sent to `url`.
    pub bearer_token_env: Option<String>,
    /// Bound on connecting, the handshake and the tool list, in milliseconds.
    pub startup_timeout_ms: Option<u64>,
    /// Bound on one tool call, in milliseconds.
    pub call_timeout_ms: Option<u64>,
}

/// How dsh reaches a server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking JSON-RPC over its stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables set for it on top of the inherited environment (minus dsh's API keys).
        env: BTreeMap<String, String>,
        /// Its working directory, when not dsh's.
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// The endpoint URL.
        url: String,
        /// The environment variable whose value is sent as `Authorization: Bearer …`.
        bearer_token_env: Option<String>,
    },
}

/// A checked server configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// The server's name: the prefix of its tools (`NAME__TOOL`). Invariant: 1 to `NAME_BYTES_MAX`
    /// bytes of ASCII letters, digits, `_` and `-`, without `__`.
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// Bound on connecting, the handshake and the tool list.
    pub startup_timeout: Duration,
    /// Bound on one tool call.
    pub call_timeout: Duration,
}

/// What is wrong with an entry: the key at fault (relative to `mcp_servers`) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("key `mcp_servers.{key}`: {reason}")]
pub struct ConfigError {
    /// The dotted key under `mcp_servers` (`time.args`, or just `time`).
    pub key: String,
    /// What is wrong.
    pub reason: String,
}

impl ServerConfig {
    /// A stdio server with the default timeouts.
    ///
    /// # Errors
    /// `ConfigError` for a bad name or an empty command.
    pub fn stdio(name: &str, command: &str, args: &[&str]) -> Result<ServerConfig, ConfigError> {
        ServerEntry {
            command: Some(command.to_string()),
            args: Some(args.iter().map(|a| a.to_string()).collect()),
            ..ServerEntry::default()
        }
        .check(name)
    }

    /// A streamable HTTP server with the default timeouts and no token.
    ///
    /// # Errors
    /// `ConfigError` for a bad name or URL.
    pub fn http(name: &str, url: &str) -> Result<ServerConfig, ConfigError> {
        ServerEntry {
            url: Some(url.to_string()),
            ..ServerEntry::default()
        }
        .check(name)
    }
}

impl ServerEntry {
    /// Checks the entry of server `name`.
    ///
    /// # Errors
    /// `ConfigError` naming the key at fault: a bad name, both or neither of `command` and `url`,
    /// stdio keys beside `url` (or the reverse), an empty string, a URL that is not `http(s)://`,
    /// or a timeout outside `1..=TIMEOUT_MS_MAX`.
    pub fn check(self, name: &str) -> Result<ServerConfig, ConfigError> {
        check_name(name)?;
        let fail = |key: &str, reason: &str| ConfigError {
            key: if key.is_empty() {
                name.to_string()
            } else {
                format!("{name}.{key}")
            },
            reason: reason.to_string(),
        };
        let transport = match (self.command, self.url) {
            (Some(_), Some(_)) => return Err(fail("", "give either `command` or `url`, not both")),
            (None, None) => return Err(fail("", "give `command` (stdio) or `url` (HTTP)")),
            (Some(command), None) => {
                if command.trim().is_empty() {
                    return Err(fail("command", "must not be empty"));
                }
                if self.bearer_token_env.is_some() {
                    return Err(fail("bearer_token_env", "only applies to a `url` server"));
                }
                Transport::Stdio {
                    command,
                    args: self.args.unwrap_or_default(),
                    env: check_env(self.env.unwrap_or_default()).map_err(|r| fail("env", &r))?,
                    cwd: self.cwd,
                }
            }
            (None, Some(url)) => {
                for (key, set) in [
                    ("args", self.args.is_some()),
                    ("env", self.env.is_some()),
                    ("cwd", self.cwd.is_some()),
                ] {
                    if set {
                        return Err(fail(key, "only applies to a `command` server"));
                    }
                }
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(fail("url", "must start with http:// or https://"));
                }
                if let Some(var) = &self.bearer_token_env
                    && !is_variable_name(var)
                {
                    return Err(fail(
                        "bearer_token_env",
                        "must be an environment variable name",
                    ));
                }
                Transport::Http {
                    url,
                    bearer_token_env: self.bearer_token_env,
                }
            }
        };
        let timeout = |key: &str, ms: Option<u64>, default: u64| match ms.unwrap_or(default) {
            ms @ 1..=TIMEOUT_MS_MAX => Ok(Duration::from_millis(ms)),
            ms => Err(fail(
                key,
                &format!("{ms} is out of range 1..={TIMEOUT_MS_MAX}"),
            )),
        };
        Ok(ServerConfig {
            name: name.to_string(),
            transport,
            startup_timeout: timeout(
                "startup_timeout_ms",
                self.startup_timeout_ms,
                DEFAULT_STARTUP_TIMEOUT_MS,
            )?,
            call_timeout: timeout(
                "call_timeout_ms",
                self.call_timeout_ms,
                DEFAULT_CALL_TIMEOUT_MS,
            )?,
        })
    }
}

/// Refuses a name that could not prefix a tool name unambiguously.
fn check_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !name.contains("__");
    if ok {
        return Ok(());
    }
    Err(ConfigError {
        key: name.chars().take(NAME_BYTES_MAX * 2).collect(),
        reason: format!(
            "a server name is 1 to {NAME_BYTES_MAX} letters, digits, `_` or `-`, without `__`"
        ),
    })
}

fn check_env(env: BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
    match env.keys().find(|k| !is_variable_name(k)) {
        None => Ok(env),
        Some(k) => Err(format!(
            "`{}` is not an environment variable name",
            k.escape_debug()
        )),
    }
}

fn is_variable_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(toml_like: serde_json::Value) -> ServerEntry {
        serde_json::from_value(toml_like).expect("entry")
    }

    #[test]
    fn a_stdio_entry_is_checked_with_defaults() {
        let c = entry(serde_json::json!({"command": "node", "args": ["x.js"], "env": {"A": "1"}}))
            .check("every")
            .expect("valid");
        assert_eq!(
            c.transport,
            Transport::Stdio {
                command: "node".into(),
                args: vec!["x.js".into()],
                env: BTreeMap::from([("A".into(), "1".into())]),
                cwd: None
            }
        );
        assert_eq!(
            c.startup_timeout,
            Duration::from_millis(DEFAULT_STARTUP_TIMEOUT_MS)
        );
        assert_eq!(
            c.call_timeout,
            Duration::from_millis(DEFAULT_CALL_TIMEOUT_MS)
        );
    }

    #[test]
    fn bad_entries_name_the_key() {
        let cases = [
            (
                "a__b",
                serde_json::json!({"command": "x"}),
                "key `mcp_servers.a__b`: a server name is 1 to 32 letters, digits, `_` or `-`, without `__`",
            ),
            (
                "s",
                serde_json::json!({}),
                "key `mcp_servers.s`: give `command` (stdio) or `url` (HTTP)",
            ),
            (
                "s",
                serde_json::json!({"command": "x", "url": "http://h"}),
                "key `mcp_servers.s`: give either `command` or `url`, not both",
            ),
            (
                "s",
                serde_json::json!({"command": " "}),
                "key `mcp_servers.s.command`: must not be empty",
            ),
            (
                "s",
                serde_json::json!({"url": "ftp://h"}),
                "key `mcp_servers.s.url`: must start with http:// or https://",
            ),
            (
                "s",
                serde_json::json!({"url": "http://h", "args": []}),
                "key `mcp_servers.s.args`: only applies to a `command` server",
            ),
            (
                "s",
                serde_json::json!({"command": "x", "bearer_token_env": "T"}),
                "key `mcp_servers.s.bearer_token_env`: only applies to a `url` server",
            ),
            (
                "s",
                serde_json::json!({"command": "x", "env": {"A B": "1"}}),
                "key `mcp_servers.s.env`: `A B` is not an environment variable name",
            ),
            (
                "s",
                serde_json::json!({"command": "x", "call_timeout_ms": 0}),
                "key `mcp_servers.s.call_timeout_ms`: 0 is out of range 1..=86400000",
            ),
        ];
        for (name, value, want) in cases {
            let got = entry(value)
                .check(name)
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert_eq!(got, Err(want.to_string()), "{name}");
        }
    }
}

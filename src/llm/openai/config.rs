//! The configuration of an `openai` route: `OpenAiConfig` (with its environment lookup), the
//! redacted `ApiKey`, the reasoning switches, and `OpenAiError`, why a configuration was refused.
//!
//! Nothing here does I/O except `OpenAiConfig::from_env`, which reads the process environment.
//! The key is checked once, here, and never shown: `ApiKey` has a redacted `Debug` and no
//! `Display`, and `OpenAiConfig`'s `Debug` shows its base URL without userinfo.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::endpoint;
use super::{DEFAULT_BASE_URL, DEFAULT_MODEL, DEFAULT_ROUTE};
use crate::limits::Limits;

/// Why a configuration, key or provider was refused. Nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenAiError {
    /// An API key that is blank or cannot be carried in an HTTP header.
    #[error(
        "the API key from {source_name} is blank or has characters an HTTP header cannot carry"
    )]
    InvalidCredential {
        /// Where the key came from (a variable name or "the provider configuration"), never the key.
        source_name: String,
    },
    /// A base URL that does not parse, is not http(s), or has undecodable userinfo.
    #[error("base url {base_url:?} is not an http or https url: {reason}")]
    InvalidBaseUrl {
        /// The URL as given, with any userinfo replaced by `<redacted>@`.
        base_url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A timeout of zero or above `TIMEOUT_MS_MAX`.
    #[error("{what} is {ms} ms, it must be in 1..={ms_max}")]
    InvalidTimeout {
        /// Which timeout (`connect timeout`, `idle timeout`).
        what: &'static str,
        /// The value given.
        ms: u64,
        /// The largest value accepted.
        ms_max: u64,
    },
    /// A name that must be given was empty.
    #[error("{what} must not be empty")]
    Empty {
        /// Which name (`route name`, `model`).
        what: &'static str,
    },
    /// A default reasoning effort the configured wire cannot send.
    #[error("reasoning effort {effort:?} is not supported here (expected one of {supported})")]
    UnsupportedReasoningEffort {
        /// The effort given, cut to 40 characters.
        effort: String,
        /// The efforts that would be accepted.
        supported: String,
    },
    /// The HTTP client could not be built (TLS roots, for example).
    #[error("http client could not be built: {reason}")]
    Client {
        /// The client error and its sources, one line.
        reason: String,
    },
}

/// An API key. Checked once (trimmed, then only printable ASCII without spaces, so it fits a header)
/// and never shown: `Debug` prints `ApiKey(<redacted>)` and there is no `Display`.
///
/// Invariant: non-empty, every byte in `0x21..=0x7E`.
#[derive(Clone)]
pub struct ApiKey(Box<str>);

impl ApiKey {
    /// Validates a key given directly (configuration).
    ///
    /// # Errors
    /// `InvalidCredential` (naming the configuration, never the key) when it is blank or has a
    /// character outside `0x21..=0x7E`.
    pub fn new(raw: &str) -> Result<ApiKey, OpenAiError> {
        ApiKey::from_source(raw, "the provider configuration")
    }

    /// Validates a key read from `source_name` (an environment variable, a file), which the error
    /// names.
    ///
    /// # Errors
    /// As `new`.
    pub fn from_source(raw: &str, source_name: &str) -> Result<ApiKey, OpenAiError> {
        let key = raw.trim();
        if key.is_empty() || !key.bytes().all(|b| (0x21..=0x7E).contains(&b)) {
            return Err(OpenAiError::InvalidCredential {
                source_name: source_name.to_owned(),
            });
        }
        Ok(ApiKey(key.into()))
    }

    /// The secret itself, for the one header that carries it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// Replaces every occurrence of the key in `text` (a server may echo it in an error message).
    pub(crate) fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if text.contains(self.expose()) {
            Cow::Owned(text.replace(self.expose(), "<redacted>"))
        } else {
            Cow::Borrowed(text)
        }
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for ApiKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        ApiKey::new(&raw).map_err(serde::de::Error::custom)
    }
}

/// DeepSeek's `thinking` switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Thinking {
    /// The model reasons before it answers.
    Enabled,
    /// The model answers without reasoning.
    Disabled,
}

/// How a request's reasoning effort reaches the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReasoningWire {
    /// DeepSeek (§7.2): efforts `off|low|high|max`; `off` → `thinking:{type:"disabled"}`, the others →
    /// `thinking:{type:"enabled"}, reasoning_effort`. Anything else is `UNSUPPORTED_REASONING_EFFORT`.
    #[default]
    Deepseek,
    /// OpenAI: the effort is sent verbatim as `reasoning_effort`; `thinking` is never sent.
    Openai,
    /// Neither field is ever sent (endpoints that reject both).
    Omit,
}

/// Configuration of one `openai` route.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The route name the provider registers under (`Provider::name`). Default `openai`.
    pub route: String,
    /// The endpoint root; requests go to `<its path>/chat/completions`, its query kept. Userinfo
    /// (`http://user:pass@host/`) is taken out of the URL and sent as HTTP Basic authorization, in
    /// place of the API key (see `has_credential`). Default DeepSeek's.
    pub base_url: String,
    /// The model used when a request names none. Default `deepseek-v4-flash`.
    pub model: String,
    /// The key, sent as `Authorization: Bearer`. `None` is allowed: unless the base URL carries
    /// userinfo, each request then ends `MISSING_CREDENTIAL` before any I/O.
    pub api_key: Option<ApiKey>,
    /// Bound on establishing the connection. Default 10 s.
    pub connect_timeout_ms: u64,
    /// Bound on each wait for the server (response headers, each body read). Default 300 s, as the
    /// original's stream watchdog: a reasoning model may think silently for minutes.
    pub idle_timeout_ms: u64,
    /// The output cap sent when a request sets none (`None`: the server's default).
    pub max_tokens: Option<u64>,
    /// The model's context window, reported by `model_info`. Default 1,000,000 (DeepSeek V4).
    pub context_window: Option<u64>,
    /// How reasoning effort is put on the wire.
    pub reasoning_wire: ReasoningWire,
    /// DeepSeek deployment switch: `disabled` refuses any effort but `off`.
    pub thinking: Option<Thinking>,
    /// The effort used when a request sets none.
    pub reasoning_effort: Option<String>,
    /// Bounds on what the server may send.
    pub limits: Limits,
}

impl fmt::Debug for OpenAiConfig {
    /// Every field, with the base URL's userinfo and the key redacted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("route", &self.route)
            .field("base_url", &endpoint::redact_userinfo(&self.base_url))
            .field("model", &self.model)
            .field("api_key", &self.api_key)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("idle_timeout_ms", &self.idle_timeout_ms)
            .field("max_tokens", &self.max_tokens)
            .field("context_window", &self.context_window)
            .field("reasoning_wire", &self.reasoning_wire)
            .field("thinking", &self.thinking)
            .field("reasoning_effort", &self.reasoning_effort)
            .field("limits", &self.limits)
            .finish()
    }
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        OpenAiConfig {
            route: DEFAULT_ROUTE.to_owned(),
            base_url: DEFAULT_BASE_URL.to_owned(),
            model: DEFAULT_MODEL.to_owned(),
            api_key: None,
            connect_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            max_tokens: None,
            context_window: Some(1_000_000),
            reasoning_wire: ReasoningWire::Deepseek,
            thinking: None,
            reasoning_effort: None,
            limits: Limits::DEFAULT,
        }
    }
}

impl OpenAiConfig {
    /// Whether requests will carry a credential: the base URL's userinfo (sent as HTTP Basic) or
    /// the API key (sent as a bearer token). When the base URL has userinfo it wins and the key is
    /// not sent: a credential written into the URL is specific to that endpoint, while the key may
    /// come from an environment variable meant for another service, and one request has room for
    /// one `Authorization` header.
    pub fn has_credential(&self) -> bool {
        self.api_key.is_some() || endpoint::has_userinfo(&self.base_url)
    }

    /// The default configuration completed from the process environment: the key from
    /// `DEEPSEEK_API_KEY`, else `OPENAI_API_KEY`; the base URL from `DSH_BASE_URL`, else
    /// `DEEPSEEK_BASE_URL`; the model from `DSH_MODEL`. Empty variables count as unset.
    ///
    /// # Errors
    /// `InvalidCredential` naming the variable when the key it holds is unusable.
    pub fn from_env() -> Result<OpenAiConfig, OpenAiError> {
        OpenAiConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// `from_env` over any variable lookup (tests, layered configuration).
    ///
    /// # Errors
    /// As `from_env`.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<OpenAiConfig, OpenAiError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let mut config = OpenAiConfig::default();
        for name in ["DEEPSEEK_API_KEY", "OPENAI_API_KEY"] {
            if let Some(raw) = get(name) {
                config.api_key = Some(ApiKey::from_source(&raw, name)?);
                break;
            }
        }
        if let Some(url) = get("DSH_BASE_URL").or_else(|| get("DEEPSEEK_BASE_URL")) {
            config.base_url = url.trim().to_owned();
        }
        if let Some(model) = get("DSH_MODEL") {
            config.model = model.trim().to_owned();
        }
        Ok(config)
    }
}

/// The efforts DeepSeek accepts, in the order an error lists them.
const DEEPSEEK_EFFORTS: [&str; 4] = ["off", "low", "high", "max"];

/// Checks `effort` against what `config`'s wire can send.
///
/// # Errors
/// `UnsupportedReasoningEffort` for an effort DeepSeek does not know, or anything but `off` when
/// thinking is disabled.
pub(crate) fn check_effort(config: &OpenAiConfig, effort: &str) -> Result<(), OpenAiError> {
    if config.reasoning_wire != ReasoningWire::Deepseek {
        return Ok(());
    }
    let unsupported = |supported: &str| OpenAiError::UnsupportedReasoningEffort {
        effort: effort.chars().take(40).collect(),
        supported: supported.to_owned(),
    };
    if !DEEPSEEK_EFFORTS.contains(&effort) {
        return Err(unsupported("off, low, high, max"));
    }
    if config.thinking == Some(Thinking::Disabled) && effort != "off" {
        return Err(unsupported("off, since thinking is disabled"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // §7.1, §9.30.3
    #[test]
    fn api_keys_are_validated_and_never_shown() {
        let key = ApiKey::new("  sk-abc123  ").expect("valid after trim");
        assert_eq!(key.expose(), "sk-abc123");
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
        for bad in ["", "   ", "sk abc", "sk-\u{e9}", "sk-\n1"] {
            let err = ApiKey::from_source(bad, "DEEPSEEK_API_KEY").expect_err("invalid");
            assert_eq!(
                err,
                OpenAiError::InvalidCredential {
                    source_name: "DEEPSEEK_API_KEY".into()
                }
            );
            if !bad.trim().is_empty() {
                assert!(!err.to_string().contains(bad.trim()), "{err}");
            }
        }
        assert_eq!(key.scrub("bad key sk-abc123!"), "bad key <redacted>!");
    }

    // §9.29.54–61
    #[test]
    fn environment_lookup_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let c = OpenAiConfig::from_lookup(env(&[])).expect("ok");
        assert!(c.api_key.is_none());
        assert_eq!(
            (c.base_url.as_str(), c.model.as_str()),
            (DEFAULT_BASE_URL, DEFAULT_MODEL)
        );
        let c = OpenAiConfig::from_lookup(env(&[
            ("DEEPSEEK_API_KEY", ""),
            ("OPENAI_API_KEY", "sk-o"),
            ("DEEPSEEK_BASE_URL", "http://b"),
            ("DSH_MODEL", "m2"),
        ]))
        .expect("ok");
        assert_eq!(c.api_key.as_ref().map(ApiKey::expose), Some("sk-o"));
        assert_eq!((c.base_url.as_str(), c.model.as_str()), ("http://b", "m2"));
        let c = OpenAiConfig::from_lookup(env(&[
            ("DEEPSEEK_API_KEY", "sk-d"),
            ("OPENAI_API_KEY", "sk-o"),
            ("DSH_BASE_URL", "http://a"),
            ("DEEPSEEK_BASE_URL", "http://b"),
        ]))
        .expect("ok");
        assert_eq!(c.api_key.as_ref().map(ApiKey::expose), Some("sk-d"));
        assert_eq!(c.base_url, "http://a");
        let err =
            OpenAiConfig::from_lookup(env(&[("DEEPSEEK_API_KEY", "sk bad")])).expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "the API key from DEEPSEEK_API_KEY is blank or has characters an HTTP header cannot carry"
        );
    }
}

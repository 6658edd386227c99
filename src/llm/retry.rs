//! The retry policy (`reference/session-llm.md` §6.8–§6.9) as pure functions: configuration with
//! validation, the policy key, and the decision plus backoff for one failed request attempt; and
//! `RetryHook`, the default `request_error` hook built on them.
//!
//! A policy belongs to a provider (`Provider::retry_policy`). When an attempt fails (an `error` or
//! `aborted` finish), the runtime asks its `request_error` hooks what to do; the default hook looks at
//! the failure and at the `llm/retry` events already recorded in the same turn and step, and either
//! delegates (the turn ends `error`) or schedules retry `n` after a delay. The runtime then writes
//! `llm/retry`, waits (cancellably), writes `llm/retry-started` and re-issues the request in the same
//! step.
//!
//! What must stay true: a `normal` policy never schedules more than `max_retries` retries per chain; a
//! chain is the retries of one (turn, step, provider, policy key), so a new step or a changed policy
//! starts again at retry 1 with a new retry id; delays never exceed `max_delay_ms`. The policy key and
//! the delay numbers are written into the log, so they are formatted exactly as the original
//! (JavaScript) writes them.
//!
//! Nothing here reads a clock, draws random numbers or mints ids: the runtime passes, in the
//! `RequestErrorCtx`, the uniform `random` used for jitter and the id a new chain takes.

use async_trait::async_trait;
use serde_json::{Map, Number, Value};

use crate::hooks::{HookError, Recovery, RequestErrorCtx, RequestErrorHook, ScheduledRetry};
use crate::llm::types::{LlmFailure, codes};
use crate::session::event::LlmRetry;

/// The largest delay a policy may configure: the JavaScript timer bound (2^31 − 1 ms, ~24.8 days),
/// kept so policies stay interchangeable with the original.
pub const DELAY_MS_MAX: u64 = 2_147_483_647;

/// The largest integer JavaScript represents exactly (2^53 − 1); `maxRetries` must not exceed it.
const SAFE_INTEGER_MAX: u64 = (1 << 53) - 1;

/// Why a retry policy configuration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryPolicyError {
    /// The policy, or its `backoff`, is not a JSON object.
    #[error("retry policy {what} must be a JSON object, got {shown}")]
    NotAnObject {
        /// Which part: `configuration` or `backoff`.
        what: &'static str,
        /// The value as given (shortened).
        shown: String,
    },
    /// A key the policy format does not have.
    #[error("retry policy {what} has unknown key {key:?}")]
    UnknownKey {
        /// Which part: `configuration` or `backoff`.
        what: &'static str,
        /// The unknown key.
        key: String,
    },
    /// `mode` is neither `normal` nor `always`.
    #[error("retry policy mode must be \"normal\" or \"always\", got {shown}")]
    BadMode {
        /// The value as given.
        shown: String,
    },
    /// `maxRetries` is not a non-negative safe integer.
    #[error("retry policy maxRetries must be a non-negative safe integer, got {shown}")]
    BadMaxRetries {
        /// The value as given.
        shown: String,
    },
    /// `retryableCodes` is not a non-empty array.
    #[error("retry policy retryableCodes must be a non-empty array of strings, got {shown}")]
    BadCodes {
        /// The value as given.
        shown: String,
    },
    /// One entry of `retryableCodes` is not a non-empty string.
    #[error("retry policy retryableCodes[{code_idx}] must be a non-empty string, got {shown}")]
    BadCode {
        /// The entry's index.
        code_idx: usize,
        /// The entry as given.
        shown: String,
    },
    /// `retryableCodes` lists a code twice.
    #[error("retry policy retryableCodes lists {code:?} twice")]
    DuplicateCode {
        /// The repeated code.
        code: String,
    },
    #[error(
        "retry policy backoff.{field} must be a positive integer of at most {delay_ms_max} ms, got {shown}"
    )]
    /// A backoff delay is not a positive integer within `DELAY_MS_MAX`.
    BadDelay {
        /// `initialDelayMs` or `maxDelayMs`.
        field: &'static str,
        /// The value as given.
        shown: String,
        /// The largest delay allowed.
        delay_ms_max: u64,
    },
    #[error(
        "retry policy backoff.initialDelayMs {initial_delay_ms} exceeds backoff.maxDelayMs {max_delay_ms}"
    )]
    /// The initial delay is above the cap.
    InitialAboveMax {
        /// `backoff.initialDelayMs`.
        initial_delay_ms: u64,
        /// `backoff.maxDelayMs`.
        max_delay_ms: u64,
    },
    /// `backoff.jitterRatio` is not a number in [0, 1].
    #[error("retry policy backoff.jitterRatio must be a number in [0, 1], got {shown}")]
    BadJitter {
        /// The value as given.
        shown: String,
    },
}

/// Which failures are retried, and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryMode {
    /// Retry failures whose code is in `retryable_codes`, at most `max_retries` times per chain, and
    /// honour a provider's retry-after only when it fits under `max_delay_ms`.
    Normal {
        /// Retries per chain at most.
        max_retries: u64,
        /// In configured order; the policy key sorts them.
        retryable_codes: Vec<String>,
    },
    /// Retry every failure, without a limit (the runtime still lets cancellation win).
    Always,
}

impl RetryMode {
    /// `normal` or `always`, as written in `llm/retry.mode`.
    pub fn name(&self) -> &'static str {
        match self {
            RetryMode::Normal { .. } => "normal",
            RetryMode::Always => "always",
        }
    }
}

/// Exponential backoff with jitter.
#[derive(Clone, Debug, PartialEq)]
pub struct Backoff {
    /// The delay before retry 1; doubled for each later retry. In 1..=`DELAY_MS_MAX` and at most
    /// `max_delay_ms` when validated.
    pub initial_delay_ms: u64,
    /// The cap on any delay, jitter included. In 1..=`DELAY_MS_MAX` when validated.
    pub max_delay_ms: u64,
    /// Relative spread of the jitter: the delay is scaled by a factor in `[1 - j, 1 + j]`. In [0, 1]
    /// when validated.
    pub jitter_ratio: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial_delay_ms: 500,
            max_delay_ms: 10_000,
            jitter_ratio: 0.1,
        }
    }
}

/// A retry policy. `from_json` and `validate` check the bounds documented on each field; the other
/// methods accept any values without panicking (a nonsensical policy gives nonsensical but finite
/// delays).
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Which failures are retried, and how often.
    pub mode: RetryMode,
    /// How long each retry waits.
    pub backoff: Backoff,
}

/// The codes the default policy retries: failures that a later identical request may not hit.
pub const DEFAULT_RETRYABLE_CODES: [&str; 5] = [
    codes::EMPTY_RESPONSE,
    codes::RATE_LIMIT,
    codes::SERVER,
    codes::TIMEOUT,
    codes::TRANSPORT,
];

/// The default budget of a normal policy.
pub const DEFAULT_MAX_RETRIES: u64 = 5;

impl Default for RetryPolicy {
    /// `normal`, 5 retries, `[EMPTY_RESPONSE, RATE_LIMIT, SERVER, TIMEOUT, TRANSPORT]`, 500 ms initial
    /// delay, 10 s cap, jitter 0.1.
    fn default() -> Self {
        RetryPolicy {
            mode: RetryMode::Normal {
                max_retries: DEFAULT_MAX_RETRIES,
                retryable_codes: DEFAULT_RETRYABLE_CODES.map(String::from).to_vec(),
            },
            backoff: Backoff::default(),
        }
    }
}

/// What to do about one failed attempt.
#[derive(Clone, Debug, PartialEq)]
pub enum RetryDecision {
    /// Not retried by this policy: let the next hook decide (the turn ends `error` if none does).
    Delegate,
    /// Retry number `retry` (1-based within its chain) after `delay_ms`. `retry_id` is the chain's id
    /// when the chain already exists, `None` for a new chain (the caller supplies one).
    Schedule {
        /// The retry's number within its chain, from 1.
        retry: u64,
        /// The chain's id, `None` for a new chain.
        retry_id: Option<String>,
        /// The wait before the retry, in milliseconds.
        delay_ms: f64,
    },
}

impl RetryPolicy {
    /// Parses and validates a policy configuration (§6.8): `{mode:"normal", maxRetries?,
    /// retryableCodes?, backoff?}` or `{mode:"always", backoff?}`, with `backoff = {initialDelayMs?,
    /// maxDelayMs?, jitterRatio?}`; absent fields take the defaults. `mode` is required. An `always`
    /// policy tolerates (and drops, unchecked) the normal-only `maxRetries` and `retryableCodes`.
    ///
    /// Delays must be integers here (the original also accepts fractional milliseconds; a policy
    /// stores whole milliseconds).
    ///
    /// # Errors
    /// The first problem found: a non-object, an unknown key, a bad mode, `maxRetries` that is not a
    /// non-negative safe integer, codes that are empty/duplicated/not non-empty strings, delays outside
    /// 1..=2147483647 or with `initialDelayMs > maxDelayMs`, `jitterRatio` outside [0, 1].
    pub fn from_json(v: &Value) -> Result<RetryPolicy, RetryPolicyError> {
        let obj = as_object(v, "config")?;
        let mode = match obj.get("mode") {
            Some(Value::String(m)) if m == "normal" || m == "always" => m.as_str(),
            other => {
                return Err(RetryPolicyError::BadMode {
                    shown: shown(other),
                });
            }
        };
        let allowed: &[&str] = &["mode", "maxRetries", "retryableCodes", "backoff"];
        if let Some(key) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(RetryPolicyError::UnknownKey {
                what: "config",
                key: key.clone(),
            });
        }
        let backoff = match obj.get("backoff") {
            None => Backoff::default(),
            Some(b) => parse_backoff(b)?,
        };
        let mode = if mode == "always" {
            RetryMode::Always
        } else {
            RetryMode::Normal {
                max_retries: match obj.get("maxRetries") {
                    None => DEFAULT_MAX_RETRIES,
                    Some(n) => parse_max_retries(n)?,
                },
                retryable_codes: match obj.get("retryableCodes") {
                    None => DEFAULT_RETRYABLE_CODES.map(String::from).to_vec(),
                    Some(c) => parse_codes(c)?,
                },
            }
        };
        let policy = RetryPolicy { mode, backoff };
        policy.validate()?;
        Ok(policy)
    }

    /// Checks the bounds `from_json` enforces, for a policy built in code.
    ///
    /// # Errors
    /// As [`RetryPolicy::from_json`].
    pub fn validate(&self) -> Result<(), RetryPolicyError> {
        if let RetryMode::Normal {
            max_retries,
            retryable_codes,
        } = &self.mode
        {
            if *max_retries > SAFE_INTEGER_MAX {
                return Err(RetryPolicyError::BadMaxRetries {
                    shown: max_retries.to_string(),
                });
            }
            check_codes(retryable_codes)?;
        }
        let b = &self.backoff;
        for (field, delay_ms) in [
            ("initialDelayMs", b.initial_delay_ms),
            ("maxDelayMs", b.max_delay_ms),
        ] {
            if !(1..=DELAY_MS_MAX).contains(&delay_ms) {
                return Err(RetryPolicyError::BadDelay {
                    field,
                    shown: delay_ms.to_string(),
                    delay_ms_max: DELAY_MS_MAX,
                });
            }
        }
        if b.initial_delay_ms > b.max_delay_ms {
            return Err(RetryPolicyError::InitialAboveMax {
                initial_delay_ms: b.initial_delay_ms,
                max_delay_ms: b.max_delay_ms,
            });
        }
        if !(0.0..=1.0).contains(&b.jitter_ratio) {
            return Err(RetryPolicyError::BadJitter {
                shown: js_number_string(b.jitter_ratio),
            });
        }
        Ok(())
    }

    /// This policy in `normal` mode with a budget of `n` retries: a normal policy keeps its codes, an
    /// `always` policy takes the default codes. The backoff is kept.
    pub fn with_max_retries(self, n: u64) -> RetryPolicy {
        let retryable_codes = match self.mode {
            RetryMode::Normal {
                retryable_codes, ..
            } => retryable_codes,
            RetryMode::Always => DEFAULT_RETRYABLE_CODES.map(String::from).to_vec(),
        };
        RetryPolicy {
            mode: RetryMode::Normal {
                max_retries: n,
                retryable_codes,
            },
            backoff: self.backoff,
        }
    }

    /// The canonical JSON array of the behaviour-affecting fields, byte-identical to the original's:
    /// normal `["normal",maxRetries,[sorted codes],initialDelayMs,maxDelayMs,jitterRatio]`, always
    /// `["always",initialDelayMs,maxDelayMs,jitterRatio]`. Codes sort by UTF-16 code units and numbers
    /// print as JavaScript prints them (`0`, `0.1`, `1e-7`).
    pub fn policy_key(&self) -> String {
        let b = &self.backoff;
        let mut key = String::from("[\"");
        key.push_str(self.mode.name());
        key.push('"');
        if let RetryMode::Normal {
            max_retries,
            retryable_codes,
        } = &self.mode
        {
            let mut sorted: Vec<&String> = retryable_codes.iter().collect();
            sorted.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            key.push(',');
            key.push_str(&max_retries.to_string());
            key.push_str(",[");
            for (code_idx, code) in sorted.iter().enumerate() {
                if code_idx > 0 {
                    key.push(',');
                }
                // A string always serializes.
                key.push_str(&serde_json::to_string(code).expect("strings serialize"));
            }
            key.push(']');
        }
        for part in [
            b.initial_delay_ms.to_string(),
            b.max_delay_ms.to_string(),
            js_number_string(b.jitter_ratio),
        ] {
            key.push(',');
            key.push_str(&part);
        }
        key.push(']');
        key
    }

    /// The local backoff before retry `retry` (1-based):
    /// `min(min(initial * 2^min(retry-1, 1024), max) * (1 - j + 2*j*random), max)`, not rounded.
    /// `random` is clamped to [0, 1] (NaN counts as 0); the result is always finite and in
    /// `[0, max_delay_ms]`.
    pub fn backoff_delay_ms(&self, retry: u64, random: f64) -> f64 {
        let b = &self.backoff;
        let random = if random.is_nan() {
            0.0
        } else {
            random.clamp(0.0, 1.0)
        };
        let jitter = if b.jitter_ratio.is_nan() {
            0.0
        } else {
            b.jitter_ratio
        };
        let exponent = i32::try_from(retry.saturating_sub(1).min(1024)).unwrap_or(1024);
        let max_ms = b.max_delay_ms as f64;
        let base_ms = (b.initial_delay_ms as f64 * 2f64.powi(exponent)).min(max_ms);
        let delay_ms = (base_ms * (1.0 - jitter + 2.0 * jitter * random)).min(max_ms);
        // Only a jitter outside [0, 1] (an unvalidated policy) can push the factor below zero.
        delay_ms.max(0.0)
    }

    /// The decision for one failed attempt of `provider`, given the `llm/retry` events already
    /// recorded in this turn and step (oldest first).
    ///
    /// Normal mode delegates a code it does not retry and a chain whose budget is spent. The chain is
    /// the retries with the same provider and policy key; its last retry number + 1 is the next, and
    /// its id is reused. A provider retry-after of at most `max_delay_ms` is used verbatim; a larger
    /// one makes normal mode delegate and always mode fall back to the local backoff.
    pub fn decide(
        &self,
        failure: &LlmFailure,
        provider: &str,
        retries: &[LlmRetry],
        random: f64,
    ) -> RetryDecision {
        let max_retries = match &self.mode {
            RetryMode::Normal {
                max_retries,
                retryable_codes,
            } => {
                if !retryable_codes.contains(&failure.code) {
                    return RetryDecision::Delegate;
                }
                Some(*max_retries)
            }
            RetryMode::Always => None,
        };
        let policy_key = self.policy_key();
        let previous = retries
            .iter()
            .rev()
            .find(|r| r.provider == provider && r.policy_key == policy_key);
        let n_done = previous.map_or(0, |r| r.retry);
        if max_retries.is_some_and(|max| n_done >= max) {
            return RetryDecision::Delegate;
        }
        let delay_ms = match failure.provider_retry_after_ms {
            Some(after_ms) if after_ms > 0 && after_ms <= self.backoff.max_delay_ms => {
                after_ms as f64
            }
            Some(after_ms) if after_ms > 0 && max_retries.is_some() => {
                return RetryDecision::Delegate;
            }
            _ => self.backoff_delay_ms(n_done.saturating_add(1), random),
        };
        RetryDecision::Schedule {
            retry: n_done.saturating_add(1),
            retry_id: previous.map(|r| r.retry_id.clone()),
            delay_ms,
        }
    }
}

/// A number as JavaScript's `JSON.stringify` writes it, for `llm/retry.delayMs`: integral finite
/// values as integers (`500`, not `500.0`; `-0` as `0`), others as floats (`1.1`). JSON has no
/// non-finite numbers; NaN and infinities map to 0 (delays computed here are always finite).
pub fn js_number(v: f64) -> Number {
    if !v.is_finite() {
        return Number::from(0u64);
    }
    if v.fract() == 0.0 {
        // Integral and within range: the casts are exact.
        if (0.0..18_446_744_073_709_551_616.0).contains(&v) {
            return Number::from(v as u64);
        }
        if (-9_223_372_036_854_775_808.0..0.0).contains(&v) {
            return Number::from(v as i64);
        }
    }
    Number::from_f64(v).unwrap_or_else(|| Number::from(0u64))
}

/// A number as JavaScript's `Number.prototype.toString()` writes it (ECMA-262 `Number::toString`):
/// the shortest round-trip digits, plain notation for exponents from -7 to 20, otherwise
/// `d.ddde±x`.
fn js_number_string(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sign = if v < 0.0 { "-" } else { "" };
    // `{:e}` gives the shortest round-trip digits as `d.ddde<exp>`.
    let sci = format!("{:e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exp: i64 = exp.parse().unwrap_or(0);
    let k = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    // JavaScript's n: the value is 0.d1d2...dk * 10^n.
    let n = exp + 1;
    let body = if k <= n && n <= 21 {
        let zeros = usize::try_from(n - k).unwrap_or(0);
        format!("{digits}{}", "0".repeat(zeros))
    } else if 0 < n && n <= 21 {
        let at = usize::try_from(n).unwrap_or(0);
        format!("{}.{}", &digits[..at], &digits[at..])
    } else if -6 < n && n <= 0 {
        let zeros = usize::try_from(-n).unwrap_or(0);
        format!("0.{}{digits}", "0".repeat(zeros))
    } else {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let exp_sign = if n > 0 { "+" } else { "-" };
        format!("{first}{dot}{rest}e{exp_sign}{}", (n - 1).abs())
    };
    format!("{sign}{body}")
}

/// At most 60 characters of an offending JSON value, for an error message.
fn shown(v: Option<&Value>) -> String {
    match v {
        None => "nothing".into(),
        Some(v) => {
            let text = v.to_string();
            if text.chars().count() > 60 {
                let cut: String = text.chars().take(60).collect();
                format!("{cut}...")
            } else {
                text
            }
        }
    }
}

fn as_object<'a>(
    v: &'a Value,
    what: &'static str,
) -> Result<&'a Map<String, Value>, RetryPolicyError> {
    v.as_object().ok_or_else(|| RetryPolicyError::NotAnObject {
        what,
        shown: shown(Some(v)),
    })
}

/// A JSON number that is an exact non-negative integer of at most 2^53 − 1 (`1.0` counts, as in
/// JavaScript).
fn safe_integer(v: &Value) -> Option<u64> {
    let n = v.as_number()?;
    if let Some(u) = n.as_u64() {
        return (u <= SAFE_INTEGER_MAX).then_some(u);
    }
    let f = n.as_f64()?;
    // Integral and in range, so the cast is exact.
    (f.fract() == 0.0 && (0.0..=SAFE_INTEGER_MAX as f64).contains(&f)).then_some(f as u64)
}

fn parse_max_retries(v: &Value) -> Result<u64, RetryPolicyError> {
    safe_integer(v).ok_or_else(|| RetryPolicyError::BadMaxRetries {
        shown: shown(Some(v)),
    })
}

fn parse_codes(v: &Value) -> Result<Vec<String>, RetryPolicyError> {
    let items = match v.as_array() {
        Some(items) if !items.is_empty() => items,
        _ => {
            return Err(RetryPolicyError::BadCodes {
                shown: shown(Some(v)),
            });
        }
    };
    let codes = items
        .iter()
        .enumerate()
        .map(|(code_idx, item)| match item {
            Value::String(code) if !code.is_empty() => Ok(code.clone()),
            _ => Err(RetryPolicyError::BadCode {
                code_idx,
                shown: shown(Some(item)),
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_codes(&codes)?;
    Ok(codes)
}

fn check_codes(codes: &[String]) -> Result<(), RetryPolicyError> {
    if codes.is_empty() {
        return Err(RetryPolicyError::BadCodes { shown: "[]".into() });
    }
    let mut seen = std::collections::HashSet::with_capacity(codes.len());
    for (code_idx, code) in codes.iter().enumerate() {
        if code.is_empty() {
            return Err(RetryPolicyError::BadCode {
                code_idx,
                shown: "\"\"".into(),
            });
        }
        if !seen.insert(code.as_str()) {
            return Err(RetryPolicyError::DuplicateCode { code: code.clone() });
        }
    }
    Ok(())
}

fn parse_backoff(v: &Value) -> Result<Backoff, RetryPolicyError> {
    let obj = as_object(v, "backoff")?;
    let allowed = ["initialDelayMs", "maxDelayMs", "jitterRatio"];
    if let Some(key) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(RetryPolicyError::UnknownKey {
            what: "backoff",
            key: key.clone(),
        });
    }
    let defaults = Backoff::default();
    let delay = |field: &'static str, default_ms: u64| match obj.get(field) {
        None => Ok(default_ms),
        Some(v) => safe_integer(v)
            .filter(|ms| (1..=DELAY_MS_MAX).contains(ms))
            .ok_or_else(|| RetryPolicyError::BadDelay {
                field,
                shown: shown(Some(v)),
                delay_ms_max: DELAY_MS_MAX,
            }),
    };
    let initial_delay_ms = delay("initialDelayMs", defaults.initial_delay_ms)?;
    let max_delay_ms = delay("maxDelayMs", defaults.max_delay_ms)?;
    let jitter_ratio = match obj.get("jitterRatio") {
        None => defaults.jitter_ratio,
        Some(v) => v
            .as_f64()
            .filter(|j| (0.0..=1.0).contains(j))
            .ok_or_else(|| RetryPolicyError::BadJitter {
                shown: shown(Some(v)),
            })?,
    };
    Ok(Backoff {
        initial_delay_ms,
        max_delay_ms,
        jitter_ratio,
    })
}

/// The default `request_error` hook: retries what its policy says, with backoff.
///
/// It uses its own policy when built with one ([`RetryHook::with_policy`],
/// [`RetryHook::with_max_retries`]); otherwise the serving provider's policy from the context, and
/// delegates when no provider served the request. In `always` mode it does not consult later hooks
/// first (the runtime orders hooks); it schedules.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RetryHook {
    /// `None`: follow the serving provider's policy.
    policy: Option<RetryPolicy>,
}

impl RetryHook {
    /// A hook that follows each provider's own policy.
    pub fn new() -> RetryHook {
        RetryHook::default()
    }

    /// A hook that applies `policy` to every provider.
    pub fn with_policy(policy: RetryPolicy) -> RetryHook {
        RetryHook {
            policy: Some(policy),
        }
    }

    /// A hook that applies the default policy with a budget of `n` retries to every provider.
    pub fn with_max_retries(n: u64) -> RetryHook {
        RetryHook::with_policy(RetryPolicy::default().with_max_retries(n))
    }

    /// The recovery for the failure in `ctx`; a new chain takes the runtime's `ctx.new_retry_id`, a
    /// continued chain keeps its id. A turn already cancelled is never retried.
    pub fn recovery(&self, ctx: &RequestErrorCtx) -> Recovery {
        let Some(policy) = self.policy.as_ref().or(ctx.retry_policy.as_ref()) else {
            return Recovery::Delegate;
        };
        if ctx.hook.cancel.is_cancelled() {
            return Recovery::Delegate;
        }
        match policy.decide(&ctx.failure, &ctx.provider, &ctx.retries, ctx.random) {
            RetryDecision::Delegate => Recovery::Delegate,
            RetryDecision::Schedule {
                retry,
                retry_id,
                delay_ms,
            } => Recovery::Backoff(ScheduledRetry {
                retry_id: retry_id.unwrap_or_else(|| ctx.new_retry_id.clone()),
                mode: policy.mode.name().to_string(),
                policy_key: policy.policy_key(),
                retry,
                max_retries: match policy.mode {
                    RetryMode::Normal { max_retries, .. } => Some(max_retries),
                    RetryMode::Always => None,
                },
                delay_ms,
            }),
        }
    }
}

/// The default bound on the retry sequence of one request (`SequenceBound`): 10 minutes. With the
/// `openai` provider's 300 s idle timeout and the default 5 retries, an unbounded sequence against a
/// stalled server waits about 30 minutes before the turn ends.
pub const DEFAULT_SEQUENCE_MS_MAX: u64 = 600_000;

/// A bound on the whole retry sequence of one request, on top of a policy's own budget: a retry is
/// scheduled only if it would start within `ms_max` of the sequence's first failure. Each attempt
/// keeps its own idle timeout, so the last attempt may still run for one timeout past the bound.
///
/// Pure: the caller measures the time since the first failure and passes it in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SequenceBound {
    /// Milliseconds from the sequence's first failure within which a retry may start.
    pub ms_max: u64,
}

impl Default for SequenceBound {
    /// `DEFAULT_SEQUENCE_MS_MAX`.
    fn default() -> Self {
        SequenceBound {
            ms_max: DEFAULT_SEQUENCE_MS_MAX,
        }
    }
}

impl SequenceBound {
    /// Whether a retry after `delay_ms`, decided `elapsed_ms` after the sequence's first failure,
    /// starts within the bound.
    pub fn allows(&self, elapsed_ms: u64, delay_ms: f64) -> bool {
        (elapsed_ms as f64 + delay_ms.max(0.0)) <= self.ms_max as f64
    }

    /// `recovery` cut by the bound: a scheduled retry that would start too late becomes `Delegate`
    /// (the turn ends `error` with the failure).
    pub fn apply(&self, recovery: Recovery, elapsed_ms: u64) -> Recovery {
        match recovery {
            Recovery::Backoff(s) if !self.allows(elapsed_ms, s.delay_ms) => Recovery::Delegate,
            other => other,
        }
    }
}

#[async_trait]
impl RequestErrorHook for RetryHook {
    async fn request_error(&self, ctx: &RequestErrorCtx) -> Result<Recovery, HookError> {
        Ok(self.recovery(ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::HookCtx;
    use crate::ids::SessionId;
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    fn policy(v: Value) -> RetryPolicy {
        RetryPolicy::from_json(&v).expect("valid policy")
    }

    fn failure(code: &str) -> LlmFailure {
        LlmFailure::new(code, "busy")
    }

    fn with_retry_after(code: &str, after_ms: u64) -> LlmFailure {
        LlmFailure {
            provider_retry_after_ms: Some(after_ms),
            ..failure(code)
        }
    }

    /// The `llm/retry` event the runtime would record for a scheduled retry.
    fn recorded(provider: &str, p: &RetryPolicy, retry: u64, retry_id: &str) -> LlmRetry {
        LlmRetry {
            retry_id: retry_id.into(),
            turn: 1,
            step: 1,
            provider: provider.into(),
            mode: p.mode.name().into(),
            policy_key: p.policy_key(),
            retry,
            max_retries: match p.mode {
                RetryMode::Normal { max_retries, .. } => Some(max_retries),
                RetryMode::Always => None,
            },
            delay_ms: Number::from(0u64),
            failure: failure(codes::SERVER),
        }
    }

    /// The id the runtime supplies in `ctx` for a new chain.
    const NEW_RETRY_ID: &str = "minted-by-the-runtime";

    fn ctx(
        provider: &str,
        failure: LlmFailure,
        retry_policy: Option<RetryPolicy>,
        retries: Vec<LlmRetry>,
        random: f64,
    ) -> RequestErrorCtx {
        RequestErrorCtx {
            hook: HookCtx {
                session_id: SessionId::new("s1").expect("valid"),
                turn: 1,
                step: 1,
                cancel: CancellationToken::new(),
            },
            provider: provider.into(),
            failure,
            retry_policy,
            retries,
            random,
            new_retry_id: NEW_RETRY_ID.into(),
        }
    }

    fn scheduled(recovery: Recovery) -> ScheduledRetry {
        match recovery {
            Recovery::Backoff(s) => s,
            other => panic!("expected a scheduled retry, got {other:?}"),
        }
    }

    /// retry-policy.spec 1: "resolves immutable normal defaults".
    #[test]
    fn resolves_normal_defaults() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.mode,
            RetryMode::Normal {
                max_retries: 5,
                retryable_codes: [
                    "EMPTY_RESPONSE",
                    "RATE_LIMIT",
                    "SERVER",
                    "TIMEOUT",
                    "TRANSPORT"
                ]
                .map(String::from)
                .to_vec()
            }
        );
        assert_eq!(
            p.backoff,
            Backoff {
                initial_delay_ms: 500,
                max_delay_ms: 10_000,
                jitter_ratio: 0.1
            }
        );
        assert_eq!(policy(json!({"mode": "normal"})), p);
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(
            p.policy_key(),
            r#"["normal",5,["EMPTY_RESPONSE","RATE_LIMIT","SERVER","TIMEOUT","TRANSPORT"],500,10000,0.1]"#
        );
    }

    /// retry-policy.spec 2: "resolves and detaches a configured normal policy".
    #[test]
    fn resolves_a_configured_normal_policy() {
        let config = json!({
            "mode": "normal",
            "maxRetries": 2,
            "retryableCodes": ["SERVER", "RATE_LIMIT"],
            "backoff": {"initialDelayMs": 500, "maxDelayMs": 10000, "jitterRatio": 0},
        });
        let p = policy(config);
        assert_eq!(
            p,
            RetryPolicy {
                mode: RetryMode::Normal {
                    max_retries: 2,
                    retryable_codes: vec!["SERVER".into(), "RATE_LIMIT".into()],
                },
                backoff: Backoff {
                    initial_delay_ms: 500,
                    max_delay_ms: 10_000,
                    jitter_ratio: 0.0
                },
            }
        );
        // retry.spec 2: the exact key, codes sorted, numbers written as JavaScript writes them.
        assert_eq!(
            p.policy_key(),
            r#"["normal",2,["RATE_LIMIT","SERVER"],500,10000,0]"#
        );
        // A partial backoff keeps the other defaults; 1.0 is an integer, as in JavaScript.
        let partial =
            policy(json!({"mode": "normal", "maxRetries": 1.0, "backoff": {"maxDelayMs": 800}}));
        assert_eq!(
            partial.backoff,
            Backoff {
                initial_delay_ms: 500,
                max_delay_ms: 800,
                jitter_ratio: 0.1
            }
        );
    }

    /// retry-policy.spec 3 and 4: always mode with default backoff; normal-only fields tolerated and
    /// dropped (not even checked).
    #[test]
    fn resolves_always_mode_and_drops_normal_only_fields() {
        let p = policy(json!({"mode": "always"}));
        assert_eq!(
            p,
            RetryPolicy {
                mode: RetryMode::Always,
                backoff: Backoff::default()
            }
        );
        assert_eq!(p.policy_key(), r#"["always",500,10000,0.1]"#);
        let switched = policy(json!({
            "mode": "always",
            "maxRetries": -3,
            "retryableCodes": [],
            "backoff": {"initialDelayMs": 3, "maxDelayMs": 5, "jitterRatio": 1},
        }));
        assert_eq!(switched.mode, RetryMode::Always);
        assert_eq!(switched.policy_key(), r#"["always",3,5,1]"#);
    }

    /// retry-policy.spec 5: "rejects invalid policy %#" (the original's 16 cases, plus the rest of the
    /// documented bounds). JSON cannot hold an infinite number; an out-of-range huge one stands in.
    #[test]
    fn rejects_invalid_policies() {
        let cases: Vec<(Value, &str)> = vec![
            (
                json!({"mode": "normal", "maxRetries": -1}),
                "retry policy maxRetries must be a non-negative safe integer, got -1",
            ),
            (
                json!({"mode": "normal", "maxRetries": 1.5}),
                "retry policy maxRetries must be a non-negative safe integer, got 1.5",
            ),
            (
                json!({"mode": "normal", "maxRetries": 9_007_199_254_740_992u64}),
                "retry policy maxRetries must be a non-negative safe integer, got 9007199254740992",
            ),
            (
                json!({"mode": "normal", "maxRetries": "2"}),
                "retry policy maxRetries must be a non-negative safe integer, got \"2\"",
            ),
            (
                json!({"mode": "normal", "backoff": {"initialDelayMs": 0}}),
                "retry policy backoff.initialDelayMs must be a positive integer of at most 2147483647 ms, got 0",
            ),
            (
                json!({"mode": "normal", "backoff": {"maxDelayMs": 1e300}}),
                "retry policy backoff.maxDelayMs must be a positive integer of at most 2147483647 ms, got 1e+300",
            ),
            (
                json!({"mode": "normal", "backoff": {"maxDelayMs": 2_147_483_648u64}}),
                "retry policy backoff.maxDelayMs must be a positive integer of at most 2147483647 ms, got 2147483648",
            ),
            (
                json!({"mode": "normal", "backoff": {"initialDelayMs": -5}}),
                "retry policy backoff.initialDelayMs must be a positive integer of at most 2147483647 ms, got -5",
            ),
            (
                json!({"mode": "normal", "backoff": {"initialDelayMs": 2.5}}),
                "retry policy backoff.initialDelayMs must be a positive integer of at most 2147483647 ms, got 2.5",
            ),
            (
                json!({"mode": "normal", "backoff": {"initialDelayMs": 600, "maxDelayMs": 500}}),
                "retry policy backoff.initialDelayMs 600 exceeds backoff.maxDelayMs 500",
            ),
            (
                json!({"mode": "always", "backoff": {"jitterRatio": 1.5}}),
                "retry policy backoff.jitterRatio must be a number in [0, 1], got 1.5",
            ),
            (
                json!({"mode": "always", "backoff": {"jitterRatio": -0.1}}),
                "retry policy backoff.jitterRatio must be a number in [0, 1], got -0.1",
            ),
            (
                json!({"mode": "normal", "retryableCodes": []}),
                "retry policy retryableCodes must be a non-empty array of strings, got []",
            ),
            (
                json!({"mode": "normal", "retryableCodes": "SERVER"}),
                "retry policy retryableCodes must be a non-empty array of strings, got \"SERVER\"",
            ),
            (
                json!({"mode": "normal", "retryableCodes": ["SERVER", "SERVER"]}),
                "retry policy retryableCodes lists \"SERVER\" twice",
            ),
            (
                json!({"mode": "normal", "retryableCodes": ["SERVER", ""]}),
                "retry policy retryableCodes[1] must be a non-empty string, got \"\"",
            ),
            (
                json!({"mode": "normal", "retryableCodes": [429]}),
                "retry policy retryableCodes[0] must be a non-empty string, got 429",
            ),
            (
                json!({"mode": "normal", "maxRetry": 2}),
                "retry policy config has unknown key \"maxRetry\"",
            ),
            (
                json!({"mode": "normal", "backoff": {"initialDelay": 2}}),
                "retry policy backoff has unknown key \"initialDelay\"",
            ),
            (
                json!({"mode": "always", "backoff": {"jitter": 0}}),
                "retry policy backoff has unknown key \"jitter\"",
            ),
            (
                json!({"mode": "sometimes"}),
                "retry policy mode must be \"normal\" or \"always\", got \"sometimes\"",
            ),
            (
                json!({"maxRetries": 2}),
                "retry policy mode must be \"normal\" or \"always\", got nothing",
            ),
            (
                json!({"mode": "normal", "backoff": 5}),
                "retry policy backoff must be a JSON object, got 5",
            ),
            (
                json!(["normal"]),
                "retry policy config must be a JSON object, got [\"normal\"]",
            ),
        ];
        for (config, want) in cases {
            match RetryPolicy::from_json(&config) {
                Ok(p) => panic!("{config} accepted as {p:?}"),
                Err(err) => assert_eq!(err.to_string(), want, "for {config}"),
            }
        }
    }

    #[test]
    fn validate_checks_policies_built_in_code() {
        let mut p = RetryPolicy::default();
        p.backoff.jitter_ratio = f64::NAN;
        assert_eq!(
            p.validate(),
            Err(RetryPolicyError::BadJitter {
                shown: "NaN".into()
            })
        );
        let p = RetryPolicy {
            mode: RetryMode::Normal {
                max_retries: 1,
                retryable_codes: Vec::new(),
            },
            backoff: Backoff::default(),
        };
        assert!(matches!(
            p.validate(),
            Err(RetryPolicyError::BadCodes { .. })
        ));
        let p = RetryPolicy {
            mode: RetryMode::Always,
            backoff: Backoff {
                initial_delay_ms: 0,
                ..Backoff::default()
            },
        };
        assert!(matches!(
            p.validate(),
            Err(RetryPolicyError::BadDelay {
                field: "initialDelayMs",
                ..
            })
        ));
    }

    #[test]
    fn numbers_print_as_javascript_prints_them() {
        let cases = [
            (0.0, "0"),
            (-0.0, "0"),
            (0.1, "0.1"),
            (1.0, "1"),
            (1.1, "1.1"),
            (0.000001, "0.000001"),
            (0.0000001, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (123.456, "123.456"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (1.25e22, "1.25e+22"),
            (-2.5, "-2.5"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "Infinity"),
        ];
        for (v, want) in cases {
            assert_eq!(js_number_string(v), want, "for {v:?}");
        }
        let json = |v: f64| serde_json::to_string(&js_number(v)).expect("numbers serialize");
        assert_eq!(json(500.0), "500");
        assert_eq!(json(1100.0), "1100");
        assert_eq!(json(1.1), "1.1");
        assert_eq!(json(-0.0), "0");
        assert_eq!(json(-3.0), "-3");
        assert_eq!(json(f64::NAN), "0");
    }

    /// retry.spec 2: "records the scheduled delay before retrying the request" — the exact
    /// `llm/retry` facts for the first retry of a new chain.
    #[test]
    fn schedules_the_first_retry_of_a_new_chain() {
        let p = policy(json!({
            "mode": "normal", "maxRetries": 2, "retryableCodes": ["SERVER", "RATE_LIMIT"],
            "backoff": {"initialDelayMs": 500, "maxDelayMs": 10000, "jitterRatio": 0},
        }));
        let hook = RetryHook::with_policy(p);
        let c = ctx("mock", failure(codes::RATE_LIMIT), None, Vec::new(), 0.7);
        assert_eq!(
            hook.recovery(&c),
            Recovery::Backoff(ScheduledRetry {
                retry_id: NEW_RETRY_ID.into(),
                mode: "normal".into(),
                policy_key: r#"["normal",2,["RATE_LIMIT","SERVER"],500,10000,0]"#.into(),
                retry: 1,
                max_retries: Some(2),
                delay_ms: 500.0,
            })
        );
    }

    /// retry.spec 3: "retries an EMPTY_RESPONSE error finish under the default retryable codes".
    #[test]
    fn retries_empty_response_by_default() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.decide(&failure(codes::EMPTY_RESPONSE), "mock", &[], 0.5),
            RetryDecision::Schedule {
                retry: 1,
                retry_id: None,
                delay_ms: 500.0
            }
        );
    }

    /// retry.spec 5: "applies bounded exponential jitter and stops after the configured budget" —
    /// 450 (retry 1, random 0), 1100 (retry 2, random 1), then delegated.
    #[test]
    fn applies_bounded_jitter_and_stops_after_the_budget() {
        let p = RetryPolicy::default().with_max_retries(2);
        let fail = failure(codes::SERVER);
        assert_eq!(
            p.decide(&fail, "mock", &[], 0.0),
            RetryDecision::Schedule {
                retry: 1,
                retry_id: None,
                delay_ms: 450.0
            }
        );
        let first = recorded("mock", &p, 1, "chain-a");
        assert_eq!(
            p.decide(&fail, "mock", std::slice::from_ref(&first), 1.0),
            RetryDecision::Schedule {
                retry: 2,
                retry_id: Some("chain-a".into()),
                delay_ms: 1100.0
            }
        );
        let second = recorded("mock", &p, 2, "chain-a");
        assert_eq!(
            p.decide(&fail, "mock", &[first, second], 0.5),
            RetryDecision::Delegate
        );
        // A budget of 0 never retries.
        let none = RetryPolicy::default().with_max_retries(0);
        assert_eq!(
            none.decide(&fail, "mock", &[], 0.5),
            RetryDecision::Delegate
        );
    }

    /// retry.spec 6: "accepts the zero-delay lower jitter bound".
    #[test]
    fn accepts_the_zero_delay_lower_jitter_bound() {
        let p = policy(json!({"mode": "normal", "backoff": {"jitterRatio": 1}}));
        assert_eq!(
            p.decide(&failure(codes::SERVER), "mock", &[], 0.0),
            RetryDecision::Schedule {
                retry: 1,
                retry_id: None,
                delay_ms: 0.0
            }
        );
        assert_eq!(p.backoff_delay_ms(1, 1.0), 1000.0);
        assert_eq!(p.backoff_delay_ms(1, 0.5), 500.0);
    }

    /// retry.spec 7: "uses a bounded provider Retry-After verbatim and delegates an over-cap
    /// instruction" (normal mode).
    #[test]
    fn uses_a_bounded_retry_after_verbatim_and_delegates_over_cap() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.decide(&with_retry_after(codes::RATE_LIMIT, 2000), "mock", &[], 0.9),
            RetryDecision::Schedule {
                retry: 1,
                retry_id: None,
                delay_ms: 2000.0
            }
        );
        assert_eq!(
            p.decide(
                &with_retry_after(codes::RATE_LIMIT, 10_000),
                "mock",
                &[],
                0.9
            ),
            RetryDecision::Schedule {
                retry: 1,
                retry_id: None,
                delay_ms: 10_000.0
            }
        );
        assert_eq!(
            p.decide(
                &with_retry_after(codes::RATE_LIMIT, 10_001),
                "mock",
                &[],
                0.9
            ),
            RetryDecision::Delegate
        );
    }

    /// retry.spec 8: "uses local jittered backoff when always mode receives an over-cap Retry-After"
    /// — initial 3 ms, jitter 0: min(3 * 2^0, 5) * 1 = 3.
    #[test]
    fn always_mode_falls_back_to_local_backoff_over_cap() {
        let p = policy(
            json!({"mode": "always", "backoff": {"initialDelayMs": 3, "maxDelayMs": 5, "jitterRatio": 0}}),
        );
        assert_eq!(
            p.decide(&with_retry_after(codes::AUTH, 10_001), "other", &[], 0.3),
            RetryDecision::Schedule {
                retry: 1,
                retry_id: None,
                delay_ms: 3.0
            }
        );
        assert_eq!(
            p.decide(&with_retry_after(codes::AUTH, 4), "other", &[], 0.3),
            RetryDecision::Schedule {
                retry: 1,
                retry_id: None,
                delay_ms: 4.0
            }
        );
    }

    /// retry.spec 9 and 10: "delegates non-transient failures without scheduling a timer" (AUTH,
    /// normal mode) and "delegates when no final adapter served the failed request".
    #[test]
    fn delegates_non_transient_failures_and_unserved_requests() {
        let hook = RetryHook::new();
        let auth = ctx(
            "mock",
            failure(codes::AUTH),
            Some(RetryPolicy::default()),
            Vec::new(),
            0.5,
        );
        assert_eq!(hook.recovery(&auth), Recovery::Delegate);
        let unserved = ctx("mock", failure(codes::SERVER), None, Vec::new(), 0.5);
        assert_eq!(hook.recovery(&unserved), Recovery::Delegate);
    }

    /// retry.spec 11: "selects policy by the failed request provider" — the hook follows the policy
    /// of the provider that served the attempt.
    #[test]
    fn follows_the_serving_provider_policy() {
        let hook = RetryHook::new();
        let normal = ctx(
            "mock",
            failure(codes::AUTH),
            Some(RetryPolicy::default()),
            Vec::new(),
            0.5,
        );
        assert_eq!(hook.recovery(&normal), Recovery::Delegate);
        let always = policy(json!({"mode": "always", "backoff": {"jitterRatio": 0}}));
        let other = ctx("other", failure(codes::AUTH), Some(always), Vec::new(), 0.5);
        let s = scheduled(hook.recovery(&other));
        assert_eq!(
            s,
            ScheduledRetry {
                retry_id: NEW_RETRY_ID.into(),
                mode: "always".into(),
                policy_key: r#"["always",500,10000,0]"#.into(),
                retry: 1,
                max_retries: None,
                delay_ms: 500.0
            }
        );
        // A hook with its own policy overrides the provider's.
        let own = RetryHook::with_max_retries(1);
        let c = ctx(
            "other",
            failure(codes::SERVER),
            Some(policy(json!({"mode": "always"}))),
            Vec::new(),
            0.5,
        );
        let s = scheduled(own.recovery(&c));
        assert_eq!((s.mode.as_str(), s.max_retries), ("normal", Some(1)));
    }

    /// retry.spec 13: "keeps finite retry budgets scoped to the failed provider".
    #[test]
    fn keeps_budgets_scoped_to_the_provider() {
        let p = RetryPolicy::default().with_max_retries(1);
        let mock_retry = recorded("mock", &p, 1, "chain-mock");
        let fail = failure(codes::SERVER);
        assert_eq!(
            p.decide(&fail, "mock", std::slice::from_ref(&mock_retry), 0.5),
            RetryDecision::Delegate
        );
        assert_eq!(
            p.decide(&fail, "other", &[mock_retry], 0.5),
            RetryDecision::Schedule {
                retry: 1,
                retry_id: None,
                delay_ms: 500.0
            }
        );
    }

    /// retry.spec 14: "uses the serving registration policy and resets changed-policy history" — a
    /// changed policy starts a new chain at retry 1 with a new id.
    #[test]
    fn a_changed_policy_starts_a_new_chain() {
        let old = RetryPolicy::default().with_max_retries(1);
        let new = RetryPolicy::default().with_max_retries(3);
        assert_ne!(old.policy_key(), new.policy_key());
        let history = [recorded("mock", &old, 1, "old-chain")];
        let hook = RetryHook::with_policy(new.clone());
        let c = ctx("mock", failure(codes::SERVER), None, history.to_vec(), 0.5);
        let s = scheduled(hook.recovery(&c));
        assert_eq!((s.retry, s.retry_id.as_str()), (1, NEW_RETRY_ID));
        assert_eq!(s.policy_key, new.policy_key());

        // Within the new chain the id is reused and numbering continues.
        let history = vec![
            recorded("mock", &old, 1, "old-chain"),
            recorded("mock", &new, 1, "new-chain"),
        ];
        let c = RequestErrorCtx {
            new_retry_id: "unused".into(),
            ..ctx("mock", failure(codes::SERVER), None, history, 0.5)
        };
        let s = scheduled(hook.recovery(&c));
        assert_eq!((s.retry, s.retry_id.as_str()), (2, "new-chain"));
    }

    /// retry.spec 15: "keeps always mode unbounded while preserving cancellable jittered backoff" —
    /// delays 1.1, 2.2, 4, 4 and no `maxRetries`.
    #[test]
    fn always_mode_is_unbounded_with_capped_jittered_backoff() {
        let p = policy(
            json!({"mode": "always", "backoff": {"initialDelayMs": 1, "maxDelayMs": 4, "jitterRatio": 0.1}}),
        );
        let hook = RetryHook::with_policy(p.clone());
        let mut history = Vec::new();
        let mut delays = Vec::new();
        for attempt in 0..4 {
            // The runtime supplies a fresh id every time; only the first starts the chain.
            let c = RequestErrorCtx {
                new_retry_id: format!("minted-{attempt}"),
                ..ctx("mock", failure(codes::AUTH), None, history.clone(), 1.0)
            };
            let s = scheduled(hook.recovery(&c));
            assert_eq!(s.max_retries, None);
            assert_eq!(s.retry_id, "minted-0");
            delays.push(serde_json::to_string(&js_number(s.delay_ms)).expect("numbers serialize"));
            history.push(recorded("mock", &p, s.retry, &s.retry_id));
        }
        assert_eq!(delays, ["1.1", "2.2", "4", "4"]);
        // Far past any sane retry count the delay stays at the cap.
        assert_eq!(p.backoff_delay_ms(u64::MAX, 1.0), 4.0);
        assert_eq!(p.backoff_delay_ms(2000, 0.0), 4.0 * 0.9);
    }

    /// Cancellation wins: a turn already cancelled is not retried.
    #[test]
    fn a_cancelled_turn_is_not_retried() {
        let hook = RetryHook::new();
        let c = ctx(
            "mock",
            failure(codes::SERVER),
            Some(RetryPolicy::default()),
            Vec::new(),
            0.5,
        );
        c.hook.cancel.cancel();
        assert_eq!(hook.recovery(&c), Recovery::Delegate);
    }

    /// The hook mints nothing: a new chain takes the id the runtime put in the context (a UUID v4
    /// from `dsh::ids::mint_retry_id` in the agent actor), and a continued chain keeps its own.
    #[test]
    fn the_hook_takes_the_runtime_supplied_id_for_a_new_chain() {
        let hook = RetryHook::new();
        let runtime_id = crate::ids::mint_retry_id();
        let c = RequestErrorCtx {
            new_retry_id: runtime_id.clone(),
            ..ctx(
                "mock",
                failure(codes::SERVER),
                Some(RetryPolicy::default()),
                Vec::new(),
                0.5,
            )
        };
        let recovery = futures::executor::block_on(hook.request_error(&c)).expect("never fails");
        let s = scheduled(recovery);
        assert_eq!(s.retry_id, runtime_id);
        let continued = RequestErrorCtx {
            retries: vec![recorded("mock", &RetryPolicy::default(), 1, &runtime_id)],
            new_retry_id: crate::ids::mint_retry_id(),
            ..c
        };
        let recovery = futures::executor::block_on(hook.request_error(&continued));
        let s = scheduled(recovery.expect("never fails"));
        assert_eq!((s.retry, s.retry_id), (2, runtime_id));
    }

    #[test]
    fn the_sequence_bound_refuses_a_retry_that_would_start_too_late() {
        let bound = SequenceBound { ms_max: 10_000 };
        assert_eq!(SequenceBound::default().ms_max, 600_000);
        assert!(bound.allows(0, 500.0));
        assert!(bound.allows(9_000, 1_000.0));
        assert!(!bound.allows(9_001, 1_000.0));
        assert!(!bound.allows(10_001, 0.0));
        let c = ctx(
            "mock",
            failure(codes::TIMEOUT),
            Some(RetryPolicy::default()),
            Vec::new(),
            0.5,
        );
        let recovery = RetryHook::new().recovery(&c);
        assert!(matches!(
            bound.apply(recovery.clone(), 1_000),
            Recovery::Backoff(_)
        ));
        assert_eq!(bound.apply(recovery, 9_999), Recovery::Delegate);
        assert_eq!(bound.apply(Recovery::Delegate, 0), Recovery::Delegate);
    }

    proptest::proptest! {
        /// Delays stay in [0, max] and within the jitter band around the capped exponential base.
        #[test]
        fn backoff_stays_within_its_band(
            initial in 1u64..=DELAY_MS_MAX,
            spread in 0u64..=DELAY_MS_MAX,
            jitter in 0.0f64..=1.0,
            retry in 1u64..2000,
            random in 0.0f64..=1.0,
        ) {
            let max = initial.saturating_add(spread).min(DELAY_MS_MAX);
            let p = RetryPolicy {
                mode: RetryMode::Always,
                backoff: Backoff { initial_delay_ms: initial, max_delay_ms: max, jitter_ratio: jitter },
            };
            proptest::prop_assert_eq!(p.validate(), Ok(()));
            let delay = p.backoff_delay_ms(retry, random);
            let base = (initial as f64 * 2f64.powi(i32::try_from(retry - 1).expect("small"))).min(max as f64);
            proptest::prop_assert!(delay.is_finite() && delay >= 0.0 && delay <= max as f64);
            proptest::prop_assert!(delay >= base * (1.0 - jitter) - 1e-6);
            proptest::prop_assert!(delay <= base * (1.0 + jitter) + 1e-6);
        }
    }
}

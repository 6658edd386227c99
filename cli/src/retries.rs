//! The retry hook of `dsh run` and `dsh chat`: the default policy (`RetryHook`), with the whole
//! retry sequence of one request bounded in time (`SequenceBound`, `retry_timeout_ms` in `dsh.toml`,
//! `--retry-timeout-ms`), and each retry announced on stderr (`dsh: retrying in 2 s after TIMEOUT
//! (attempt 2 of 6)`), so a person sees why the command waits.
//!
//! The policy and the bound are pure; this hook only measures time. A sequence starts at the first
//! failure of a request (no `llm/retry` of that provider recorded yet in the turn and step) and its
//! start is remembered per session and provider. A retry the bound refuses ends the turn `error`
//! with the failure itself (a hook failure, not a delegation, so no later hook retries it anyway).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use async_trait::async_trait;
use dsh::SessionId;
use dsh::hooks::{HookError, Recovery, RequestErrorCtx, RequestErrorHook};
use dsh::llm::retry::{RetryHook, SequenceBound};

use crate::text::visible;

/// Where a sequence of retries started: its turn and step, and the time of its first failure.
type SequenceStart = (u64, u64, Instant);

/// The default retry policy, bounded in time and announced on stderr.
#[derive(Debug)]
pub struct AnnouncedRetries {
    policy: RetryHook,
    bound: SequenceBound,
    /// The running sequence of each session and provider (a few entries: one agent per command).
    started: Mutex<HashMap<(SessionId, String), SequenceStart>>,
}

impl AnnouncedRetries {
    /// The default policy with the retry sequence of one request bounded to `bound`.
    pub fn new(bound: SequenceBound) -> AnnouncedRetries {
        AnnouncedRetries {
            policy: RetryHook::new(),
            bound,
            started: Mutex::new(HashMap::new()),
        }
    }

    /// Milliseconds since the first failure of the sequence `ctx` belongs to (0 for a new one).
    fn elapsed_ms(&self, ctx: &RequestErrorCtx, now: Instant) -> u64 {
        let key = (ctx.hook.session_id.clone(), ctx.provider.clone());
        let continues = ctx.retries.iter().any(|r| r.provider == ctx.provider);
        let mut started = self
            .started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let start = match started.get(&key) {
            Some(&(turn, step, at))
                if continues && (turn, step) == (ctx.hook.turn, ctx.hook.step) =>
            {
                at
            }
            _ => {
                started.insert(key, (ctx.hook.turn, ctx.hook.step, now));
                now
            }
        };
        u64::try_from(now.duration_since(start).as_millis()).unwrap_or(u64::MAX)
    }
}

#[async_trait]
impl RequestErrorHook for AnnouncedRetries {
    async fn request_error(&self, ctx: &RequestErrorCtx) -> Result<Recovery, HookError> {
        let elapsed_ms = self.elapsed_ms(ctx, Instant::now());
        let wanted = self.policy.request_error(ctx).await?;
        match (&wanted, self.bound.apply(wanted.clone(), elapsed_ms)) {
            (_, Recovery::Backoff(s)) => {
                eprintln!(
                    "dsh: retrying in {} after {} (attempt {})",
                    seconds(s.delay_ms),
                    visible(&ctx.failure.code),
                    attempt_of(s.retry, s.max_retries)
                );
                Ok(Recovery::Backoff(s))
            }
            (Recovery::Backoff(_), _) => {
                eprintln!(
                    "dsh: not retrying {}: the retries of this request have taken {} (limit {}; \
                     retry_timeout_ms in dsh.toml)",
                    visible(&ctx.failure.code),
                    seconds(elapsed_ms as f64),
                    seconds(self.bound.ms_max as f64)
                );
                Err(HookError::Failure(ctx.failure.clone()))
            }
            (_, decided) => Ok(decided),
        }
    }
}

/// `attempt 2 of 6` for retry 1 of 5 (the first attempt was not a retry); `attempt 2` when unbounded.
fn attempt_of(retry: u64, max_retries: Option<u64>) -> String {
    match max_retries {
        Some(max) => format!("{} of {}", retry.saturating_add(1), max.saturating_add(1)),
        None => retry.saturating_add(1).to_string(),
    }
}

/// Milliseconds as seconds for a person: `2 s`, `0.5 s`, `1.3 s`.
fn seconds(ms: f64) -> String {
    let s = (ms / 100.0).round() / 10.0;
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsh::hooks::HookCtx;
    use dsh::llm::retry::RetryPolicy;
    use dsh::llm::types::LlmFailure;
    use dsh::session::event::LlmRetry;
    use tokio_util::sync::CancellationToken;

    fn ctx(turn: u64, step: u64, retries: Vec<LlmRetry>) -> RequestErrorCtx {
        RequestErrorCtx {
            hook: HookCtx {
                session_id: SessionId::new("s").expect("valid id"),
                turn,
                step,
                cancel: CancellationToken::new(),
            },
            provider: "p".into(),
            failure: LlmFailure::new("TIMEOUT", "idle"),
            retry_policy: Some(RetryPolicy::default()),
            retries,
            random: 0.5,
            new_retry_id: "r".into(),
        }
    }

    fn recorded(retry: u64) -> LlmRetry {
        LlmRetry {
            retry_id: "r".into(),
            turn: 1,
            step: 1,
            provider: "p".into(),
            mode: "normal".into(),
            policy_key: RetryPolicy::default().policy_key(),
            retry,
            max_retries: Some(5),
            delay_ms: 500.into(),
            failure: LlmFailure::new("TIMEOUT", "idle"),
        }
    }

    #[test]
    fn a_sequence_is_timed_from_its_first_failure() {
        let hook = AnnouncedRetries::new(SequenceBound::default());
        let t0 = Instant::now();
        let later = t0 + std::time::Duration::from_millis(7_000);
        assert_eq!(hook.elapsed_ms(&ctx(1, 1, Vec::new()), t0), 0);
        assert_eq!(hook.elapsed_ms(&ctx(1, 1, vec![recorded(1)]), later), 7_000);
        // A new step, or no retry recorded yet, starts a new sequence.
        assert_eq!(hook.elapsed_ms(&ctx(1, 2, vec![recorded(1)]), later), 0);
        assert_eq!(hook.elapsed_ms(&ctx(1, 2, Vec::new()), later), 0);
    }

    #[tokio::test]
    async fn a_retry_past_the_bound_ends_the_turn_with_the_failure() {
        let hook = AnnouncedRetries::new(SequenceBound { ms_max: 0 });
        let got = hook.request_error(&ctx(1, 1, Vec::new())).await;
        assert_eq!(
            got,
            Err(HookError::Failure(LlmFailure::new("TIMEOUT", "idle")))
        );
        let hook = AnnouncedRetries::new(SequenceBound::default());
        let got = hook.request_error(&ctx(1, 1, Vec::new())).await;
        assert!(
            matches!(got, Ok(Recovery::Backoff(ref s)) if s.retry == 1),
            "{got:?}"
        );
    }

    #[test]
    fn attempts_and_seconds_read_as_a_person_counts() {
        assert_eq!(attempt_of(1, Some(5)), "2 of 6");
        assert_eq!(attempt_of(3, None), "4");
        assert_eq!(seconds(2_000.0), "2 s");
        assert_eq!(seconds(500.0), "0.5 s");
        assert_eq!(seconds(1_260.0), "1.3 s");
    }
}

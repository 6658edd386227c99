//! The `sim` provider: a seeded, deterministic simulated model for demos, load tests and benchmarks.
//!
//! What a reply contains depends only on the seed and the request — the session id and, per message,
//! its role, block count and text length — never on timing or scheduling, so a run of many agents is
//! reproducible however its tasks interleave. A reply is optional reasoning, then either text (a
//! length drawn from `reply_tokens_min..=reply_tokens_max`) or, with `tool_call_probability`, one call
//! of a tool from `request.tools` with arguments generated from its JSON schema (objects, strings,
//! numbers, integers, booleans, arrays, enums, `const`, required keys, the usual length and range
//! keywords). After `max_tool_steps` consecutive tool steps the model answers in text, so every turn
//! terminates.
//!
//! Time: the first chunk waits `ttft_ms`; tokens then flow at `tokens_per_sec` (0: as fast as the
//! consumer reads), paced in batches of about 20 ms against a fixed anchor so that sleeps do not
//! drift. Every wait is cancellable; cancellation ends the stream with `finish{aborted}`. Cheap per
//! token: a token is one word from a fixed vocabulary, and the delta string is its only allocation.
//!
//! The parts: this module decides what a reply holds (`SimProvider`'s plan); `stream` paces it out
//! as chunks; `args` generates tool arguments from a JSON schema; `rng` is the deterministic
//! randomness every choice is drawn from.

mod args;
mod rng;
mod stream;

use std::fmt;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::llm::provider::{ChunkStream, Provider};
use crate::llm::types::{ContentBlock, LlmRequest, Role};
use args::generate_arguments;
use rng::Fnv;

pub use rng::SplitMix64;

/// The largest reply length accepted, in tokens.
pub const REPLY_TOKENS_MAX: u32 = 1_000_000;

/// Why a simulator configuration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The reply length bounds are upside down.
    #[error("reply_tokens_min {min} is above reply_tokens_max {max}")]
    ReplyRange {
        /// `reply_tokens_min` as given.
        min: u32,
        /// `reply_tokens_max` as given.
        max: u32,
    },
    /// Replies could grow past what one log event may hold.
    #[error("reply_tokens_max is {max}, the limit is {limit}")]
    ReplyTooLong {
        /// `reply_tokens_max` as given.
        max: u32,
        /// The largest value accepted.
        limit: u32,
    },
    /// A probability outside 0..=1 (NaN included).
    #[error("tool_call_probability is {p}, it must be within 0..=1")]
    Probability {
        /// The value given.
        p: f64,
    },
}

/// Configuration of the simulated model (serde, for configuration files; unknown keys are refused).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Seeds every choice. Equal seeds and requests give equal replies.
    pub seed: u64,
    /// Time to first token.
    pub ttft_ms: u64,
    /// Output pace; 0 streams as fast as it is read.
    pub tokens_per_sec: u64,
    /// The shortest text reply, in tokens (words).
    pub reply_tokens_min: u32,
    /// The longest text reply, in tokens (words). Invariant when validated: at least
    /// `reply_tokens_min`.
    pub reply_tokens_max: u32,
    /// Chance that a step calls a tool (when the request offers tools).
    pub tool_call_probability: f64,
    /// Consecutive tool steps after which the model answers in text.
    pub max_tool_steps: u32,
    /// Whether replies start with a reasoning block (half the text length).
    pub reasoning: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 0,
            ttft_ms: 300,
            tokens_per_sec: 60,
            reply_tokens_min: 8,
            reply_tokens_max: 64,
            tool_call_probability: 0.3,
            max_tool_steps: 3,
            reasoning: false,
        }
    }
}

impl SimConfig {
    /// No waiting at all: for tests and throughput benchmarks.
    pub fn instant(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            ttft_ms: 0,
            tokens_per_sec: 0,
            ..SimConfig::default()
        }
    }

    fn validate(&self) -> Result<(), SimError> {
        if self.reply_tokens_min > self.reply_tokens_max {
            return Err(SimError::ReplyRange {
                min: self.reply_tokens_min,
                max: self.reply_tokens_max,
            });
        }
        if self.reply_tokens_max > REPLY_TOKENS_MAX {
            return Err(SimError::ReplyTooLong {
                max: self.reply_tokens_max,
                limit: REPLY_TOKENS_MAX,
            });
        }
        if !(0.0..=1.0).contains(&self.tool_call_probability) {
            return Err(SimError::Probability {
                p: self.tool_call_probability,
            });
        }
        Ok(())
    }
}

/// The vocabulary replies and generated strings are drawn from.
const WORDS: [&str; 64] = [
    "the",
    "agent",
    "reads",
    "a",
    "file",
    "and",
    "then",
    "writes",
    "its",
    "answer",
    "to",
    "log",
    "every",
    "event",
    "is",
    "durable",
    "before",
    "we",
    "acknowledge",
    "input",
    "model",
    "streams",
    "tokens",
    "while",
    "tools",
    "run",
    "in",
    "parallel",
    "under",
    "one",
    "turn",
    "step",
    "result",
    "order",
    "stays",
    "stable",
    "across",
    "restarts",
    "so",
    "nothing",
    "acknowledged",
    "gets",
    "lost",
    "when",
    "process",
    "crashes",
    "supervisor",
    "restores",
    "session",
    "from",
    "disk",
    "with",
    "repair",
    "of",
    "open",
    "turns",
    "steer",
    "joins",
    "next",
    "boundary",
    "cancel",
    "drains",
    "pool",
    "quickly",
];

/// Assistant tool steps since the last message that is not a tool exchange.
fn consecutive_tool_steps(request: &LlmRequest) -> u32 {
    let mut n = 0;
    for message in request.messages.iter().rev() {
        let is_tool_results = !message.content.is_empty()
            && message
                .content
                .iter()
                .all(|b| matches!(b, ContentBlock::ToolResult { .. }));
        match message.role {
            Role::User if is_tool_results => {}
            Role::Assistant if message.tool_calls().next().is_some() => n += 1,
            _ => break,
        }
    }
    n
}

/// A tool call the simulator decided to make.
#[derive(Clone, Debug, PartialEq)]
struct PlannedCall {
    /// The call id.
    id: String,
    /// The tool called (one of the request's tools).
    name: String,
    /// The generated argument JSON.
    arguments: String,
}

/// Everything a reply will contain, fixed before the first chunk.
#[derive(Clone, Debug)]
struct Plan {
    reasoning_tokens: u32,
    text_tokens: u32,
    call: Option<PlannedCall>,
    input_tokens: u64,
    /// Draws the words of the reply.
    words: SplitMix64,
}

/// The simulated model. Cheap to clone.
#[derive(Clone)]
pub struct SimProvider {
    name: String,
    config: SimConfig,
}

impl fmt::Debug for SimProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimProvider")
            .field("name", &self.name)
            .field("config", &self.config)
            .finish()
    }
}

impl SimProvider {
    /// A provider named `sim`.
    ///
    /// # Errors
    /// An inverted or oversized reply range, or a probability outside 0..=1.
    pub fn new(config: SimConfig) -> Result<SimProvider, SimError> {
        config.validate()?;
        Ok(SimProvider {
            name: "sim".into(),
            config,
        })
    }

    /// The same provider under another route name.
    pub fn named(mut self, name: impl Into<String>) -> SimProvider {
        self.name = name.into();
        self
    }

    /// The configuration the simulator runs with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    fn plan(&self, request: &LlmRequest) -> Plan {
        let c = &self.config;
        let mut h = Fnv::new(c.seed);
        if let Some(id) = &request.session_id {
            h.bytes(id.as_str().as_bytes());
        }
        // The conversation in O(1), whatever its length: its size, its total text (summed by the
        // history as it grew) and its last message. Hashing every message made a request of turn
        // 5,000 cost the simulator 80 µs, 44 % of a `dsh sim --agents 1 --turns 5000` run.
        let messages = &request.messages;
        h.u64(messages.len() as u64);
        h.u64(messages.text_bytes());
        if let Some(last) = messages.last() {
            h.u64(last.role as u64);
            h.u64(last.content.len() as u64);
            h.u64(last.text_bytes());
        }
        let input_tokens = messages.text_bytes() / 4 + 4 * messages.len() as u64;
        let mut rng = SplitMix64::new(h.0);
        let text_tokens =
            rng.between(u64::from(c.reply_tokens_min), u64::from(c.reply_tokens_max)) as u32;
        let reasoning_tokens = if c.reasoning {
            (text_tokens / 2).max(1)
        } else {
            0
        };
        let wants_tool = rng.unit() < c.tool_call_probability;
        let call = (wants_tool
            && !request.tools.is_empty()
            && consecutive_tool_steps(request) < c.max_tool_steps)
            .then(|| {
                let tool = &request.tools[rng.below(request.tools.len() as u64) as usize];
                let arguments = generate_arguments(&tool.parameters, &mut rng).to_string();
                PlannedCall {
                    id: format!("call_sim_{:016x}", rng.next_u64()),
                    name: tool.name.clone(),
                    arguments,
                }
            });
        Plan {
            reasoning_tokens,
            text_tokens: if call.is_some() {
                0
            } else {
                text_tokens.max(1)
            },
            call,
            input_tokens: input_tokens + request.system.as_ref().map_or(0, |s| s.len() as u64 / 4),
            words: SplitMix64::new(rng.next_u64()),
        }
    }
}

impl Provider for SimProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn stream(&self, request: LlmRequest, cancel: CancellationToken) -> ChunkStream {
        stream::start(self.plan(&request), &self.config, cancel)
    }
}

#[cfg(test)]
mod tests {
    use super::args::{bound, schema_type};
    use super::*;
    use crate::ids::{MessageId, SessionId};
    use crate::llm::types::{
        BlockType, FinishReason, LlmCallConfig, Message, MessageSource, StreamChunk, ToolSchema,
    };
    use futures::StreamExt;
    use serde_json::{Value, json};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::time::Instant;

    /// A validator for the schema subset the generator promises.
    fn valid(schema: &Value, v: &Value) -> Result<(), String> {
        if let Some(c) = schema.get("const") {
            return if c == v {
                Ok(())
            } else {
                Err(format!("{v} != const {c}"))
            };
        }
        if let Some(Value::Array(options)) = schema.get("enum") {
            return if options.contains(v) {
                Ok(())
            } else {
                Err(format!("{v} not in enum"))
            };
        }
        match schema_type(schema) {
            "object" => {
                let obj = v.as_object().ok_or(format!("{v} is not an object"))?;
                for r in schema
                    .get("required")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let r = r.as_str().unwrap_or("");
                    if !obj.contains_key(r) {
                        return Err(format!("missing required {r}"));
                    }
                }
                let props = schema.get("properties").and_then(Value::as_object);
                for (k, val) in obj {
                    let p = props
                        .and_then(|p| p.get(k))
                        .ok_or(format!("unexpected key {k}"))?;
                    valid(p, val)?;
                }
                Ok(())
            }
            "array" => {
                let items = v.as_array().ok_or(format!("{v} is not an array"))?;
                let n = items.len() as u64;
                if schema
                    .get("minItems")
                    .and_then(Value::as_u64)
                    .is_some_and(|m| n < m)
                    || schema
                        .get("maxItems")
                        .and_then(Value::as_u64)
                        .is_some_and(|m| n > m)
                {
                    return Err(format!("array length {n} out of bounds"));
                }
                let item_schema = schema.get("items").cloned().unwrap_or(json!({}));
                items.iter().try_for_each(|i| valid(&item_schema, i))
            }
            "integer" | "number" => {
                if schema_type(schema) == "integer" && !(v.is_i64() || v.is_u64()) {
                    return Err(format!("{v} is not an integer"));
                }
                let x = v.as_f64().ok_or(format!("{v} is not a number"))?;
                if bound(schema, "minimum").is_some_and(|m| x < m)
                    || bound(schema, "maximum").is_some_and(|m| x > m)
                    || bound(schema, "exclusiveMinimum").is_some_and(|m| x <= m)
                    || bound(schema, "exclusiveMaximum").is_some_and(|m| x >= m)
                {
                    return Err(format!("{x} out of range"));
                }
                Ok(())
            }
            "boolean" => v
                .is_boolean()
                .then_some(())
                .ok_or(format!("{v} is not a boolean")),
            _ => {
                let s = v.as_str().ok_or(format!("{v} is not a string"))?;
                let n = s.chars().count() as u64;
                if schema
                    .get("minLength")
                    .and_then(Value::as_u64)
                    .is_some_and(|m| n < m)
                    || schema
                        .get("maxLength")
                        .and_then(Value::as_u64)
                        .is_some_and(|m| n > m)
                {
                    return Err(format!("string length {n} out of bounds"));
                }
                Ok(())
            }
        }
    }

    #[test]
    fn generated_arguments_validate_against_their_schemas() {
        let schemas = [
            json!({"type":"object","properties":{"path":{"type":"string","minLength":3,"maxLength":5}},"required":["path"]}),
            json!({"type":"object","properties":{
                "mode":{"type":"string","enum":["r","w","a"]},
                "count":{"type":"integer","minimum":1,"maximum":3},
                "ratio":{"type":"number","minimum":-1.5,"maximum":1.5},
                "offset":{"type":"integer","exclusiveMinimum":10,"exclusiveMaximum":12},
                "force":{"type":"boolean"},
                "tags":{"type":"array","items":{"type":"string"},"minItems":2,"maxItems":4},
                "nested":{"type":"object","properties":{"x":{"type":["integer","null"]},"k":{"const":"v"}},"required":["x","k"]}
            },"required":["mode","count","ratio","offset","force","tags","nested"]}),
            json!({"type":"object","properties":{}}),
            json!({"type":"object","properties":{"deep":{"type":"array","items":{"type":"array","items":{"type":"integer"}}}},"required":["deep"]}),
        ];
        for (i, schema) in schemas.iter().enumerate() {
            for seed in 0..200 {
                let v = generate_arguments(schema, &mut SplitMix64::new(seed));
                assert_eq!(valid(schema, &v), Ok(()), "schema {i} seed {seed}: {v}");
            }
        }
        let v = generate_arguments(&schemas[1], &mut SplitMix64::new(7));
        assert_eq!(v["offset"], json!(11));
        assert_eq!(v["nested"]["k"], json!("v"));
    }

    fn request(n_user: usize, tools: Vec<ToolSchema>) -> LlmRequest {
        LlmRequest {
            config: LlmCallConfig {
                provider: "sim".into(),
                model: "sim".into(),
                ..LlmCallConfig::default()
            },
            system: None,
            tools,
            messages: (0..n_user)
                .map(|i| {
                    Arc::new(Message::user_text(
                        MessageId::new(&format!("m{i}")).expect("id"),
                        "hello there",
                    ))
                })
                .collect(),
            session_id: Some(SessionId::new("s1").expect("id")),
            purpose: None,
        }
    }

    fn read_tool() -> ToolSchema {
        ToolSchema {
            name: "read".into(),
            description: "reads".into(),
            parameters: json!({"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}),
        }
    }

    async fn run(p: &SimProvider, r: LlmRequest) -> Vec<StreamChunk> {
        p.stream(r, CancellationToken::new()).collect().await
    }

    #[tokio::test]
    async fn replies_are_deterministic_and_well_formed() {
        let p = SimProvider::new(SimConfig {
            reasoning: true,
            ..SimConfig::instant(42)
        })
        .expect("valid");
        let a = run(&p, request(1, vec![])).await;
        let b = run(&p, request(1, vec![])).await;
        assert_eq!(a, b);
        let other = run(
            &SimProvider::new(SimConfig {
                reasoning: true,
                ..SimConfig::instant(43)
            })
            .expect("valid"),
            request(1, vec![]),
        )
        .await;
        assert_ne!(a, other);
        assert_eq!(
            a[0],
            StreamChunk::BlockStart {
                index: 0,
                block_type: BlockType::Reasoning
            }
        );
        let n = a.len();
        assert_eq!(a[n - 1], StreamChunk::finish(FinishReason::Stop));
        let StreamChunk::Usage { usage } = &a[n - 2] else {
            panic!("usage before finish: {:?}", a[n - 2])
        };
        let n_deltas = a
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    StreamChunk::TextDelta { .. } | StreamChunk::ReasoningDelta { .. }
                )
            })
            .count() as u64;
        assert_eq!(usage.output_tokens, n_deltas);
        assert_eq!(
            usage.reasoning_tokens,
            Some(
                a.iter()
                    .filter(|c| matches!(c, StreamChunk::ReasoningDelta { .. }))
                    .count() as u64
            )
        );
        // The text block-end is the concatenation of the deltas.
        let text: String = a
            .iter()
            .filter_map(|c| match c {
                StreamChunk::TextDelta { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert!(a.contains(&StreamChunk::BlockEnd {
            index: 1,
            block: ContentBlock::Text { text }
        }));
    }

    #[tokio::test]
    async fn calls_tools_with_valid_arguments_and_stops_after_max_tool_steps() {
        let p = SimProvider::new(SimConfig {
            tool_call_probability: 1.0,
            max_tool_steps: 2,
            ..SimConfig::instant(1)
        })
        .expect("valid");
        let mut req = request(1, vec![read_tool()]);
        for step in 0..3 {
            let chunks = run(&p, req.clone()).await;
            let last = chunks.last().cloned();
            if step < 2 {
                assert_eq!(
                    last,
                    Some(StreamChunk::finish(FinishReason::ToolCalls)),
                    "step {step}"
                );
                let call = chunks
                    .iter()
                    .find_map(|c| match c {
                        StreamChunk::BlockEnd {
                            block: b @ ContentBlock::ToolCall { .. },
                            ..
                        } => Some(b.clone()),
                        _ => None,
                    })
                    .expect("a call");
                let ContentBlock::ToolCall {
                    id,
                    name,
                    arguments,
                } = &call
                else {
                    unreachable!()
                };
                assert_eq!(name, "read");
                let args: Value = serde_json::from_str(arguments).expect("json arguments");
                assert_eq!(valid(&read_tool().parameters, &args), Ok(()));
                req.messages.push(Arc::new(Message {
                    id: MessageId::new(&format!("a{step}")).expect("id"),
                    role: Role::Assistant,
                    content: vec![call.clone()],
                    source: MessageSource::model("sim", "sim"),
                }));
                req.messages.push(Arc::new(Message {
                    id: MessageId::new(&format!("r{step}")).expect("id"),
                    role: Role::User,
                    content: vec![ContentBlock::ToolResult {
                        tool_call_id: id.clone(),
                        content: vec![ContentBlock::text("ok")],
                        is_error: None,
                    }],
                    source: MessageSource::tool(id),
                }));
            } else {
                assert_eq!(
                    last,
                    Some(StreamChunk::finish(FinishReason::Stop)),
                    "after 2 tool steps the model answers"
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn paces_tokens_and_cancels_promptly() {
        let p = SimProvider::new(SimConfig {
            seed: 3,
            ttft_ms: 500,
            tokens_per_sec: 100,
            reply_tokens_min: 200,
            reply_tokens_max: 200,
            tool_call_probability: 0.0,
            ..SimConfig::default()
        })
        .expect("valid");
        let start = Instant::now();
        let chunks = run(&p, request(1, vec![])).await;
        let elapsed = start.elapsed();
        assert_eq!(chunks.len(), 200 + 4);
        // 0.5 s to first token, then 200 tokens at 100/s (paused clock: exact, not timed).
        assert_eq!(elapsed, Duration::from_millis(2500));
        let cancel = CancellationToken::new();
        let mut s = p.stream(request(1, vec![]), cancel.clone());
        assert!(matches!(
            s.next().await,
            Some(StreamChunk::BlockStart { .. })
        ));
        cancel.cancel();
        assert!(matches!(
            s.next().await,
            Some(StreamChunk::Finish {
                reason: FinishReason::Aborted { .. },
                ..
            })
        ));
        assert_eq!(s.next().await, None);
    }

    /// Pacing changes when chunks arrive, never what they are.
    #[tokio::test(start_paused = true)]
    async fn content_does_not_depend_on_timing() {
        let base = SimConfig {
            seed: 11,
            reasoning: true,
            tool_call_probability: 0.5,
            ..SimConfig::instant(11)
        };
        let paced = SimConfig {
            ttft_ms: 250,
            tokens_per_sec: 37,
            ..base.clone()
        };
        for n_user in 1..6 {
            let a = run(
                &SimProvider::new(base.clone()).expect("valid"),
                request(n_user, vec![read_tool()]),
            )
            .await;
            let b = run(
                &SimProvider::new(paced.clone()).expect("valid"),
                request(n_user, vec![read_tool()]),
            )
            .await;
            assert_eq!(a, b, "{n_user} messages");
        }
    }

    #[test]
    fn config_is_validated_and_serde_refuses_unknown_keys() {
        assert_eq!(
            SimProvider::new(SimConfig {
                reply_tokens_min: 5,
                reply_tokens_max: 4,
                ..SimConfig::default()
            })
            .map(|_| ()),
            Err(SimError::ReplyRange { min: 5, max: 4 })
        );
        assert!(
            SimProvider::new(SimConfig {
                tool_call_probability: f64::NAN,
                ..SimConfig::default()
            })
            .is_err()
        );
        let c: SimConfig =
            serde_json::from_value(json!({"seed": 9, "reasoning": true})).expect("valid");
        assert_eq!((c.seed, c.reasoning, c.ttft_ms), (9, true, 300));
        assert!(serde_json::from_value::<SimConfig>(json!({"sed": 9})).is_err());
    }
}

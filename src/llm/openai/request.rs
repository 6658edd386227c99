//! The request body (`reference/session-llm.md` §7.2): an `LlmRequest` serialized in §7.2's key
//! order, with the history mapped to chat-completions messages (tool results become `tool`
//! messages, reasoning is sent back as `reasoning_content`) and the reasoning effort mapped to the
//! configured wire. Pure; every refusal happens here, before any I/O.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::Value;

use super::config::{OpenAiConfig, ReasoningWire, Thinking, check_effort};
use crate::llm::types::{ContentBlock, LlmFailure, LlmRequest, Message, Role, codes};

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<WireThinking>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<WireTool<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<&'a serde_json::Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop: Option<&'a [String]>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct WireThinking {
    #[serde(rename = "type")]
    kind: Thinking,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum WireMessage<'a> {
    System {
        content: Cow<'a, str>,
    },
    User {
        content: Cow<'a, str>,
    },
    Assistant {
        content: Cow<'a, str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_content: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_calls: Option<Vec<WireToolCall<'a>>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: Cow<'a, str>,
    },
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireCallFunction<'a>,
}

#[derive(Serialize)]
struct WireCallFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// Concatenates the text (or reasoning) blocks of `content`, borrowing when there is one.
fn concat<'a>(content: &'a [ContentBlock], reasoning: bool) -> Cow<'a, str> {
    let mut out: Cow<'a, str> = Cow::Borrowed("");
    for block in content {
        let text = match (block, reasoning) {
            (ContentBlock::Text { text }, false) | (ContentBlock::Reasoning { text }, true) => text,
            _ => continue,
        };
        if out.is_empty() {
            out = Cow::Borrowed(text);
        } else {
            out.to_mut().push_str(text);
        }
    }
    out
}

fn has_image(content: &[ContentBlock]) -> bool {
    content.iter().any(|b| match b {
        ContentBlock::Other(_) => b.type_tag() == "image",
        ContentBlock::ToolResult { content, .. } => has_image(content),
        _ => false,
    })
}

fn wire_messages<'a>(message: &'a Message, out: &mut Vec<WireMessage<'a>>) {
    match message.role {
        Role::System => out.push(WireMessage::System {
            content: concat(&message.content, false),
        }),
        Role::Assistant => {
            let calls: Vec<WireToolCall<'a>> = message
                .tool_calls()
                .map(|c| WireToolCall {
                    id: c.id,
                    kind: "function",
                    function: WireCallFunction {
                        name: c.name,
                        arguments: c.arguments,
                    },
                })
                .collect();
            let reasoning = concat(&message.content, true);
            out.push(WireMessage::Assistant {
                content: concat(&message.content, false),
                reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                tool_calls: (!calls.is_empty()).then_some(calls),
            });
        }
        Role::User => {
            let text = concat(&message.content, false);
            let n_results = message
                .content
                .iter()
                .filter(|b| matches!(b, ContentBlock::ToolResult { .. }))
                .count();
            if !text.is_empty() || n_results == 0 {
                out.push(WireMessage::User { content: text });
            }
            for block in &message.content {
                if let ContentBlock::ToolResult {
                    tool_call_id,
                    content,
                    ..
                } = block
                {
                    let text = concat(content, false);
                    out.push(WireMessage::Tool {
                        tool_call_id,
                        content: if text.is_empty() {
                            Cow::Borrowed("(no output)")
                        } else {
                            text
                        },
                    });
                }
            }
        }
    }
}

/// The request body as JSON bytes (§7.2 key order, optional keys omitted).
///
/// # Errors
/// `UNSUPPORTED_CONTENT` for any image (no vision support on this path); `UNSUPPORTED_REASONING_EFFORT`
/// for an effort the endpoint cannot take. Both before any I/O.
pub fn serialize_request(
    config: &OpenAiConfig,
    request: &LlmRequest,
) -> Result<Vec<u8>, LlmFailure> {
    if request.messages.iter().any(|m| has_image(&m.content)) {
        return Err(LlmFailure::new(
            codes::UNSUPPORTED_CONTENT,
            "image content is not supported by the openai provider's text path",
        ));
    }
    let effort = request
        .config
        .reasoning_effort
        .as_deref()
        .or(config.reasoning_effort.as_deref());
    let (thinking, reasoning_effort) = match (config.reasoning_wire, effort) {
        (ReasoningWire::Omit, _) => (None, None),
        (ReasoningWire::Openai, effort) => (None, effort),
        (ReasoningWire::Deepseek, None) => (config.thinking, None),
        (ReasoningWire::Deepseek, Some(effort)) => {
            check_effort(config, effort)
                .map_err(|e| LlmFailure::new(codes::UNSUPPORTED_REASONING_EFFORT, e.to_string()))?;
            if effort == "off" {
                (Some(Thinking::Disabled), None)
            } else {
                (Some(Thinking::Enabled), Some(effort))
            }
        }
    };
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if let Some(system) = &request.system {
        messages.push(WireMessage::System {
            content: Cow::Borrowed(system),
        });
    }
    for message in &request.messages {
        wire_messages(message, &mut messages);
    }
    let tools = (!request.tools.is_empty()).then(|| {
        request
            .tools
            .iter()
            .map(|t| WireTool {
                kind: "function",
                function: WireFunction {
                    name: &t.name,
                    description: &t.description,
                    parameters: &t.parameters,
                },
            })
            .collect()
    });
    let model = if request.config.model.is_empty() {
        &config.model
    } else {
        &request.config.model
    };
    let body = WireRequest {
        model,
        messages,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        thinking: thinking.map(|kind| WireThinking { kind }),
        reasoning_effort,
        tools,
        temperature: request.config.temperature.as_ref(),
        max_tokens: request.config.max_tokens.or(config.max_tokens),
        stop: request.config.stop.as_deref(),
    };
    serde_json::to_vec(&body).map_err(|e| {
        LlmFailure::new(
            codes::INVALID_REQUEST,
            format!("request could not be serialized: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ids::MessageId;
    use crate::llm::types::{LlmCallConfig, MessageSource, ToolSchema};
    use serde_json::json;

    fn msg(role: Role, content: Value) -> Arc<Message> {
        Arc::new(Message {
            id: MessageId::new("m").expect("valid id"),
            role,
            content: serde_json::from_value(content).expect("valid blocks"),
            source: if role == Role::Assistant {
                MessageSource::model("openai", "m")
            } else {
                MessageSource::user()
            },
        })
    }

    fn request(messages: Vec<Arc<Message>>) -> LlmRequest {
        LlmRequest {
            config: LlmCallConfig {
                provider: "openai".into(),
                model: "deepseek-v4-flash".into(),
                ..LlmCallConfig::default()
            },
            system: None,
            tools: vec![],
            messages: messages.into(),
            session_id: None,
            purpose: None,
        }
    }

    fn body(config: &OpenAiConfig, request: &LlmRequest) -> Value {
        serde_json::from_slice(&serialize_request(config, request).expect("serializable"))
            .expect("json")
    }

    fn wire_messages_of(messages: Vec<Arc<Message>>) -> Value {
        body(&OpenAiConfig::default(), &request(messages))["messages"].clone()
    }

    // §9.28.1, §9.28.2
    #[test]
    fn user_text_and_system_history() {
        let out = wire_messages_of(vec![
            msg(Role::System, json!([{"type":"text","text":"be brief"}])),
            msg(
                Role::User,
                json!([{"type":"text","text":"hello "},{"type":"text","text":"world"}]),
            ),
        ]);
        assert_eq!(
            out,
            json!([{"role":"system","content":"be brief"},{"role":"user","content":"hello world"}])
        );
    }

    // §9.28.3, §9.28.4, §9.28.5, §9.28.37–39
    #[test]
    fn assistant_reasoning_and_tool_calls_are_sent_back() {
        let out = wire_messages_of(vec![
            msg(
                Role::Assistant,
                json!([{"type":"reasoning","text":"hm"},{"type":"text","text":"hi"}]),
            ),
            msg(
                Role::Assistant,
                json!([{"type":"reasoning","text":"plan"},{"type":"tool-call","id":"c1","name":"read","arguments":"{\"p\":1}"},{"type":"tool-call","id":"c2","name":"ls","arguments":"{}"}]),
            ),
            msg(Role::Assistant, json!([])),
            msg(Role::Assistant, json!([{"type":"reasoning","text":"only"}])),
        ]);
        assert_eq!(
            out,
            json!([
                {"role":"assistant","content":"hi","reasoning_content":"hm"},
                {"role":"assistant","content":"","reasoning_content":"plan","tool_calls":[
                    {"id":"c1","type":"function","function":{"name":"read","arguments":"{\"p\":1}"}},
                    {"id":"c2","type":"function","function":{"name":"ls","arguments":"{}"}}]},
                {"role":"assistant","content":""},
                {"role":"assistant","content":"","reasoning_content":"only"}
            ])
        );
    }

    // §9.28.6, §9.28.7, §9.28.8, §9.28.9, §9.28.11, §9.28.28
    #[test]
    fn tool_results_become_tool_messages() {
        let out = wire_messages_of(vec![
            msg(
                Role::User,
                json!([{"type":"text","text":"see"},{"type":"tool-result","toolCallId":"c1","content":[{"type":"text","text":"file a"}]}]),
            ),
            msg(
                Role::User,
                json!([{"type":"tool-result","toolCallId":"c2","content":[],"isError":true},{"type":"plugin-note","x":1}]),
            ),
            msg(Role::User, json!([])),
        ]);
        assert_eq!(
            out,
            json!([
                {"role":"user","content":"see"},
                {"role":"tool","tool_call_id":"c1","content":"file a"},
                {"role":"tool","tool_call_id":"c2","content":"(no output)"},
                {"role":"user","content":""}
            ])
        );
    }

    // §9.28.10
    #[test]
    fn image_blocks_are_unsupported_content_even_nested() {
        let image = json!({"type":"image","attachment":{"attachmentId":"sha256:00","mediaType":"image/png","bytes":1,"width":1,"height":1}});
        for content in [
            json!([image.clone()]),
            json!([{"type":"tool-result","toolCallId":"c","content":[image]}]),
        ] {
            let err = serialize_request(
                &OpenAiConfig::default(),
                &request(vec![msg(Role::User, content)]),
            )
            .expect_err("image");
            assert_eq!(err.code, "UNSUPPORTED_CONTENT");
        }
    }

    // §9.28.12, §9.28.13, §9.28.14, §9.28.15, §9.28.16
    #[test]
    fn body_keys_in_order_with_system_params_and_tools() {
        let mut req = request(vec![msg(Role::User, json!([{"type":"text","text":"hi"}]))]);
        let bare = serialize_request(&OpenAiConfig::default(), &req).expect("ok");
        assert_eq!(
            String::from_utf8(bare).expect("utf8"),
            r#"{"model":"deepseek-v4-flash","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}"#
        );
        req.system = Some("sys".into());
        req.config.temperature = Some(serde_json::Number::from_f64(0.5).expect("finite"));
        req.config.max_tokens = Some(100);
        req.config.stop = Some(vec!["END".into()]);
        req.config.reasoning_effort = Some("high".into());
        req.tools = vec![ToolSchema {
            name: "read".into(),
            description: "reads".into(),
            parameters: json!({"type":"object"}),
        }];
        let text =
            String::from_utf8(serialize_request(&OpenAiConfig::default(), &req).expect("ok"))
                .expect("utf8");
        assert_eq!(
            text,
            r#"{"model":"deepseek-v4-flash","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"thinking":{"type":"enabled"},"reasoning_effort":"high","tools":[{"type":"function","function":{"name":"read","description":"reads","parameters":{"type":"object"}}}],"temperature":0.5,"max_tokens":100,"stop":["END"]}"#
        );
    }

    // §9.28.17–§9.28.24
    #[test]
    fn thinking_and_effort_mapping() {
        let req = |effort: Option<&str>| {
            let mut r = request(vec![]);
            r.config.reasoning_effort = effort.map(str::to_owned);
            r
        };
        let pick = |config: &OpenAiConfig, effort: Option<&str>| {
            let b = body(config, &req(effort));
            (
                b.get("thinking").cloned(),
                b.get("reasoning_effort").cloned(),
            )
        };
        let base = OpenAiConfig::default();
        for effort in ["low", "high", "max"] {
            assert_eq!(
                pick(&base, Some(effort)),
                (Some(json!({"type":"enabled"})), Some(json!(effort)))
            );
        }
        assert_eq!(
            pick(&base, Some("off")),
            (Some(json!({"type":"disabled"})), None)
        );
        let low_default = OpenAiConfig {
            reasoning_effort: Some("off".into()),
            ..OpenAiConfig::default()
        };
        assert_eq!(
            pick(&low_default, None),
            (Some(json!({"type":"disabled"})), None)
        );
        assert_eq!(
            pick(&low_default, Some("max")),
            (Some(json!({"type":"enabled"})), Some(json!("max")))
        );
        assert_eq!(pick(&base, None), (None, None));
        let enabled = OpenAiConfig {
            thinking: Some(Thinking::Enabled),
            ..OpenAiConfig::default()
        };
        assert_eq!(
            pick(&enabled, None),
            (Some(json!({"type":"enabled"})), None)
        );
        let disabled = OpenAiConfig {
            thinking: Some(Thinking::Disabled),
            ..OpenAiConfig::default()
        };
        let err = serialize_request(&disabled, &req(Some("high"))).expect_err("locked");
        assert_eq!(err.code, "UNSUPPORTED_REASONING_EFFORT");
        let err = serialize_request(&base, &req(Some("medium"))).expect_err("unknown effort");
        assert_eq!(err.code, "UNSUPPORTED_REASONING_EFFORT");
        let openai = OpenAiConfig {
            reasoning_wire: ReasoningWire::Openai,
            ..OpenAiConfig::default()
        };
        assert_eq!(pick(&openai, Some("medium")), (None, Some(json!("medium"))));
        let omit = OpenAiConfig {
            reasoning_wire: ReasoningWire::Omit,
            ..OpenAiConfig::default()
        };
        assert_eq!(pick(&omit, Some("high")), (None, None));
    }
}

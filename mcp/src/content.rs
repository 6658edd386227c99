//! Mapping an MCP `tools/call` result to the `ToolOutput` the model sees.
//!
//! Text stays text. An image (or audio) becomes a text line naming its media type and size, with the
//! data itself in the result's `meta` (`{"images": [{"mediaType", "data"}]}`): the providers dsh
//! talks to take no images inside tool results, and an image block in the log would make every later
//! request of the session fail. An embedded text resource becomes its URI and text; a binary one or a
//! resource link, a line naming it. `structuredContent` without any content block becomes its JSON
//! text. An `isError` result is an error result (code `MCP_TOOL_ERROR`). Everything is bounded:
//! text past `TEXT_BYTES_MAX` is cut with a marker, and image data past `IMAGE_BYTES_MAX` is dropped.

use dsh::llm::types::ContentBlock;
use dsh::session::event::ToolErrorInfo;
use dsh::tools::ToolOutput;
use serde_json::{Value, json};

/// The most text one result gives the model, in bytes (what fits is kept, the rest marked cut).
pub const TEXT_BYTES_MAX: usize = 256 * 1024;
/// The most image data (base64) one result keeps in `meta`, in bytes, over all its images.
pub const IMAGE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// The error class logged for every failure of an MCP call.
pub const ERROR_NAME: &str = "McpError";

/// An error result: the model sees `Error: <message>`, the log records `{McpError, code}`.
pub fn failure(code: &str, message: impl AsRef<str>) -> ToolOutput {
    ToolOutput::error(
        message,
        Some(ToolErrorInfo {
            name: ERROR_NAME.to_string(),
            code: code.to_string(),
        }),
    )
}

/// The output for a call result, given as JSON (`{content, structuredContent?, isError?}`).
pub fn output(result: &Value) -> ToolOutput {
    let mut text = Bounded::default();
    let mut images = Vec::new();
    let mut image_bytes = 0usize;
    let blocks = result.get("content").and_then(Value::as_array);
    for block in blocks.into_iter().flatten() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push(str_of(block, "text")),
            Some(kind @ ("image" | "audio")) => {
                let data = str_of(block, "data");
                let media = str_of(block, "mimeType");
                let approx = data.len() / 4 * 3;
                let kept = image_bytes + data.len() <= IMAGE_BYTES_MAX;
                text.push(&format!(
                    "[{kind} {media}, {approx} bytes{}]",
                    if kept { "" } else { ", too large to keep" }
                ));
                if kept {
                    image_bytes += data.len();
                    images.push(json!({"mediaType": media, "data": data}));
                }
            }
            Some("resource") => text.push(&resource_text(block.get("resource"))),
            Some("resource_link") => text.push(&format!(
                "[resource link {} {}]",
                str_of(block, "uri"),
                str_of(block, "name")
            )),
            other => text.push(&format!(
                "[content of type {} left out]",
                other.unwrap_or("unknown")
            )),
        }
    }
    if text.is_empty()
        && let Some(structured) = result.get("structuredContent")
    {
        text.push(&structured.to_string());
    }
    let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
    let body = text.finish();
    let mut out = if is_error {
        let mut out = failure("MCP_TOOL_ERROR", "");
        out.content = vec![ContentBlock::text(format!("Error: {body}"))];
        out
    } else {
        ToolOutput::text(body)
    };
    if !images.is_empty() {
        out.meta = Some(json!({"images": images}));
    }
    out
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn resource_text(resource: Option<&Value>) -> String {
    let Some(r) = resource else {
        return "[resource]".to_string();
    };
    let uri = str_of(r, "uri");
    match r.get("text").and_then(Value::as_str) {
        Some(t) => format!("[resource {uri}]\n{t}"),
        None => format!(
            "[resource {uri} {}, {} bytes]",
            str_of(r, "mimeType"),
            str_of(r, "blob").len() / 4 * 3
        ),
    }
}

/// Text pieces joined by newlines, cut at `TEXT_BYTES_MAX`.
#[derive(Default)]
struct Bounded {
    text: String,
    cut: bool,
}

impl Bounded {
    fn push(&mut self, piece: &str) {
        if self.cut {
            return;
        }
        if !self.text.is_empty() {
            self.text.push('\n');
        }
        let room = TEXT_BYTES_MAX.saturating_sub(self.text.len());
        if piece.len() <= room {
            self.text.push_str(piece);
            return;
        }
        let mut end = room;
        while !piece.is_char_boundary(end) {
            end -= 1;
        }
        self.text.push_str(&piece[..end]);
        self.cut = true;
    }

    fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    fn finish(mut self) -> String {
        if self.cut {
            self.text
                .push_str(&format!("\n[output cut at {TEXT_BYTES_MAX} bytes]"));
        }
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(out: &ToolOutput) -> String {
        out.content
            .iter()
            .map(|b| match b {
                ContentBlock::Text { text } => text.clone(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn blocks_map_to_text_and_meta() {
        let out = output(&json!({"content": [
            {"type": "text", "text": "hello"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "test://1", "text": "body"}},
            {"type": "resource_link", "uri": "test://2", "name": "two"},
        ]}));
        assert!(!out.is_error);
        assert_eq!(
            text_of(&out),
            "hello\n[image image/png, 3 bytes]\n[resource test://1]\nbody\n[resource link test://2 two]"
        );
        assert_eq!(
            out.meta,
            Some(json!({"images": [{"mediaType": "image/png", "data": "AAAA"}]}))
        );
    }

    #[test]
    fn an_error_result_is_an_error_output() {
        let out = output(&json!({"content": [{"type": "text", "text": "bad"}], "isError": true}));
        assert!(out.is_error);
        assert_eq!(text_of(&out), "Error: bad");
        assert_eq!(
            out.error,
            Some(ToolErrorInfo {
                name: "McpError".into(),
                code: "MCP_TOOL_ERROR".into()
            })
        );
    }

    #[test]
    fn text_is_bounded() {
        let big = "é".repeat(TEXT_BYTES_MAX);
        let out = output(&json!({"content": [{"type": "text", "text": big}]}));
        let text = text_of(&out);
        assert!(text.len() <= TEXT_BYTES_MAX + 64, "{}", text.len());
        assert!(text.ends_with("[output cut at 262144 bytes]"));
    }

    #[test]
    fn structured_content_alone_is_shown() {
        let out = output(&json!({"content": [], "structuredContent": {"a": 1}}));
        assert_eq!(text_of(&out), "{\"a\":1}");
    }
}

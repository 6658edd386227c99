//! How the command line shows a conversation to a person: the live stream of `dsh chat` and the
//! transcript of `dsh show`, sharing one vocabulary (tool lines, turn endings, reasoning).
//!
//! A transcript uses append-origin surface events only (`reference/session-llm.md` §2.6): a
//! replacement (compaction) shadows history the user already saw, so its copies are model-only and
//! are not shown again. Non-surface events (turn and step boundaries, tool calls, retries, discarded
//! input) are shown where they help a reader follow what happened.
//!
//! Nothing from the log reaches the terminal raw: every piece of text that the model, a tool, a
//! server or the user wrote passes through `text::visible`, so an escape sequence in it (a title
//! change, a screen clear) is shown as `^[…`, never obeyed. Only the styling below emits escapes.
//!
//! Styling is ANSI only when the output is a terminal and `NO_COLOR` is unset; without it, reasoning
//! is prefixed (`[thinking]`) instead of dimmed, so the distinction survives a pipe.

use std::collections::HashMap;
use std::io::{self, Write};

use dsh::llm::types::{ContentBlock, Message, StreamChunk};
use dsh::session::event::{
    CancelCause, Event, EventData, SessionHeader, SurfaceOp, ToolResultEvent, TurnEndReason,
};
use serde_json::Value;

use crate::text::visible;

/// Characters of tool arguments shown on a tool line.
const ARGS_SHOWN_MAX: usize = 80;
/// Characters of a result's first line shown on a tool line.
const SUMMARY_SHOWN_MAX: usize = 60;
/// Lines of a tool result shown in a transcript.
const RESULT_LINES_SHOWN_MAX: usize = 20;

/// Whether to use ANSI styling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Style {
    /// Whether ANSI styling is used.
    pub color: bool,
}

impl Style {
    /// Color when `stream_is_terminal` and `NO_COLOR` is unset or empty.
    pub fn detect(stream_is_terminal: bool) -> Style {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style {
            color: stream_is_terminal && !no_color,
        }
    }

    fn wrap(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    /// `s` dimmed.
    pub fn dim(&self, s: &str) -> String {
        self.wrap("2", s)
    }

    /// `s` in bold.
    pub fn bold(&self, s: &str) -> String {
        self.wrap("1", s)
    }

    /// `s` in red (failures).
    pub fn red(&self, s: &str) -> String {
        self.wrap("31", s)
    }

    /// `s` in cyan (tool lines, prompts).
    pub fn cyan(&self, s: &str) -> String {
        self.wrap("36", s)
    }
}

/// `s` cut to `chars_max` characters, with `…` when cut; newlines become spaces.
pub fn snippet(s: &str, chars_max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    let flat = visible(flat.trim());
    if flat.chars().count() <= chars_max {
        flat.into_owned()
    } else {
        let mut out: String = flat.chars().take(chars_max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// How a turn ended, in words; `None` for a normal completion.
pub fn turn_end_note(reason: &TurnEndReason) -> Option<String> {
    match reason {
        TurnEndReason::Completed => None,
        TurnEndReason::MaxTokens => Some("max-tokens: the reply hit the output limit".into()),
        TurnEndReason::Blocked => Some("blocked: a hook refused the step".into()),
        TurnEndReason::Aborted { reason } => Some(format!("aborted ({})", cause_text(reason))),
        TurnEndReason::Error { error } => Some(format!(
            "error {}: {}",
            visible(&error.code),
            visible(&error.message)
        )),
        TurnEndReason::Interrupted => {
            Some("interrupted: the process stopped mid-turn (closed by repair)".into())
        }
    }
}

fn cause_text(cause: &CancelCause) -> String {
    match cause {
        CancelCause::User => "cancelled by the user".into(),
        CancelCause::Parent => "cancelled by its parent".into(),
        CancelCause::Hook { reason } => format!("cancelled by a hook: {}", visible(reason)),
        CancelCause::Disposed => "the agent was disposed".into(),
        CancelCause::Legacy => "cancelled".into(),
    }
}

/// The text of a tool result (its nested content's text blocks) and whether it is an error.
fn result_text(result: &ToolResultEvent) -> (String, bool) {
    let mut text = String::new();
    let mut is_error = false;
    for block in &result.message.content {
        match block {
            ContentBlock::ToolResult {
                content,
                is_error: e,
                ..
            } => {
                is_error |= e.unwrap_or(false);
                for inner in content {
                    if let ContentBlock::Text { text: t } = inner {
                        text.push_str(t);
                    }
                }
            }
            ContentBlock::Text { text: t } => text.push_str(t),
            _ => {}
        }
    }
    (text, is_error || result.error.is_some())
}

fn result_call_id(result: &ToolResultEvent) -> Option<&str> {
    result.message.content.iter().find_map(|b| match b {
        ContentBlock::ToolResult { tool_call_id, .. } => Some(tool_call_id.as_str()),
        _ => None,
    })
}

/// A one-line summary of a tool result: what the built-in tools report in `meta`, else the first
/// line of the text.
pub fn result_summary(result: &ToolResultEvent) -> String {
    let (text, is_error) = result_text(result);
    if is_error {
        let first = text.trim_start_matches("Error: ");
        return format!(
            "error: {}",
            snippet(first.lines().next().unwrap_or(""), SUMMARY_SHOWN_MAX)
        );
    }
    if let Some(Value::Object(meta)) = &result.meta {
        if let (Some(first), Some(last)) = (
            meta.get("first_line").and_then(Value::as_u64),
            meta.get("last_line").and_then(Value::as_u64),
        ) {
            let more = meta.get("more").and_then(Value::as_bool).unwrap_or(false);
            return format!(
                "lines {first}-{last}{}",
                if more { " (more follow)" } else { "" }
            );
        }
        if let Some(n) = meta.get("entries").and_then(Value::as_u64) {
            return format!("{n} entries");
        }
        if let Some(code) = meta.get("exit_code").and_then(Value::as_i64) {
            let n_lines = text.lines().count().saturating_sub(1);
            return format!("exit {code}, {n_lines} lines of output");
        }
    }
    let n_lines = text.lines().count();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if n_lines > 1 {
        format!(
            "{} (+{} lines)",
            snippet(first, SUMMARY_SHOWN_MAX),
            n_lines - 1
        )
    } else if first.is_empty() {
        "(empty)".into()
    } else {
        snippet(first, SUMMARY_SHOWN_MAX)
    }
}

/// `name {args}` with the arguments compacted and cut.
fn call_text(name: &str, arguments: &str) -> String {
    let compact = serde_json::from_str::<Value>(arguments)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| arguments.to_string());
    let name = visible(name);
    if compact.is_empty() || compact == "{}" {
        name.into_owned()
    } else {
        format!("{name} {}", snippet(&compact, ARGS_SHOWN_MAX))
    }
}

/// Renders the live event stream of one agent for `dsh chat`.
#[derive(Debug)]
pub struct Live {
    style: Style,
    /// Whether the cursor is at the start of a line.
    at_line_start: bool,
    /// Whether a reasoning run is being printed (dimmed or prefixed).
    in_reasoning: bool,
    /// Tool calls seen in this turn by id: name and raw arguments, for the result line.
    calls: HashMap<String, (String, String)>,
}

impl Live {
    /// A renderer at the start of a line.
    pub fn new(style: Style) -> Live {
        Live {
            style,
            at_line_start: true,
            in_reasoning: false,
            calls: HashMap::new(),
        }
    }

    /// The cursor is at the start of a line (the terminal echoed the user's line and its newline).
    pub fn at_line_start(&mut self) {
        self.at_line_start = true;
    }

    /// Something without a newline (the prompt) was printed outside the renderer.
    pub fn mid_line(&mut self) {
        self.at_line_start = false;
    }

    /// Ends the current line if something is on it.
    pub fn newline(&mut self, out: &mut impl Write) -> io::Result<()> {
        self.end_reasoning(out)?;
        if !self.at_line_start {
            out.write_all(b"\n")?;
            self.at_line_start = true;
        }
        Ok(())
    }

    fn end_reasoning(&mut self, out: &mut impl Write) -> io::Result<()> {
        if self.in_reasoning {
            self.in_reasoning = false;
            if self.style.color {
                out.write_all(b"\x1b[0m")?;
            }
            if !self.at_line_start {
                out.write_all(b"\n")?;
                self.at_line_start = true;
            }
        }
        Ok(())
    }

    fn text(&mut self, out: &mut impl Write, text: &str) -> io::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        out.write_all(visible(text).as_bytes())?;
        self.at_line_start = text.ends_with('\n');
        Ok(())
    }

    /// Prints whatever `event` adds to the conversation.
    ///
    /// # Errors
    /// A write error of `out`.
    pub fn event(&mut self, event: &Event, out: &mut impl Write) -> io::Result<()> {
        match &event.data {
            EventData::AssistantChunk(c) => match &c.chunk {
                StreamChunk::TextDelta { text, .. } => {
                    self.end_reasoning(out)?;
                    self.text(out, text)?;
                }
                StreamChunk::ReasoningDelta { text, .. } => {
                    if !self.in_reasoning {
                        if !self.at_line_start {
                            out.write_all(b"\n")?;
                            self.at_line_start = true;
                        }
                        if self.style.color {
                            out.write_all(b"\x1b[2m")?;
                        } else {
                            out.write_all(b"[thinking] ")?;
                            self.at_line_start = false;
                        }
                        self.in_reasoning = true;
                    }
                    self.text(out, text)?;
                }
                _ => {}
            },
            EventData::AssistantMessage(m) => {
                self.newline(out)?;
                if m.interrupted == Some(true) {
                    writeln!(out, "{}", self.style.dim("[reply interrupted]"))?;
                }
            }
            EventData::ToolCall(call) => {
                self.calls.insert(
                    call.call_id.clone(),
                    (call.name.clone(), call.arguments.clone()),
                );
            }
            EventData::ToolResult(result) => {
                self.newline(out)?;
                let (name, args) = result_call_id(result)
                    .and_then(|id| self.calls.get(id))
                    .cloned()
                    .unwrap_or_else(|| ("tool".into(), String::new()));
                let summary = result_summary(result);
                let (_, is_error) = result_text(result);
                let summary = if is_error {
                    self.style.red(&summary)
                } else {
                    summary
                };
                writeln!(
                    out,
                    "{} {} {summary}",
                    self.style.cyan("·"),
                    self.style.dim(&format!("{} →", call_text(&name, &args)))
                )?;
            }
            EventData::LlmRetry(r) => {
                self.newline(out)?;
                let delay_ms = r.delay_ms.as_f64().unwrap_or(0.0);
                writeln!(
                    out,
                    "{}",
                    self.style.dim(&format!(
                        "[retry {} in {:.1} s: {} {}]",
                        r.retry,
                        delay_ms / 1000.0,
                        visible(&r.failure.code),
                        snippet(&r.failure.message, SUMMARY_SHOWN_MAX)
                    ))
                )?;
            }
            EventData::TurnEnd(end) => {
                self.newline(out)?;
                self.calls.clear();
                if let Some(note) = turn_end_note(&end.reason) {
                    let note = format!("[{note}]");
                    let shown = match end.reason {
                        TurnEndReason::Error { .. } => self.style.red(&note),
                        _ => self.style.dim(&note),
                    };
                    writeln!(out, "{shown}")?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Whether a surface event is shown in a transcript (append-origin only).
fn is_shown_surface(event: &Event) -> bool {
    !matches!(event.surface_op, Some(SurfaceOp::Replace { .. }))
}

fn indented(out: &mut impl Write, prefix: &str, text: &str) -> io::Result<()> {
    for (i, line) in text.lines().enumerate() {
        if i == 0 {
            writeln!(out, "{prefix}{line}")?;
        } else {
            writeln!(out, "{}{line}", " ".repeat(prefix.chars().count()))?;
        }
    }
    Ok(())
}

fn message_text(message: &Message) -> String {
    message.text()
}

/// Writes a readable transcript of a session.
///
/// # Errors
/// A write error of `out`.
pub fn transcript(
    header: &SessionHeader,
    events: &[Event],
    style: Style,
    out: &mut impl Write,
) -> io::Result<()> {
    writeln!(
        out,
        "{}",
        style.bold(&format!(
            "session {}  created {}{}",
            visible(header.id.as_str()),
            utc(i64::try_from(header.created_at).unwrap_or(i64::MAX)),
            header
                .cwd
                .as_ref()
                .map(|c| format!("  cwd {}", visible(c)))
                .unwrap_or_default()
        ))
    )?;
    let mut calls: HashMap<String, String> = HashMap::new();
    for event in events {
        transcript_event(event, style, &mut calls, out)?;
    }
    Ok(())
}

/// Writes what one event adds to a transcript; `calls` maps call ids to tool names.
fn transcript_event(
    event: &Event,
    style: Style,
    calls: &mut HashMap<String, String>,
    out: &mut impl Write,
) -> io::Result<()> {
    match &event.data {
        EventData::TurnStart(t) => {
            writeln!(out)?;
            writeln!(out, "{}", style.bold(&format!("── turn {} ──", t.turn)))?;
        }
        EventData::StepStart(s) if s.step > 1 => {
            writeln!(out, "{}", style.dim(&format!("   · step {}", s.step)))?;
        }
        EventData::UserMessage(m) if is_shown_surface(event) => {
            let text = message_text(m);
            let prefix = if m.source.kind() == "user" {
                "> ".to_string()
            } else {
                format!("[{}] ", visible(m.source.kind()))
            };
            indented(out, &style.cyan(&prefix), &visible(&text))?;
        }
        EventData::AssistantMessage(a) if is_shown_surface(event) => {
            transcript_assistant(a, style, out)?;
        }
        EventData::ToolCall(c) => {
            calls.insert(c.call_id.clone(), c.name.clone());
            writeln!(
                out,
                "{} {}",
                style.cyan("→"),
                call_text(&c.name, &c.arguments)
            )?;
        }
        EventData::ToolResult(r) if is_shown_surface(event) => {
            let name = visible(
                result_call_id(r)
                    .and_then(|id| calls.get(id))
                    .map_or("tool", String::as_str),
            );
            transcript_result(r, &name, style, out)?;
        }
        EventData::LlmRetry(r) => {
            let delay_ms = r.delay_ms.as_f64().unwrap_or(0.0);
            writeln!(
                out,
                "{}",
                style.dim(&format!(
                    "[retry {} after {:.1} s: {} {}]",
                    r.retry,
                    delay_ms / 1000.0,
                    visible(&r.failure.code),
                    visible(&r.failure.message)
                ))
            )?;
        }
        EventData::InboxSpliced(s) if s.outcome.is_some() => {
            let n = s.removed_count.unwrap_or(0);
            writeln!(
                out,
                "{}",
                style.dim(&format!(
                    "[{n} pending input{} discarded]",
                    if n == 1 { "" } else { "s" }
                ))
            )?;
        }
        EventData::TurnEnd(end) => {
            let text = match turn_end_note(&end.reason) {
                None => format!("── end of turn {}: completed ──", end.turn),
                Some(note) => format!("── end of turn {}: {note} ──", end.turn),
            };
            let shown = match end.reason {
                TurnEndReason::Error { .. } | TurnEndReason::Interrupted => style.red(&text),
                _ => style.dim(&text),
            };
            writeln!(out, "{shown}")?;
        }
        _ => {}
    }
    Ok(())
}

/// The text and reasoning of an assistant message in a transcript.
fn transcript_assistant(
    a: &dsh::session::event::AssistantMessageEvent,
    style: Style,
    out: &mut impl Write,
) -> io::Result<()> {
    for block in &a.message.content {
        match block {
            ContentBlock::Reasoning { text } => {
                let text = visible(text);
                let shown = if style.color {
                    style.dim(&text)
                } else {
                    format!("[thinking] {text}")
                };
                writeln!(out, "{shown}")?;
            }
            ContentBlock::Text { text } => writeln!(out, "{}", visible(text))?,
            _ => {}
        }
    }
    if a.interrupted == Some(true) {
        writeln!(out, "{}", style.dim("[reply interrupted]"))?;
    }
    Ok(())
}

/// A tool result in a transcript: its head line, then its first lines.
fn transcript_result(
    r: &ToolResultEvent,
    name: &str,
    style: Style,
    out: &mut impl Write,
) -> io::Result<()> {
    let (text, is_error) = result_text(r);
    let head = if is_error {
        style.red(&format!("← {name} failed:"))
    } else {
        style.cyan(&format!("← {name}:"))
    };
    writeln!(out, "{head}")?;
    let n_lines = text.lines().count();
    for line in text.lines().take(RESULT_LINES_SHOWN_MAX) {
        writeln!(out, "    {}", visible(line))?;
    }
    if n_lines > RESULT_LINES_SHOWN_MAX {
        writeln!(
            out,
            "    {}",
            style.dim(&format!(
                "… {} more lines",
                n_lines - RESULT_LINES_SHOWN_MAX
            ))
        )?;
    }
    Ok(())
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time in milliseconds.
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Howard Hinnant's `civil_from_days`: the proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14 22:13:20");
        assert_eq!(utc(-1_000), "1969-12-31 23:59:59");
    }

    /// Escapes in streamed text, reasoning, tool names and arguments, and failures are shown.
    #[test]
    fn live_output_shows_control_characters() {
        use dsh::session::event::AssistantChunk;
        let chunk = |chunk: StreamChunk| Event {
            seq: 0,
            time: 0,
            data: EventData::AssistantChunk(std::sync::Arc::new(AssistantChunk {
                turn: 1,
                step: 1,
                chunk,
            })),
            ignorable: false,
            source_event_seqs: None,
            surface_op: None,
            raw_data: None,
        };
        let mut live = Live::new(Style { color: false });
        let mut out = Vec::new();
        for c in [
            StreamChunk::ReasoningDelta {
                index: 0,
                text: "plan\x1b]0;x\x07".into(),
            },
            StreamChunk::TextDelta {
                index: 1,
                text: "hi\x1b[2J\n".into(),
            },
        ] {
            live.event(&chunk(c), &mut out).expect("writes");
        }
        let shown = String::from_utf8(out).expect("utf-8");
        assert_eq!(shown, "[thinking] plan^[]0;x^G\nhi^[[2J\n");
        assert_eq!(call_text("r\x1bx", "not json \x1b"), "r^[x not json ^[");
        assert_eq!(snippet("a\x1bb", 10), "a^[b");
    }

    #[test]
    fn snippet_flattens_and_cuts() {
        assert_eq!(snippet("a\nb", 10), "a b");
        assert_eq!(snippet("abcdef", 4), "abc…");
        assert_eq!(snippet("  x  ", 4), "x");
    }
}

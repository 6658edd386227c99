//! Server-sent events framing (the WHATWG `text/event-stream` format as chat-completions endpoints
//! use it): byte chunks in, event payloads out. Generic: what a payload means is the provider's
//! business (`llm::openai`'s response translator).
//!
//! `SseDecoder` is a pure, push-based state machine, so it can be tested and measured without a
//! socket. It takes byte chunks cut anywhere (inside a UTF-8 sequence, between CR and LF, inside a
//! leading BOM) and yields `SseItem`s: an event's `data` (its `data:` lines joined with `\n`), the
//! `[DONE]` sentinel, or a `:` comment reported out of band (comments are transport activity: the
//! HTTP provider's idle timer counts any bytes). An event dispatches on its blank line only. Every
//! line and every event is bounded (`Limits::sse_line_bytes_max`, `Limits::sse_event_bytes_max`), and
//! the bound is checked before a buffer grows. After `[DONE]` nothing more is decoded; `finish` at
//! EOF reports a stream that never sent `[DONE]`. Nothing here does I/O or reads a clock.

use crate::limits::Limits;

/// Why a byte stream is not valid, bounded server-sent events. Lines and events are refused before
/// a buffer grows past its bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SseError {
    /// A line over `Limits::sse_line_bytes_max`.
    #[error("sse line is at least {bytes} bytes, the limit is {bytes_max}")]
    LineTooLong {
        /// The line's size so far.
        bytes: usize,
        /// The bound.
        bytes_max: usize,
    },
    /// An event's data over `Limits::sse_event_bytes_max`.
    #[error("sse event is at least {bytes} bytes, the limit is {bytes_max}")]
    EventTooLarge {
        /// The event's size so far.
        bytes: usize,
        /// The bound.
        bytes_max: usize,
    },
    /// The body ended before the `[DONE]` sentinel.
    #[error("sse stream ended without [DONE]")]
    ClosedWithoutDone,
}

/// One decoded server-sent-events item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseItem {
    /// An event's data: its `data:` lines joined with `\n`.
    Data(String),
    /// A `:` comment line (without the colon and one leading space). Never a payload.
    Comment(String),
    /// The `[DONE]` sentinel. Nothing is decoded after it.
    Done,
}

/// The UTF-8 byte-order mark, stripped from the start of a stream only.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Incremental SSE decoder over byte chunks. See the module docs.
#[derive(Debug, Clone)]
pub struct SseDecoder {
    line_bytes_max: usize,
    event_bytes_max: usize,
    /// The current line's bytes received so far, without its terminator.
    ///
    /// Invariant: `line.len() <= line_bytes_max`; it is non-empty only while a line spans feeds.
    line: Vec<u8>,
    /// The current event's data lines joined with `\n`.
    ///
    /// Invariant: `data.len() <= event_bytes_max`.
    data: String,
    /// Whether the current event has seen a `data` field (an event of `data:` alone carries "").
    has_data: bool,
    /// The previous feed ended with CR, so an LF starting the next feed ends no line.
    skip_lf: bool,
    /// No line has completed yet: the first line may start with a byte-order mark.
    at_start: bool,
    /// `[DONE]` arrived: every later byte is ignored.
    done: bool,
}

impl SseDecoder {
    /// A decoder bounded by `limits.sse_line_bytes_max` and `limits.sse_event_bytes_max`.
    pub fn new(limits: &Limits) -> SseDecoder {
        SseDecoder {
            line_bytes_max: limits.sse_line_bytes_max,
            event_bytes_max: limits.sse_event_bytes_max,
            line: Vec::new(),
            data: String::new(),
            has_data: false,
            skip_lf: false,
            at_start: true,
            done: false,
        }
    }

    /// Whether `[DONE]` has been decoded.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Decodes `bytes` and returns the items they complete.
    ///
    /// # Errors
    /// A line or an event over its bound. The decoder must not be fed again after an error.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<SseItem>, SseError> {
        let mut out = Vec::new();
        self.feed_into(bytes, &mut out)?;
        Ok(out)
    }

    /// Decodes `bytes`, appending the items they complete to `out` (no allocation beyond the items).
    ///
    /// # Errors
    /// A line or an event over its bound; items completed before the breach are already in `out`.
    pub fn feed_into(&mut self, mut bytes: &[u8], out: &mut Vec<SseItem>) -> Result<(), SseError> {
        if self.done || bytes.is_empty() {
            return Ok(());
        }
        if self.skip_lf {
            self.skip_lf = false;
            if let [b'\n', rest @ ..] = bytes {
                bytes = rest;
            }
        }
        while !bytes.is_empty() {
            let Some(end) = memchr::memchr2(b'\n', b'\r', bytes) else {
                self.extend_line(bytes)?;
                return Ok(());
            };
            let (head, tail) = bytes.split_at(end);
            let mut rest = &tail[1..];
            if tail[0] == b'\r' {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    None => self.skip_lf = true,
                    Some(_) => {}
                }
            }
            if self.line.is_empty() {
                self.line_done(head, out)?;
            } else {
                self.extend_line(head)?;
                let line = std::mem::take(&mut self.line);
                let result = self.line_done(&line, out);
                self.line = line;
                self.line.clear();
                result?;
            }
            if self.done {
                return Ok(());
            }
            bytes = rest;
        }
        Ok(())
    }

    /// Ends the stream.
    ///
    /// # Errors
    /// `ClosedWithoutDone` unless `[DONE]` was decoded (an empty body, a cut mid-event and a final
    /// `data: [DONE]` without its blank line are all truncations).
    pub fn finish(&mut self) -> Result<(), SseError> {
        if self.done {
            Ok(())
        } else {
            Err(SseError::ClosedWithoutDone)
        }
    }

    fn extend_line(&mut self, part: &[u8]) -> Result<(), SseError> {
        let bytes = self.line.len() + part.len();
        if bytes > self.line_bytes_max {
            return Err(SseError::LineTooLong {
                bytes,
                bytes_max: self.line_bytes_max,
            });
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    fn line_done(&mut self, mut line: &[u8], out: &mut Vec<SseItem>) -> Result<(), SseError> {
        if line.len() > self.line_bytes_max {
            return Err(SseError::LineTooLong {
                bytes: line.len(),
                bytes_max: self.line_bytes_max,
            });
        }
        if self.at_start {
            self.at_start = false;
            line = line.strip_prefix(BOM).unwrap_or(line);
        }
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if line[0] == b':' {
            let text = strip_one_space(&line[1..]);
            out.push(SseItem::Comment(String::from_utf8_lossy(text).into_owned()));
            return Ok(());
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => (&line[..colon], strip_one_space(&line[colon + 1..])),
            None => (line, &[][..]),
        };
        if field != b"data" {
            // `event`, `id`, `retry` and unknown fields carry nothing the chat stream uses.
            return Ok(());
        }
        let value = String::from_utf8_lossy(value);
        let bytes = self.data.len() + usize::from(self.has_data) + value.len();
        if bytes > self.event_bytes_max {
            return Err(SseError::EventTooLarge {
                bytes,
                bytes_max: self.event_bytes_max,
            });
        }
        if self.has_data {
            self.data.push('\n');
        }
        self.data.push_str(&value);
        self.has_data = true;
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseItem>) {
        if !self.has_data {
            return;
        }
        self.has_data = false;
        if self.data == "[DONE]" {
            self.data.clear();
            self.done = true;
            out.push(SseItem::Done);
        } else {
            out.push(SseItem::Data(std::mem::take(&mut self.data)));
        }
    }
}

fn strip_one_space(value: &[u8]) -> &[u8] {
    value.strip_prefix(b" ").unwrap_or(value)
}
#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8]) -> (Vec<SseItem>, Result<(), SseError>) {
        let mut d = SseDecoder::new(&Limits::DEFAULT);
        let mut out = Vec::new();
        if let Err(e) = d.feed_into(input, &mut out) {
            return (out, Err(e));
        }
        let end = d.finish();
        (out, end)
    }

    fn data(s: &str) -> SseItem {
        SseItem::Data(s.to_owned())
    }

    // §9.26.1
    #[test]
    fn yields_event_payloads_and_the_done_sentinel() {
        let (items, end) = decode_all(b"data: {\"a\":1}\n\ndata: [DONE]\n\n");
        assert_eq!(items, vec![data("{\"a\":1}"), SseItem::Done]);
        assert_eq!(end, Ok(()));
    }

    // §9.26.2
    #[test]
    fn reports_comments_out_of_band_without_yielding_them() {
        let (items, end) = decode_all(b": keep-alive\n\ndata: x\n\n:no-space\ndata: [DONE]\n\n");
        assert_eq!(
            items,
            vec![
                SseItem::Comment("keep-alive".into()),
                data("x"),
                SseItem::Comment("no-space".into()),
                SseItem::Done
            ]
        );
        assert_eq!(end, Ok(()));
    }

    // §9.26.3
    #[test]
    fn stops_yielding_after_done_even_when_more_data_follows() {
        let mut d = SseDecoder::new(&Limits::DEFAULT);
        let items = d.feed(b"data: [DONE]\n\ndata: late\n\n").expect("valid");
        assert_eq!(items, vec![SseItem::Done]);
        assert_eq!(d.feed(b"data: later\n\n").expect("ignored"), vec![]);
        assert_eq!(d.finish(), Ok(()));
    }

    // §9.26.4
    #[test]
    fn stream_closed_when_the_stream_ends_without_done() {
        let (items, end) = decode_all(b"data: {\"a\":1}\n\n");
        assert_eq!(items, vec![data("{\"a\":1}")]);
        assert_eq!(end, Err(SseError::ClosedWithoutDone));
    }

    // §9.26.5
    #[test]
    fn stream_closed_for_an_empty_stream() {
        assert_eq!(decode_all(b""), (vec![], Err(SseError::ClosedWithoutDone)));
    }

    // §9.26.6
    #[test]
    fn stream_closed_for_a_mid_event_close() {
        let (items, end) = decode_all(b"data: {\"a\":1}\n\ndata: {\"b\"");
        assert_eq!(items, vec![data("{\"a\":1}")]);
        assert_eq!(end, Err(SseError::ClosedWithoutDone));
    }

    // §9.26.7
    #[test]
    fn a_final_done_missing_its_blank_line_is_truncation() {
        let (items, end) = decode_all(b"data: {\"a\":1}\n\ndata: [DONE]\n");
        assert_eq!(items, vec![data("{\"a\":1}")]);
        assert_eq!(end, Err(SseError::ClosedWithoutDone));
    }

    #[test]
    fn joins_data_lines_and_ignores_other_fields() {
        let input = b"event: message\nid: 7\nretry: 10\ndata: a\ndata:b\ndata\nfoo: bar\n\n";
        let (items, _) = decode_all(input);
        assert_eq!(items, vec![data("a\nb\n")]);
    }

    #[test]
    fn an_event_without_data_dispatches_nothing() {
        let (items, _) = decode_all(b"event: ping\n\n\n\ndata: [DONE]\n\n");
        assert_eq!(items, vec![SseItem::Done]);
    }

    #[test]
    fn accepts_crlf_cr_and_lf_line_ends_and_a_bom() {
        for input in [
            &b"\xEF\xBB\xBFdata: x\r\n\r\ndata: [DONE]\r\n\r\n"[..],
            &b"data: x\r\rdata: [DONE]\r\r"[..],
            &b"data: x\n\r\ndata: [DONE]\r\n\n"[..],
        ] {
            let (items, end) = decode_all(input);
            assert_eq!(items, vec![data("x"), SseItem::Done], "{input:?}");
            assert_eq!(end, Ok(()));
        }
    }

    #[test]
    fn utf8_split_across_feeds_is_reassembled() {
        let input = "data: héllo 🌍\n\n".as_bytes();
        for cut in 0..=input.len() {
            let mut d = SseDecoder::new(&Limits::DEFAULT);
            let mut items = d.feed(&input[..cut]).expect("valid");
            items.extend(d.feed(&input[cut..]).expect("valid"));
            assert_eq!(items, vec![data("héllo 🌍")], "cut at {cut}");
        }
    }

    #[test]
    fn a_bom_split_across_feeds_is_stripped_and_only_at_the_start() {
        let mut d = SseDecoder::new(&Limits::DEFAULT);
        let mut items = d.feed(b"\xEF").expect("valid");
        items.extend(
            d.feed(b"\xBB\xBFdata: a\n\n\xEF\xBB\xBFdata: b\n\n")
                .expect("valid"),
        );
        // A BOM later in the stream is part of a field name, so that line is ignored.
        assert_eq!(items, vec![data("a")]);
    }

    #[test]
    fn a_line_over_the_bound_is_refused_before_buffering() {
        let limits = Limits {
            sse_line_bytes_max: 16,
            ..Limits::DEFAULT
        };
        let mut d = SseDecoder::new(&limits);
        assert_eq!(d.feed(b"data: 0123456789").expect("16 bytes fit"), vec![]);
        assert_eq!(
            d.feed(b"a"),
            Err(SseError::LineTooLong {
                bytes: 17,
                bytes_max: 16
            })
        );
        let mut d = SseDecoder::new(&limits);
        assert_eq!(
            d.feed(b"data: 0123456789ab\n"),
            Err(SseError::LineTooLong {
                bytes: 18,
                bytes_max: 16
            })
        );
    }

    #[test]
    fn an_event_over_the_bound_is_refused() {
        let limits = Limits {
            sse_event_bytes_max: 5,
            ..Limits::DEFAULT
        };
        let mut d = SseDecoder::new(&limits);
        assert_eq!(
            d.feed(b"data: ab\ndata: cd\n").expect("5 bytes fit"),
            vec![]
        );
        assert_eq!(
            d.feed(b"data: e\n"),
            Err(SseError::EventTooLarge {
                bytes: 7,
                bytes_max: 5
            })
        );
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn event_text() -> impl Strategy<Value = String> {
            proptest::string::string_regex("[a-zé🌍 {}\":,]{0,12}").expect("valid regex")
        }

        proptest! {
            /// However the bytes are cut, the decoder yields the same items.
            #[test]
            fn any_split_yields_the_same_items(
                texts in proptest::collection::vec(event_text(), 0..6),
                ends in proptest::collection::vec(0usize..3, 0..6),
                cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
            ) {
                let mut input = Vec::new();
                for (i, t) in texts.iter().enumerate() {
                    let end: &[u8] = match ends.get(i).copied().unwrap_or(0) { 0 => b"\n", 1 => b"\r\n", _ => b"\r" };
                    input.extend_from_slice(b"data: ");
                    input.extend_from_slice(t.as_bytes());
                    input.extend_from_slice(end);
                    input.extend_from_slice(end);
                }
                input.extend_from_slice(b"data: [DONE]\n\n");
                let (whole, end) = decode_all(&input);
                prop_assert_eq!(end, Ok(()));
                let mut points: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
                points.sort_unstable();
                let mut d = SseDecoder::new(&Limits::DEFAULT);
                let mut pieces = Vec::new();
                let mut from = 0;
                for p in points.into_iter().chain([input.len()]) {
                    d.feed_into(&input[from..p], &mut pieces).expect("valid");
                    from = p;
                }
                prop_assert_eq!(d.finish(), Ok(()));
                prop_assert_eq!(pieces, whole);
            }
        }
    }
}

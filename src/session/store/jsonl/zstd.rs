//! The original's default on-disk encoding of a log, `session.jsonl.zstd` (`reference/session-llm.md`
//! §5.6): the same lines as a plain log, as a concatenation of independent zstd frames, each with its
//! content checksum. Frame 1 holds exactly the header line; each later frame one durable batch of
//! lines (each ending in `\n`).
//!
//! The importer recognises such a log by the zstd magic bytes at its start (`is_zstd`), whatever the
//! file is called, and reads it through `Decompressed`, which keeps the plain importer's bounds on the
//! decompressed text: no line longer than `Limits::event_bytes_max`, no more lines than
//! `Limits::session_events_max` events and a header. A decompression bomb therefore fails with a
//! clear error after at most one line's worth of memory, never by exhausting it. An input that ends
//! inside a frame (a batch whose write a crash cut short) is read as the original reads it: the
//! complete lines decoded before the cut are kept and the rest is a torn tail; a frame that is
//! damaged (a bad checksum or block) is an error.
//!
//! Decoding and encoding use the `zstd` crate (bindings to the reference C library, which the
//! original's writer also produces its frames with): it verifies frame checksums and decodes
//! concatenated frames, and its encoder sets the checksum flag the original writes.

use std::io::{self, Read, Write};

use crate::limits::Limits;
use crate::session::event::{Event, SessionHeader};

/// The four bytes every zstd frame starts with (`0xFD2FB528`, little-endian).
pub const MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// True when `head`, the first bytes of an input, start a zstd frame.
pub fn is_zstd(head: &[u8]) -> bool {
    head.starts_with(&MAGIC)
}

/// Why a zstd log could not be decompressed: the importer reports it as
/// `ImportError::Decompress`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct DecompressError {
    /// The decompressed line (1-based, the header is line 1) where decoding stopped.
    pub line: usize,
    /// What was wrong.
    pub reason: String,
}

/// Decompresses a zstd log for the line importer, failing as soon as the decompressed text breaks a
/// bound of `limits` (see the module documentation).
pub(super) struct Decompressed<'a, R: io::BufRead> {
    decoder: zstd::stream::read::Decoder<'a, R>,
    /// Bytes of the current (unfinished) line so far.
    line_bytes: usize,
    /// Lines finished so far.
    lines: usize,
    line_bytes_max: usize,
    lines_max: usize,
    /// Set when the input ended inside a frame: a write of the original cut short by a crash.
    cut_short: bool,
}

impl<R: io::BufRead> Decompressed<'_, R> {
    /// Starts decoding `input`, which begins with `MAGIC`.
    ///
    /// # Errors
    /// When the decoder cannot be set up.
    pub(super) fn new(input: R, limits: &Limits) -> io::Result<Self> {
        Ok(Decompressed {
            decoder: zstd::stream::read::Decoder::with_buffer(input)?,
            line_bytes: 0,
            lines: 0,
            // The line reader itself refuses a line over the bound; one byte more here (its `\n`)
            // lets that reader report an exactly-at-the-bound line as it does for a plain log.
            line_bytes_max: limits.event_bytes_max.saturating_add(1),
            lines_max: limits.session_events_max.saturating_add(1),
            cut_short: false,
        })
    }

    /// True when the input ended inside a frame (everything decoded before the cut was delivered).
    pub(super) fn cut_short(&self) -> bool {
        self.cut_short
    }

    /// Accounts for `bytes` just decompressed.
    fn count(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut rest = bytes;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            self.line_bytes = self.line_bytes.saturating_add(i);
            self.check_line()?;
            self.line_bytes = 0;
            self.lines += 1;
            if self.lines > self.lines_max {
                return Err(self.error_at(self.lines, format!(
                    "the decompressed log holds more than {} lines, the limit (a zstd bomb or a damaged log)",
                    self.lines_max
                )));
            }
            rest = &rest[i + 1..];
        }
        self.line_bytes = self.line_bytes.saturating_add(rest.len());
        self.check_line()
    }

    fn check_line(&self) -> io::Result<()> {
        if self.line_bytes > self.line_bytes_max {
            return Err(self.error(format!(
                "the decompressed line is over {} bytes, the limit (a zstd bomb or a damaged log)",
                self.line_bytes_max - 1
            )));
        }
        Ok(())
    }

    /// An error at the current (unfinished) line, carried through `io::Error` to the importer.
    fn error(&self, reason: String) -> io::Error {
        self.error_at(self.lines + 1, reason)
    }

    /// An error at `line`, carried through `io::Error` to the importer.
    fn error_at(&self, line: usize, reason: String) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, DecompressError { line, reason })
    }
}

impl<R: io::BufRead> Read for Decompressed<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cut_short {
            return Ok(0);
        }
        let n = match self.decoder.read(buf) {
            Ok(n) => n,
            // The input ended inside a frame: a batch whose write never completed. Like the
            // original, keep every line decoded before the cut and end the log there; the importer
            // reports the cut as a torn tail.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                self.cut_short = true;
                return Ok(0);
            }
            Err(e) => return Err(self.error(format!("the zstd stream is damaged: {e}"))),
        };
        self.count(&buf[..n])?;
        Ok(n)
    }
}

/// Writes a log in the original's zstd layout: frame 1 the header line, frame 2 (when there are
/// events) every event line, one event per line as `export` writes them; each frame checksummed.
///
/// # Errors
/// When writing to `out` fails.
pub fn export_zstd(
    header: &SessionHeader,
    events: &[Event],
    out: &mut impl Write,
) -> io::Result<()> {
    let mut plain = Vec::new();
    super::export(header, &[], &mut plain)?;
    write_frame(&plain, out)?;
    if events.is_empty() {
        return Ok(());
    }
    plain.clear();
    for event in events {
        serde_json::to_writer(&mut plain, event)?;
        plain.push(b'\n');
    }
    write_frame(&plain, out)
}

/// Writes `bytes` as one zstd frame with its content checksum, at the default level.
fn write_frame(bytes: &[u8], out: &mut impl Write) -> io::Result<()> {
    let mut encoder = zstd::stream::write::Encoder::new(&mut *out, 0)?;
    encoder.include_checksum(true)?;
    encoder.include_contentsize(true)?;
    encoder.set_pledged_src_size(Some(bytes.len() as u64))?;
    encoder.write_all(bytes)?;
    encoder.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::store::jsonl::{ImportError, ImportOptions, export, import, import_with};

    /// A log the original could have written: a header, a turn with an unknown key kept, and a
    /// user message in its key order.
    const LOG: &str = concat!(
        r#"{"type":"session","version":0,"id":"s1","createdAt":5,"delegationDepth":0}"#,
        "\n",
        r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1,"origin":"rpc"}}"#,
        "\n",
        r#"{"type":"user/message","seq":1,"time":1,"data":{"content":[{"type":"text","text":"hi"}],"source":{"kind":"user"},"role":"user","id":"u1"},"surfaceOp":"append"}"#,
        "\n",
        r#"{"type":"turn/end","seq":2,"time":1,"data":{"turn":1,"reason":{"kind":"completed"}}}"#,
        "\n",
    );

    /// `LOG` the way the original's writer lays it out: the header alone in frame 1, then one frame
    /// per durable batch (here two).
    fn original_layout(text: &str) -> Vec<u8> {
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let mut out = Vec::new();
        for batch in [&lines[..1], &lines[1..3], &lines[3..]] {
            write_frame(batch.concat().as_bytes(), &mut out).unwrap();
        }
        out
    }

    fn plain_export(imported: &crate::session::store::jsonl::Imported) -> String {
        let mut out = Vec::new();
        export(&imported.header, &imported.events, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_zstd_log_imports_as_its_text_does() {
        let compressed = original_layout(LOG);
        assert!(is_zstd(&compressed));
        let from_zstd = import(&mut &compressed[..], &Limits::DEFAULT).unwrap();
        let from_text = import(&mut LOG.as_bytes(), &Limits::DEFAULT).unwrap();
        assert_eq!(from_zstd.events, from_text.events);
        assert_eq!(from_zstd.header, from_text.header);
        assert_eq!(plain_export(&from_zstd), LOG);
    }

    #[test]
    fn export_zstd_writes_the_originals_frames() {
        let imported = import(&mut LOG.as_bytes(), &Limits::DEFAULT).unwrap();
        let mut out = Vec::new();
        export_zstd(&imported.header, &imported.events, &mut out).unwrap();
        // Frame 1 is exactly the header line, with the checksum flag (bit 2 of the frame header
        // descriptor, the byte after the magic) set.
        assert!(is_zstd(&out));
        assert_eq!(out[4] & 0x04, 0x04);
        let first = zstd::zstd_safe::find_frame_compressed_size(&out).unwrap();
        let header = zstd::stream::decode_all(&out[..first]).unwrap();
        assert_eq!(header, LOG.split_inclusive('\n').next().unwrap().as_bytes());
        assert!(is_zstd(&out[first..]));
        assert_eq!(out[first + 4] & 0x04, 0x04);
        assert_eq!(zstd::stream::decode_all(&out[..]).unwrap(), LOG.as_bytes());
        let again = import(&mut &out[..], &Limits::DEFAULT).unwrap();
        assert_eq!(plain_export(&again), LOG);
    }

    #[test]
    fn a_damaged_zstd_log_is_a_decompress_error() {
        let mut compressed = original_layout(LOG);
        let at = compressed.len() - 6;
        compressed[at] ^= 0xFF;
        let err = import(&mut &compressed[..], &Limits::DEFAULT).unwrap_err();
        let ImportError::Decompress(DecompressError { line, reason }) = &err else {
            panic!("{err:?}");
        };
        // The first two frames decode; the third, holding line 4, fails its checksum.
        assert_eq!(*line, 4);
        assert!(
            reason.starts_with("the zstd stream is damaged: "),
            "{reason}"
        );
    }

    #[test]
    fn a_zstd_bomb_stops_at_the_line_bound() {
        let limits = Limits {
            event_bytes_max: 4096,
            ..Limits::DEFAULT
        };
        // 64 MiB of one line compresses to a few KiB.
        let mut text = LOG.split_inclusive('\n').next().unwrap().to_string();
        text.push_str(&"a".repeat(64 << 20));
        let mut bomb = Vec::new();
        write_frame(text.as_bytes(), &mut bomb).unwrap();
        assert!(bomb.len() < 64 << 10, "{}", bomb.len());
        let err = import_with(&mut &bomb[..], &limits, &ImportOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 2: the decompressed line is over 4096 bytes, the limit (a zstd bomb or a damaged log)"
        );
        // Too many lines, each within the bound, stop at the event bound the same way.
        let few = Limits {
            session_events_max: 10,
            ..Limits::DEFAULT
        };
        let mut many = LOG.split_inclusive('\n').next().unwrap().to_string();
        many.push_str(&"x\n".repeat(1000));
        let mut compressed = Vec::new();
        write_frame(many.as_bytes(), &mut compressed).unwrap();
        let err = import_with(&mut &compressed[..], &few, &ImportOptions::default()).unwrap_err();
        assert!(
            err.to_string()
                == "line 12: the decompressed log holds more than 11 lines, the limit (a zstd bomb or a damaged log)",
            "{err}"
        );
    }

    #[test]
    fn a_frame_cut_short_is_a_torn_tail() {
        let compressed = original_layout(LOG);
        let full = import(&mut &compressed[..], &Limits::DEFAULT).unwrap();
        assert_eq!(full.torn_tail, None);
        let first = zstd::zstd_safe::find_frame_compressed_size(&compressed).unwrap();
        let second = zstd::zstd_safe::find_frame_compressed_size(&compressed[first..]).unwrap();
        let last = first + second;
        let reason = "the last zstd frame is incomplete: its write was cut short";
        // Cut inside the last frame's block (the `turn/end` batch): the lines of the first two
        // frames load and the cut is reported where the next line would start.
        let cut = &compressed[..last + 8];
        let imported = import(&mut &cut[..], &Limits::DEFAULT).unwrap();
        assert_eq!(imported.events, full.events[..2]);
        let torn = imported.torn_tail.expect("the cut is reported");
        assert_eq!((torn.line, torn.reason.as_str()), (4, reason));
        // Cut inside the last frame's checksum: its block decoded whole, so its line is kept, as the
        // original keeps the complete lines of a torn frame.
        let cut = &compressed[..compressed.len() - 2];
        let imported = import(&mut &cut[..], &Limits::DEFAULT).unwrap();
        assert_eq!(imported.events, full.events);
        let torn = imported.torn_tail.expect("the cut is reported");
        assert_eq!((torn.line, torn.reason.as_str()), (5, reason));
    }
}

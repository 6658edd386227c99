//! One function per fuzz target. Each feeds arbitrary bytes to a parser that faces the outside and
//! checks what must hold of its answer; a panic (or a failed check) is a finding.

use std::io::Cursor;
use std::path::Path;

use dsh::Limits;
use dsh::ids::{MessageId, SessionId};
use dsh::llm::openai::ChunkDecoder;
use dsh::llm::sse::SseDecoder;
use dsh::scenario::Scenario;
use dsh::session::Event;
use dsh::session::invariant;
use dsh::session::store::jsonl::{self, legacy};

/// The v0 event decoder, then the legacy conversions and the packed chunk rows on the same JSON.
/// A decoded event re-encodes to a text that decodes to the same text again.
pub fn event_v0(data: &[u8]) {
    if let Ok(event) = Event::from_json_bytes(data) {
        let once = event.to_json();
        let again = Event::from_json(&once).expect("an encoded event decodes");
        assert_eq!(again.to_json(), once, "the codec is not stable");
    }
    let Ok(serde_json::Value::Object(mut map)) = serde_json::from_slice(data) else {
        return;
    };
    if let Some(tag) = map
        .get("type")
        .and_then(serde_json::Value::as_str)
        .and_then(legacy::RowTag::from_type)
    {
        if let Ok(events) = legacy::decode_row(tag, &map) {
            assert!(!events.is_empty(), "a decoded row packs at least one chunk");
            for e in &events {
                let text = e.to_json();
                Event::from_json(&text).expect("an unpacked chunk decodes");
            }
        }
        return;
    }
    if legacy::convert_event(&mut map, "fuzz-session", |seq| Some(format!("m{seq}"))).is_ok() {
        // Whatever the conversion left must be decodable or refused, never a panic.
        let text = serde_json::Value::Object(map).to_string();
        let _ = Event::from_json(&text);
    }
}

/// Checks an import's answer: its events are contiguous from seq 0, pass the relational checker and
/// round-trip through `export`.
fn check_imported(imported: &jsonl::Imported) {
    for (i, e) in imported.events.iter().enumerate() {
        assert_eq!(e.seq, i as u64, "imported events are contiguous from 0");
    }
    invariant::check(&imported.events).expect("an imported log passes the checker");
    let mut out = Vec::new();
    jsonl::export(&imported.header, &imported.events, &mut out).expect("export to memory");
    let back = jsonl::import(&mut Cursor::new(&out), &Limits::DEFAULT)
        .expect("an exported import imports again");
    assert_eq!(back.events.len(), imported.events.len());
    for (a, b) in back.events.iter().zip(&imported.events) {
        assert_eq!(a.to_json(), b.to_json(), "export/import changed an event");
    }
}

/// The JSON-lines importer on plain text (a zstd magic at the start makes it the zstd path on
/// arbitrary frames).
pub fn import_plain(data: &[u8]) {
    if let Ok(imported) = jsonl::import(&mut Cursor::new(data), &Limits::DEFAULT) {
        check_imported(&imported);
    }
}

/// The JSON-lines importer on the input compressed as zstd frames (split at the first newline, so
/// a log arrives as two frames like the original writes): same answer as the plain import.
pub fn import_zstd(data: &[u8]) {
    if dsh::session::store::jsonl::zstd::is_zstd(data) {
        return;
    }
    let cut = data
        .iter()
        .position(|&b| b == b'\n')
        .map_or(data.len(), |i| i + 1);
    let mut framed = zstd::encode_all(&data[..cut], 1).expect("compress in memory");
    framed.extend(zstd::encode_all(&data[cut..], 1).expect("compress in memory"));
    let plain = jsonl::import(&mut Cursor::new(data), &Limits::DEFAULT);
    let zipped = jsonl::import(&mut Cursor::new(&framed), &Limits::DEFAULT);
    match (&plain, &zipped) {
        (Ok(p), Ok(z)) => {
            assert_eq!(p.events.len(), z.events.len(), "zstd changed the events");
            check_imported(z);
        }
        (Err(_), Err(_)) => {}
        _ => panic!(
            "plain and zstd imports disagree: {:?} vs {:?}",
            plain.as_ref().err(),
            zipped.as_ref().err()
        ),
    }
}

/// The SSE framing and the OpenAI chunk translator, fed in pieces cut where the first byte says.
/// Cutting a body differently never changes the chunks or the verdict.
pub fn sse_chunks(data: &[u8]) {
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let run = |step: usize| {
        let mut decoder = ChunkDecoder::new(&Limits::DEFAULT);
        let mut out = Vec::new();
        let mut failed = None;
        for piece in body.chunks(step.max(1)) {
            if let Err(e) = decoder.feed(piece, &mut out) {
                failed = Some(e.to_string());
                break;
            }
        }
        let finished = failed.is_none() && decoder.finish().is_ok();
        (format!("{out:?}"), failed.is_some(), finished)
    };
    let whole = run(body.len());
    let cut_up = run(usize::from(cut % 16) + 1);
    assert_eq!(whole, cut_up, "cutting the body changed the outcome");
    let mut sse = SseDecoder::new(&Limits::DEFAULT);
    let _ = sse.feed(body).and_then(|_| sse.finish());
}

/// The scenario parser (SPEC §9).
pub fn scenario(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Scenario::parse(text);
    }
}

/// The `dsh.toml` parser.
pub fn dsh_toml(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = dsh_cli::config::check_file_text(text, Path::new("/fuzz"));
    }
}

/// Session and message id validation: an accepted session id is what it claims to be.
pub fn session_id(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(id) = SessionId::new(text) {
        assert_eq!(id.as_str(), text);
        assert!(!text.is_empty() && text.len() <= 128, "length rule");
        assert!(text != "." && text != "..", "an id never names a directory");
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)),
            "alphabet rule"
        );
    }
    if let Ok(id) = MessageId::new(text) {
        assert_eq!(id.as_str(), text);
    }
}

/// The server's request bodies, the first byte choosing which.
pub fn serve_body(data: &[u8]) {
    use dsh_cli::serve::body::parse;
    use dsh_cli::serve::input::{CancelBody, InputBody};
    use dsh_cli::serve::sessions::CreateSession;
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            let _ = parse::<CreateSession>(body);
        }
        1 => {
            let _ = parse::<InputBody>(body);
        }
        _ => {
            let _ = parse::<CancelBody>(body);
        }
    }
}

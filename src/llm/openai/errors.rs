//! How the endpoint's refusals become failures (`reference/session-llm.md` §7.5): an HTTP status
//! and its error body map to a §7.5 code, with the conservative context-overflow and quota wording
//! checks (§6.6) and `Retry-After` parsing. Pure: the caller passes the clock in.
//!
//! Called by the stream (`stream.rs`) once it has read a non-2xx response's bounded error body.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::TIMEOUT_MS_MAX;
use crate::llm::types::{LlmFailure, codes};

/// Server text copied into a failure message is cut to this many characters.
const SERVER_MESSAGE_CHARS_MAX: usize = 1_000;

/// Maps a non-2xx status and its body to a failure (without retry-after and request id).
pub fn map_http_error(status: u16, body: &[u8]) -> LlmFailure {
    let error = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|mut v| v.get_mut("error").map(Value::take));
    let field = |key: &str| -> Option<String> {
        match error.as_ref()?.get(key)? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    let message = field("message")
        .map(|m| m.chars().take(SERVER_MESSAGE_CHARS_MAX).collect())
        .unwrap_or_else(|| format!("API error (HTTP {status})"));
    let detail = [field("code"), field("type"), field("message")]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
    let code = match status {
        401 | 403 => codes::AUTH.to_owned(),
        413 => codes::INVALID_REQUEST.to_owned(),
        _ if is_quota_exceeded(&detail) => codes::QUOTA.to_owned(),
        429 => codes::RATE_LIMIT.to_owned(),
        400 if is_context_window_exceeded(&detail) => codes::CONTEXT_WINDOW_EXCEEDED.to_owned(),
        400 => codes::INVALID_REQUEST.to_owned(),
        s if s >= 500 => codes::SERVER.to_owned(),
        s => format!("HTTP_{s}"),
    };
    let mut failure = LlmFailure::new(&code, message);
    failure.status = (100..=599).contains(&status).then_some(status);
    failure
}

/// Conservative context-overflow wording (§6.6); `detail` is lower-case.
pub fn is_context_window_exceeded(detail: &str) -> bool {
    const PHRASES: [&str; 6] = [
        "context_length_exceeded",
        "context_window_exceeded",
        "maximum context length",
        "too long for this model",
        "context window exceeded",
        "prompt is too long",
    ];
    if PHRASES.iter().any(|p| detail.contains(p)) {
        return true;
    }
    // "exceeds the model context window", "exceeded the context length" — but not "exceeds maximum
    // allowed value".
    detail.find("exceed").is_some_and(|at| {
        let rest = &detail[at..];
        ["context window", "context length", "context size"]
            .iter()
            .any(|p| rest.contains(p))
    })
}

/// Terminal quota wording (§6.6), never plain rate limiting; `detail` is lower-case.
pub fn is_quota_exceeded(detail: &str) -> bool {
    const PHRASES: [&str; 9] = [
        "insufficient_quota",
        "insufficient quota",
        "insufficient balance",
        "insufficient_balance",
        "insufficient credits",
        "insufficient_credits",
        "exceeded your current quota",
        "balance depleted",
        "out of credits",
    ];
    if PHRASES.iter().any(|p| detail.contains(p)) {
        return true;
    }
    ["quota", "usage limit"].iter().any(|subject| {
        ["exceeded", "exhausted", "reached"]
            .iter()
            .any(|verb| detail.contains(&format!("{subject} {verb}")))
    })
}

/// `Retry-After` as ms: all-digit seconds, or an IMF-fixdate HTTP date minus `now`. Zero, past,
/// unparsable and absurd (over `TIMEOUT_MS_MAX`) values give `None`.
pub fn parse_retry_after_ms(value: &str, now: SystemTime) -> Option<u64> {
    let value = value.trim();
    let ms = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        value.parse::<u64>().ok()?.checked_mul(1000)?
    } else {
        let at_secs = parse_http_date(value)?;
        let now_ms = u64::try_from(now.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
        at_secs.checked_mul(1000)?.checked_sub(now_ms)?
    };
    (ms > 0 && ms <= TIMEOUT_MS_MAX).then_some(ms)
}

/// Parses `Sun, 06 Nov 1994 08:49:37 GMT` (RFC 9110 IMF-fixdate) to Unix seconds.
fn parse_http_date(value: &str) -> Option<u64> {
    let rest = value.split_once(", ")?.1;
    let parts: Vec<&str> = rest.split(' ').collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let day: u64 = day.parse().ok()?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| m == month)? as u64 + 1;
    let year: u64 = year.parse().ok()?;
    let hms: Vec<u64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let [h, m, s] = hms.as_slice() else {
        return None;
    };
    if !(1..=31).contains(&day) || !(1970..=9999).contains(&year) || *h > 23 || *m > 59 || *s > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), for years from 1970.
    let (y, mo) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * mo + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    Some(days * 86_400 + h * 3600 + m * 60 + s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    // §9.29.13, §9.29.14, §9.29.18–22
    #[test]
    fn http_errors_map_to_codes() {
        let err = |status: u16, body: &str| map_http_error(status, body.as_bytes());
        let with_msg = |m: &str| json!({"error":{"message":m}}).to_string();
        for (status, code) in [
            (401, "AUTH"),
            (403, "AUTH"),
            (429, "RATE_LIMIT"),
            (400, "INVALID_REQUEST"),
            (500, "SERVER"),
            (503, "SERVER"),
            (413, "INVALID_REQUEST"),
            (418, "HTTP_418"),
        ] {
            let f = err(status, &with_msg("boom"));
            assert_eq!(
                (f.code.as_str(), f.message.as_str(), f.status),
                (code, "boom", Some(status)),
                "{status}"
            );
        }
        let overflow = json!({"error":{"message":"This request exceeds the model context window","code":"context_length_exceeded"}}).to_string();
        assert_eq!(err(400, &overflow).code, "CONTEXT_WINDOW_EXCEEDED");
        assert_eq!(err(413, &overflow).code, "INVALID_REQUEST");
        assert_eq!(
            err(400, &with_msg("value exceeds maximum allowed value")).code,
            "INVALID_REQUEST"
        );
        let quota = json!({"error":{"message":"You exceeded your current quota","type":"insufficient_quota"}}).to_string();
        assert_eq!(err(429, &quota).code, "QUOTA");
        assert_eq!(err(402, &with_msg("Insufficient Balance")).code, "QUOTA");
        assert_eq!(
            err(429, &with_msg("Rate limit reached for requests")).code,
            "RATE_LIMIT"
        );
        assert_eq!(err(500, r#"{"error":{}}"#).message, "API error (HTTP 500)");
        let f = err(502, "Bad Gateway");
        assert_eq!(
            (f.code.as_str(), f.message.as_str()),
            ("SERVER", "API error (HTTP 502)")
        );
    }

    // §9.29.15–17
    #[test]
    fn retry_after_seconds_and_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after_ms("2", now), Some(2000));
        assert_eq!(
            parse_retry_after_ms("Sun, 06 Nov 1994 08:49:40 GMT", now),
            Some(3000)
        );
        for bad in [
            "0",
            "",
            "-1",
            "1.5",
            "soon",
            "99999999999999999999999",
            "3000000",
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sat, 05 Nov 1994 08:49:40 GMT",
            "Sun, 06 Nov 1994 25:49:40 GMT",
        ] {
            assert_eq!(parse_retry_after_ms(bad, now), None, "{bad}");
        }
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2000 12:00:00 GMT"),
            Some(951_825_600)
        );
    }
}

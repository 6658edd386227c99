//! `GET /v1/sessions/{id}/events`: a session's durable events as server-sent events (SPEC §13).
//!
//! Each SSE event is one durable event: `id:` its seq, `event:` its type, `data:` its v0 JSON. The
//! stream starts after `Last-Event-ID` (a reconnect) or `after=SEQ`, else at seq 0; it replays the
//! durable log and then follows the agent live, with no gap and no duplicate: the subscription is
//! opened *before* the log is read, and live events at or below the last seq sent are skipped.
//! `follow=false` ends at the last event durable when the request came.
//!
//! A slow client never slows the agent nor grows memory: the agent publishes into a bounded buffer
//! per subscriber, which the response body of a live session reads itself, only as fast as the
//! connection takes its chunks. When the client falls so far behind that the buffer overflows, the
//! stream ends with an `event: resume` whose data names the last seq sent; reconnecting with
//! `Last-Event-ID` (what a browser's `EventSource` does on its own) replays the rest from the store.
//!
//! Each event is formatted once, straight into the chunk being built: every event already published
//! when the body is polled joins one chunk (up to `BATCH_BYTES_MAX`), so a client that keeps up
//! gets a turn's events in a few writes rather than one write per event, and a burst of events
//! costs one wake-up of the connection's task. (A session another node hosts is read from the store
//! by a producer task instead, through a small bounded channel.)
//!
//! Open streams are bounded (`--max-streams`, default `DEFAULT_MAX_STREAMS`): past the bound a new
//! stream gets 503 `too_many_streams` with `Retry-After`, so subscribers cannot grow the server's
//! memory and tasks without bound either. A stream's slot frees when it ends: the client went
//! away, the stream ended, or the server drains.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use dsh::session::Event;
use dsh::session::store::{Inspection, SessionStore};
use dsh::turn::Status;
use dsh_actors::{AgentHandle, Observation, Observed, Subscription};
use serde::Deserialize;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::error::ApiError;
use super::state::{AppState, ReadTarget};
use crate::stored::Opened;

/// Events buffered between the producer task of a session hosted elsewhere and its response body.
const CHANNEL_CAPACITY: usize = 64;

/// The most bytes of ready frames joined into one chunk of the response body.
const BATCH_BYTES_MAX: usize = 64 * 1024;

/// The keep-alive comment sent when nothing else was sent for the keep-alive interval.
const KEEP_ALIVE: &[u8] = b":\n\n";

/// One formatted SSE frame.
type Frame = Bytes;

/// Event streams open at once unless `--max-streams` says otherwise.
pub const DEFAULT_MAX_STREAMS: usize = 1024;

/// The name of the final event that tells a lagging client to reconnect.
pub const RESUME_EVENT: &str = "resume";

/// `GET /v1/sessions/{id}/events` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Start after this seq (`Last-Event-ID` wins when both are given).
    pub after: Option<u64>,
    /// Keep the stream open for new events (default true).
    pub follow: Option<bool>,
}

/// Where a stream starts and whether it follows.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// The first seq to send.
    from: u64,
    /// Whether to follow live events after the replay.
    follow: bool,
}

/// `GET /v1/sessions/{id}/events`.
#[utoipa::path(get, path = "/v1/sessions/{id}/events", params(("id" = String, Path, description = "The session id"), ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this seq"), EventsQuery), responses((status = 200, description = "One SSE event per durable event: `id:` seq, `event:` type, `data:` v0 JSON", content_type = "text/event-stream", body = String), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 404, description = "No such session", body = crate::serve::error::ErrorBody), (status = 503, description = "Too many event streams open (`too_many_streams`); see Retry-After", body = crate::serve::error::ErrorBody)))]
pub async fn events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::bad_request(format!("query: {}", e.body_text())))?;
    let last_event_id = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| ApiError::bad_request("header `Last-Event-ID`: not a seq"))?,
        ),
        None => None,
    };
    let plan = Plan {
        from: last_event_id
            .or(query.after)
            .map_or(0, |s| s.saturating_add(1)),
        follow: query.follow.unwrap_or(true),
    };
    let slot = Arc::clone(&state.inner.streams)
        .try_acquire_owned()
        .map_err(|_| ApiError::too_many_streams(state.inner.settings.max_streams))?;
    let body = match state.read_target(&id).await? {
        ReadTarget::Live(handle) => live_stream(&state, handle, plan, slot),
        ReadTarget::Elsewhere(stored) => Body::from_stream(batched(
            elsewhere_stream(&state, *stored, plan, slot),
            state.inner.settings.keep_alive,
        )),
    };
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// The body of a stream of a session live on this node: its log's durable events, then
/// (following) the events it publishes.
///
/// The response body reads the agent's subscription itself: no task or channel sits between them,
/// so a burst of durable events costs one wake-up of the connection's task, which formats every
/// event already published straight into one chunk (up to `BATCH_BYTES_MAX`) and writes it. The
/// body is polled only when the connection can take more, so a client that stops reading leaves
/// the events in the subscription's bounded buffer; once that overflows, the stream ends with the
/// `resume` event, and the agent is never slowed.
fn live_stream(
    state: &AppState,
    handle: AgentHandle,
    plan: Plan,
    slot: tokio::sync::OwnedSemaphorePermit,
) -> Body {
    // Subscribed before the log is read: nothing published in between is missed.
    let subscription = plan.follow.then(|| handle.subscribe());
    let gauge = state.inner.metrics.sse_subscribers.clone();
    gauge.inc();
    let keep_alive = state.inner.settings.keep_alive;
    let live = Live {
        handle,
        store: state.store().clone(),
        sub: subscription,
        phase: Phase::Start { from: plan.from },
        end: Box::pin(state.inner.streams_end.clone().cancelled_owned()),
        keep_alive,
        tick: Box::pin(tokio::time::sleep(keep_alive)),
        last_sent: tokio::time::Instant::now(),
        _open: OpenStream(gauge),
        _slot: slot,
    };
    let span = tracing::Span::current();
    let chunks = futures::stream::unfold(live, move |mut live| {
        let span = span.clone();
        async move {
            let chunk = live.next_chunk().instrument(span).await?;
            live.last_sent = tokio::time::Instant::now();
            Some((Ok::<_, Infallible>(chunk), live))
        }
    });
    Body::from_stream(chunks)
}

/// Where a live stream is.
enum Phase {
    /// The log is not read yet; the first seq to send is `from`.
    Start { from: u64 },
    /// Sending the durable events of `log` from index `at`, below seq `durable`, from seq `from`
    /// on; then following (with a subscription) from `next`.
    Replay {
        log: Vec<Event>,
        at: usize,
        from: u64,
        durable: u64,
        next: u64,
    },
    /// Following the subscription; the next seq to send is `next`.
    Follow { next: u64 },
    /// Ended.
    Done,
}

/// A live stream's state between polls of its response body.
struct Live {
    handle: AgentHandle,
    store: Opened,
    /// `None` with `follow=false`.
    sub: Option<Subscription>,
    phase: Phase,
    /// Fires when streams must end (the host stopped).
    end: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    keep_alive: Duration,
    /// Wakes the body when a keep-alive may be due; only moved when it fires, so a busy stream
    /// does not touch the timer for every chunk.
    tick: Pin<Box<tokio::time::Sleep>>,
    /// When the last chunk went out.
    last_sent: tokio::time::Instant,
    _open: OpenStream,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Live {
    /// The next chunk of the body; `None` ends it.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Done => return None,
                Phase::Start { from } => self.phase = self.start(from).await?,
                Phase::Replay {
                    log,
                    mut at,
                    from,
                    durable,
                    mut next,
                } => {
                    let mut chunk = Vec::new();
                    while let Some(event) = log.get(at) {
                        if chunk.len() >= BATCH_BYTES_MAX {
                            break;
                        }
                        at += 1;
                        if event.seq >= from && event.seq < durable {
                            push_frame(&mut chunk, event, event.to_json().as_bytes());
                            next = event.seq + 1;
                        }
                    }
                    self.phase = if at < log.len() {
                        Phase::Replay {
                            log,
                            at,
                            from,
                            durable,
                            next,
                        }
                    } else if self.sub.is_some() {
                        Phase::Follow {
                            next: next.max(from.min(durable)),
                        }
                    } else {
                        Phase::Done
                    };
                    if !chunk.is_empty() {
                        return Some(Bytes::from(chunk));
                    }
                }
                Phase::Follow { next } => {
                    let mut chunk = Vec::new();
                    self.phase = self.follow(next, &mut chunk).await;
                    if !chunk.is_empty() {
                        return Some(Bytes::from(chunk));
                    }
                }
            }
        }
    }

    /// Reads the log: the replay of the durable events from `from` on. `None` when the log cannot
    /// be read (the stream ends).
    async fn start(&mut self, from: u64) -> Option<Phase> {
        let log = self.handle.log().await.ok()?;
        let status = self.handle.status().await.ok()?;
        let mut durable = status.durable_seq;
        let logged = log.last().map_or(0, |e| e.seq + 1);
        if durable < logged && status.status == Status::Idle {
            // Events handed to the writer before the subscription opened are never published to
            // it. A running agent writes more (at least its `turn/end`), and the gap before that
            // is read from the log then; an idle one writes nothing more, so wait for these to be
            // durable.
            self.handle.when_idle().await.ok()?;
            durable = logged;
        }
        Some(Phase::Replay {
            log,
            at: 0,
            from,
            durable,
            next: from,
        })
    }

    /// Waits for what the agent publishes and frames into `chunk` every durable event from seq
    /// `next` on that is ready (at least one, unless a keep-alive is due or the stream ends);
    /// returns the phase after it.
    async fn follow(&mut self, mut next: u64, chunk: &mut Vec<u8>) -> Phase {
        let Some(sub) = self.sub.as_mut() else {
            return Phase::Done;
        };
        let first = tokio::select! {
            observation = sub.next() => observation,
            () = self.end.as_mut() => {
                // The host stopped: send what it published before, then end.
                while let Some(observation) = self.sub.as_mut().and_then(Subscription::try_next) {
                    match self.take(observation, next, chunk).await {
                        Some(n) => next = n,
                        None => break,
                    }
                }
                return Phase::Done;
            }
            () = self.tick.as_mut() => {
                let due = self.last_sent + self.keep_alive;
                let now = tokio::time::Instant::now();
                if due <= now {
                    chunk.extend_from_slice(KEEP_ALIVE);
                    self.tick.as_mut().reset(now + self.keep_alive);
                } else {
                    self.tick.as_mut().reset(due);
                }
                return Phase::Follow { next };
            }
        };
        let Some(first) = first else {
            // The agent is gone.
            return Phase::Done;
        };
        match self.take(first, next, chunk).await {
            Some(n) => next = n,
            None => return Phase::Done,
        }
        // Every other item already published joins the same chunk.
        while chunk.len() < BATCH_BYTES_MAX {
            let Some(observation) = self.sub.as_mut().and_then(Subscription::try_next) else {
                break;
            };
            match self.take(observation, next, chunk).await {
                Some(n) => next = n,
                None => return Phase::Done,
            }
        }
        Phase::Follow { next }
    }

    /// Frames `observation` into `chunk` when it is the durable event of seq `next` or later
    /// (filling a gap before it from the log); returns the next seq to send, or `None` when the
    /// stream must end (after a `resume` event when the client fell behind).
    async fn take(
        &mut self,
        observation: Observation,
        next: u64,
        chunk: &mut Vec<u8>,
    ) -> Option<u64> {
        match observation {
            Observation::Item(Observed::Event { event, json, .. }) => {
                if event.seq < next {
                    return Some(next);
                }
                if event.seq > next {
                    // Events already handed to the writer when the subscription opened are not
                    // published to it; they are durable now (seqs become durable in order), so
                    // the log has them.
                    if fill_gap(&self.handle, self.store.store(), next, event.seq, chunk)
                        .await
                        .is_none()
                    {
                        chunk.extend_from_slice(&resume_event(next));
                        return None;
                    }
                }
                push_frame(chunk, &event, &json);
                Some(event.seq + 1)
            }
            Observation::Item(_) => Some(next),
            Observation::Lagged(n) => {
                tracing::debug!(
                    missed = n,
                    next,
                    "event stream lagged; telling the client to resume"
                );
                chunk.extend_from_slice(&resume_event(next));
                None
            }
        }
    }
}

/// How often the stream of a session hosted elsewhere reads the store for new events.
const ELSEWHERE_POLL: Duration = Duration::from_millis(250);

/// The stream of a session another node hosts (SPEC §14): its durable events from the store, then
/// (following) whatever the store gains, read every `ELSEWHERE_POLL`, without taking the lease.
fn elsewhere_stream(
    state: &AppState,
    stored: Inspection,
    plan: Plan,
    slot: tokio::sync::OwnedSemaphorePermit,
) -> mpsc::Receiver<Frame> {
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let end = state.inner.streams_end.clone();
    let gauge = state.inner.metrics.sse_subscribers.clone();
    gauge.inc();
    let store = state.store().clone();
    let id = stored.header.id.clone();
    let producer = async move {
        let _open = OpenStream(gauge);
        let _slot = slot;
        let mut next = plan.from;
        let mut events = stored.events;
        loop {
            let from = next;
            for event in events.iter().filter(|e| e.seq >= from) {
                if tx.send(sse_event(event)).await.is_err() {
                    return;
                }
                next = event.seq + 1;
            }
            if !plan.follow {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(ELSEWHERE_POLL) => {}
                () = end.cancelled() => return,
                () = tx.closed() => return,
            }
            match store.store().inspect(&id).await {
                Ok(inspected) => events = inspected.events,
                Err(_) => return,
            }
        }
    };
    tokio::spawn(producer.instrument(tracing::Span::current()));
    rx
}

/// The response body: every frame ready when the body is polled, joined into one chunk (bounded by
/// `BATCH_BYTES_MAX`), and a keep-alive comment after `keep_alive` without a frame. Ends when the
/// producer does.
fn batched(
    rx: mpsc::Receiver<Frame>,
    keep_alive: Duration,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> {
    futures::stream::unfold(rx, move |mut rx| async move {
        let first = match tokio::time::timeout(keep_alive, rx.recv()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return None,
            Err(_) => return Some((Ok(Bytes::from_static(KEEP_ALIVE)), rx)),
        };
        let Ok(second) = rx.try_recv() else {
            return Some((Ok(first), rx));
        };
        let mut chunk = Vec::with_capacity((first.len() + second.len()) * 4);
        chunk.extend_from_slice(&first);
        chunk.extend_from_slice(&second);
        while chunk.len() < BATCH_BYTES_MAX {
            match rx.try_recv() {
                Ok(frame) => chunk.extend_from_slice(&frame),
                Err(_) => break,
            }
        }
        Some((Ok(Bytes::from(chunk)), rx))
    })
}

/// Counts an open stream in the `sse_subscribers` gauge while it lives.
struct OpenStream(prometheus_client::metrics::gauge::Gauge<i64, std::sync::atomic::AtomicI64>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The SSE frame of a durable event: `id:` its seq, `event:` its type, `data:` its v0 JSON.
fn sse_event(event: &Event) -> Frame {
    let json = event.to_json();
    let mut frame = Vec::with_capacity(json.len() + 64);
    push_frame(&mut frame, event, json.as_bytes());
    Bytes::from(frame)
}

/// Appends the SSE frame of a durable event whose v0 JSON is `json` (for a live event, the bytes
/// the store keeps, published with it: it is not serialised a second time).
fn push_frame(frame: &mut Vec<u8>, event: &Event, json: &[u8]) {
    let kind = event.kind();
    frame.reserve(json.len() + kind.len() + 48);
    // Built by hand rather than with `write!`: the formatting machinery cost more than the copy
    // of the JSON itself (callgrind of `DSH_BENCH_ONLY=http`).
    frame.extend_from_slice(b"id: ");
    push_decimal(frame, event.seq);
    frame.extend_from_slice(b"\nevent: ");
    frame.extend_from_slice(kind.as_bytes());
    frame.push(b'\n');
    push_data(frame, json);
    frame.push(b'\n');
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Appends `data` as `data:` lines. Compact JSON has no line break; were one there (whitespace
/// between tokens, the only place valid JSON can hold a raw one), each line gets its own `data:`
/// and a raw `\r` is dropped, which the JSON reads the same without.
fn push_data(frame: &mut Vec<u8>, data: &[u8]) {
    // Compact JSON, the case of every event the runtime writes: one line, one copy.
    if memchr::memchr2(b'\n', b'\r', data).is_none() {
        frame.extend_from_slice(b"data: ");
        frame.extend_from_slice(data);
        frame.push(b'\n');
        return;
    }
    for line in data.split(|&b| b == b'\n') {
        frame.extend_from_slice(b"data: ");
        if memchr::memchr(b'\r', line).is_some() {
            frame.extend(line.iter().copied().filter(|&b| b != b'\r'));
        } else {
            frame.extend_from_slice(line);
        }
        frame.push(b'\n');
    }
}

/// Frames the events `from..to` from the agent's log (or, when the agent is stopping, from the
/// store: they are durable) into `chunk`; `None` when neither has them.
async fn fill_gap(
    handle: &AgentHandle,
    store: &dyn SessionStore,
    from: u64,
    to: u64,
    chunk: &mut Vec<u8>,
) -> Option<()> {
    let log = match handle.log().await {
        Ok(log) if log.len() as u64 >= to => log,
        _ => store.inspect(handle.id()).await.ok()?.events,
    };
    let start = usize::try_from(from).ok()?;
    let end = usize::try_from(to).ok()?;
    let missing = log.get(start..end)?;
    for event in missing {
        push_frame(chunk, event, event.to_json().as_bytes());
    }
    Some(())
}

/// The final event of a stream that fell behind: reconnect after the last seq received.
fn resume_event(next: u64) -> Frame {
    let last = next.checked_sub(1);
    let data = serde_json::json!({ "reason": "lagged", "last_event_id": last });
    Bytes::from(format!("event: {RESUME_EVENT}\ndata: {data}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_id_event_and_one_data_line_per_line() {
        let mut frame = Vec::new();
        push_data(&mut frame, b"{\"a\":\r\n1}");
        assert_eq!(frame, b"data: {\"a\":\ndata: 1}\n");
        let mut frame = Vec::new();
        push_data(&mut frame, b"{\"a\":1}");
        assert_eq!(frame, b"data: {\"a\":1}\n");
        for n in [0, 7, 10, 99, 1234567890, u64::MAX] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
        let resume = resume_event(5);
        let resume = std::str::from_utf8(&resume).expect("utf-8");
        let data = resume
            .strip_prefix("event: resume\ndata: ")
            .and_then(|d| d.strip_suffix("\n\n"))
            .expect("one event, one data line");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(data).expect("JSON"),
            serde_json::json!({"reason": "lagged", "last_event_id": 4})
        );
    }
}

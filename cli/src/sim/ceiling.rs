//! The store's own group-commit ceiling, measured in the same run with no runtime in between.

use super::*;

/// The mean JSON size of one agent's events.
pub(super) async fn mean_event_bytes(
    store: &Arc<dyn SessionStore>,
    id: &SessionId,
) -> Result<usize, SimError> {
    let loaded = store.load(id).await?;
    let n = loaded.events.len().max(1);
    let bytes: usize = loaded.events.iter().map(|e| e.to_json().len()).sum();
    Ok((bytes / n).max(1))
}

/// An `assistant/chunk` event of about `event_bytes` bytes at `seq`, inside turn 1, step 1.
pub(super) fn ceiling_event(seq: u64, event_bytes: usize) -> EncodedEvent {
    let head = format!(
        r#"{{"type":"assistant/chunk","seq":{seq},"time":1700000000000,"data":{{"turn":1,"step":1,"chunk":{{"type":"text-delta","index":0,"text":""#
    );
    let tail = r#""}}}"#;
    let n_text = event_bytes.saturating_sub(head.len() + tail.len()).max(1);
    let mut json = String::with_capacity(head.len() + n_text + tail.len());
    json.push_str(&head);
    json.extend(std::iter::repeat_n('x', n_text));
    json.push_str(tail);
    EncodedEvent {
        seq,
        kind: "assistant/chunk".into(),
        json: Bytes::from(json),
    }
}

/// The store's own ceiling: `n_appenders` tasks, each appending `batch_events`-event batches to
/// its own session as fast as the store acknowledges them, until `duration` has passed (or each
/// did `CEILING_ROUNDS_MAX` rounds). Events are encoded before the clock starts.
pub(super) async fn store_ceiling(
    store: &Arc<dyn SessionStore>,
    prefix: &str,
    n_appenders: usize,
    batch_events: usize,
    event_bytes: usize,
    duration: Duration,
) -> Result<CeilingReport, SimError> {
    let opening = [
        r#"{"type":"turn/start","seq":0,"time":1700000000000,"data":{"turn":1}}"#,
        r#"{"type":"step/start","seq":1,"time":1700000000000,"data":{"turn":1,"step":1}}"#,
    ];
    let opening: Vec<EncodedEvent> = opening
        .iter()
        .enumerate()
        .map(|(seq, json)| EncodedEvent {
            seq: seq as u64,
            kind: if seq == 0 { "turn/start" } else { "step/start" }.into(),
            json: Bytes::from_static(json.as_bytes()),
        })
        .collect();
    let first_seq = opening.len() as u64;
    let events: Arc<Vec<EncodedEvent>> = Arc::new(
        (0..(CEILING_ROUNDS_MAX * batch_events) as u64)
            .map(|i| ceiling_event(first_seq + i, event_bytes))
            .collect(),
    );
    let ids: Vec<SessionId> = (0..n_appenders)
        .map(|i| SessionId::new(&format!("{prefix}{i:07}")))
        .collect::<Result<_, _>>()
        .map_err(|e| SimError::Task(format!("ceiling id: {e}")))?;
    let setups = ids.iter().map(|id| {
        let store = Arc::clone(store);
        let id = id.clone();
        let opening = opening.clone();
        tokio::spawn(async move {
            store.create(&SessionHeader::new(id.clone(), 0)).await?;
            store.append(&id, opening).await
        })
    });
    for setup in futures::future::join_all(setups).await {
        setup.map_err(|e| SimError::Task(e.to_string()))??;
    }

    let started = Instant::now();
    let deadline = started + duration;
    let appenders: Vec<_> = ids
        .into_iter()
        .map(|id| {
            let store = Arc::clone(store);
            let events = Arc::clone(&events);
            tokio::spawn(async move {
                let mut n = 0u64;
                for batch in events.chunks(batch_events) {
                    if Instant::now() >= deadline {
                        break;
                    }
                    store.append(&id, batch.to_vec()).await?;
                    n += batch.len() as u64;
                }
                Ok::<u64, StoreError>(n)
            })
        })
        .collect();
    let mut total = 0u64;
    for appender in appenders {
        total += appender
            .await
            .map_err(|e| SimError::Task(e.to_string()))??;
    }
    let elapsed = started.elapsed();
    Ok(CeilingReport {
        events_per_sec: per_sec(total, elapsed),
        appenders: n_appenders,
        events: total,
        batch_events,
        event_bytes,
        duration_ms: elapsed.as_secs_f64() * 1000.0,
    })
}

/// Syncs timed by `sync_time`.
pub(super) const SYNC_SAMPLES: usize = 100;

/// The time of one sync on the store's disk, measured in the same run: `SYNC_SAMPLES` rounds of
/// overwriting 4 KiB of a scratch file in `dir` and `fdatasync`ing it (what one commit group of the
/// sqlite store costs at least: its WAL append is one such write and sync). The file is removed.
pub(super) fn sync_time(dir: &Path) -> std::io::Result<Percentiles> {
    use std::io::{Seek, SeekFrom};
    let path = dir.join("sync-probe");
    let mut file = std::fs::File::create(&path)?;
    let page = [0x5a_u8; 4096];
    let mut ns = Vec::with_capacity(SYNC_SAMPLES);
    let result = (|| {
        file.write_all(&page)?;
        file.sync_all()?;
        for _ in 0..SYNC_SAMPLES {
            let started = Instant::now();
            file.seek(SeekFrom::Start(0))?;
            file.write_all(&page)?;
            file.sync_data()?;
            ns.push(started.elapsed().as_nanos() as u64);
        }
        Ok(())
    })();
    drop(file);
    let _ = std::fs::remove_file(&path);
    result.map(|()| Percentiles::of(&mut ns))
}

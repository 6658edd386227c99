//! The writer of `SqliteStore`: one async task that owns the write queue and the write connection,
//! and commits everything queued as one group.
//!
//! `run_writer` waits for a request, takes every request queued behind it (all sessions, at most
//! `SqliteConfig::group_requests_max`), and hands the group to one blocking job on tokio's blocking
//! pool (`commit_while_queued`): one `BEGIN IMMEDIATE … COMMIT` — one WAL fsync — then every waiter
//! is answered. Requests that arrive during a commit form the next group, which the same job takes
//! and commits while the queue is not empty, so a busy runtime's workers never stand between two
//! groups; once the queue is empty the job ends and the task waits again. There is never a timer.
//! When enough WAL was written, a passive checkpoint runs beside the commits, on a connection of
//! its own (`run_checkpoint`): it copies WAL pages into the database and syncs it, which took 50–60
//! ms per 16 MiB here, and commits must not wait for it (they did until 2026-11-30, which put every
//! acknowledgement queued meanwhile behind it). At most one checkpoint runs at a time; a close
//! waits for it. A passive checkpoint alone cannot let SQLite start the WAL over while commits keep
//! coming (it ends behind the commits made while it ran), so once it finished the writer copies the
//! rest itself between two groups (`catch_up_if_due`: the frames committed during one checkpoint;
//! 18–52 ms at 100,000 agents, 176 ms p50 at a million), after which SQLite starts the WAL over
//! from its beginning at the next commit. A checkpoint that ended more than `CATCH_UP_FRAMES_MAX`
//! frames behind is first followed by up to `CHECKPOINT_PASSES_MAX` more passes beside the commits
//! (`Checkpointer::another_pass`), each copying what was committed during the one before, so the
//! catch-up that holds the commits has little left (median 8.5 ms against 32 ms at 30,000 ramped
//! agents). Should the WAL never start over (a reader still reading an old snapshot every time),
//! every `wal_restart_after_bytes` the writer checkpoints the whole WAL and truncates it between
//! two groups (`restart_wal_if_due`); either way the `-wal` file is bounded under sustained load.
//! A truncation due right after a catch-up that copied the WAL whole waits for the next commit,
//! which starts the WAL over itself (seen by the WAL header's salts).
//! While nothing is queued, the writer writes the `-wal` file's blocks (zeros, 1 MiB a chunk, each
//! synced) ahead of SQLite's end of the WAL, up to `checkpoint_after_bytes`
//! (`SqliteConfig::wal_prefill_bytes`, `prefill_wal`): a commit's fsync then overwrites blocks the
//! file has instead of also writing out its new size and blocks, which cost a fresh store's commits about
//! twice as much until the WAL had been started over once.
//! Running the commits under `spawn_blocking` rather than on a thread of our own keeps tokio's
//! paused test clock from jumping while an fsync runs (STYLE §5, tokio#5115); the job never waits
//! for the queue, so the clock never waits for it either.
//!
//! What must stay true: requests reach this queue already validated and reserved (`sqlite/mod.rs`), so a
//! statement that fails here is a failure of the disk or the database, never of the caller: the
//! whole group gets `Io`, the store is poisoned, and nothing is retried. A `Close` request stops the
//! writer after everything queued before it; the connection (and the lock file) close before the
//! close is answered.

use std::ffi::c_int;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ToSql, TransactionBehavior, params};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tracing::{debug, warn};

use super::{Db, Shared, Slot, describe};
use crate::ids::SessionId;
use crate::session::store::{EncodedEvent, StoreError};

/// A session header on its way into the `sessions` table with the first append.
#[derive(Debug)]
pub(super) struct Materialize {
    pub(super) created_at: i64,
    pub(super) json: String,
}

#[derive(Debug)]
pub(super) enum Op {
    /// Events appended at the stored end: an `append`, or the closers of a `load`'s repair.
    Append {
        id: SessionId,
        materialize: Option<Materialize>,
        events: Vec<EncodedEvent>,
    },
    Delete {
        id: SessionId,
    },
    /// Stop the writer once everything queued before this is committed.
    Close,
}

/// One queued write and the waiter it answers.
pub(super) struct Request {
    pub(super) op: Op,
    pub(super) reply: oneshot::Sender<Result<(), StoreError>>,
    /// Returns this request's bytes to the queue budget when the request is dropped (answered).
    pub(super) _bytes: Option<OwnedSemaphorePermit>,
}

fn to_i64(value: u64, what: &str) -> rusqlite::Result<i64> {
    i64::try_from(value).map_err(|_| {
        rusqlite::Error::ToSqlConversionFailure(format!("{what} {value} exceeds i64").into())
    })
}

/// Event JSON bound as SQLite TEXT without re-validating UTF-8 (`EncodedEvent::json` is built from
/// a `String`).
struct JsonText<'a>(&'a [u8]);

impl ToSql for JsonText<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(ValueRef::Text(self.0)))
    }
}

/// The writer's connection and what the blocking commit job carries between groups.
pub(super) struct Writer {
    pub(super) db: Db,
    /// The exclusive lock on `LOCK_FILE_NAME`, held (never read) until the writer stops.
    pub(super) _lock: File,
    pub(super) wal_bytes_since_checkpoint: u64,
    /// WAL bytes written since the WAL last started over (`restart_wal`, or a reset SQLite made at
    /// a commit after a catch-up).
    pub(super) wal_bytes_since_restart: u64,
    /// Frames in the WAL after the last commit, as SQLite's WAL hook reports them; `None` when
    /// the hook could not be installed (no reset is then seen, and `restart_wal` bounds the WAL).
    wal_frames: Option<Arc<AtomicU64>>,
    /// `wal_frames` after the group before: fewer after a commit means the WAL started over.
    wal_frames_before: u64,
    /// Bytes of one WAL frame: a database page and the frame's 24-byte header.
    frame_bytes: u64,
    /// The `-wal` file's length when the writer last looked, once it wrote blocks ahead of SQLite
    /// there or found them written (`prefill_wal`); 0 after a truncation.
    wal_filled: u64,
    /// A prefill chunk could not be written (the disk full, say): the writer writes no more.
    prefill_off: bool,
    /// The last catch-up copied every frame of the WAL and no commit has run since: the salts
    /// of the WAL's header then. SQLite starts the WAL over at the next commit (unless a reader
    /// still reads from it), so a truncation due now waits for that commit and is needed only if
    /// it did not (`restart_wal_if_due`); and that commit started it over if the salts changed,
    /// which SQLite does at every start, even where the commit wrote as many frames as the WAL
    /// held (its frame count alone cannot show that reset).
    wal_copied_whole: Option<WalSalts>,
}

/// The `-wal` file of the database `db_path`.
fn wal_path(db_path: &std::path::Path) -> std::path::PathBuf {
    super::open::beside(db_path, "-wal")
}

/// The two salts of a WAL's header (bytes 16–23), which SQLite changes whenever it starts the WAL
/// over.
type WalSalts = [u8; 8];

/// The salts in the header of the `-wal` file beside `db_path`; `None` if it cannot be read (no
/// WAL yet, say).
fn read_wal_salts(db_path: &std::path::Path) -> Option<WalSalts> {
    let file = File::open(wal_path(db_path)).ok()?;
    let mut salts = [0u8; 8];
    file.read_exact_at(&mut salts, 16).ok()?;
    Some(salts)
}

/// What a commit did to the WAL (`Writer::wal_after_commit`).
struct WalAdvance {
    /// SQLite started the WAL over from its beginning at this commit.
    reset: bool,
    /// The bytes of the frames the commit wrote.
    bytes: u64,
}

impl Writer {
    /// The writer over its connection and its lock, nothing written yet.
    pub(super) fn new(mut db: Db, lock: File) -> Writer {
        let frames = Arc::new(AtomicU64::new(0));
        let hook_frames = Arc::clone(&frames);
        let installed = db.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: c_int| {
            hook_frames.store(u64::try_from(pages).unwrap_or(0), Ordering::Relaxed);
            Ok(())
        }));
        if let Err(e) = &installed {
            debug!(error = %e, "the WAL hook could not be installed; WAL resets go unseen");
        }
        // SQLite's default page size, should the pragma fail: it only scales the WAL bytes counted.
        let page_bytes = db
            .query_row("PRAGMA page_size", [], |r| r.get::<_, u32>(0))
            .map_or(4096, u64::from);
        Writer {
            db,
            _lock: lock,
            wal_bytes_since_checkpoint: 0,
            wal_bytes_since_restart: 0,
            wal_frames: installed.ok().map(|()| frames),
            wal_frames_before: 0,
            frame_bytes: page_bytes + WAL_FRAME_HEADER_BYTES,
            wal_filled: 0,
            prefill_off: false,
            wal_copied_whole: None,
        }
    }

    /// The `-wal` file length to write ahead to now (`SqliteConfig::wal_prefill_bytes`): SQLite's
    /// end of the WAL plus as many bytes as it wrote to the WAL since the open (at least
    /// `PREFILL_AHEAD_MIN_BYTES`), at most `wal_prefill_bytes` and `checkpoint_after_bytes`
    /// (past which SQLite starts the WAL over and reuses the blocks it wrote itself). So a store
    /// that writes little writes little ahead, and one that writes fast gets its WAL's blocks
    /// ahead of its commits. Only once that is a whole chunk past what the file had when the
    /// writer last looked, or it is the bound: each chunk is a sync, which a commit arriving
    /// meanwhile waits for (one per commit, as the writer first did, took more time from the
    /// commits than it saved them). `None` without the WAL hook (SQLite's end unknown), once
    /// poisoned, or after a chunk failed.
    fn prefill_wanted(&self, shared: &Shared) -> Option<u64> {
        if self.prefill_off || shared.poison.get().is_some() {
            return None;
        }
        let frames = self.wal_frames.as_ref()?.load(Ordering::Relaxed);
        let end = WAL_HEADER_BYTES.saturating_add(frames.saturating_mul(self.frame_bytes));
        let written = shared
            .counters
            .n_wal_bytes_committed
            .load(Ordering::Relaxed);
        let bound = shared
            .config
            .wal_prefill_bytes
            .min(shared.config.checkpoint_after_bytes);
        let wanted = end
            .saturating_add(written.max(PREFILL_AHEAD_MIN_BYTES))
            .min(bound);
        let due = wanted >= self.wal_filled.saturating_add(PREFILL_CHUNK_BYTES)
            || (wanted == bound && wanted > self.wal_filled);
        due.then_some(wanted)
    }

    /// After a commit: the WAL bytes it wrote (the frames it added, or with no WAL hook the
    /// events' bytes, `event_bytes`), and whether the WAL started over at it, which SQLite does at
    /// the first commit after a checkpoint copied all of it when no reader still reads from it:
    /// the WAL holds fewer frames than after the commit before, or, after a catch-up that copied
    /// it whole, its header's salts changed (`wal_copied_whole`; a group can write as many frames
    /// as the WAL held). Then the WAL is as short as one group again, and every frame in it is
    /// this commit's.
    fn wal_after_commit(&mut self, event_bytes: u64, db_path: &std::path::Path) -> WalAdvance {
        let salts_before = self.wal_copied_whole.take();
        let Some(frames) = &self.wal_frames else {
            return WalAdvance {
                reset: false,
                bytes: event_bytes,
            };
        };
        let now = frames.load(Ordering::Relaxed);
        let salts_changed = || {
            salts_before
                .is_some_and(|before| read_wal_salts(db_path).is_some_and(|salts| salts != before))
        };
        let reset = now < self.wal_frames_before || salts_changed();
        if !reset && now == self.wal_frames_before {
            // No page written (SQLite starts the WAL over only to write one): the next commit
            // that writes is the one that may start it over.
            self.wal_copied_whole = salts_before;
        }
        let added = if reset {
            now
        } else {
            now - self.wal_frames_before
        };
        self.wal_frames_before = now;
        WalAdvance {
            reset,
            bytes: added * self.frame_bytes,
        }
    }
}

/// The header SQLite writes before each page in the WAL.
const WAL_FRAME_HEADER_BYTES: u64 = 24;

/// The header SQLite writes at the start of the WAL.
const WAL_HEADER_BYTES: u64 = 32;

/// The most zeros one prefill chunk writes (and syncs) while the writer has nothing to commit: a
/// request that arrives meanwhile waits for it, about 1 ms here (64 chunks in 73–89 ms).
const PREFILL_CHUNK_BYTES: u64 = 1 << 20;

/// The writer keeps at least this much of the `-wal` file written ahead of SQLite's end of it,
/// less one chunk.
const PREFILL_AHEAD_MIN_BYTES: u64 = 2 << 20;

/// The writer task: owns the queue; one blocking commit job at a time, and at most one checkpoint
/// job beside it.
pub(super) async fn run_writer(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<Request>,
    writer: Writer,
) {
    let mut writer = Some(writer);
    let mut checkpointer = Checkpointer::default();
    let group_requests_max = shared.config.group_requests_max;
    // A group the commit job took from the queue but left to this task (it holds a close).
    let mut carried: Vec<Request> = Vec::new();
    loop {
        let mut group = if carried.is_empty() {
            if rx.is_empty()
                && let Some(wanted) = writer.as_ref().and_then(|w| w.prefill_wanted(&shared))
                && let Some(w) = writer.take()
            {
                writer = writer_job(&shared, w, "WAL prefill", move |shared, writer| {
                    prefill_wal(shared, writer, wanted);
                })
                .await;
                continue;
            }
            let Some(first) = rx.recv().await else {
                break;
            };
            let mut group = vec![first];
            take_queued(&mut rx, &mut group, group_requests_max);
            group
        } else {
            std::mem::take(&mut carried)
        };
        let close_idx = group.iter().position(|r| matches!(r.op, Op::Close));
        let after_close = close_idx.map(|idx| group.split_off(idx));
        if !group.is_empty() {
            match writer.take() {
                Some(w) => {
                    // The queue goes with the job, which takes the groups queued behind this one.
                    let job_shared = Arc::clone(&shared);
                    let job = tokio::task::spawn_blocking(move || {
                        commit_while_queued(&job_shared, w, checkpointer, rx, group)
                    });
                    match job.await {
                        Ok(burst) => {
                            rx = burst.rx;
                            checkpointer = burst.checkpointer;
                            carried = burst.next;
                            let w = catch_up_if_due(&shared, &mut checkpointer, burst.writer).await;
                            writer = match w {
                                Some(w) => restart_wal_if_due(&shared, &mut checkpointer, w).await,
                                None => None,
                            };
                            if let Some(w) = writer.as_mut() {
                                checkpointer.start_if_due(&shared, w);
                            }
                        }
                        // The group's waiters see their reply channels dropped, and the queue
                        // went with the job: later requests find it closed.
                        Err(e) => {
                            shared.poison(format!("the commit job failed: {e}"));
                            break;
                        }
                    }
                }
                None => {
                    let cause = shared
                        .poison
                        .get()
                        .cloned()
                        .unwrap_or_else(|| "the writer connection was lost".to_string());
                    answer_all(group, || StoreError::Poisoned {
                        cause: cause.clone(),
                    });
                }
            }
        }
        if let Some(mut rest) = after_close {
            // Close the connections (and release the lock) before answering the close.
            checkpointer.finish().await;
            drop(writer.take());
            let close = rest.remove(0);
            answer_all(rest, || StoreError::Closed);
            let _ = close.reply.send(Ok(()));
            break;
        }
    }
    debug!(path = %shared.db_path.display(), "session store writer stopped");
}

/// Moves requests queued behind `group`'s into it, up to `max` in all, without waiting.
fn take_queued(rx: &mut mpsc::Receiver<Request>, group: &mut Vec<Request>, max: usize) {
    group.reserve(rx.len().min(max.saturating_sub(group.len())));
    while group.len() < max {
        match rx.try_recv() {
            Ok(request) => group.push(request),
            Err(_) => break,
        }
    }
}

/// What a commit job hands back to the writer task.
struct Burst {
    writer: Writer,
    checkpointer: Checkpointer,
    rx: mpsc::Receiver<Request>,
    /// Requests taken from the queue and not committed: a group holding a close.
    next: Vec<Request>,
}

/// The commit job: commits `group`, then — as long as requests are queued, no close is among
/// them, and no catch-up or WAL restart is due — takes the next group from the queue and commits
/// it on the same blocking thread. Under load the writer thus goes from one commit to the next
/// without handing back to the writer task, which would wait for a tokio worker busy with agents
/// between every two groups (the disk idle meanwhile: the 10,000-agent burst ran at 0.56–0.62 of
/// the store's ceiling on two workers, 0.71–0.81 with the agents on threads of their own). When the
/// queue is empty the job ends, and the task waits for the next request; so the job never blocks
/// on the queue, and tokio's paused test clock never waits for it.
fn commit_while_queued(
    shared: &Arc<Shared>,
    mut writer: Writer,
    mut checkpointer: Checkpointer,
    mut rx: mpsc::Receiver<Request>,
    mut group: Vec<Request>,
) -> Burst {
    let group_requests_max = shared.config.group_requests_max;
    let next = loop {
        on_cpu(shared, || commit_group(shared, &mut writer, group));
        if shared.poison.get().is_some()
            || (checkpointer.catch_up_due
                && !checkpointer.is_running()
                && !checkpointer.another_pass(shared, &writer))
            || writer.wal_bytes_since_restart >= shared.config.wal_restart_after_bytes
        {
            // The writer task runs what is due between this group and the next.
            break Vec::new();
        }
        checkpointer.start_if_due(shared, &mut writer);
        let mut queued = Vec::new();
        take_queued(&mut rx, &mut queued, group_requests_max);
        if queued.is_empty() || queued.iter().any(|r| matches!(r.op, Op::Close)) {
            break queued;
        }
        group = queued;
    };
    Burst {
        writer,
        checkpointer,
        rx,
        next,
    }
}

fn answer_all(group: Vec<Request>, error: impl Fn() -> StoreError) {
    for request in group {
        let _ = request.reply.send(Err(error()));
    }
}

/// Runs `work` (a blocking job of the writer) and adds the CPU time its thread spent on it to
/// `writer_cpu_ns`: what the store's own work costs, apart from the runtime's.
fn on_cpu<T>(shared: &Shared, work: impl FnOnce() -> T) -> T {
    let cpu = || {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
    };
    let started = cpu();
    let result = work();
    shared
        .counters
        .writer_cpu_ns
        .fetch_add(cpu().saturating_sub(started), Ordering::Relaxed);
    result
}

/// Commits one group in one transaction, answers every request, then checkpoints if due. Any
/// failure poisons the store.
fn commit_group(shared: &Shared, writer: &mut Writer, group: Vec<Request>) {
    if let Some(cause) = shared.poison.get() {
        answer_all(group, || StoreError::Poisoned {
            cause: cause.clone(),
        });
        return;
    }
    shared.counters.n_groups.fetch_add(1, Ordering::SeqCst);
    let _span = tracing::debug_span!("store_commit", n_requests = group.len()).entered();
    let started = Instant::now();
    let mut n_events = 0u64;
    let mut n_bytes = 0u64;
    for request in &group {
        if let Op::Append { events, .. } = &request.op {
            n_events += events.len() as u64;
            n_bytes += events.iter().map(|e| e.json.len() as u64).sum::<u64>();
        }
    }
    let n_requests = group.len() as u64;
    match write_group(&mut writer.db, &group) {
        Ok(()) => {
            let c = &shared.counters;
            c.n_requests_committed
                .fetch_add(n_requests, Ordering::SeqCst);
            c.n_events_committed.fetch_add(n_events, Ordering::SeqCst);
            c.n_bytes_committed.fetch_add(n_bytes, Ordering::SeqCst);
            let mut deleted = Vec::new();
            for request in group {
                if let Op::Delete { id } = &request.op {
                    deleted.push(id.clone());
                }
                let _ = request.reply.send(Ok(()));
            }
            debug!(
                n_requests,
                n_events,
                n_bytes,
                commit_us = started.elapsed().as_micros() as u64,
                "group committed"
            );
            if !deleted.is_empty() {
                // The tombstones have done their job: the database now says "absent" itself.
                let mut sessions = shared.sessions();
                for id in deleted {
                    if matches!(sessions.slots.get(&id), Some(Slot::Deleted)) {
                        sessions.slots.remove(&id);
                        sessions.epoch += 1;
                    }
                }
            }
            let wal = writer.wal_after_commit(n_bytes, &shared.db_path);
            if wal.reset {
                c.n_wal_resets.fetch_add(1, Ordering::SeqCst);
                writer.wal_bytes_since_restart = 0;
            }
            c.n_wal_bytes_committed
                .fetch_add(wal.bytes, Ordering::SeqCst);
            writer.wal_bytes_since_checkpoint += wal.bytes;
            writer.wal_bytes_since_restart += wal.bytes;
        }
        Err(e) => {
            let cause = format!(
                "commit of {n_requests} requests ({n_events} events) failed: {}",
                describe(&e)
            );
            shared.poison(cause.clone());
            answer_all(group, || StoreError::Io {
                op: "commit",
                cause: cause.clone(),
            });
        }
    }
}

/// The group's statements in one `BEGIN IMMEDIATE … COMMIT`.
fn write_group(conn: &mut Connection, group: &[Request]) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut insert_event = tx.prepare_cached(
            "INSERT INTO events (session_id, seq, kind, json) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut insert_session =
            tx.prepare_cached("INSERT INTO sessions (id, created_at, header) VALUES (?1, ?2, ?3)")?;
        let mut delete_events = tx.prepare_cached("DELETE FROM events WHERE session_id = ?1")?;
        let mut delete_session = tx.prepare_cached("DELETE FROM sessions WHERE id = ?1")?;
        let mut insert_all = |id: &SessionId, events: &[EncodedEvent]| -> rusqlite::Result<()> {
            for event in events {
                insert_event.execute(params![
                    id.as_str(),
                    to_i64(event.seq, "seq")?,
                    event.kind,
                    JsonText(&event.json)
                ])?;
            }
            Ok(())
        };
        for request in group {
            match &request.op {
                Op::Append {
                    id,
                    materialize,
                    events,
                } => {
                    if let Some(m) = materialize {
                        insert_session.execute(params![id.as_str(), m.created_at, m.json])?;
                    }
                    insert_all(id, events)?;
                }
                Op::Delete { id } => {
                    delete_events.execute([id.as_str()])?;
                    delete_session.execute([id.as_str()])?;
                }
                Op::Close => {}
            }
        }
    }
    tx.commit()
}

/// WAL frames the catch-up may be left to copy between two groups (512 KiB of 4 KiB pages, a few
/// ms): a checkpoint that ended further behind the commits is followed by another pass beside them.
const CATCH_UP_FRAMES_MAX: u64 = 128;

/// Passes beside the commits after the first, at most, before the catch-up runs however far behind
/// they ended: commits that outpace the copying still get their catch-up, and the WAL its reset.
const CHECKPOINT_PASSES_MAX: u32 = 4;

/// The checkpoint job beside the commits; it hands its connection back when it finishes.
#[derive(Default)]
struct Checkpointer {
    running: Option<tokio::task::JoinHandle<Option<Db>>>,
    /// A checkpoint was started and its catch-up (`catch_up_if_due`) has not run yet.
    catch_up_due: bool,
    /// The WAL frames copied when the last pass ended (SQLite's `nCkpt`), written by the job.
    backfilled: Arc<AtomicU64>,
    /// Passes started since the catch-up became due, after the first.
    passes: u32,
}

impl Checkpointer {
    /// Starts a checkpoint if enough WAL was written since the last one started and none runs.
    fn start_if_due(&mut self, shared: &Arc<Shared>, writer: &mut Writer) {
        if writer.wal_bytes_since_checkpoint < shared.config.checkpoint_after_bytes
            || shared.poison.get().is_some()
            || self.is_running()
        {
            // Not due, or still copying the previous batch: a later group tries again.
            return;
        }
        writer.wal_bytes_since_checkpoint = 0;
        self.catch_up_due = true;
        self.passes = 0;
        self.spawn(shared);
    }

    /// Whether a checkpoint job is still running.
    fn is_running(&self) -> bool {
        self.running.as_ref().is_some_and(|job| !job.is_finished())
    }

    /// Starts a passive checkpoint beside the commits, on the finished job's connection (or a new
    /// one). Call only when none runs.
    fn spawn(&mut self, shared: &Arc<Shared>) {
        use futures::FutureExt;
        // Finished, so `now_or_never` cannot miss its output: the connection to reuse.
        let db = self
            .running
            .take()
            .and_then(|job| job.now_or_never())
            .and_then(Result::ok)
            .flatten();
        let shared = Arc::clone(shared);
        let backfilled = Arc::clone(&self.backfilled);
        self.running = Some(tokio::task::spawn_blocking(move || {
            on_cpu(&shared, || run_checkpoint(&shared, db, &backfilled))
        }));
    }

    /// With the catch-up due and no pass running: if the last pass ended more than
    /// `CATCH_UP_FRAMES_MAX` frames behind the commits (those made while it ran), starts another
    /// beside them and says so; the catch-up, which holds the commits, waits for a pass that ends
    /// close enough. A pass copies what was committed during the one before, so the distance
    /// shrinks while the copying outpaces the commits; after `CHECKPOINT_PASSES_MAX` passes the
    /// catch-up runs anyway. Without the WAL hook (the frames unknown) it never starts one.
    fn another_pass(&mut self, shared: &Arc<Shared>, writer: &Writer) -> bool {
        let Some(frames) = writer
            .wal_frames
            .as_ref()
            .map(|f| f.load(Ordering::Relaxed))
        else {
            return false;
        };
        let behind = frames.saturating_sub(self.backfilled.load(Ordering::Relaxed));
        if behind <= CATCH_UP_FRAMES_MAX || self.passes >= CHECKPOINT_PASSES_MAX {
            return false;
        }
        self.passes += 1;
        debug!(
            behind,
            passes = self.passes,
            "another checkpoint pass before the catch-up"
        );
        self.spawn(shared);
        true
    }

    /// Waits for a running checkpoint; its connection closes with it.
    async fn finish(&mut self) {
        if let Some(job) = self.running.take() {
            drop(job.await);
        }
    }
}

/// Once the passive checkpoint beside the commits has finished, copies what was committed while it
/// ran, between two groups, on the writer's connection (a passive checkpoint of the few frames it
/// left, and a sync of the database). The WAL is then copied whole, so SQLite starts it over at
/// the next commit (unless a reader still reads from it): the `-wal` file is reused from its
/// beginning instead of growing, and the truncation of `restart_wal`, which held the commits for
/// 0.6–0.7 s at every 64 MiB of events in a 100,000-agent `dsh sim` (it frees and syncs the
/// whole file), is not needed. The next group waits for the catch-up: the frames the last pass
/// left, and the sync of the pages it copied (the passes sync theirs, `sync_database_file`; before
/// they did, the catch-up synced every page of every pass, up to 170 ms at a million agents).
/// `None` if the blocking job itself failed (the store is poisoned).
async fn catch_up_if_due(
    shared: &Arc<Shared>,
    checkpointer: &mut Checkpointer,
    writer: Writer,
) -> Option<Writer> {
    if !checkpointer.catch_up_due
        || checkpointer.is_running()
        || shared.poison.get().is_some()
        || checkpointer.another_pass(shared, &writer)
    {
        return Some(writer);
    }
    checkpointer.catch_up_due = false;
    checkpointer.passes = 0;
    let held = Instant::now();
    let done = writer_job(shared, writer, "WAL catch-up", |shared, writer| {
        let started = Instant::now();
        match wal_checkpoint(&writer.db, "PASSIVE") {
            Ok((busy, n_wal_frames, n_checkpointed)) => {
                let whole = busy == 0 && n_checkpointed == n_wal_frames;
                writer.wal_copied_whole = whole.then(|| read_wal_salts(&shared.db_path)).flatten();
                if whole {
                    // Nothing is left to copy: a checkpoint started now would only stand in the
                    // way of the next commit's reset.
                    writer.wal_bytes_since_checkpoint = 0;
                }
                debug!(
                    busy,
                    n_wal_frames,
                    n_checkpointed,
                    catch_up_us = started.elapsed().as_micros() as u64,
                    "wal caught up"
                );
            }
            Err(e) => shared.poison(format!("wal catch-up failed: {}", describe(&e))),
        }
    })
    .await;
    shared.counters.n_catch_ups.fetch_add(1, Ordering::SeqCst);
    add_elapsed(&shared.counters.commits_held_ns, held);
    done
}

/// Runs `work` on the writer's state as one blocking job of the writer (`on_cpu`), between two
/// groups. `None` if the job itself failed (it panicked): the store is then poisoned, naming
/// `what`.
async fn writer_job(
    shared: &Arc<Shared>,
    writer: Writer,
    what: &'static str,
    work: impl FnOnce(&Shared, &mut Writer) + Send + 'static,
) -> Option<Writer> {
    let job_shared = Arc::clone(shared);
    let job = tokio::task::spawn_blocking(move || {
        let mut writer = writer;
        on_cpu(&job_shared, || work(&job_shared, &mut writer));
        writer
    });
    match job.await {
        Ok(writer) => Some(writer),
        Err(e) => {
            shared.poison(format!("the {what} job failed: {e}"));
            None
        }
    }
}

/// Writes zeros at the `-wal` file's end, towards `wanted` bytes and at most
/// `PREFILL_CHUNK_BYTES`, and syncs them, so that SQLite's commits overwrite blocks the file has
/// (`SqliteConfig::wal_prefill_bytes`). Only ever past the file's current length, which is at
/// least SQLite's end of the WAL, and only between two commit jobs: nothing SQLite wrote is
/// touched. A write that fails (the disk full) is cut back off and ends the prefilling; a sync
/// that fails poisons, as any sync's failure does (after it the kernel may have dropped dirty
/// pages, and SQLite's next sync of the file would report it too).
fn prefill_wal(shared: &Shared, writer: &mut Writer, wanted: u64) {
    let started = Instant::now();
    let path = wal_path(&shared.db_path);
    let file = match OpenOptions::new().write(true).open(&path) {
        Ok(file) => file,
        Err(e) => {
            debug!(error = %e, "the WAL cannot be opened for its prefill; none is written");
            writer.prefill_off = true;
            return;
        }
    };
    let len = match file.metadata() {
        Ok(meta) => meta.len(),
        Err(e) => {
            debug!(error = %e, "the WAL's length is unknown; no prefill is written");
            writer.prefill_off = true;
            return;
        }
    };
    if len >= wanted {
        writer.wal_filled = len;
        return;
    }
    let n = (wanted - len).min(PREFILL_CHUNK_BYTES);
    // `n` is at most PREFILL_CHUNK_BYTES (1 MiB), so it fits any usize.
    let zeros = vec![0u8; usize::try_from(n).unwrap_or(1 << 20)];
    if let Err(e) = file.write_all_at(&zeros, len) {
        let cut = file.set_len(len);
        warn!(
            error = %e,
            cut_back = cut.is_ok(),
            "writing the WAL's prefill failed; no more is written"
        );
        writer.prefill_off = true;
        return;
    }
    if let Err(e) = file.sync_data() {
        shared.poison(format!("syncing the WAL's prefill failed: {e}"));
        return;
    }
    writer.wal_filled = len + n;
    let c = &shared.counters;
    c.n_wal_prefill_bytes.fetch_add(n, Ordering::SeqCst);
    c.n_wal_prefill_chunks.fetch_add(1, Ordering::SeqCst);
    let took = add_elapsed(&c.wal_prefill_ns, started);
    debug!(
        from = len,
        bytes = n,
        prefill_us = took.as_micros() as u64,
        "wal prefilled"
    );
}

/// Adds the time since `since` to the nanoseconds in `counter`, and returns it.
fn add_elapsed(counter: &AtomicU64, since: Instant) -> std::time::Duration {
    let took = since.elapsed();
    let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    counter.fetch_add(ns, Ordering::Relaxed);
    took
}

/// Checkpoints the whole WAL and truncates it once `wal_restart_after_bytes` were written since
/// the last time, between two groups: the running passive checkpoint is waited for, and the next
/// group waits for this one (it copies what the passive ones have not, about one
/// `checkpoint_after_bytes` at most, and syncs). Not right after a catch-up that copied the whole
/// WAL: SQLite starts it over at the next commit, which the truncation would only make slower (it
/// also frees the blocks written ahead, `prefill_wal`); if that commit finds a reader in the way,
/// the truncation runs after it. Under commits that never pause, every catch-up was followed by a
/// truncation whenever a group ended past the bound. `None` if the blocking job itself failed (the
/// store is poisoned).
async fn restart_wal_if_due(
    shared: &Arc<Shared>,
    checkpointer: &mut Checkpointer,
    writer: Writer,
) -> Option<Writer> {
    if writer.wal_bytes_since_restart < shared.config.wal_restart_after_bytes
        || writer.wal_copied_whole.is_some()
        || shared.poison.get().is_some()
    {
        return Some(writer);
    }
    let held = Instant::now();
    checkpointer.finish().await;
    let done = writer_job(shared, writer, "WAL restart", restart_wal).await;
    add_elapsed(&shared.counters.commits_held_ns, held);
    done
}

/// `wal_checkpoint(TRUNCATE)` on the writer's connection, with no commit and no other checkpoint
/// running: every WAL frame is copied into the database, the database synced, and the WAL file
/// truncated, so the next commit starts it over. A reader still reading from the WAL after the busy
/// timeout makes it report busy: nothing is lost, and it is tried again one
/// `checkpoint_after_bytes` later. A failure poisons, as any checkpoint's does.
fn restart_wal(shared: &Shared, writer: &mut Writer) {
    let started = Instant::now();
    let result = wal_checkpoint(&writer.db, "TRUNCATE");
    match result {
        Ok((busy, n_wal_frames, n_checkpointed)) => {
            debug!(
                busy,
                n_wal_frames,
                n_checkpointed,
                restart_us = started.elapsed().as_micros() as u64,
                "wal truncated"
            );
            if busy == 0 {
                shared
                    .counters
                    .n_wal_restarts
                    .fetch_add(1, Ordering::SeqCst);
                writer.wal_bytes_since_restart = 0;
                writer.wal_bytes_since_checkpoint = 0;
                // The WAL is empty: the next commit's frames are no reset of SQLite's.
                writer.wal_frames_before = 0;
                // And the file too: its blocks are written ahead again.
                writer.wal_filled = 0;
            } else {
                writer.wal_bytes_since_restart = shared
                    .config
                    .wal_restart_after_bytes
                    .saturating_sub(shared.config.checkpoint_after_bytes);
            }
        }
        Err(e) => shared.poison(format!("wal truncation failed: {}", describe(&e))),
    }
}

/// `PRAGMA wal_checkpoint(mode)` on `db`; SQLite's answer: whether it was blocked (1) or not (0),
/// the frames in the WAL, and the frames now copied into the database.
fn wal_checkpoint(db: &Connection, mode: &'static str) -> rusqlite::Result<(i64, i64, i64)> {
    db.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
}

/// Syncs the database file's data, beside the commits. SQLite syncs it only in a checkpoint that
/// copies the WAL to its end, and beside the commits only the catch-up, which holds them, does
/// that: every page the passes copied before stayed dirty until then, and the catch-up's sync wrote
/// them all (130–140 ms at a million agents, for a catch-up of a dozen frames). Synced after each
/// pass, the catch-up's sync has only the pages it copied itself. Only a hint to the disk: the
/// file's content is SQLite's, and the catch-up still syncs what it copies.
fn sync_database_file(path: &std::path::Path) -> std::io::Result<()> {
    File::open(path)?.sync_data()
}

/// A passive checkpoint on the checkpoint connection (opened on first use, returned for reuse). A
/// failure poisons: the checkpoint's fsync of the database file is as much a sync as a commit's.
fn run_checkpoint(shared: &Shared, db: Option<Db>, backfilled: &AtomicU64) -> Option<Db> {
    let started = Instant::now();
    let db = match db {
        Some(db) => db,
        None => match super::open::open_checkpointer(&shared.db_path, shared.vfs.as_ref()) {
            Ok(db) => db,
            Err(e) => {
                shared.poison(format!(
                    "opening the checkpoint connection failed: {}",
                    describe(&e)
                ));
                return None;
            }
        },
    };
    let result = wal_checkpoint(&db, "PASSIVE");
    match result {
        Ok((busy, n_wal_frames, n_checkpointed)) => {
            shared.counters.n_checkpoints.fetch_add(1, Ordering::SeqCst);
            let copied = started.elapsed();
            if n_checkpointed > 0 {
                if let Err(e) = sync_database_file(&shared.db_path) {
                    // As a failed checkpoint: after a failed fsync the kernel may have dropped the
                    // pages it could not write, and a later fsync (the catch-up's) succeed anyway.
                    shared.poison(format!(
                        "syncing the database file after a checkpoint failed: {e}"
                    ));
                    return None;
                }
                shared
                    .counters
                    .n_database_syncs
                    .fetch_add(1, Ordering::SeqCst);
            }
            backfilled.store(
                u64::try_from(n_checkpointed).unwrap_or(0),
                Ordering::Relaxed,
            );
            debug!(
                busy,
                n_wal_frames,
                n_checkpointed,
                checkpoint_us = copied.as_micros() as u64,
                sync_us = (started.elapsed() - copied).as_micros() as u64,
                "wal checkpointed"
            );
            Some(db)
        }
        Err(e) => {
            shared.poison(format!("wal checkpoint failed: {}", describe(&e)));
            None
        }
    }
}

/// The writer's bounds and schedules that no store-level test can see deterministically: the group
/// bound (reachable only when a sender refills the slot the first receive freed, on another thread,
/// while the group is taken), the tombstones a committed delete clears, and when a WAL checkpoint
/// starts and what a close waits for. Each drives the writer's functions directly over a real
/// database, without the writer task. RELIABILITY.md §7 lists the mutants these pin.
#[cfg(test)]
mod tests {

    use std::path::Path;

    use super::super::open::open_writer;
    use super::super::{DB_FILE_NAME, LOCK_FILE_NAME, SqliteConfig, SqliteStore};
    use super::*;
    use crate::session::event::SessionHeader;

    /// A store's files in `dir` (made by opening and closing a store) and the writer's state over
    /// them, as `SqliteStore::open` builds it, with no writer task running.
    async fn parts(dir: &Path, config: SqliteConfig) -> (Arc<Shared>, Writer) {
        SqliteStore::open(dir, config.clone())
            .expect("open")
            .close()
            .await
            .expect("close");
        let db_path = dir.join(DB_FILE_NAME);
        let db = open_writer(&db_path, None).expect("open the writer connection");
        let lock = File::open(dir.join(LOCK_FILE_NAME)).expect("the lock file");
        let shared = Arc::new(Shared::new(dir, db_path, config, None));
        let writer = Writer::new(db, lock);
        (shared, writer)
    }

    /// `parts` with a checkpoint due after every commit (`checkpoint_after_bytes` 1).
    async fn parts_checkpointing_always(dir: &Path) -> (Arc<Shared>, Writer) {
        let config = SqliteConfig {
            checkpoint_after_bytes: 1,
            ..SqliteConfig::default()
        };
        parts(dir, config).await
    }

    /// The frames in the WAL after the last commit, as the WAL hook reported them.
    fn wal_frames(writer: &Writer) -> u64 {
        writer
            .wal_frames
            .as_ref()
            .map(|f| f.load(Ordering::Relaxed))
            .expect("the WAL hook is installed")
    }

    fn resets(shared: &Shared) -> u64 {
        shared.counters.n_wal_resets.load(Ordering::SeqCst)
    }

    fn sid(id: &str) -> SessionId {
        SessionId::new(id).expect("a valid session id")
    }

    fn request(op: Op) -> (Request, oneshot::Receiver<Result<(), StoreError>>) {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            op,
            reply,
            _bytes: None,
        };
        (request, answer)
    }

    /// An append of nothing: a request that commits (as part of its group) and writes no row.
    fn empty_append(id: &str) -> Op {
        Op::Append {
            id: sid(id),
            materialize: None,
            events: Vec::new(),
        }
    }

    /// Takes a first group of at most `first_max` requests from `rx` and runs one commit job on
    /// it, on tokio's blocking pool as the writer task does.
    async fn commit_job(
        shared: &Arc<Shared>,
        writer: Writer,
        checkpointer: Checkpointer,
        mut rx: mpsc::Receiver<Request>,
        first_max: usize,
    ) -> Burst {
        let mut first = Vec::new();
        take_queued(&mut rx, &mut first, first_max);
        let shared = Arc::clone(shared);
        tokio::task::spawn_blocking(move || {
            commit_while_queued(&shared, writer, checkpointer, rx, first)
        })
        .await
        .expect("the job ran")
    }

    /// A group takes at most `group_requests_max` requests even when more are queued: five
    /// requests with a bound of two commit as groups of 2, 2 and 1 (the last cut by the close
    /// behind it), though the queue holds all of them.
    #[tokio::test]
    async fn a_group_takes_at_most_group_requests_max_requests() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = SqliteConfig {
            group_requests_max: 2,
            ..SqliteConfig::default()
        };
        let (shared, writer) = parts(dir.path(), config).await;
        let (tx, rx) = mpsc::channel(16);
        let mut answers = Vec::new();
        for i in 0..5 {
            let (request, answer) = request(empty_append(&format!("s{i}")));
            tx.try_send(request).expect("room in the queue");
            answers.push(answer);
        }
        let (close, closed) = request(Op::Close);
        tx.try_send(close).expect("room in the queue");
        run_writer(Arc::clone(&shared), rx, writer).await;
        for answer in answers {
            assert_eq!(answer.await.expect("answered"), Ok(()));
        }
        assert_eq!(closed.await.expect("answered"), Ok(()));
        let c = &shared.counters;
        assert_eq!(c.n_groups.load(Ordering::SeqCst), 3);
        assert_eq!(c.n_requests_committed.load(Ordering::SeqCst), 5);
    }

    /// One commit job commits every group queued behind its own while there is one, on its
    /// thread, and hands back the first group that holds a close without committing any of it:
    /// with a bound of two, five appends and a close queued give groups of 2 and 2 in the job,
    /// and `[append, close]` back to the writer task, the queue empty.
    #[tokio::test]
    async fn a_commit_job_commits_the_groups_queued_behind_its_own_up_to_a_close() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = SqliteConfig {
            group_requests_max: 2,
            ..SqliteConfig::default()
        };
        let (shared, writer) = parts(dir.path(), config).await;
        let (tx, rx) = mpsc::channel(16);
        let mut answers = Vec::new();
        for i in 0..5 {
            let (request, answer) = request(empty_append(&format!("s{i}")));
            tx.try_send(request).expect("room in the queue");
            answers.push(answer);
        }
        let (close, _closed) = request(Op::Close);
        tx.try_send(close).expect("room in the queue");
        let burst = commit_job(&shared, writer, Checkpointer::default(), rx, 2).await;
        let kinds: Vec<bool> = burst
            .next
            .iter()
            .map(|r| matches!(r.op, Op::Close))
            .collect();
        assert_eq!(kinds, vec![false, true]);
        assert!(burst.rx.is_empty());
        let c = &shared.counters;
        assert_eq!(c.n_groups.load(Ordering::SeqCst), 2);
        assert_eq!(c.n_requests_committed.load(Ordering::SeqCst), 4);
        for answer in answers.drain(..4) {
            assert_eq!(answer.await.expect("answered"), Ok(()));
        }
    }

    /// A commit job ends after the group that makes a WAL restart due, though more is queued: the
    /// writer task restarts the WAL between that group and the next.
    #[tokio::test]
    async fn a_commit_job_ends_when_a_wal_restart_is_due() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = SqliteConfig {
            group_requests_max: 1,
            wal_restart_after_bytes: 1,
            ..SqliteConfig::default()
        };
        let (shared, writer) = parts(dir.path(), config).await;
        let (tx, rx) = mpsc::channel(16);
        for i in 0..3u64 {
            let id = format!("s{i}");
            let (request, _answer) = request(Op::Append {
                id: sid(&id),
                materialize: Some(Materialize {
                    created_at: 0,
                    json: "{}".to_string(),
                }),
                events: vec![EncodedEvent {
                    seq: 0,
                    kind: "x".into(),
                    json: bytes::Bytes::from_static(b"{}"),
                }],
            });
            tx.try_send(request).expect("room in the queue");
        }
        let burst = commit_job(&shared, writer, Checkpointer::default(), rx, 1).await;
        assert!(burst.next.is_empty());
        assert_eq!(burst.rx.len(), 2);
        assert_eq!(shared.counters.n_groups.load(Ordering::SeqCst), 1);
    }

    /// A committed delete removes its session's tombstone (the map loses the entry, so its size
    /// follows the sessions in use) and bumps the epoch once per tombstone removed (so that a
    /// `touch` that read the database before the delete committed reads again). A session deleted
    /// and created again before the delete committed keeps its new slot, and the epoch does not
    /// move for it.
    #[tokio::test]
    async fn a_committed_delete_clears_its_tombstone_and_bumps_the_epoch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (shared, mut writer) = parts(dir.path(), SqliteConfig::default()).await;
        {
            let mut sessions = shared.sessions();
            sessions.slots.insert(sid("gone"), Slot::Deleted);
            let header = SessionHeader::new(sid("again"), 7);
            sessions
                .slots
                .insert(sid("again"), Slot::Registered { header });
            sessions.epoch = 5;
        }
        let (gone, gone_answer) = request(Op::Delete { id: sid("gone") });
        let (again, again_answer) = request(Op::Delete { id: sid("again") });
        let (append, append_answer) = request(empty_append("other"));
        commit_group(&shared, &mut writer, vec![gone, again, append]);
        assert_eq!(gone_answer.await.expect("answered"), Ok(()));
        assert_eq!(again_answer.await.expect("answered"), Ok(()));
        assert_eq!(append_answer.await.expect("answered"), Ok(()));
        let sessions = shared.sessions();
        assert!(!sessions.slots.contains_key(&sid("gone")));
        assert!(matches!(
            sessions.slots.get(&sid("again")),
            Some(Slot::Registered { .. })
        ));
        assert_eq!(sessions.slots.len(), 1);
        assert_eq!(sessions.epoch, 6);
    }

    /// A checkpoint starts once exactly `checkpoint_after_bytes` of WAL were written since the last
    /// one started, not one byte earlier, and never on a poisoned store. Starting one resets the
    /// count; not starting leaves it.
    #[tokio::test]
    async fn a_checkpoint_starts_at_exactly_checkpoint_after_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = SqliteConfig {
            checkpoint_after_bytes: 100,
            ..SqliteConfig::default()
        };
        let (shared, mut writer) = parts(dir.path(), config).await;
        let mut checkpointer = Checkpointer::default();
        writer.wal_bytes_since_checkpoint = 99;
        checkpointer.start_if_due(&shared, &mut writer);
        assert!(checkpointer.running.is_none());
        assert_eq!(writer.wal_bytes_since_checkpoint, 99);
        writer.wal_bytes_since_checkpoint = 100;
        checkpointer.start_if_due(&shared, &mut writer);
        assert!(checkpointer.running.is_some());
        assert_eq!(writer.wal_bytes_since_checkpoint, 0);
        checkpointer.finish().await;
        assert_eq!(shared.counters.n_checkpoints.load(Ordering::SeqCst), 1);

        shared.poison("a test poisons the store".to_string());
        writer.wal_bytes_since_checkpoint = 1_000;
        checkpointer.start_if_due(&shared, &mut writer);
        assert!(checkpointer.running.is_none());
        assert_eq!(writer.wal_bytes_since_checkpoint, 1_000);
    }

    /// A checkpoint beside the commits that copied pages into the database file syncs that file
    /// itself, so the catch-up that holds the commits has only its own pages to sync; with nothing
    /// in the WAL there is nothing to sync.
    #[tokio::test]
    async fn a_checkpoint_that_copied_pages_syncs_the_database_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (shared, mut writer) = parts(dir.path(), SqliteConfig::default()).await;
        let backfilled = AtomicU64::new(0);
        let syncs = |shared: &Shared| shared.counters.n_database_syncs.load(Ordering::SeqCst);
        let db = run_checkpoint(&shared, None, &backfilled);
        assert!(db.is_some());
        assert_eq!(backfilled.load(Ordering::Relaxed), 0, "an empty WAL");
        assert_eq!(syncs(&shared), 0);

        commit_events(&shared, &mut writer, "a", 0, 8);
        let db = run_checkpoint(&shared, db, &backfilled);
        assert!(db.is_some());
        assert!(backfilled.load(Ordering::Relaxed) > 0, "pages were copied");
        assert_eq!(syncs(&shared), 1);
        assert_eq!(shared.counters.n_checkpoints.load(Ordering::SeqCst), 2);
        assert_eq!(shared.poison.get(), None);
    }

    /// One group of one append of `n` events to `id` (created by the first), committed directly.
    fn commit_events(shared: &Shared, writer: &mut Writer, id: &str, first_seq: u64, n: u64) {
        let materialize = (first_seq == 0).then(|| Materialize {
            created_at: 1,
            json: format!(r#"{{"type":"session","id":"{id}"}}"#),
        });
        let events = (first_seq..first_seq + n)
            .map(|seq| EncodedEvent {
                seq,
                kind: "x".into(),
                json: bytes::Bytes::from(format!(r#"{{"seq":{seq},"pad":"{}"}}"#, "p".repeat(900))),
            })
            .collect();
        let (request, _answer) = request(Op::Append {
            id: sid(id),
            materialize,
            events,
        });
        commit_group(shared, writer, vec![request]);
        assert_eq!(shared.poison.get(), None);
    }

    /// A passive checkpoint that ended behind the commits (here: a reader held it back, as commits
    /// made while it ran do) leaves the WAL to grow: the next commits append to it. Its catch-up
    /// copies the rest, and SQLite starts the WAL over at the next commit: the reset is counted, the
    /// frames drop, and the count toward a truncation starts again; a truncation due between the
    /// catch-up and that commit is left to it. A group that writes no page is no reset. The
    /// catch-up is due once per started checkpoint, only once that one finished, never on a
    /// poisoned store.
    #[tokio::test]
    async fn the_catch_up_after_a_checkpoint_lets_the_next_commit_start_the_wal_over() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (shared, writer) = parts_checkpointing_always(dir.path()).await;
        let mut checkpointer = Checkpointer::default();
        // Nothing started: no catch-up.
        let mut writer = catch_up_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        commit_events(&shared, &mut writer, "a", 0, 20);
        let after_first = wal_frames(&writer);
        assert!(after_first > 0);
        // A group that writes no page leaves the WAL as it was: no reset.
        let (empty, _answer) = request(empty_append("a"));
        commit_group(&shared, &mut writer, vec![empty]);
        assert_eq!(wal_frames(&writer), after_first);
        assert_eq!(resets(&shared), 0);
        let reader = Connection::open(dir.path().join(DB_FILE_NAME)).expect("a reader");
        reader.execute_batch("BEGIN").expect("begin");
        let n: i64 = reader
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .expect("a read");
        assert_eq!(n, 20);
        commit_events(&shared, &mut writer, "a", 20, 20);
        checkpointer.start_if_due(&shared, &mut writer);
        assert!(checkpointer.catch_up_due);
        checkpointer.finish().await;
        reader.execute_batch("COMMIT").expect("end the read");
        // The checkpoint stopped at the reader's snapshot: the WAL keeps growing.
        commit_events(&shared, &mut writer, "a", 40, 20);
        let grown = wal_frames(&writer);
        assert!(grown > after_first, "{grown} frames after {after_first}");
        assert_eq!(resets(&shared), 0);

        let mut writer = catch_up_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        assert!(!checkpointer.catch_up_due);
        assert!(
            writer.wal_copied_whole.is_some(),
            "no reader: the catch-up copied all"
        );
        // A truncation due now waits for that commit, which starts the WAL over itself.
        let bound = shared.config.wal_restart_after_bytes;
        writer.wal_bytes_since_restart = bound;
        let mut writer = restart_wal_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        assert_eq!(shared.counters.n_wal_restarts.load(Ordering::SeqCst), 0);
        commit_events(&shared, &mut writer, "a", 60, 1);
        assert_eq!(resets(&shared), 1);
        assert_eq!(writer.wal_copied_whole, None);
        let restarted = wal_frames(&writer);
        assert!(
            restarted < after_first,
            "{restarted} frames after the reset"
        );
        // Counted again from the reset: the few frames of the one commit since.
        assert!(
            writer.wal_bytes_since_restart < bound,
            "{}",
            writer.wal_bytes_since_restart
        );
        assert_eq!(shared.poison.get(), None);

        // A truncation empties the WAL too, and is counted as one: the commit after it is no reset.
        writer.wal_bytes_since_restart = shared.config.wal_restart_after_bytes;
        let mut writer = restart_wal_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        commit_events(&shared, &mut writer, "a", 61, 1);
        assert_eq!(shared.counters.n_wal_restarts.load(Ordering::SeqCst), 1);
        assert_eq!(resets(&shared), 1);

        // Due only once the started checkpoint finished; never when poisoned.
        let (release, released) = std::sync::mpsc::channel::<()>();
        let mut checkpointer = Checkpointer {
            running: Some(tokio::task::spawn_blocking(move || {
                let _ = released.recv();
                None
            })),
            catch_up_due: true,
            ..Checkpointer::default()
        };
        let writer = catch_up_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        assert!(checkpointer.catch_up_due);
        release.send(()).expect("the job waits");
        checkpointer.finish().await;
        shared.poison("a test poisons the store".to_string());
        let _writer = catch_up_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        assert!(checkpointer.catch_up_due);
    }

    /// A commit after a catch-up that copied the WAL whole starts it over even where it writes more
    /// frames than the WAL held, so its frame count rises: the header's new salts show the reset,
    /// and all its frames are counted as written. A group that writes no page before it leaves
    /// that to the next. A commit after it that appends is no reset.
    #[tokio::test]
    async fn a_reset_is_seen_by_the_wal_header_when_the_commit_outgrows_the_wal_it_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (shared, mut writer) = parts_checkpointing_always(dir.path()).await;
        commit_events(&shared, &mut writer, "a", 0, 1);
        let small = wal_frames(&writer);
        let mut checkpointer = Checkpointer::default();
        checkpointer.start_if_due(&shared, &mut writer);
        checkpointer.finish().await;
        let mut writer = catch_up_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        let salts = writer
            .wal_copied_whole
            .expect("copied whole, the salts read");
        assert_eq!(writer.wal_bytes_since_checkpoint, 0, "nothing left to copy");
        let (empty, _answer) = request(empty_append("a"));
        commit_group(&shared, &mut writer, vec![empty]);
        assert_eq!(resets(&shared), 0);
        assert_eq!(writer.wal_copied_whole, Some(salts));
        let wal_bytes = || shared.counters.n_wal_bytes_committed.load(Ordering::SeqCst);
        let before = wal_bytes();
        commit_events(&shared, &mut writer, "a", 1, 200);
        let big = wal_frames(&writer);
        assert!(
            big > small,
            "{big} frames after {small}: the count alone shows no reset"
        );
        assert_eq!(resets(&shared), 1);
        assert_ne!(read_wal_salts(&shared.db_path), Some(salts));
        assert_eq!(wal_bytes() - before, big * writer.frame_bytes);
        assert_eq!(writer.wal_bytes_since_restart, big * writer.frame_bytes);
        assert_eq!(writer.wal_copied_whole, None);
        commit_events(&shared, &mut writer, "a", 201, 1);
        assert_eq!(resets(&shared), 1);
        assert_eq!(shared.poison.get(), None);
    }

    /// A prefill chunk the disk cannot take ends the prefilling and nothing else: here the `-wal`
    /// file is `/dev/full`, whose every write fails with ENOSPC, as a full disk's does. Nothing is
    /// counted as written ahead, the store is not poisoned (its commits go on), and no prefill is
    /// wanted again. A working WAL is then written ahead as before.
    #[tokio::test]
    async fn a_prefill_chunk_the_disk_cannot_take_ends_the_prefilling() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (shared, mut writer) = parts(dir.path(), SqliteConfig::default()).await;
        commit_events(&shared, &mut writer, "a", 0, 1);
        let wanted = writer
            .prefill_wanted(&shared)
            .expect("a fresh WAL wants its blocks ahead");
        assert!(wanted >= PREFILL_CHUNK_BYTES, "{wanted}");

        let full = tempfile::tempdir().expect("tempdir");
        assert!(Path::new("/dev/full").exists(), "this test needs /dev/full");
        std::os::unix::fs::symlink("/dev/full", full.path().join(format!("{DB_FILE_NAME}-wal")))
            .expect("a symlink");
        let on_full = Shared::new(
            full.path(),
            full.path().join(DB_FILE_NAME),
            SqliteConfig::default(),
            None,
        );
        prefill_wal(&on_full, &mut writer, wanted);
        assert!(writer.prefill_off);
        let c = &on_full.counters;
        assert_eq!(c.n_wal_prefill_bytes.load(Ordering::SeqCst), 0);
        assert_eq!(c.n_wal_prefill_chunks.load(Ordering::SeqCst), 0);
        assert_eq!(on_full.poison.get(), None);
        assert_eq!(writer.prefill_wanted(&shared), None);
        commit_events(&shared, &mut writer, "a", 1, 1);
        assert_eq!(shared.poison.get(), None);

        writer.prefill_off = false;
        let wanted = writer.prefill_wanted(&shared).expect("wanted again");
        prefill_wal(&shared, &mut writer, wanted);
        assert_eq!(
            shared.counters.n_wal_prefill_chunks.load(Ordering::SeqCst),
            1
        );
        let wal = wal_path(&shared.db_path);
        let len = std::fs::metadata(&wal).expect("the WAL").len();
        assert_eq!(writer.wal_filled, len);
        assert!(!writer.prefill_off);
    }

    /// A checkpoint that ended more than `CATCH_UP_FRAMES_MAX` frames behind the commits (a reader
    /// held it back, as commits made while it ran do) is followed by another pass beside the
    /// commits, not by the catch-up that would hold them; once a pass ended close enough, the
    /// catch-up runs. The commit job hands back to the writer task only then. After
    /// `CHECKPOINT_PASSES_MAX` passes the catch-up runs however far behind the last one ended.
    #[tokio::test]
    async fn a_checkpoint_far_behind_the_commits_gets_another_pass_before_the_catch_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (shared, mut writer) = parts_checkpointing_always(dir.path()).await;
        let checkpoints = |shared: &Shared| shared.counters.n_checkpoints.load(Ordering::SeqCst);
        let mut checkpointer = Checkpointer::default();
        commit_events(&shared, &mut writer, "a", 0, 20);
        let reader = Connection::open(dir.path().join(DB_FILE_NAME)).expect("a reader");
        reader.execute_batch("BEGIN").expect("begin");
        let _: i64 = reader
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .expect("a read");
        // ~1 MB of events behind the reader's snapshot: far more than the catch-up may copy.
        commit_events(&shared, &mut writer, "a", 20, 1_000);
        checkpointer.start_if_due(&shared, &mut writer);
        while checkpointer.is_running() {
            tokio::task::yield_now().await;
        }
        reader.execute_batch("COMMIT").expect("end the read");
        let frames = wal_frames(&writer);
        let behind = frames - checkpointer.backfilled.load(Ordering::Relaxed);
        assert!(behind > CATCH_UP_FRAMES_MAX, "{behind} frames behind");

        let writer = catch_up_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        assert!(checkpointer.catch_up_due, "the catch-up waits");
        assert_eq!(checkpointer.passes, 1);
        while checkpointer.is_running() {
            tokio::task::yield_now().await;
        }
        assert_eq!(checkpoints(&shared), 2);
        assert_eq!(checkpointer.backfilled.load(Ordering::Relaxed), frames);
        // The second pass copied everything: the catch-up runs now.
        let mut writer = catch_up_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        assert!(!checkpointer.catch_up_due);
        assert_eq!(checkpointer.passes, 0);

        // The commit job, too, goes on beside a pass and hands back for the catch-up.
        checkpointer.catch_up_due = true;
        checkpointer.backfilled.store(0, Ordering::Relaxed);
        // The catch-up started the WAL over: ~1 MB more puts the commits far ahead again.
        commit_events(&shared, &mut writer, "a", 1_020, 1_000);
        let (tx, rx) = mpsc::channel(4);
        let (first, _answer) = request(empty_append("a"));
        tx.try_send(first).expect("room in the queue");
        let (second, _answer) = request(empty_append("a"));
        tx.try_send(second).expect("room in the queue");
        let burst = commit_job(&shared, writer, checkpointer, rx, 1).await;
        // Both groups committed: a pass started instead of a hand-back after the first.
        assert_eq!(burst.checkpointer.passes, 1);
        assert!(burst.rx.is_empty());
        let (mut writer, mut checkpointer) = (burst.writer, burst.checkpointer);

        // At the bound, the catch-up runs however far behind.
        checkpointer.finish().await;
        checkpointer.catch_up_due = true;
        checkpointer.passes = CHECKPOINT_PASSES_MAX;
        checkpointer.backfilled.store(0, Ordering::Relaxed);
        commit_events(&shared, &mut writer, "b", 0, 1);
        let _writer = catch_up_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        assert!(!checkpointer.catch_up_due);
        assert_eq!(shared.poison.get(), None);
    }

    /// A WAL restart starts at exactly `wal_restart_after_bytes` and resets the count; below it, or
    /// on a poisoned store, nothing happens and the count stays.
    #[tokio::test]
    async fn a_wal_restart_starts_at_exactly_wal_restart_after_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = SqliteConfig {
            wal_restart_after_bytes: 100,
            ..SqliteConfig::default()
        };
        let (shared, mut writer) = parts(dir.path(), config).await;
        let mut checkpointer = Checkpointer::default();
        let restarts = |shared: &Arc<Shared>| shared.counters.n_wal_restarts.load(Ordering::SeqCst);
        writer.wal_bytes_since_restart = 99;
        let mut writer = restart_wal_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        assert_eq!((restarts(&shared), writer.wal_bytes_since_restart), (0, 99));
        writer.wal_bytes_since_restart = 100;
        let mut writer = restart_wal_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        assert_eq!((restarts(&shared), writer.wal_bytes_since_restart), (1, 0));

        shared.poison("a test poisons the store".to_string());
        writer.wal_bytes_since_restart = 1_000;
        let writer = restart_wal_if_due(&shared, &mut checkpointer, writer)
            .await
            .expect("a writer");
        assert_eq!(
            (restarts(&shared), writer.wal_bytes_since_restart),
            (1, 1_000)
        );
    }

    /// While a checkpoint runs, a due one waits (the count of WAL bytes stays); once it finished,
    /// the next due group starts one.
    #[tokio::test]
    async fn a_running_checkpoint_defers_the_next_and_a_finished_one_does_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = SqliteConfig {
            checkpoint_after_bytes: 100,
            ..SqliteConfig::default()
        };
        let (shared, mut writer) = parts(dir.path(), config).await;
        let (release, released) = std::sync::mpsc::channel::<()>();
        let mut checkpointer = Checkpointer {
            running: Some(tokio::task::spawn_blocking(move || {
                let _ = released.recv();
                None
            })),
            catch_up_due: false,
            ..Checkpointer::default()
        };
        writer.wal_bytes_since_checkpoint = 100;
        checkpointer.start_if_due(&shared, &mut writer);
        assert_eq!(writer.wal_bytes_since_checkpoint, 100);

        release.send(()).expect("the job waits");
        // Wait (not a timed assertion) until the job's thread has returned.
        while checkpointer
            .running
            .as_ref()
            .is_some_and(|job| !job.is_finished())
        {
            tokio::task::yield_now().await;
        }
        checkpointer.start_if_due(&shared, &mut writer);
        assert_eq!(writer.wal_bytes_since_checkpoint, 0);
        checkpointer.finish().await;
        assert_eq!(shared.counters.n_checkpoints.load(Ordering::SeqCst), 1);
    }

    /// `finish` waits for the running checkpoint to end (its connection closes with it): afterwards
    /// nothing runs and the checkpoint it waited for has counted itself.
    #[tokio::test]
    async fn finish_waits_for_the_running_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (shared, mut writer) = parts_checkpointing_always(dir.path()).await;
        let mut checkpointer = Checkpointer::default();
        writer.wal_bytes_since_checkpoint = 1;
        checkpointer.start_if_due(&shared, &mut writer);
        checkpointer.finish().await;
        assert!(checkpointer.running.is_none());
        assert_eq!(shared.counters.n_checkpoints.load(Ordering::SeqCst), 1);
    }
}

//! Reading stored sessions for the commands that only look (`sessions`, `show`, `check`, `export`):
//! open the store only if one exists, and read a target that is either a session id or a file of
//! DSH v0 JSON lines; and `Opened`, a store of either backend (`--store` / `DSH_STORE`). Nothing
//! here writes: a SQLite store is opened with `SqliteStore::open_read_only`
//! (SQLite's read-only mode, which never checkpoints nor deletes the `-wal` and `-shm` a crash left,
//! and works on a store the user can only read), sessions are read with `SessionStore::inspect`
//! (never `load`, which would append repair closers), and a missing data directory is not created.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use dsh::SessionId;
use dsh::limits::Limits;
use dsh::session::Event;
use dsh::session::event::SessionHeader;
use dsh::session::invariant;
use dsh::session::repair::interrupted_turn_closers;
use dsh::session::store::jsonl::{ImportOptions, import_with};
use dsh::session::store::postgres::{PostgresConfig, PostgresStore};
use dsh::session::store::sqlite::{DB_FILE_NAME, SqliteConfig, SqliteStore, Survey};
use dsh::session::store::{SessionStore, StoreError};

use crate::config::StoreUrl;
use crate::{CliError, Config};

/// An open store of either backend (`--store` / `DSH_STORE`, `Config::store_url`).
#[derive(Clone)]
pub enum Opened {
    /// The SQLite store of a directory.
    Sqlite(Arc<SqliteStore>),
    /// A PostgreSQL database shared by several nodes.
    Postgres(Arc<PostgresStore>),
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Opened::Sqlite(s) => s.fmt(f),
            Opened::Postgres(s) => s.fmt(f),
        }
    }
}

impl std::ops::Deref for Opened {
    type Target = dyn SessionStore;

    fn deref(&self) -> &(dyn SessionStore + 'static) {
        match self {
            Opened::Sqlite(s) => s.as_ref(),
            Opened::Postgres(s) => s.as_ref(),
        }
    }
}

impl Opened {
    /// The store as the runtime sees it.
    pub fn store(&self) -> &dyn SessionStore {
        match self {
            Opened::Sqlite(s) => s.as_ref(),
            Opened::Postgres(s) => s.as_ref(),
        }
    }

    /// The store, shared, for a host.
    pub fn shared(&self) -> Arc<dyn SessionStore> {
        match self {
            Opened::Sqlite(s) => Arc::clone(s) as Arc<dyn SessionStore>,
            Opened::Postgres(s) => Arc::clone(s) as Arc<dyn SessionStore>,
        }
    }

    /// Why the whole store refuses writes, if it does. A PostgreSQL store never does as a whole
    /// (a failed commit poisons only its sessions).
    pub fn poisoned(&self) -> Option<String> {
        match self {
            Opened::Sqlite(s) => s.poisoned().map(str::to_string),
            Opened::Postgres(_) => None,
        }
    }

    /// (commit groups, requests committed) so far.
    pub fn commit_counts(&self) -> (u64, u64) {
        match self {
            Opened::Sqlite(s) => {
                let stats = s.stats();
                (stats.n_groups, stats.n_requests_committed)
            }
            Opened::Postgres(s) => {
                let stats = s.stats();
                (stats.n_groups, stats.n_requests_committed)
            }
        }
    }

    /// Every readable session, and the ones that cannot be read (SQLite's `survey`; a PostgreSQL
    /// listing reports no damaged session).
    ///
    /// # Errors
    /// The store's failure to list.
    pub async fn survey(&self) -> Result<Survey, StoreError> {
        match self {
            Opened::Sqlite(s) => s.survey().await,
            Opened::Postgres(s) => Ok(Survey {
                sessions: s.list().await?,
                damaged: Vec::new(),
            }),
        }
    }

    /// Commits what is queued and closes the store (a PostgreSQL store releases its leases).
    ///
    /// # Errors
    /// The store's failure to close.
    pub async fn close(&self) -> Result<(), StoreError> {
        match self {
            Opened::Sqlite(s) => s.close().await,
            Opened::Postgres(s) => s.close().await,
        }
    }
}

/// The PostgreSQL store's settings from the environment: `DSH_NODE_ID` (this node's id in the
/// lease table; default `node-PID-RANDOM`) and `DSH_LEASE_TTL_MS` (SPEC §14 `lease_ttl`, default
/// 10,000; at least 300).
///
/// # Errors
/// `CliError::Usage` for a value that is not one.
pub fn postgres_config() -> Result<PostgresConfig, CliError> {
    let mut config = PostgresConfig::default();
    if let Ok(node) = std::env::var("DSH_NODE_ID") {
        let ok = !node.is_empty()
            && node.len() <= 128
            && node
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !ok {
            return Err(CliError::Usage(
                "DSH_NODE_ID: 1-128 characters of A-Z a-z 0-9 - _ .".to_string(),
            ));
        }
        config.node_id = node;
    }
    if let Ok(ttl) = std::env::var("DSH_LEASE_TTL_MS") {
        match ttl.parse::<u64>() {
            Ok(ms) if ms >= 300 => config.lease_ttl = std::time::Duration::from_millis(ms),
            _ => {
                return Err(CliError::Usage(format!(
                    "DSH_LEASE_TTL_MS: {ttl:?} is not a number of milliseconds of at least 300"
                )));
            }
        }
    }
    Ok(config)
}

/// Opens a PostgreSQL store for this command.
async fn open_postgres(url: &str) -> Result<Opened, CliError> {
    PostgresStore::open(url, postgres_config()?)
        .await
        .map(|s| Opened::Postgres(Arc::new(s)))
        .map_err(|e| CliError::Failed(format!("cannot open the PostgreSQL store: {e}")))
}

/// Opens the configured store for reading, if one is there; `None` when there is none (so a
/// read-only command leaves no directory behind). Reading needs no lock, so it works while a
/// `chat` or `run` holds the store. A PostgreSQL store is always there (opening it migrates its
/// schema if needed; nothing else is written).
///
/// # Errors
/// `CliError::Usage` for a bad `--store`; `CliError::Failed` when a store is there but cannot be
/// opened.
pub async fn open_existing(config: &Config) -> Result<Option<Opened>, CliError> {
    let dir = match config.store_url()? {
        StoreUrl::Postgres(url) => return open_postgres(&url).await.map(Some),
        StoreUrl::Sqlite(dir) => dir,
    };
    if !dir.join(DB_FILE_NAME).is_file() {
        if dir.exists() && !dir.is_dir() {
            return Err(CliError::Failed(format!(
                "the data directory {} is not a directory",
                dir.display()
            )));
        }
        return Ok(None);
    }
    SqliteStore::open_read_only(&dir, SqliteConfig::default())
        .map(|s| Some(Opened::Sqlite(Arc::new(s))))
        .map_err(|e| CliError::Failed(format!("cannot open the store in {}: {e}", dir.display())))
}

/// Opens (creating if needed) the configured store.
///
/// # Errors
/// `CliError::Usage` for a bad `--store`; `CliError::Failed` when the store cannot be opened.
pub async fn open(config: &Config) -> Result<Opened, CliError> {
    match config.store_url()? {
        StoreUrl::Postgres(url) => open_postgres(&url).await,
        StoreUrl::Sqlite(dir) => SqliteStore::open(&dir, SqliteConfig::default())
            .map(|s| Opened::Sqlite(Arc::new(s)))
            .map_err(|e| {
                CliError::Failed(format!("cannot open the store in {}: {e}", dir.display()))
            }),
    }
}

/// Closes a store, reporting a failure as a `CliError`.
///
/// # Errors
/// `CliError::Failed` when the store did not close cleanly.
pub async fn close(store: Opened) -> Result<(), CliError> {
    store
        .close()
        .await
        .map_err(|e| CliError::Failed(format!("closing the store: {e}")))
}

/// A session read for inspection, from the store or from a file.
#[derive(Debug)]
pub struct Inspected {
    /// The session's header.
    pub header: SessionHeader,
    /// The valid prefix of the log.
    pub events: Vec<Event>,
    /// The closers a load would append to an open last turn.
    pub closers: Vec<Event>,
    /// What a load (or the import) cuts after the last committed record, described.
    pub torn_tail: Option<String>,
    /// Legacy shapes converted while reading a file.
    pub conversions: Vec<String>,
    /// Where it came from, for messages: `session ID` or `FILE`.
    pub origin: String,
}

/// Reads `target`: an existing file of JSON lines, else a session id in the store.
///
/// # Errors
/// `CliError::Failed` naming the file line or the seq when the log is invalid; when `target` is
/// neither a file nor a stored session.
pub async fn inspect_target(config: &Config, target: &str) -> Result<Inspected, CliError> {
    let path = Path::new(target);
    if path.is_file() {
        return inspect_file(path);
    }
    let id = SessionId::new(target).map_err(|e| {
        if target.contains('/') || target.ends_with(".jsonl") {
            CliError::Failed(format!("{target}: no such file"))
        } else {
            CliError::Failed(format!(
                "{target:?} is neither a file nor a valid session id ({e})"
            ))
        }
    })?;
    let store = open_existing(config).await?.ok_or_else(|| {
        CliError::Failed(format!(
            "session {id} not found (no store in {})",
            config.data_dir.display()
        ))
    })?;
    let inspected = inspect_stored(store.store(), &id).await;
    close(store).await?;
    inspected
}

/// Reads session `id` from `store` without writing.
///
/// # Errors
/// `CliError::Failed` for an unknown or invalid session.
pub async fn inspect_stored(
    store: &dyn SessionStore,
    id: &SessionId,
) -> Result<Inspected, CliError> {
    let inspection = store.inspect(id).await.map_err(|e| match e {
        StoreError::NotFound { id } => CliError::Failed(format!("session {id} not found")),
        e => CliError::Failed(format!("invalid: {e}")),
    })?;
    invariant::check(&inspection.events)
        .map_err(|v| CliError::Failed(format!("invalid: session {id}: {v}")))?;
    Ok(Inspected {
        header: inspection.header,
        events: inspection.events,
        closers: inspection.closers,
        torn_tail: inspection
            .torn_tail
            .map(|(seq, reason)| format!("from seq {seq}: {reason}")),
        conversions: Vec::new(),
        origin: format!("session {id}"),
    })
}

/// Reads a file of DSH v0 JSON lines without writing anything.
///
/// # Errors
/// `CliError::Failed` when the file cannot be read or is not a valid log.
pub fn inspect_file(path: &Path) -> Result<Inspected, CliError> {
    let file =
        File::open(path).map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
    let imported = import_with(
        &mut BufReader::new(file),
        &Limits::DEFAULT,
        &ImportOptions::default(),
    )
    .map_err(|e| CliError::Failed(format!("invalid: {}: {e}", path.display())))?;
    let closers = interrupted_turn_closers(&imported.events);
    Ok(Inspected {
        header: imported.header,
        events: imported.events,
        closers,
        torn_tail: imported.torn_tail.map(|t| {
            format!(
                "from line {}: {} ({} line{})",
                t.line,
                t.reason,
                t.n_lines,
                if t.n_lines == 1 { "" } else { "s" }
            )
        }),
        conversions: imported.conversions,
        origin: path.display().to_string(),
    })
}

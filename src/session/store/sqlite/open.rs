//! Opening a `SqliteStore`: the data directory, its lock, the connections (write, checkpoint, read,
//! read-only) and the schema.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use tokio::sync::{Semaphore, mpsc};
use tracing::debug;

use super::writer::{Writer, run_writer};
use super::{
    DB_FILE_NAME, Db, LOCK_FILE_NAME, Shared, SqliteConfig, SqliteStore, Vfs, io_error, sql_error,
    vfs_name,
};
use crate::session::store::StoreError;

/// `PRAGMA application_id` of our databases ("DSH1"), so that we never write into someone else's file.
const APPLICATION_ID: i32 = 0x4453_4831;
/// `PRAGMA user_version`: the schema below.
const SCHEMA_VERSION: i32 = 1;
/// How long a connection waits for a lock held by another connection of this store (a checkpoint, a
/// reader finishing) before it reports busy.
const BUSY_TIMEOUT_MS: u64 = 5_000;

const SCHEMA: &str = "
CREATE TABLE sessions (
    id TEXT PRIMARY KEY NOT NULL,
    created_at INTEGER NOT NULL,
    header TEXT NOT NULL
);
CREATE TABLE events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    json TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
";

pub(super) fn open_connection(path: &Path, vfs: Option<&Vfs>) -> rusqlite::Result<Db> {
    // Each connection is used by one thread at a time (the writer job, or one read job).
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match vfs {
        Some(v) => Connection::open_with_flags_and_vfs(path, flags, vfs_name(v))?,
        None => Connection::open_with_flags(path, flags)?,
    };
    let db = Db::new(conn, vfs);
    db.busy_timeout(std::time::Duration::from_millis(BUSY_TIMEOUT_MS))?;
    plan_once(&db)?;
    Ok(db)
}

/// Keeps every statement's query plan independent of the values bound to it (SQLite's "query
/// planner stability guarantee"). Without it SQLite marks a parameter that the planner looked at
/// (the session id in `read_slot`, compared with an expression; `LIMIT ?3` in a scan) and
/// re-prepares the cached statement whenever a new value is bound to it: ~55k instructions, every
/// id lookup and every log read (callgrind). Our statements are indexed lookups whose best plan
/// does not depend on the values.
fn plan_once(db: &Db) -> rusqlite::Result<()> {
    db.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

pub(super) fn open_reader(path: &Path, vfs: Option<&Vfs>) -> rusqlite::Result<Db> {
    let db = open_connection(path, vfs)?;
    db.pragma_update(None, "query_only", true)?;
    Ok(db)
}

/// How a connection of a read-only store reads the database, chosen from the files beside it when
/// the connection opens. Every way opens with `SQLITE_OPEN_READ_ONLY`, so the connection never
/// writes the database and never checkpoints the WAL — not even when it is the last one to close,
/// which is when a read-write connection would checkpoint and delete `-wal` and `-shm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadOnlyMode {
    /// A `-wal` and a `-shm` are there (a writer is running, or one crashed): read the WAL through
    /// the `-shm` without ever writing it (`readonly_shm=1`). With no writer holding the `-shm`,
    /// SQLite rebuilds the WAL index in private memory rather than repairing the file.
    Wal,
    /// A `-wal` without a `-shm` (someone removed it): SQLite must create the `-shm` to read the
    /// WAL, so this is the one case that adds a file; it fails where the directory is not writable.
    WalWithoutIndex,
    /// No `-wal`: the last writer closed cleanly and the database file holds everything, so it is
    /// read as it is (`immutable=1`), without locks, and nothing is created — which also works on
    /// read-only media. A writer that starts meanwhile writes to its new WAL, not to this file,
    /// until a checkpoint, so a short read sees the state at open.
    Immutable,
}

/// The file SQLite keeps beside the database `db_path` under `suffix` (`-wal`, `-shm`).
pub(super) fn beside(db_path: &Path, suffix: &str) -> PathBuf {
    let mut name = db_path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

impl ReadOnlyMode {
    /// Chooses the mode for `db_path` from the files beside it now.
    pub(super) fn probe(db_path: &Path) -> ReadOnlyMode {
        let beside = |suffix: &str| beside(db_path, suffix).exists();
        match (beside("-wal"), beside("-shm")) {
            (true, true) => ReadOnlyMode::Wal,
            (true, false) => ReadOnlyMode::WalWithoutIndex,
            (false, _) => ReadOnlyMode::Immutable,
        }
    }

    /// The URI query parameters that select this mode.
    fn query(self) -> &'static str {
        match self {
            ReadOnlyMode::Wal => "mode=ro&readonly_shm=1",
            ReadOnlyMode::WalWithoutIndex => "mode=ro",
            ReadOnlyMode::Immutable => "mode=ro&immutable=1",
        }
    }
}

/// `path` as a `file:` URI: every byte but unreserved ones and `/` percent-encoded, so that a `?`,
/// `#` or `%` in a directory name stays part of the path.
fn file_uri(path: &Path, query: &str) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push('?');
    uri.push_str(query);
    uri
}

/// Opens a connection of a read-only store (`ReadOnlyMode`, probed now).
pub(super) fn open_read_only_connection(path: &Path) -> rusqlite::Result<Db> {
    let mode = ReadOnlyMode::probe(path);
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(file_uri(path, mode.query()), flags)?;
    let db = Db::new(conn, None);
    db.busy_timeout(std::time::Duration::from_millis(BUSY_TIMEOUT_MS))?;
    plan_once(&db)?;
    Ok(db)
}

/// Opens the connection that runs the writer's checkpoints beside its commits: it syncs the database
/// file (`synchronous=FULL`) and never writes rows.
pub(super) fn open_checkpointer(path: &Path, vfs: Option<&Vfs>) -> rusqlite::Result<Db> {
    let db = open_connection(path, vfs)?;
    db.pragma_update(None, "synchronous", "FULL")?;
    db.pragma_update(None, "wal_autocheckpoint", 0)?;
    Ok(db)
}

/// Opens the write connection: WAL, `synchronous=FULL`, our own checkpoints, and the schema (created
/// on a fresh file, checked on an existing one).
pub(super) fn open_writer(path: &Path, vfs: Option<&Vfs>) -> Result<Db, StoreError> {
    let op = "open";
    let mut db = open_connection(path, vfs).map_err(|e| sql_error(op, &e))?;
    let mode: String = db
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| sql_error(op, &e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(io_error(
            op,
            format!("sqlite refused WAL mode (got {mode})"),
        ));
    }
    db.pragma_update(None, "synchronous", "FULL")
        .and_then(|()| db.pragma_update(None, "wal_autocheckpoint", 0))
        .map_err(|e| sql_error(op, &e))?;
    let tx = db
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| sql_error(op, &e))?;
    let app_id: i32 = tx
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|e| sql_error(op, &e))?;
    let version: i32 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| sql_error(op, &e))?;
    let n_tables: i64 = tx
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(|e| sql_error(op, &e))?;
    match (app_id, version) {
        (0, 0) if n_tables == 0 => {
            tx.execute_batch(SCHEMA).map_err(|e| sql_error(op, &e))?;
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .and_then(|()| tx.pragma_update(None, "user_version", SCHEMA_VERSION))
                .map_err(|e| sql_error(op, &e))?;
        }
        (APPLICATION_ID, SCHEMA_VERSION) => {}
        (APPLICATION_ID, v) => {
            return Err(io_error(
                op,
                format!(
                    "{} has schema version {v}, this build reads only {SCHEMA_VERSION}",
                    path.display()
                ),
            ));
        }
        (id, _) => {
            return Err(io_error(
                op,
                format!(
                    "{} is not a dsh session store (application_id {id:#x}, {n_tables} tables)",
                    path.display()
                ),
            ));
        }
    }
    tx.commit().map_err(|e| sql_error(op, &e))?;
    Ok(db)
}

/// Registers the fault VFS a store opened with `SqliteConfig::fault_injection` routes its connections
/// through; `None` without it.
///
/// # Errors
/// `Io` when SQLite refuses the registration.
#[cfg(feature = "fault-injection")]
fn fault_vfs(config: &SqliteConfig) -> Result<Option<Vfs>, StoreError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N_VFS: AtomicU64 = AtomicU64::new(0);
    if !config.fault_injection {
        return Ok(None);
    }
    let name = format!(
        "dsh-fault-{}-{}",
        std::process::id(),
        N_VFS.fetch_add(1, Ordering::Relaxed)
    );
    let vfs =
        super::vfs::FaultVfs::register(&name, config.record_io).map_err(|e| io_error("open", e))?;
    Ok(Some(Arc::new(vfs)))
}

/// Refuses `SqliteConfig::fault_injection` in a build without the `fault-injection` feature (release
/// builds carry no fault VFS).
///
/// # Errors
/// `Io` when fault injection is asked for.
#[cfg(not(feature = "fault-injection"))]
fn fault_vfs(config: &SqliteConfig) -> Result<Option<Vfs>, StoreError> {
    if config.fault_injection {
        return Err(io_error(
            "open",
            "fault injection needs a build with the fault-injection feature",
        ));
    }
    Ok(None)
}

/// Creates the data directory (0700) if needed.
fn create_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Takes the exclusive lock on the lock file.
///
/// The lock (`flock`) belongs to the open file description, which a child process shares between
/// `fork` and `exec` (the descriptor is close-on-exec, so only for that instant). A store closed and
/// reopened in a process that spawns children concurrently can therefore find its own old lock held
/// for a moment: retry a bounded number of times before concluding another process holds it.
fn lock_exclusive(lock: &File) -> Result<(), std::fs::TryLockError> {
    const ATTEMPTS_MAX: u32 = 50;
    const PAUSE_MS: u64 = 2;
    let mut attempt = 1;
    loop {
        match lock.try_lock() {
            Err(std::fs::TryLockError::WouldBlock) if attempt < ATTEMPTS_MAX => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(PAUSE_MS));
            }
            result => return result,
        }
    }
}

/// Makes the directory entries of files created in `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl SqliteStore {
    /// Opens (creating if needed) the store in `dir`. Must be called inside a tokio runtime: it
    /// spawns the writer task.
    ///
    /// # Errors
    /// `Io` when the directory or database cannot be created or opened, another process holds the
    /// store, the file is not a dsh store or has another schema version, the configuration is
    /// invalid, or there is no tokio runtime.
    pub fn open(dir: &Path, config: SqliteConfig) -> Result<SqliteStore, StoreError> {
        let op = "open";
        if config.queue_requests_max == 0 {
            return Err(io_error(op, "queue_requests_max must be at least 1"));
        }
        if config.group_requests_max == 0 {
            return Err(io_error(op, "group_requests_max must be at least 1"));
        }
        if config.queue_bytes_max == 0 || config.queue_bytes_max > u32::MAX as usize {
            return Err(io_error(
                op,
                format!(
                    "queue_bytes_max is {}, it must be in 1..={}",
                    config.queue_bytes_max,
                    u32::MAX
                ),
            ));
        }
        let vfs = fault_vfs(&config)?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| io_error(op, "SqliteStore::open needs a tokio runtime"))?;
        create_dir(dir).map_err(|e| io_error(op, format!("{}: {e}", dir.display())))?;
        let lock_path = dir.join(LOCK_FILE_NAME);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| io_error(op, format!("{}: {e}", lock_path.display())))?;
        lock_exclusive(&lock).map_err(|e| {
            io_error(
                op,
                format!("{} is in use by another process ({e})", dir.display()),
            )
        })?;
        let db_path = dir.join(DB_FILE_NAME);
        // Create the file ourselves so that it (and the -wal and -shm files, which SQLite gives the
        // database's permissions) is private to the user.
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&db_path)
            .map_err(|e| io_error(op, format!("{}: {e}", db_path.display())))?;
        let db = open_writer(&db_path, vfs.as_ref())?;
        sync_dir(dir).map_err(|e| io_error(op, format!("{}: {e}", dir.display())))?;
        let (tx, rx) = mpsc::channel(config.queue_requests_max);
        let bytes = Arc::new(Semaphore::new(config.queue_bytes_max));
        let shared = Arc::new(Shared::new(dir, db_path, config, vfs));
        let writer = Writer::new(db, lock);
        let task = runtime.spawn(run_writer(Arc::clone(&shared), rx, writer));
        debug!(dir = %shared.dir.display(), "session store opened");
        Ok(SqliteStore {
            shared,
            tx,
            bytes,
            writer: Mutex::new(Some(task)),
        })
    }

    /// Opens an existing store in `dir` for reading only: no writer, no lock, so it works while
    /// another process owns the store (WAL lets readers run beside its writer). Every write —
    /// including the repair a `load` would append — is refused; use `inspect` to read. Its
    /// connections are opened `SQLITE_OPEN_READ_ONLY` (`ReadOnlyMode`): they never checkpoint, never
    /// delete the `-wal` and `-shm` a crash left, and work where the user can only read.
    ///
    /// # Errors
    /// `Io` when `dir` holds no store, or the file is not a dsh store of this schema version.
    pub fn open_read_only(dir: &Path, config: SqliteConfig) -> Result<SqliteStore, StoreError> {
        let op = "open";
        let db_path = dir.join(DB_FILE_NAME);
        if !db_path.is_file() {
            return Err(io_error(
                op,
                format!("{} holds no session store", dir.display()),
            ));
        }
        let db = open_read_only_connection(&db_path).map_err(|e| sql_error(op, &e))?;
        let app_id: i32 = db
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(|e| sql_error(op, &e))?;
        let version: i32 = db
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| sql_error(op, &e))?;
        if (app_id, version) != (APPLICATION_ID, SCHEMA_VERSION) {
            return Err(io_error(
                op,
                format!(
                    "{} is not a dsh session store of schema version {SCHEMA_VERSION} (application_id {app_id:#x}, version {version})",
                    db_path.display()
                ),
            ));
        }
        // No receiver: nothing is ever queued (`writable` refuses first).
        let (tx, _) = mpsc::channel(1);
        let shared = Arc::new(Shared {
            read_only: true,
            readers: Mutex::new(vec![db]),
            ..Shared::new(dir, db_path, config, None)
        });
        Ok(SqliteStore {
            shared,
            tx,
            bytes: Arc::new(Semaphore::new(1)),
            writer: Mutex::new(None),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration with no room for a request, in the queue or in a group, or a byte bound
    /// outside `1..=u32::MAX` is refused by name before anything is created on disk.
    #[tokio::test]
    async fn an_unusable_configuration_is_refused_before_the_disk_is_touched() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("store");
        let refusals = [
            (
                SqliteConfig {
                    queue_requests_max: 0,
                    ..SqliteConfig::default()
                },
                "queue_requests_max must be at least 1",
            ),
            (
                SqliteConfig {
                    group_requests_max: 0,
                    ..SqliteConfig::default()
                },
                "group_requests_max must be at least 1",
            ),
            (
                SqliteConfig {
                    queue_bytes_max: 0,
                    ..SqliteConfig::default()
                },
                "queue_bytes_max is 0",
            ),
        ];
        for (config, why) in refusals {
            let Err(err) = SqliteStore::open(&dir, config) else {
                panic!("opened with {why}");
            };
            assert!(
                matches!(&err, StoreError::Io { .. }) && err.to_string().contains(why),
                "{err}"
            );
            assert!(!dir.exists(), "{why}: the directory was created");
        }
    }

    /// The connections of a read-only store are opened read-only by SQLite itself
    /// (`SQLITE_OPEN_READ_ONLY`), not merely asked not to write (`PRAGMA query_only`, which any
    /// statement can turn off): a write through one fails even after `query_only` is switched off.
    #[tokio::test]
    async fn a_read_only_store_connection_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        SqliteStore::open(dir.path(), SqliteConfig::default())
            .unwrap()
            .close()
            .await
            .unwrap();
        let store = SqliteStore::open_read_only(dir.path(), SqliteConfig::default()).unwrap();
        let db = store.shared.take_reader().unwrap();
        assert_eq!(db.is_readonly(rusqlite::MAIN_DB), Ok(true));
        db.pragma_update(None, "query_only", false).unwrap();
        let err = db.execute_batch("CREATE TABLE intruder (x)").unwrap_err();
        assert_eq!(
            err.sqlite_error_code(),
            Some(rusqlite::ErrorCode::ReadOnly),
            "{err}"
        );
        drop(db);
        store.close().await.unwrap();
    }

    /// The mode follows the files beside the database.
    #[test]
    fn the_read_only_mode_follows_the_files_beside_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join(DB_FILE_NAME);
        std::fs::write(&db, b"").unwrap();
        assert_eq!(ReadOnlyMode::probe(&db), ReadOnlyMode::Immutable);
        std::fs::write(dir.path().join("sessions.sqlite3-wal"), b"").unwrap();
        assert_eq!(ReadOnlyMode::probe(&db), ReadOnlyMode::WalWithoutIndex);
        std::fs::write(dir.path().join("sessions.sqlite3-shm"), b"").unwrap();
        assert_eq!(ReadOnlyMode::probe(&db), ReadOnlyMode::Wal);
    }

    /// Characters SQLite would read as URI syntax stay part of the path.
    #[test]
    fn a_file_uri_escapes_what_is_not_path() {
        assert_eq!(
            file_uri(Path::new("/tmp/a b/50%?#/db"), "mode=ro"),
            "file:/tmp/a%20b/50%25%3F%23/db?mode=ro"
        );
    }
}

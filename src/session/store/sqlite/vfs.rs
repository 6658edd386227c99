//! A SQLite VFS that wraps the default (unix) VFS so that a test can make `xWrite` and `xSync` fail
//! or wait, and can record every write, truncate and sync.
//!
//! Every call is forwarded unchanged to the wrapped VFS except:
//! - `xSync`, which first counts the call, then blocks while syncs are *held*
//!   (`FaultInjector::hold_syncs`), then returns `SQLITE_IOERR_FSYNC` without syncing while syncs are
//!   *failing* (`FaultInjector::fail_syncs`, or from the n-th sync on: `fail_syncs_from`);
//! - `xWrite`, which counts the call and, from the n-th write on (`fail_writes_from`), returns
//!   `SQLITE_FULL` (what the unix VFS reports for `ENOSPC`) or `SQLITE_IOERR_WRITE` (`EIO`) without
//!   writing.
//!
//! So SQLite itself sees a failed write or fsync exactly where a real disk would report one, and the
//! store's poisoning path is exercised for real rather than simulated above SQLite.
//!
//! Recording (`SqliteConfig::record_io`): every successful write, truncate and sync of a named file,
//! every delete, and the test's own marks, in the order SQLite issued them (`IoRecord`). Replaying a
//! prefix of it, keeping per file only what its last sync covered, gives the files as a power loss at
//! that moment would leave them (`tests/power_loss.rs`). The `-shm` file is mapped, never written
//! through `xWrite`, and SQLite rebuilds it after a crash, so it is not recorded.
//!
//! Layout: our `sqlite3_file` is a `ShimFile` (the `pMethods` header plus a pointer to the shared
//! `Control`) immediately followed, at `REAL_OFFSET`, by the wrapped VFS's own file object; SQLite
//! allocates `szOsFile = REAL_OFFSET + wrapped.szOsFile` bytes for it (8-byte aligned).
//!
//! What must stay true: the registered `sqlite3_vfs` and the `Control` it points to outlive every
//! connection opened through the VFS. Each store connection holds an `Arc<FaultVfs>`, and `Drop`
//! unregisters and frees only when the last one is gone; a connection that fails to close leaks its
//! `Arc` on purpose (see `sqlite/mod.rs`, `Db`).
//!
//! Used by `SqliteStore::open` when `SqliteConfig::fault_injection` is set. Compiled only with the
//! `fault-injection` feature, which this package's tests enable and release builds do not.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use rusqlite::ffi;

/// Why the fault VFS could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VfsError {
    #[error("sqlite has no default vfs to wrap")]
    NoDefault,
    #[error("the wrapped vfs file object is {bytes} bytes, more than a c int can describe")]
    FileTooLarge { bytes: i64 },
    #[error("registering vfs {name} failed with sqlite code {code}")]
    Register { name: String, code: c_int },
}

/// One recorded file operation (`IoRecord::ops`). `file` indexes `IoRecord::paths`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IoOp {
    /// `data` written at `offset`.
    Write {
        /// Index into `IoRecord::paths`.
        file: usize,
        /// Byte offset.
        offset: u64,
        /// The bytes written.
        data: Vec<u8>,
    },
    /// The file cut (or extended) to `size` bytes.
    Truncate {
        /// Index into `IoRecord::paths`.
        file: usize,
        /// The new size.
        size: u64,
    },
    /// A successful `xSync`: everything written to the file before it is durable.
    Sync {
        /// Index into `IoRecord::paths`.
        file: usize,
    },
    /// The file was deleted.
    Delete {
        /// Index into `IoRecord::paths`.
        file: usize,
    },
    /// A mark the test put into the record (`FaultInjector::mark`), e.g. "input 7 acknowledged".
    Mark(u64),
}

/// What the VFS recorded: the files it saw and every operation on them, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IoRecord {
    /// Every named file opened or deleted, each once.
    pub paths: Vec<PathBuf>,
    /// The operations, in the order SQLite issued them.
    pub ops: Vec<IoOp>,
}

impl IoRecord {
    fn file(&mut self, path: PathBuf) -> usize {
        match self.paths.iter().position(|p| *p == path) {
            Some(i) => i,
            None => {
                self.paths.push(path);
                self.paths.len() - 1
            }
        }
    }
}

/// How a failing write fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteFault {
    /// `ENOSPC`: `SQLITE_FULL`.
    DiskFull,
    /// `EIO`: `SQLITE_IOERR_WRITE`.
    Io,
}

/// State shared by the VFS, every file opened through it, and the `FaultInjector` handles.
struct Control {
    /// The wrapped VFS. Invariant: SQLite's default VFS, which lives for the whole process.
    real: *mut ffi::sqlite3_vfs,
    fail_syncs: AtomicBool,
    /// Syncs numbered from this one on (0-based, counted by `n_syncs`) fail; `u64::MAX`: none.
    fail_syncs_from: AtomicU64,
    /// Writes numbered from this one on (0-based, counted by `n_writes`) fail; `u64::MAX`: none.
    fail_writes_from: AtomicU64,
    /// The SQLite code a failing write returns.
    write_fail_code: AtomicI32,
    n_writes: AtomicU64,
    n_writes_failed: AtomicU64,
    /// `Some` while recording.
    record: Mutex<Option<IoRecord>>,
    /// Whether syncs wait; guarded so that waiters can sleep on `released`.
    held: Mutex<bool>,
    released: Condvar,
    n_syncs: AtomicU64,
    n_syncs_failed: AtomicU64,
    n_syncs_waiting: AtomicU64,
}

impl Control {
    /// Appends the op `make` builds for `path` (its index in the record) when recording.
    fn record(&self, path: Option<&PathBuf>, make: impl FnOnce(usize) -> IoOp) {
        let Some(path) = path else { return };
        let mut record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(record) = record.as_mut() {
            let file = record.file(path.clone());
            record.ops.push(make(file));
        }
    }

    fn wait_while_held(&self) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if !*held {
            return;
        }
        self.n_syncs_waiting.fetch_add(1, Ordering::SeqCst);
        while *held {
            held = self
                .released
                .wait(held)
                .unwrap_or_else(PoisonError::into_inner);
        }
        self.n_syncs_waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A registered wrapping VFS. Dropping the last `Arc` unregisters and frees it.
pub(crate) struct FaultVfs {
    name: CString,
    /// The object registered with SQLite. Invariant: allocated by `Box::into_raw` in `register`,
    /// linked into SQLite's VFS list (which writes its `pNext`) until `Drop` unregisters it; we never
    /// read or write it in between.
    vfs: NonNull<ffi::sqlite3_vfs>,
    /// Shared so its address is stable and never asserted unique: `vfs.pAppData` and every open
    /// `ShimFile` point to it.
    control: Arc<Control>,
}

// SAFETY: `vfs` is only touched by SQLite (under its own VFS mutex) and by `Drop`, which runs once no
// connection can use it. `Control` is `Send + Sync` (below).
unsafe impl Send for FaultVfs {}
// SAFETY: as above; `&FaultVfs` only exposes the atomics and mutex of `control` and the name.
unsafe impl Sync for FaultVfs {}
// SAFETY: apart from atomics and a mutex, `Control` holds `real`, a pointer to SQLite's default VFS,
// which is never written and whose methods SQLite allows to be called from any thread (the bundled
// library is built thread-safe).
unsafe impl Send for Control {}
// SAFETY: as above.
unsafe impl Sync for Control {}

impl FaultVfs {
    /// Registers a new wrapping VFS named `name` (not the default).
    ///
    /// # Errors
    /// `VfsError` when SQLite has no default VFS or refuses the registration.
    pub fn register(name: &str, record: bool) -> Result<FaultVfs, VfsError> {
        let name = CString::new(name).map_err(|_| VfsError::Register {
            name: name.to_string(),
            code: ffi::SQLITE_MISUSE,
        })?;
        // SAFETY: a null name asks for the default VFS; the call initializes SQLite if needed and
        // returns either null or a pointer to a VFS that stays registered for the process.
        let real = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
        if real.is_null() {
            return Err(VfsError::NoDefault);
        }
        // SAFETY: `real` is non-null and points to a live, fully initialized VFS (above).
        let real_ref = unsafe { &*real };
        let sz_os_file = c_int::try_from(REAL_OFFSET)
            .ok()
            .and_then(|offset| offset.checked_add(real_ref.szOsFile))
            .ok_or(VfsError::FileTooLarge {
                bytes: i64::from(real_ref.szOsFile).saturating_add(REAL_OFFSET as i64),
            })?;
        let control = Arc::new(Control {
            real,
            fail_syncs: AtomicBool::new(false),
            fail_syncs_from: AtomicU64::new(u64::MAX),
            fail_writes_from: AtomicU64::new(u64::MAX),
            write_fail_code: AtomicI32::new(ffi::SQLITE_FULL),
            n_writes: AtomicU64::new(0),
            n_writes_failed: AtomicU64::new(0),
            record: Mutex::new(record.then(IoRecord::default)),
            held: Mutex::new(false),
            released: Condvar::new(),
            n_syncs: AtomicU64::new(0),
            n_syncs_failed: AtomicU64::new(0),
            n_syncs_waiting: AtomicU64::new(0),
        });
        let vfs = Box::new(ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: sz_os_file,
            mxPathname: real_ref.mxPathname,
            pNext: ptr::null_mut(),
            zName: name.as_ptr(),
            pAppData: Arc::as_ptr(&control).cast_mut().cast::<c_void>(),
            xOpen: Some(shim_open),
            xDelete: Some(shim_delete),
            xAccess: Some(shim_access),
            xFullPathname: Some(shim_full_pathname),
            xDlOpen: Some(shim_dl_open),
            xDlError: Some(shim_dl_error),
            xDlSym: Some(shim_dl_sym),
            xDlClose: Some(shim_dl_close),
            xRandomness: Some(shim_randomness),
            xSleep: Some(shim_sleep),
            xCurrentTime: Some(shim_current_time),
            xGetLastError: Some(shim_get_last_error),
            xCurrentTimeInt64: Some(shim_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        });
        let vfs = NonNull::from(Box::leak(vfs));
        // SAFETY: `vfs` points to a fully initialized VFS whose name and app data (`name`,
        // `control`) are owned by the `FaultVfs` we return, which unregisters it before freeing them.
        let code = unsafe { ffi::sqlite3_vfs_register(vfs.as_ptr(), 0) };
        if code != ffi::SQLITE_OK {
            // SAFETY: registration failed, so SQLite holds no pointer to it; we allocated it above.
            drop(unsafe { Box::from_raw(vfs.as_ptr()) });
            return Err(VfsError::Register {
                name: name.to_string_lossy().into_owned(),
                code,
            });
        }
        Ok(FaultVfs { name, vfs, control })
    }

    /// The name to pass to `sqlite3_open_v2`.
    pub fn name(&self) -> &str {
        // Built from a `&str` in `register`, so it is UTF-8.
        self.name.to_str().unwrap_or("")
    }

    pub fn set_fail_syncs(&self, fail: bool) {
        self.control.fail_syncs.store(fail, Ordering::SeqCst);
    }

    pub fn set_hold_syncs(&self, hold: bool) {
        let mut held = self
            .control
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *held = hold;
        if !hold {
            self.control.released.notify_all();
        }
    }

    pub fn n_syncs(&self) -> u64 {
        self.control.n_syncs.load(Ordering::SeqCst)
    }

    pub fn set_fail_syncs_from(&self, n: u64) {
        self.control.fail_syncs_from.store(n, Ordering::SeqCst);
    }

    pub fn set_fail_writes_from(&self, n: u64, fault: WriteFault) {
        let code = match fault {
            WriteFault::DiskFull => ffi::SQLITE_FULL,
            WriteFault::Io => ffi::SQLITE_IOERR_WRITE,
        };
        self.control.write_fail_code.store(code, Ordering::SeqCst);
        self.control.fail_writes_from.store(n, Ordering::SeqCst);
    }

    pub fn n_writes(&self) -> u64 {
        self.control.n_writes.load(Ordering::SeqCst)
    }

    pub fn n_writes_failed(&self) -> u64 {
        self.control.n_writes_failed.load(Ordering::SeqCst)
    }

    pub fn mark(&self, mark: u64) {
        let mut record = self
            .control
            .record
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(record) = record.as_mut() {
            record.ops.push(IoOp::Mark(mark));
        }
    }

    /// The record so far (empty when not recording); recording goes on.
    pub fn record(&self) -> IoRecord {
        self.control
            .record
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_default()
    }

    pub fn n_syncs_failed(&self) -> u64 {
        self.control.n_syncs_failed.load(Ordering::SeqCst)
    }

    pub fn n_syncs_waiting(&self) -> u64 {
        self.control.n_syncs_waiting.load(Ordering::SeqCst)
    }
}

impl Drop for FaultVfs {
    fn drop(&mut self) {
        // Never leave a sync thread waiting on a condvar we are about to free.
        self.set_hold_syncs(false);
        // SAFETY: `vfs` was registered in `register`. No connection uses it any more: each one held
        // an `Arc<FaultVfs>` until it closed. After unregistering, SQLite holds no pointer to it, so
        // the box can be freed; `name` and `control` are freed after this body.
        unsafe {
            ffi::sqlite3_vfs_unregister(self.vfs.as_ptr());
            drop(Box::from_raw(self.vfs.as_ptr()));
        }
    }
}

/// Our file object. `repr(C)` so that a `*mut sqlite3_file` SQLite hands us is a `*mut ShimFile`.
#[repr(C)]
struct ShimFile {
    base: ffi::sqlite3_file,
    control: *const Control,
    /// The file's name when it has one and the VFS records; owned (`Box::into_raw`), freed by
    /// `shim_close` or a failed `shim_open`.
    path: *mut PathBuf,
}

impl ShimFile {
    /// The recorded path of `file`, if any.
    ///
    /// # Safety
    /// `file` must be one of our files that `shim_open` opened and `shim_close` has not closed.
    unsafe fn path<'a>(file: *mut ffi::sqlite3_file) -> Option<&'a PathBuf> {
        // SAFETY: per the contract, `path` is null or the live box `shim_open` leaked.
        unsafe { (*file.cast::<ShimFile>()).path.as_ref() }
    }
}

/// The path SQLite names a file by, when the VFS records and the name is present.
///
/// # Safety
/// `name` must be null or a NUL-terminated string.
unsafe fn recorded_path(control: &Control, name: *const c_char) -> Option<PathBuf> {
    if name.is_null() {
        return None;
    }
    let recording = control
        .record
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .is_some();
    if !recording {
        return None;
    }
    // SAFETY: per the contract.
    let name = unsafe { CStr::from_ptr(name) };
    Some(PathBuf::from(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.to_bytes()),
    ))
}

/// Where the wrapped file object starts inside ours: after `ShimFile`, rounded up to 8 bytes (the
/// alignment SQLite guarantees for the whole allocation and the most any VFS file object needs).
const REAL_OFFSET: usize = std::mem::size_of::<ShimFile>().next_multiple_of(8);

static SHIM_IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    // Version 2: the shared-memory methods WAL needs, but no memory-mapped I/O (xFetch/xUnfetch).
    iVersion: 2,
    xClose: Some(shim_close),
    xRead: Some(shim_read),
    xWrite: Some(shim_write),
    xTruncate: Some(shim_truncate),
    xSync: Some(shim_sync),
    xFileSize: Some(shim_file_size),
    xLock: Some(shim_lock),
    xUnlock: Some(shim_unlock),
    xCheckReservedLock: Some(shim_check_reserved_lock),
    xFileControl: Some(shim_file_control),
    xSectorSize: Some(shim_sector_size),
    xDeviceCharacteristics: Some(shim_device_characteristics),
    xShmMap: Some(shim_shm_map),
    xShmLock: Some(shim_shm_lock),
    xShmBarrier: Some(shim_shm_barrier),
    xShmUnmap: Some(shim_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

/// The control block of our VFS.
///
/// # Safety
/// `vfs` must be a VFS registered by `FaultVfs::register` and not yet dropped.
unsafe fn control_of<'a>(vfs: *mut ffi::sqlite3_vfs) -> &'a Control {
    // SAFETY: per the contract, `pAppData` points to the `Control` boxed in the live `FaultVfs`.
    unsafe { &*((*vfs).pAppData as *const Control) }
}

/// The wrapped VFS behind ours.
///
/// # Safety
/// As `control_of`.
unsafe fn real_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: forwarded contract.
    unsafe { control_of(vfs).real }
}

/// The wrapped file object inside ours.
///
/// # Safety
/// `file` must point to an allocation of at least our VFS's `szOsFile` bytes.
unsafe fn real_file(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: `REAL_OFFSET` is inside the allocation (`szOsFile = REAL_OFFSET + wrapped size`).
    unsafe {
        file.cast::<u8>()
            .add(REAL_OFFSET)
            .cast::<ffi::sqlite3_file>()
    }
}

/// The methods of the wrapped file, once it is open.
///
/// # Safety
/// `file` must be one of our files that `shim_open` opened (its `pMethods` is ours, so the wrapped
/// file's `pMethods` is non-null).
unsafe fn real_methods<'a>(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'a ffi::sqlite3_io_methods) {
    // SAFETY: per the contract the wrapped file is open and its methods table is static in SQLite.
    unsafe {
        let real = real_file(file);
        (real, &*(*real).pMethods)
    }
}

unsafe extern "C" fn shim_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite calls xOpen with our registered VFS and a `szOsFile`-byte allocation for `file`.
    // We clear our header first so that a failed open leaves `pMethods` null (SQLite then does not
    // call xClose), and only install our methods when the wrapped VFS installed its own.
    unsafe {
        let shim = file.cast::<ShimFile>();
        (*shim).base.pMethods = ptr::null();
        (*shim).control = control_of(vfs);
        (*shim).path = ptr::null_mut();
        let real_vfs = real_vfs(vfs);
        let real = real_file(file);
        (*real).pMethods = ptr::null();
        let Some(open) = (*real_vfs).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        let code = open(real_vfs, name, real, flags, out_flags);
        if !(*real).pMethods.is_null() {
            (*shim).base.pMethods = &SHIM_IO_METHODS;
            if let Some(path) = recorded_path(control_of(vfs), name) {
                (*shim).path = Box::into_raw(Box::new(path));
            }
        }
        code
    }
}

unsafe extern "C" fn shim_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite only calls our methods on files `shim_open` opened, and calls xClose once; the
    // path box is ours (`ShimFile::path`) and nothing uses it after this.
    unsafe {
        let shim = file.cast::<ShimFile>();
        if !(*shim).path.is_null() {
            drop(Box::from_raw((*shim).path));
            (*shim).path = ptr::null_mut();
        }
        let (real, methods) = real_methods(file);
        match methods.xClose {
            Some(f) => f(real),
            None => ffi::SQLITE_OK,
        }
    }
}

unsafe extern "C" fn shim_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    n: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: as `shim_close`; the buffer is forwarded untouched.
    unsafe {
        let (real, methods) = real_methods(file);
        match methods.xRead {
            Some(f) => f(real, buf, n, offset),
            None => ffi::SQLITE_IOERR_READ,
        }
    }
}

unsafe extern "C" fn shim_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    n: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: as `shim_sync` for `control`; SQLite hands us `n` readable bytes at `buf`, which are
    // forwarded untouched and, when recording, copied.
    unsafe {
        let control = &*(*file.cast::<ShimFile>()).control;
        let nth = control.n_writes.fetch_add(1, Ordering::SeqCst);
        if nth >= control.fail_writes_from.load(Ordering::SeqCst) {
            control.n_writes_failed.fetch_add(1, Ordering::SeqCst);
            return control.write_fail_code.load(Ordering::SeqCst);
        }
        let (real, methods) = real_methods(file);
        let code = match methods.xWrite {
            Some(f) => f(real, buf, n, offset),
            None => ffi::SQLITE_IOERR_WRITE,
        };
        if code == ffi::SQLITE_OK
            && let (Ok(len), Ok(offset)) = (usize::try_from(n), u64::try_from(offset))
        {
            control.record(ShimFile::path(file), |file| IoOp::Write {
                file,
                offset,
                data: std::slice::from_raw_parts(buf.cast::<u8>(), len).to_vec(),
            });
        }
        code
    }
}

unsafe extern "C" fn shim_truncate(
    file: *mut ffi::sqlite3_file,
    size: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: as `shim_sync`.
    unsafe {
        let control = &*(*file.cast::<ShimFile>()).control;
        let (real, methods) = real_methods(file);
        let code = match methods.xTruncate {
            Some(f) => f(real, size),
            None => ffi::SQLITE_IOERR_TRUNCATE,
        };
        if code == ffi::SQLITE_OK
            && let Ok(size) = u64::try_from(size)
        {
            control.record(ShimFile::path(file), |file| IoOp::Truncate { file, size });
        }
        code
    }
}

unsafe extern "C" fn shim_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: as `shim_close`; `control` was set by `shim_open` and outlives the file (module docs).
    unsafe {
        let control = &*(*file.cast::<ShimFile>()).control;
        let nth = control.n_syncs.fetch_add(1, Ordering::SeqCst);
        control.wait_while_held();
        if control.fail_syncs.load(Ordering::SeqCst)
            || nth >= control.fail_syncs_from.load(Ordering::SeqCst)
        {
            control.n_syncs_failed.fetch_add(1, Ordering::SeqCst);
            return ffi::SQLITE_IOERR_FSYNC;
        }
        let (real, methods) = real_methods(file);
        let code = match methods.xSync {
            Some(f) => f(real, flags),
            None => ffi::SQLITE_IOERR_FSYNC,
        };
        if code == ffi::SQLITE_OK {
            control.record(ShimFile::path(file), |file| IoOp::Sync { file });
        }
        code
    }
}

unsafe extern "C" fn shim_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: as `shim_read`.
    unsafe {
        let (real, methods) = real_methods(file);
        match methods.xFileSize {
            Some(f) => f(real, size),
            None => ffi::SQLITE_IOERR_FSTAT,
        }
    }
}

unsafe extern "C" fn shim_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: as `shim_close`.
    unsafe {
        let (real, methods) = real_methods(file);
        match methods.xLock {
            Some(f) => f(real, level),
            None => ffi::SQLITE_IOERR_LOCK,
        }
    }
}

unsafe extern "C" fn shim_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: as `shim_close`.
    unsafe {
        let (real, methods) = real_methods(file);
        match methods.xUnlock {
            Some(f) => f(real, level),
            None => ffi::SQLITE_IOERR_UNLOCK,
        }
    }
}

unsafe extern "C" fn shim_check_reserved_lock(
    file: *mut ffi::sqlite3_file,
    out: *mut c_int,
) -> c_int {
    // SAFETY: as `shim_read`.
    unsafe {
        let (real, methods) = real_methods(file);
        match methods.xCheckReservedLock {
            Some(f) => f(real, out),
            None => ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
        }
    }
}

unsafe extern "C" fn shim_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: as `shim_read`.
    unsafe {
        let (real, methods) = real_methods(file);
        match methods.xFileControl {
            Some(f) => f(real, op, arg),
            None => ffi::SQLITE_NOTFOUND,
        }
    }
}

unsafe extern "C" fn shim_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as `shim_close`.
    unsafe {
        let (real, methods) = real_methods(file);
        match methods.xSectorSize {
            Some(f) => f(real),
            None => 4096,
        }
    }
}

unsafe extern "C" fn shim_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as `shim_close`.
    unsafe {
        let (real, methods) = real_methods(file);
        match methods.xDeviceCharacteristics {
            Some(f) => f(real),
            None => 0,
        }
    }
}

unsafe extern "C" fn shim_shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    page_bytes: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: as `shim_read`. A wrapped file of methods version 1 has no shared memory.
    unsafe {
        let (real, methods) = real_methods(file);
        match methods.xShmMap {
            Some(f) if methods.iVersion >= 2 => f(real, page, page_bytes, extend, out),
            _ => ffi::SQLITE_IOERR_SHMMAP,
        }
    }
}

unsafe extern "C" fn shim_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: as `shim_shm_map`.
    unsafe {
        let (real, methods) = real_methods(file);
        match methods.xShmLock {
            Some(f) if methods.iVersion >= 2 => f(real, offset, n, flags),
            _ => ffi::SQLITE_IOERR_SHMLOCK,
        }
    }
}

unsafe extern "C" fn shim_shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: as `shim_shm_map`.
    unsafe {
        let (real, methods) = real_methods(file);
        if let Some(f) = methods.xShmBarrier
            && methods.iVersion >= 2
        {
            f(real);
        }
    }
}

unsafe extern "C" fn shim_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: as `shim_shm_map`.
    unsafe {
        let (real, methods) = real_methods(file);
        match methods.xShmUnmap {
            Some(f) if methods.iVersion >= 2 => f(real, delete),
            _ => ffi::SQLITE_OK,
        }
    }
}

unsafe extern "C" fn shim_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    // SAFETY: SQLite calls VFS methods with our registered VFS; arguments are forwarded untouched to
    // the wrapped VFS, which expects exactly them.
    unsafe {
        let real = real_vfs(vfs);
        let code = match (*real).xDelete {
            Some(f) => f(real, name, sync_dir),
            None => ffi::SQLITE_IOERR_DELETE,
        };
        if code == ffi::SQLITE_OK {
            let control = control_of(vfs);
            let path = recorded_path(control, name);
            control.record(path.as_ref(), |file| IoOp::Delete { file });
        }
        code
    }
}

unsafe extern "C" fn shim_access(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    // SAFETY: as `shim_delete`.
    unsafe {
        let real = real_vfs(vfs);
        match (*real).xAccess {
            Some(f) => f(real, name, flags, out),
            None => ffi::SQLITE_IOERR_ACCESS,
        }
    }
}

unsafe extern "C" fn shim_full_pathname(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n_out: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: as `shim_delete`.
    unsafe {
        let real = real_vfs(vfs);
        match (*real).xFullPathname {
            Some(f) => f(real, name, n_out, out),
            None => ffi::SQLITE_CANTOPEN,
        }
    }
}

unsafe extern "C" fn shim_dl_open(vfs: *mut ffi::sqlite3_vfs, name: *const c_char) -> *mut c_void {
    // SAFETY: as `shim_delete`.
    unsafe {
        let real = real_vfs(vfs);
        match (*real).xDlOpen {
            Some(f) => f(real, name),
            None => ptr::null_mut(),
        }
    }
}

unsafe extern "C" fn shim_dl_error(vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) {
    // SAFETY: as `shim_delete`.
    unsafe {
        let real = real_vfs(vfs);
        if let Some(f) = (*real).xDlError {
            f(real, n, out);
        }
    }
}

type DlSym = Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)>;

unsafe extern "C" fn shim_dl_sym(
    vfs: *mut ffi::sqlite3_vfs,
    handle: *mut c_void,
    symbol: *const c_char,
) -> DlSym {
    // SAFETY: as `shim_delete`.
    unsafe {
        let real = real_vfs(vfs);
        match (*real).xDlSym {
            Some(f) => f(real, handle, symbol),
            None => None,
        }
    }
}

unsafe extern "C" fn shim_dl_close(vfs: *mut ffi::sqlite3_vfs, handle: *mut c_void) {
    // SAFETY: as `shim_delete`.
    unsafe {
        let real = real_vfs(vfs);
        if let Some(f) = (*real).xDlClose {
            f(real, handle);
        }
    }
}

unsafe extern "C" fn shim_randomness(
    vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: as `shim_delete`.
    unsafe {
        let real = real_vfs(vfs);
        match (*real).xRandomness {
            Some(f) => f(real, n, out),
            None => 0,
        }
    }
}

unsafe extern "C" fn shim_sleep(vfs: *mut ffi::sqlite3_vfs, micros: c_int) -> c_int {
    // SAFETY: as `shim_delete`.
    unsafe {
        let real = real_vfs(vfs);
        match (*real).xSleep {
            Some(f) => f(real, micros),
            None => 0,
        }
    }
}

unsafe extern "C" fn shim_current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    // SAFETY: as `shim_delete`.
    unsafe {
        let real = real_vfs(vfs);
        match (*real).xCurrentTime {
            Some(f) => f(real, out),
            None => ffi::SQLITE_ERROR,
        }
    }
}

unsafe extern "C" fn shim_get_last_error(
    vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: as `shim_delete`.
    unsafe {
        let real = real_vfs(vfs);
        match (*real).xGetLastError {
            Some(f) => f(real, n, out),
            None => 0,
        }
    }
}

unsafe extern "C" fn shim_current_time_int64(
    vfs: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: as `shim_delete`; version 2 of the wrapped VFS is checked before the field is read.
    unsafe {
        let real = real_vfs(vfs);
        match (*real).xCurrentTimeInt64 {
            Some(f) if (*real).iVersion >= 2 => f(real, out),
            _ => ffi::SQLITE_ERROR,
        }
    }
}

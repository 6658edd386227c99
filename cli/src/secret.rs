//! The API key, taken out of the process environment at start-up.
//!
//! `dsh run --shell` lets the model run commands as the user, and any process of the user can read
//! `/proc/<dsh>/environ`, the environment block `dsh` was started with. Removing a variable with
//! `remove_var` only edits the `environ` array; the bytes of the initial block stay where the
//! kernel put them and `/proc/<pid>/environ` keeps showing them. So the key variables are read
//! once, validated into `ApiKey` (which never prints itself), removed from the environment, and the
//! bytes of their entries in the initial block are overwritten with NULs. From then on the key lives
//! only in `ApiKey`: children inherit no key variable and `/proc` shows none.

use std::ffi::{CStr, c_char};

use dsh::llm::openai::{ApiKey, OpenAiConfig};

/// The variables that may hold the key, in the order they are tried.
pub const KEY_VARS: [&str; 2] = ["DEEPSEEK_API_KEY", "OPENAI_API_KEY"];

/// What the environment held for the key when `dsh` started.
#[derive(Clone, Debug, Default)]
pub enum StartupKey {
    /// No key variable was set (or all were empty).
    #[default]
    Unset,
    /// A valid key.
    Key(ApiKey),
    /// A key variable held an unusable key; the message names the variable, never the key.
    Invalid(String),
}

unsafe extern "C" {
    /// The C library's environment array (POSIX `environ`).
    static environ: *const *mut c_char;
}

/// Reads the key variables into a `StartupKey`, removes them from the environment and wipes their
/// bytes from the process's initial environment block.
///
/// # Safety
/// No other thread may exist: this writes the process environment (`remove_var`) and the memory
/// the `environ` entries point to, which any concurrent reader of the environment would race with.
/// Call it first thing in `main`, before any runtime or logger starts a thread.
pub unsafe fn take_api_key() -> StartupKey {
    let values: Vec<(&str, Option<String>)> = KEY_VARS
        .iter()
        .map(|&name| (name, std::env::var(name).ok()))
        .collect();
    let lookup = |name: &str| {
        values
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.clone())
    };
    let key = match OpenAiConfig::from_lookup(lookup) {
        Ok(config) => config.api_key.map_or(StartupKey::Unset, StartupKey::Key),
        Err(e) => StartupKey::Invalid(e.to_string()),
    };
    // SAFETY: the caller guarantees no other thread exists, so nothing reads or writes the
    // environment while `environ` is walked, the entries are removed and their bytes are wiped.
    unsafe { wipe_key_entries() };
    key
}

/// Removes every `KEY_VARS` entry from the environment and overwrites its bytes with NULs.
///
/// # Safety
/// As `take_api_key`: single-threaded.
unsafe fn wipe_key_entries() {
    let mut entries: Vec<(*mut c_char, usize)> = Vec::new();
    // SAFETY: `environ` is the C library's NULL-terminated array of NUL-terminated strings; with no
    // other thread, nothing changes it while it is walked.
    unsafe {
        let mut cursor = environ;
        while !cursor.is_null() && !(*cursor).is_null() {
            let entry = *cursor;
            let bytes = CStr::from_ptr(entry).to_bytes();
            let is_key = KEY_VARS.iter().any(|name| {
                bytes.len() > name.len()
                    && bytes.starts_with(name.as_bytes())
                    && bytes[name.len()] == b'='
            });
            if is_key {
                entries.push((entry, bytes.len()));
            }
            cursor = cursor.add(1);
        }
    }
    for name in KEY_VARS {
        // SAFETY: single-threaded (the caller's guarantee), as `remove_var` requires.
        unsafe { std::env::remove_var(name) };
    }
    for (entry, len) in entries {
        for i in 0..len {
            // SAFETY: `entry` points to `len` writable bytes of an environment string (the initial
            // block on the stack, or a string the C library allocated and never frees); removed from
            // `environ` above, so no one reads it any more.
            unsafe { std::ptr::write_volatile(entry.add(i), 0) };
        }
    }
}

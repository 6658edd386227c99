//! `dsh export ID [-o FILE] [--zstd]` and `dsh import FILE [--id ID]`: a session as DSH v0 JSON
//! lines, the format shared with the original harness. `--zstd` writes the original's default
//! on-disk layout (`session.jsonl.zstd`); import recognises that layout by its magic bytes.
//!
//! Export reads the stored log as it is (an open last turn stays open: a load would repair it, and
//! export never writes to the store); with `-o` the file is written to a temporary name beside it
//! and renamed only when complete and synced, so a failed export leaves no half file. Import reads
//! and validates the whole file first, refuses an id that exists, repairs nothing, and commits the
//! header with every event in one append, so it writes all or nothing.

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::Path;
use std::process::ExitCode;

use dsh::SessionId;
use dsh::limits::Limits;
use dsh::session::event::{Event, SessionHeader};
use dsh::session::store::jsonl::zstd::export_zstd;
use dsh::session::store::jsonl::{ImportOptions, export, import_with};
use dsh::session::store::{EncodedEvent, SessionStore, StoreError};

use crate::stored::{close, inspect_stored, open, open_existing};
use crate::text::{echo, error_line};
use crate::{CliError, Config, ExportArgs, ImportArgs};

/// Runs `dsh export`.
///
/// # Errors
/// `CliError::Failed` for an unknown or invalid session, or an output that cannot be written.
pub async fn export_cmd(args: ExportArgs, config: Config) -> Result<ExitCode, CliError> {
    let id = SessionId::new(&args.id)
        .map_err(|e| CliError::Usage(format!("invalid session id: {e}")))?;
    let store = open_existing(&config).await?.ok_or_else(|| {
        CliError::Failed(format!(
            "session {id} not found (no store in {})",
            config.data_dir.display()
        ))
    })?;
    let inspected = inspect_stored(store.store(), &id).await;
    close(store).await?;
    let inspected = inspected?;
    let write = |header: &SessionHeader, events: &[Event], out: &mut dyn Write| {
        if args.zstd {
            export_zstd(header, events, &mut &mut *out)
        } else {
            export(header, events, &mut &mut *out)
        }
    };
    match &args.output {
        None => {
            let stdout = std::io::stdout();
            write(&inspected.header, &inspected.events, &mut stdout.lock())
                .map_err(|e| CliError::output("writing the export", e))?;
        }
        Some(path) => write_atomically(path, |file| {
            write(&inspected.header, &inspected.events, file)
        })?,
    }
    if !inspected.closers.is_empty() {
        eprintln!("note: the last turn is open; it was exported as stored (a load closes it)");
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `path` through a temporary file in the same directory, synced and then renamed over it.
/// A `path` that exists and is not a regular file (a symlink, FIFO, device, directory) is refused
/// before anything is written: renaming over it would replace the link or node itself.
fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> Result<(), CliError> {
    let shown = echo(&path.display().to_string());
    let fail = |e: std::io::Error| CliError::Failed(format!("{shown}: {e}"));
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_file() => {
            return Err(CliError::Failed(format!(
                "{shown}: exists and is not a regular file ({}); refusing to replace it",
                file_kind(meta.file_type())
            )));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".dsh-export-")
        .tempfile_in(dir)
        .map_err(fail)?;
    write(tmp.as_file_mut()).map_err(fail)?;
    tmp.as_file_mut().flush().map_err(fail)?;
    tmp.as_file().sync_all().map_err(fail)?;
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

/// What a non-regular file is, in words.
fn file_kind(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Runs `dsh import`.
///
/// # Errors
/// `CliError::Failed` when the file is unreadable or invalid, the id exists, or the store fails;
/// nothing is written then.
pub async fn import_cmd(args: ImportArgs, config: Config) -> Result<ExitCode, CliError> {
    let session_id = match &args.id {
        Some(s) => Some(SessionId::new(s).map_err(|e| CliError::Usage(format!("--id: {e}")))?),
        None => None,
    };
    let file = File::open(&args.file).map_err(|e| {
        CliError::Failed(format!("{}: {e}", echo(&args.file.display().to_string())))
    })?;
    let options = ImportOptions {
        session_id,
        cwd: None,
    };
    let imported =
        import_with(&mut BufReader::new(file), &Limits::DEFAULT, &options).map_err(|e| {
            CliError::Failed(format!(
                "invalid: {}: {}",
                echo(&args.file.display().to_string()),
                error_line(&e.to_string())
            ))
        })?;
    let id = imported.header.id.clone();
    if imported.events.is_empty() {
        return Err(CliError::Failed(format!(
            "{}: the log holds no events; nothing to import",
            args.file.display()
        )));
    }
    let store = open(&config).await?;
    let result = commit(store.store(), &imported.header, &imported.events).await;
    close(store).await?;
    result?;
    for c in &imported.conversions {
        eprintln!("converted: {c}");
    }
    if let Some(t) = &imported.torn_tail {
        eprintln!(
            "note: a torn tail was not imported: from line {}: {}",
            t.line, t.reason
        );
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "imported session {id} ({} events)",
        imported.events.len()
    )
    .map_err(|e| CliError::output("writing the report", e))?;
    Ok(ExitCode::SUCCESS)
}

async fn commit(
    store: &dyn SessionStore,
    header: &dsh::session::event::SessionHeader,
    events: &[dsh::session::Event],
) -> Result<(), CliError> {
    let id = &header.id;
    let exists = |id: &SessionId| CliError::Failed(format!("session {id} already exists"));
    let store_err = |e: StoreError| match e {
        StoreError::AlreadyExists { id } => exists(&id),
        e => CliError::Failed(format!("importing {id}: {e}")),
    };
    if store.header(id).await.map_err(store_err)?.is_some() {
        return Err(exists(id));
    }
    store.create(header).await.map_err(store_err)?;
    let encoded: Vec<EncodedEvent> = EncodedEvent::encode_all(events);
    store.append(id, encoded).await.map_err(store_err)
}

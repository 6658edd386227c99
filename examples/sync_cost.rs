//! What one `fdatasync` costs on the disk under a directory, by where the write before it lands:
//! over blocks the file already has, at its end (the file grows), or into blocks `fallocate`
//! reserved; and, after an overwrite, `fsync` (what SQLite calls, built without `HAVE_FDATASYNC`)
//! against `fdatasync`. The SQLite writer writes the `-wal` file's blocks ahead of SQLite
//! (`SqliteConfig::wal_prefill_bytes`) because of the difference (BENCHMARKS.md, "the WAL's
//! blocks written ahead").
//!
//! `cargo run --release --example sync_cost -- [DIR] [--samples N] [--bytes N] [--rounds N]`
//! (defaults: the current directory, 2,000 samples of 4,096 bytes, 2 rounds). Prints p50, p90 and
//! p99 per case and round; the scratch files are removed.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

struct Args {
    dir: PathBuf,
    samples: usize,
    bytes: usize,
    rounds: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        dir: PathBuf::from("."),
        samples: 2_000,
        bytes: 4_096,
        rounds: 2,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            let value = it.next().ok_or(format!("{name} needs a value"))?;
            match value.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{name} must be a positive integer, not {value:?}")),
            }
        };
        match arg.as_str() {
            "--samples" => args.samples = number("--samples")?,
            "--bytes" => args.bytes = number("--bytes")?,
            "--rounds" => args.rounds = number("--rounds")?,
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}")),
            dir => args.dir = PathBuf::from(dir),
        }
    }
    Ok(args)
}

/// A scratch file in `dir`, created empty (truncated) and synced.
fn scratch(dir: &Path, name: &str) -> io::Result<(File, PathBuf)> {
    let path = dir.join(format!(".sync-cost-{}-{name}", std::process::id()));
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    file.sync_all()?;
    Ok((file, path))
}

/// Times `samples` rounds of writing `buf` at `offset(i)` and `fdatasync`, in microseconds.
fn time_syncs(
    file: &File,
    buf: &[u8],
    samples: usize,
    offset: impl Fn(usize) -> u64,
) -> io::Result<Vec<f64>> {
    time_writes(file, buf, samples, offset, File::sync_data)
}

/// Times `samples` rounds of writing `buf` at `offset(i)` and `sync`, in microseconds.
fn time_writes(
    file: &File,
    buf: &[u8],
    samples: usize,
    offset: impl Fn(usize) -> u64,
    sync: fn(&File) -> io::Result<()>,
) -> io::Result<Vec<f64>> {
    let mut took = Vec::with_capacity(samples);
    for i in 0..samples {
        let started = Instant::now();
        file.write_all_at(buf, offset(i))?;
        sync(file)?;
        took.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok(took)
}

fn report(case: &str, mut took: Vec<f64>) {
    took.sort_by(f64::total_cmp);
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    println!(
        "{case:<34} p50 {:>7.1} µs  p90 {:>7.1}  p99 {:>7.1}",
        at(0.5),
        at(0.9),
        at(0.99)
    );
}

fn round(args: &Args) -> io::Result<()> {
    let buf = vec![0x5a_u8; args.bytes];
    let span = (args.samples * args.bytes) as u64;
    let at = |i: usize| (i * args.bytes) as u64;

    let (file, path) = scratch(&args.dir, "overwrite")?;
    file.write_all_at(&buf, 0)?;
    file.sync_all()?;
    report(
        "overwrite one block",
        time_syncs(&file, &buf, args.samples, |_| 0)?,
    );
    drop(file);
    std::fs::remove_file(path)?;

    let (file, path) = scratch(&args.dir, "append")?;
    report(
        "append (the file grows)",
        time_syncs(&file, &buf, args.samples, at)?,
    );
    report(
        "overwrite what was appended",
        time_syncs(&file, &buf, args.samples, at)?,
    );
    report(
        "the same with fsync",
        time_writes(&file, &buf, args.samples, at, File::sync_all)?,
    );
    drop(file);
    std::fs::remove_file(path)?;

    let (file, path) = scratch(&args.dir, "fallocate")?;
    rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, span)?;
    file.sync_all()?;
    report(
        "write into fallocated blocks",
        time_syncs(&file, &buf, args.samples, at)?,
    );
    drop(file);
    std::fs::remove_file(path)?;
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("sync_cost: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "{} samples of {} bytes in {}",
        args.samples,
        args.bytes,
        args.dir.display()
    );
    for n in 1..=args.rounds {
        println!("round {n}");
        if let Err(e) = round(&args) {
            eprintln!("sync_cost: {e}");
            std::process::exit(1);
        }
    }
}

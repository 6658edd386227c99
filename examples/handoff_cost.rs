//! What a hand-off to another thread and back costs a task on tokio's two-worker runtime, the shape
//! of one SQLite commit seen from the agent: a fixed amount of blocking work (a stand-in for the
//! commit, a busy loop) done in place, on the blocking pool with the answer sent back by a oneshot
//! (`spawn_blocking`), behind a task that spawns that blocking job for it (the SQLite writer's
//! task: `run_writer`), or on a thread of its own fed by a channel. Each way's mean time per job
//! less the in-place time is the hand-offs' cost. BENCHMARKS.md ("hand-offs") uses it to bound what
//! a lone agent's durable turn can reach.
//!
//! `cargo run --release --example handoff_cost -- [--samples N] [--work-us N] [--rounds N]`
//! (defaults: 3,000 jobs of 150 µs each way, 3 rounds).

use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

struct Args {
    samples: usize,
    work: Duration,
    rounds: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        samples: 3_000,
        work: Duration::from_micros(150),
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let value = it.next().ok_or(format!("{arg} needs a value"))?;
        let n = match value.parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => return Err(format!("{arg} must be a positive integer, not {value:?}")),
        };
        match arg.as_str() {
            "--samples" => args.samples = usize::try_from(n).map_err(|e| e.to_string())?,
            "--work-us" => args.work = Duration::from_micros(n),
            "--rounds" => args.rounds = usize::try_from(n).map_err(|e| e.to_string())?,
            flag => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(args)
}

/// The blocking work: a busy loop of `work`, so that the thread doing it stays on its core.
fn busy(work: Duration) {
    let started = Instant::now();
    while started.elapsed() < work {
        std::hint::spin_loop();
    }
}

/// Microseconds per job of `samples` jobs, each awaited by `one` before the next starts; a yield
/// between two, as an agent's handler ends between two commits.
async fn per_job<F, Fut>(samples: usize, mut one: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let started = Instant::now();
    for _ in 0..samples {
        one().await;
        tokio::task::yield_now().await;
    }
    started.elapsed().as_secs_f64() * 1e6 / samples as f64
}

async fn in_place(samples: usize, work: Duration) -> f64 {
    per_job(samples, || async move { busy(work) }).await
}

async fn blocking_pool(samples: usize, work: Duration) -> f64 {
    per_job(samples, || async move {
        let (done, answer) = oneshot::channel();
        tokio::task::spawn_blocking(move || {
            busy(work);
            let _ = done.send(());
        });
        let _ = answer.await;
    })
    .await
}

async fn behind_a_task(samples: usize, work: Duration) -> f64 {
    let (tx, mut rx) = mpsc::channel::<oneshot::Sender<()>>(16);
    let task = tokio::spawn(async move {
        while let Some(done) = rx.recv().await {
            let job = tokio::task::spawn_blocking(move || {
                busy(work);
                let _ = done.send(());
            });
            let _ = job.await;
        }
    });
    let took = per_job(samples, || {
        let tx = tx.clone();
        async move {
            let (done, answer) = oneshot::channel();
            if tx.send(done).await.is_ok() {
                let _ = answer.await;
            }
        }
    })
    .await;
    drop(tx);
    let _ = task.await;
    took
}

async fn own_thread(samples: usize, work: Duration) -> f64 {
    let (tx, rx) = std::sync::mpsc::channel::<oneshot::Sender<()>>();
    let thread = std::thread::spawn(move || {
        while let Ok(done) = rx.recv() {
            busy(work);
            let _ = done.send(());
        }
    });
    let took = per_job(samples, || {
        let (done, answer) = oneshot::channel();
        let sent = tx.send(done).is_ok();
        async move {
            if sent {
                let _ = answer.await;
            }
        }
    })
    .await;
    drop(tx);
    let _ = thread.join();
    took
}

/// Runs one way in a task of its own, as an agent's handler runs, not on the main thread; NaN if
/// the task panicked.
async fn in_a_task(way: impl Future<Output = f64> + Send + 'static) -> f64 {
    tokio::spawn(way).await.unwrap_or(f64::NAN)
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("handoff_cost: {e}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("handoff_cost: no runtime: {e}");
            std::process::exit(1);
        }
    };
    let (samples, work) = (args.samples, args.work);
    println!(
        "{samples} jobs of {} µs each way, two workers",
        work.as_micros()
    );
    runtime.block_on(async move {
        for n in 1..=args.rounds {
            let base = in_a_task(in_place(samples, work)).await;
            let pool = in_a_task(blocking_pool(samples, work)).await;
            let task = in_a_task(behind_a_task(samples, work)).await;
            let thread = in_a_task(own_thread(samples, work)).await;
            println!(
                "round {n}: in place {base:.1} µs; spawn_blocking +{:.1}; behind a task +{:.1}; \
                 own thread +{:.1}",
                pool - base,
                task - base,
                thread - base
            );
        }
    });
}

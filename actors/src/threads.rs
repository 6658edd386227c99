//! `AgentThreads`: the host's own threads, each a single-threaded tokio runtime, that agents are
//! pinned to (`HostConfig::agent_threads`).
//!
//! On tokio's multi-threaded runtime the tasks of one agent (its actor, stream, writer, tool pool
//! and the short tasks they spawn) wake each other on whichever worker is free, so one turn's work
//! can move between workers many times, each move waking a parked thread. Pinned, an agent's actor
//! is spawned on one of these runtimes, and everything it spawns (ractor and `tokio::spawn` use the
//! runtime they are called from) stays on that thread: only input from outside and the answers to
//! it cross threads — and not even those for a caller that runs beside its agent
//! (`AgentHandle::spawn_beside` spawns onto the agent's thread). New agents are spread over the
//! threads round-robin, so a fleet still uses every thread; a woken or restarted agent returns to
//! the thread it ran on, so whatever was spawned beside it stays beside it. A thread never steals
//! another's agents, which is the price of the locality. An actor is started from the caller's
//! task with its thread's runtime entered (`AgentThreads::enter`): only its processing loop runs
//! on the thread, and the caller does not wait for the thread to answer.
//!
//! Each thread runs until the host's registry is dropped (the last `Host` or `AgentHandle` gone);
//! its runtime is then dropped on that thread, outside any task, which cancels whatever is left on
//! it (a host shut down first has nothing left).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// How long an agent thread that ran out of work watches for work from other threads before it
/// sleeps. Input and answers reach an agent's thread from others (a caller, the store's commit
/// thread); one that already slept must be woken by the kernel. Spinning this long each time the
/// thread goes idle costs at most that much CPU per burst of work, and nothing while the thread is
/// busy. (No consistent speed-up measured on the project's 2-core VMs: BENCHMARKS.md.)
const SPIN_BEFORE_PARK: Duration = Duration::from_micros(50);

/// Spins until a task arrives from another thread (the runtime's injection queue) or
/// `SPIN_BEFORE_PARK` passed: tokio then parks, or, with work queued, only polls its driver.
fn spin_before_park() {
    let Ok(handle) = Handle::try_current() else {
        return;
    };
    let metrics = handle.metrics();
    let deadline = Instant::now() + SPIN_BEFORE_PARK;
    while metrics.global_queue_depth() == 0 && Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

/// The host's agent threads.
pub(crate) struct AgentThreads {
    threads: Vec<AgentThread>,
    /// The thread the next agent actor starts on (modulo the count).
    next: AtomicUsize,
}

struct AgentThread {
    handle: Handle,
    /// Dropped (or sent) to end the thread.
    _stop: oneshot::Sender<()>,
}

impl AgentThreads {
    /// Starts `n` threads (`n` ≥ 1) named `dsh-agents-<i>`.
    ///
    /// # Errors
    /// The OS error when a thread or its runtime cannot be created.
    pub(crate) fn start(n: usize) -> std::io::Result<AgentThreads> {
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name(format!("dsh-agents-{i}-blocking"))
                .on_thread_park(spin_before_park)
                .build()?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("dsh-agents-{i}"))
                .spawn(move || {
                    // Either outcome ends the thread: sent, or the sender dropped with the host.
                    let _ = runtime.block_on(stopped);
                    drop(runtime);
                })?;
            threads.push(AgentThread {
                handle,
                _stop: stop,
            });
        }
        Ok(AgentThreads {
            threads,
            next: AtomicUsize::new(0),
        })
    }

    /// The thread an agent actor starts on: `home`, the one its last actor ran on, when it had
    /// one (a wake or a restart: a task spawned beside the agent stays beside it), otherwise the
    /// next in turn (round-robin), so that the agents a host creates are spread evenly.
    pub(crate) fn place(&self, home: Option<usize>) -> usize {
        match home {
            Some(i) if i < self.threads.len() => i,
            _ => self.next.fetch_add(1, Ordering::Relaxed) % self.threads.len(),
        }
    }

    /// Runs `work` on the calling task with thread `i`'s runtime entered whenever it is polled, so
    /// that every task it spawns (an actor's processing loop: ractor and `tokio::spawn` use the
    /// runtime they are called from) runs on thread `i`, without a round trip to that thread: a
    /// caller creating agents one after the other waits for none of them. `None` when there is
    /// no thread `i`.
    ///
    /// The threads outlive every caller that can reach them (they end with the host's registry,
    /// which the caller borrows), so what is spawned here is never refused.
    pub(crate) async fn enter<F: Future>(&self, i: usize, work: F) -> Option<F::Output> {
        let handle = self.threads.get(i)?.handle.clone();
        let mut work = std::pin::pin!(work);
        Some(
            std::future::poll_fn(move |cx| {
                let _entered = handle.enter();
                work.as_mut().poll(cx)
            })
            .await,
        )
    }

    /// The runtime of thread `i`, if there is one.
    pub(crate) fn handle(&self, i: usize) -> Option<&Handle> {
        self.threads.get(i).map(|t| &t.handle)
    }
}

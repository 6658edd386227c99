//! The live progress line on stderr (only when stderr is a terminal).

use super::*;

/// Counters the progress line reads.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) turns_driven: AtomicU64,
    pub(super) turns_total: AtomicU64,
    pub(super) agents_created: AtomicU64,
    pub(super) agents_total: AtomicU64,
}

/// The live progress line on stderr.
pub(super) struct Progress {
    pub(super) counters: Arc<Counters>,
    pub(super) phase: Arc<Mutex<&'static str>>,
    pub(super) metrics_events: Arc<AtomicU64>,
    pub(super) stop: CancellationToken,
    pub(super) task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Progress {
    pub(super) fn start(draw: bool) -> Progress {
        let counters = Arc::new(Counters::default());
        let phase = Arc::new(Mutex::new("starting"));
        let metrics_events = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let task = draw.then(|| {
            let counters = Arc::clone(&counters);
            let phase = Arc::clone(&phase);
            let events = Arc::clone(&metrics_events);
            let stop = stop.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tokio::select! {
                        () = stop.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    let phase = *phase
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let line = progress_line(
                        phase,
                        &counters,
                        events.load(Ordering::Relaxed),
                        started.elapsed(),
                    );
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "\r\x1b[2K{line}");
                    let _ = err.flush();
                }
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K");
                let _ = err.flush();
            })
        });
        Progress {
            counters,
            phase,
            metrics_events,
            stop,
            task: Mutex::new(task),
        }
    }

    pub(super) fn phase(&self, phase: &'static str) {
        *self
            .phase
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = phase;
    }

    pub(super) async fn finish(&self) {
        self.stop.cancel();
        let task = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

pub(super) fn progress_line(phase: &str, c: &Counters, events: u64, elapsed: Duration) -> String {
    const WIDTH: usize = 30;
    let (done, total) = match phase {
        "creating agents" => (
            c.agents_created.load(Ordering::Relaxed),
            c.agents_total.load(Ordering::Relaxed),
        ),
        _ => (
            c.turns_driven.load(Ordering::Relaxed),
            c.turns_total.load(Ordering::Relaxed),
        ),
    };
    let filled = if total == 0 {
        0
    } else {
        (done.min(total) as usize * WIDTH) / total as usize
    };
    format!(
        "[{}{}] {done}/{total} {phase}  {events} durable events  {:.1} s",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        elapsed.as_secs_f64()
    )
}

//! Named one-shot gates: a scripted stream (or a scenario tool or hook) waits on a gate until a test
//! or a scenario action opens it. Opening is idempotent and wakes every waiter; waiting is
//! cancellable by dropping the future.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// One named one-shot gate.
#[derive(Default)]
struct Gate {
    open: AtomicBool,
    notify: Notify,
}

/// A cloneable registry of named one-shot gates, shared by script streams and scenario tool
/// behaviours. A gate is created closed on first mention; once opened it stays open; a gate never
/// opened stays closed.
#[derive(Clone, Default)]
pub struct Gates {
    by_name: Arc<Mutex<HashMap<String, Arc<Gate>>>>,
}

impl fmt::Debug for Gates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let map = self.lock();
        let mut names: Vec<(&String, bool)> = map
            .iter()
            .map(|(k, g)| (k, g.open.load(Ordering::Acquire)))
            .collect();
        names.sort();
        f.debug_map().entries(names).finish()
    }
}

impl Gates {
    /// A set with no gate open.
    pub fn new() -> Gates {
        Gates::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Gate>>> {
        // The map is only inserted into; a panic elsewhere cannot leave it half-updated.
        self.by_name
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn gate(&self, name: &str) -> Arc<Gate> {
        self.lock().entry(name.to_owned()).or_default().clone()
    }

    /// Opens `name` and wakes every waiter. Opening twice is harmless.
    pub fn open(&self, name: &str) {
        let gate = self.gate(name);
        gate.open.store(true, Ordering::Release);
        gate.notify.notify_waiters();
    }

    /// Whether `name` has been opened.
    pub fn is_open(&self, name: &str) -> bool {
        self.lock()
            .get(name)
            .is_some_and(|g| g.open.load(Ordering::Acquire))
    }

    /// Resolves once `name` is open (at once if it already is).
    pub async fn wait(&self, name: &str) {
        let gate = self.gate(name);
        loop {
            let notified = gate.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so an `open` between the check and the await still wakes us.
            notified.as_mut().enable();
            if gate.open.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

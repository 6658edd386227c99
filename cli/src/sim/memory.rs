//! Memory per hibernated agent: the resident set size from `/proc`, the allocator's trim, and
//! waiting until every agent hibernated.

use super::*;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    pub(super) fn malloc_trim(pad: usize) -> std::os::raw::c_int;
}

/// Returns the allocator's free memory to the OS, so that RSS shows live memory: the same measure
/// as `tests/memory.rs`. Both allocators are asked: jemalloc (the `dsh` binary's) to purge every
/// arena's unused pages now rather than after its decay time, glibc's (the test binaries') to trim.
/// Asking the one not in use costs nothing.
pub(super) fn trim_heap() {
    #[cfg(all(target_os = "linux", not(target_env = "musl")))]
    {
        // 4096 is jemalloc's `MALLCTL_ARENAS_ALL`: the command applies to every arena.
        let name = c"arena.4096.purge";
        // SAFETY: `name` is a NUL-terminated mallctl name; `arena.<i>.purge` is a command that
        // reads and writes nothing, so it is called with null old and new pointers and zero
        // lengths, as jemalloc's manual requires of it. It takes jemalloc's own locks and may be
        // called from any thread; an error (there is no such arena yet) changes nothing.
        unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
        }
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` has no preconditions: it only releases free memory of the allocator's
    // arenas to the OS, takes the arena locks itself, and may be called from any thread at any time.
    unsafe {
        malloc_trim(0);
    }
}

/// Reads `VmRSS` and `VmHWM` (bytes) from `/proc/self/status`; `None` where there is no procfs.
pub(super) fn memory_status() -> (Option<u64>, Option<u64>) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (None, None);
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Status polls in flight at once while waiting for the agents to hibernate.
const STATUS_POLLS_AT_ONCE: usize = 10_000;

/// Waits until every agent reports `hibernated`. A `status` call counts as activity and restarts an
/// agent's idle clock, so each poll waits two hibernation delays after the previous one. Returns how
/// many hibernated.
pub(super) async fn wait_hibernated(
    agents: &[AgentHandle],
    hibernate_ms: u64,
) -> Result<usize, SimError> {
    let pause = Duration::from_millis(hibernate_ms.saturating_mul(2).saturating_add(20));
    let mut awake: Vec<usize> = (0..agents.len()).collect();
    for _ in 0..HIBERNATE_POLLS_MAX {
        if awake.is_empty() {
            break;
        }
        tokio::time::sleep(pause).await;
        let mut still = Vec::new();
        // In slices, so a million agents' polls are never all in flight at once.
        for slice in awake.chunks(STATUS_POLLS_AT_ONCE) {
            let statuses =
                futures::future::join_all(slice.iter().map(|&idx| agents[idx].status())).await;
            for (idx, status) in slice.iter().zip(statuses) {
                let status = status.map_err(|error| SimError::Input {
                    agent_idx: *idx,
                    error,
                })?;
                if !status.hibernated {
                    still.push(*idx);
                }
            }
        }
        awake = still;
    }
    Ok(agents.len() - awake.len())
}

/// What memory the hibernated agents hold.
pub(super) struct MemoryPhase {
    /// Agents that reported `hibernated`.
    pub(super) hibernated_agents: usize,
    /// The run's peak resident set size.
    pub(super) peak_rss_bytes: Option<u64>,
    /// Resident set size before any agent existed.
    pub(super) rss_before_bytes: Option<u64>,
    /// Resident set size once the agents hibernated, after the allocator's trim.
    pub(super) rss_hibernated_bytes: Option<u64>,
    /// Resident bytes per hibernated agent after the trim (observer buffers left out).
    pub(super) bytes_per_agent: Option<u64>,
    /// The same before the trim.
    pub(super) bytes_per_agent_untrimmed: Option<u64>,
    /// Resident memory the observer's subscription buffers took, left out of the figures above.
    pub(super) observer_bytes: u64,
}

/// Waits until the agents hibernated and measures what they hold against `rss_before_bytes`, the
/// resident set size before any agent existed.
pub(super) async fn measure_memory(
    plan: &SimPlan,
    agents: &[AgentHandle],
    rss_before_bytes: Option<u64>,
    observer_bytes: u64,
) -> Result<MemoryPhase, SimError> {
    let hibernated_agents = wait_hibernated(agents, plan.hibernate_ms).await?;
    // The run's peak, before the ceiling burst adds its own sessions (all in RAM for `memory`).
    let (rss_untrimmed_bytes, peak_rss_bytes) = memory_status();
    trim_heap();
    let (rss_hibernated_bytes, _) = memory_status();
    let per_agent = |after: Option<u64>| match (rss_before_bytes, after) {
        (Some(before), Some(after)) => {
            Some(after.saturating_sub(before).saturating_sub(observer_bytes) / plan.agents as u64)
        }
        _ => None,
    };
    Ok(MemoryPhase {
        hibernated_agents,
        peak_rss_bytes,
        rss_before_bytes,
        rss_hibernated_bytes,
        bytes_per_agent: per_agent(rss_hibernated_bytes),
        bytes_per_agent_untrimmed: per_agent(rss_untrimmed_bytes),
        observer_bytes,
    })
}

/// What waking a sample of hibernated agents measured (`--wake-sample`).
#[derive(Default)]
pub(super) struct WakePhase {
    /// Each woken agent's followup, from the call until it returned (input durable).
    pub(super) ack_ns: Vec<u64>,
    /// The same followup until the turn it started ended (`when_idle`).
    pub(super) turn_ns: Vec<u64>,
}

/// Seeds the choice of the woken agents (with `--seed`), apart from every agent's own rng.
const WAKE_SEED: u64 = 0x5741_4B45_5341_4D50;

/// Wakes `plan.wake_sample` agents, a seeded random sample without repeats, one after the other:
/// each that is still hibernated gets one followup; the acknowledgement and the whole turn are
/// timed. One at a time, so a figure is one wake's, not the queue of many.
pub(super) async fn wake_sample(
    plan: &SimPlan,
    agents: &[AgentHandle],
) -> Result<WakePhase, SimError> {
    let mut phase = WakePhase::default();
    let n = agents.len();
    let k = plan.wake_sample.min(n);
    let mut rng = SplitMix64::new(plan.seed ^ WAKE_SEED);
    let mut chosen = std::collections::HashSet::with_capacity(k);
    while chosen.len() < k {
        let agent_idx = (rng.next_u64() % n as u64) as usize;
        if !chosen.insert(agent_idx) {
            continue;
        }
        let agent = &agents[agent_idx];
        let fail = |error| SimError::Input { agent_idx, error };
        if !agent.status().await.map_err(fail)?.hibernated {
            continue;
        }
        let prompt = Message::user_text(MessageId::mint(), "Wake up: one more question.");
        let started = Instant::now();
        agent.followup(prompt).await.map_err(fail)?;
        phase.ack_ns.push(ns(started.elapsed()));
        agent.when_idle().await.map_err(fail)?;
        phase.turn_ns.push(ns(started.elapsed()));
    }
    Ok(phase)
}

//! Memory per hibernated agent: the resident set size from `/proc`, the allocator's trim, and
//! waiting until every agent hibernated.

use super::*;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    pub(super) fn malloc_trim(pad: usize) -> std::os::raw::c_int;
}

/// Returns the allocator's free memory to the OS (glibc), so that RSS shows live memory. The same
/// measure as `tests/memory.rs`.
pub(super) fn trim_heap() {
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
        let statuses =
            futures::future::join_all(awake.iter().map(|&idx| agents[idx].status())).await;
        let mut still = Vec::new();
        for (idx, status) in awake.iter().zip(statuses) {
            let status = status.map_err(|error| SimError::Input {
                agent_idx: *idx,
                error,
            })?;
            if !status.hibernated {
                still.push(*idx);
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
    })
}

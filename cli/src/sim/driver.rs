//! The agents' side of a run: creating them, one driver task per agent sending followups, steers
//! and cancels, the observer thread sampling step and steer latencies, and the simulated tool.

use super::*;

/// The simulated tool: waits `--tool-ms` (or until cancelled) and answers.
pub(super) struct WaitTool {
    pub(super) duration: Duration,
}

#[async_trait::async_trait]
impl Tool for WaitTool {
    fn name(&self) -> &str {
        TOOL_NAME
    }

    fn description(&self) -> &str {
        "Waits a moment, as a tool that does real work would."
    }

    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "properties": {"note": {"type": "string", "maxLength": 16}},
            "required": ["note"]
        })
    }

    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        ExecutionMode::Parallel
    }

    async fn execute(&self, _call: ToolInvocation, cancel: CancellationToken) -> ToolOutput {
        if !self.duration.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(self.duration) => {}
                () = cancel.cancelled() => return ToolOutput::error("cancelled", None),
            }
        }
        ToolOutput::text("done")
    }
}

/// SplitMix64, seeded per agent so that which turns get a steer or a cancel depends only on
/// `--seed` and the agent's index.
pub(super) fn agent_rng(seed: u64, agent_idx: usize) -> SplitMix64 {
    SplitMix64::new(seed ^ (agent_idx as u64).wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// What one driver measured.
#[derive(Default)]
pub(super) struct DriverTally {
    pub(super) ack_ns: Vec<u64>,
    /// The agent's first followup, from when it was due until durable.
    pub(super) arrival_ack_ns: Vec<u64>,
    pub(super) cancel_to_idle_ns: Vec<u64>,
    pub(super) followups: u64,
    pub(super) steers: u64,
    pub(super) cancels: u64,
}

/// Steers sent and not yet claimed or discarded: message id → when `steer` was called.
pub(super) type SteersInFlight = Arc<DashMap<MessageId, Instant>>;

impl DriverTally {
    /// Adds `other`'s samples and counts to this tally.
    fn absorb(&mut self, other: DriverTally) {
        self.ack_ns.extend(other.ack_ns);
        self.arrival_ack_ns.extend(other.arrival_ack_ns);
        self.cancel_to_idle_ns.extend(other.cancel_to_idle_ns);
        self.followups += other.followups;
        self.steers += other.steers;
        self.cancels += other.cancels;
    }
}

/// The delay of agent `agent_idx`'s first input after the start of the turns (`--ramp-ms`): the
/// first draw of its rng, so its later draws (steers, cancels) do not depend on the ramp.
fn ramp_delay(plan: &SimPlan, agent_idx: usize) -> Duration {
    if plan.ramp_ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(agent_rng(plan.seed, agent_idx).next_u64() % plan.ramp_ms)
}

/// Drives one agent through its turns, its first input at `ramp_start` plus its ramp delay.
pub(super) async fn drive(
    agent: AgentHandle,
    agent_idx: usize,
    plan: Arc<SimPlan>,
    ramp_start: Instant,
    steers: Option<SteersInFlight>,
    progress: Arc<Counters>,
) -> Result<DriverTally, SimError> {
    let fail = |error| SimError::Input { agent_idx, error };
    let mut rng = agent_rng(plan.seed, agent_idx);
    let mut tally = DriverTally {
        ack_ns: Vec::with_capacity(plan.turns_per_agent),
        ..DriverTally::default()
    };
    let mut due = ramp_start;
    if plan.ramp_ms > 0 {
        // The same draw as `ramp_delay`; the spawner already waited for it.
        due += Duration::from_millis(rng.next_u64() % plan.ramp_ms);
        tokio::time::sleep_until(due.into()).await;
    }
    for turn_idx in 0..plan.turns_per_agent {
        let prompt = Message::user_text(
            MessageId::mint(),
            format!("Turn {}: tell me how the log stays durable.", turn_idx + 1),
        );
        let started = Instant::now();
        agent.followup(prompt).await.map_err(fail)?;
        let acked = started.elapsed();
        tally.ack_ns.push(ns(acked));
        if turn_idx == 0 {
            tally
                .arrival_ack_ns
                .push(ns(acked + started.saturating_duration_since(due)));
        }
        tally.followups += 1;
        if rng.chance(plan.steer_rate) {
            let id = MessageId::mint();
            let steer = Message::user_text(id.clone(), "Also mention group commit.");
            let started = Instant::now();
            if let Some(steers) = &steers {
                steers.insert(id, started);
            }
            agent.steer(steer).await.map_err(fail)?;
            tally.ack_ns.push(ns(started.elapsed()));
            tally.steers += 1;
        }
        if rng.chance(plan.cancel_rate) {
            let started = Instant::now();
            agent.cancel(CancelCause::User, false).await.map_err(fail)?;
            agent.when_idle().await.map_err(fail)?;
            tally.cancel_to_idle_ns.push(ns(started.elapsed()));
            tally.cancels += 1;
        }
        agent.when_idle().await.map_err(fail)?;
        progress.turns_driven.fetch_add(1, Ordering::Relaxed);
    }
    Ok(tally)
}

/// What the host-wide observer saw.
#[derive(Default)]
pub(super) struct ObserverTally {
    pub(super) step_ns: Vec<u64>,
    pub(super) steer_to_claim_ns: Vec<u64>,
    pub(super) steers_claimed: u64,
    pub(super) steers_discarded: u64,
    pub(super) turns_started_by_followup: u64,
    pub(super) turns_started_by_steer: u64,
    pub(super) turn_ends: BTreeMap<String, u64>,
    pub(super) lagged: u64,
    pub(super) failures: Vec<(String, String)>,
}

pub(super) struct Observer {
    pub(super) tally: ObserverTally,
    pub(super) steers: SteersInFlight,
    /// Per agent: when its open step's `step/start` was observed.
    pub(super) step_started: HashMap<SessionId, Instant>,
    /// Per agent: the turn of its last observed claim, and whether only steers were claimed in it
    /// so far. A followup is only ever claimed at its turn's first step, so a turn that claims one
    /// was started by it, even when a steer's claim in the same step was observed first.
    pub(super) last_claim: HashMap<SessionId, (u64, bool)>,
}

impl Observer {
    pub(super) fn observe(&mut self, item: Observation) {
        let now = Instant::now();
        match item {
            Observation::Lagged(n) => self.tally.lagged += n,
            Observation::Item(Observed::Event { agent, event, .. }) => match &event.data {
                EventData::StepStart(_) => {
                    self.step_started.insert(agent, now);
                }
                EventData::StepEnd(_) => {
                    if let Some(started) = self.step_started.remove(&agent) {
                        self.tally.step_ns.push(ns(now - started));
                    }
                }
                EventData::TurnEnd(end) => {
                    *self
                        .tally
                        .turn_ends
                        .entry(end.reason.kind().to_string())
                        .or_default() += 1;
                }
                _ => {}
            },
            Observation::Item(Observed::Live { agent, event }) => match event {
                LiveEvent::InboxClaimed { message, turn } => {
                    let steer = self.steers.remove(&message.id);
                    if let Some((_, sent)) = &steer {
                        self.tally.steers_claimed += 1;
                        self.tally.steer_to_claim_ns.push(ns(now - *sent));
                    }
                    let is_steer = steer.is_some();
                    match self.last_claim.get_mut(&agent) {
                        Some((last_turn, only_steers)) if *last_turn == turn => {
                            if *only_steers && !is_steer {
                                *only_steers = false;
                                self.tally.turns_started_by_steer -= 1;
                                self.tally.turns_started_by_followup += 1;
                            }
                        }
                        _ => {
                            self.last_claim.insert(agent, (turn, is_steer));
                            if is_steer {
                                self.tally.turns_started_by_steer += 1;
                            } else {
                                self.tally.turns_started_by_followup += 1;
                            }
                        }
                    }
                }
                LiveEvent::InboxDiscarded(message) if self.steers.remove(&message.id).is_some() => {
                    self.tally.steers_discarded += 1;
                }
                _ => {}
            },
            Observation::Item(Observed::Failed { agent, reason }) => {
                self.tally.failures.push((agent.to_string(), reason));
            }
            Observation::Item(Observed::Restarted { .. }) => {}
        }
    }
}

/// Runs the observer on a thread of its own: as one task among 20,000 agents and drivers it would
/// be polled too rarely to keep up, and lag (losing samples) instead of measuring. It stops once
/// `stop` fires and everything already buffered is read.
pub(super) fn spawn_observer(
    subscriptions: Vec<Subscription>,
    steers: SteersInFlight,
    stop: CancellationToken,
) -> Result<std::thread::JoinHandle<ObserverTally>, SimError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SimError::Task(format!("observer runtime: {e}")))?;
    let streams = subscriptions.into_iter().map(|sub| {
        Box::pin(futures::stream::unfold(sub, |mut sub| async move {
            sub.next().await.map(|item| (item, sub))
        }))
    });
    let mut items = futures::stream::select_all(streams);
    std::thread::Builder::new()
        .name("dsh-sim-observer".into())
        .spawn(move || {
            runtime.block_on(async move {
                let mut observer = Observer {
                    tally: ObserverTally::default(),
                    steers,
                    step_started: HashMap::new(),
                    last_claim: HashMap::new(),
                };
                loop {
                    tokio::select! {
                        biased;
                        item = items.next() => match item {
                            Some(item) => observer.observe(item),
                            None => break,
                        },
                        () = stop.cancelled() => {
                            // Everything published before the stop is buffered: drain it.
                            while let Some(Some(item)) = items.next().now_or_never() {
                                observer.observe(item);
                            }
                            break;
                        }
                    }
                }
                observer.tally
            })
        })
        .map_err(|e| SimError::Task(format!("observer thread: {e}")))
}

/// Runs the measured part of a simulation on a started host: creates the agents, drives their
/// turns, waits until they hibernated, measures the store's ceiling, and assembles the report.
pub(super) async fn run_agents(
    plan: &Arc<SimPlan>,
    store: &SimStore,
    host: &Host,
    progress: &Progress,
) -> Result<SimReport, SimError> {
    let counters = Arc::clone(&progress.counters);
    counters
        .agents_total
        .store(plan.agents as u64, Ordering::Relaxed);
    counters.turns_total.store(
        (plan.agents as u64).saturating_mul(plan.turns_per_agent as u64),
        Ordering::Relaxed,
    );
    let steers: SteersInFlight = Arc::new(DashMap::new());
    trim_heap();
    let (rss_before_bytes, _) = memory_status();
    progress.phase("creating agents");
    let fleet = create_agents(plan, host, &counters).await?;
    let sample = observe_sample(plan, &fleet.agents, &steers)?;

    progress.phase("turns");
    let turns = run_turns(plan, store, host, progress, &fleet.agents, &sample, &steers).await;
    sample.stop.cancel();
    let observed = tokio::task::spawn_blocking(move || sample.observer.join())
        .await
        .map_err(|e| SimError::Task(e.to_string()))?
        .map_err(|_| SimError::Task("the observer thread panicked".into()))?;
    if let Some((agent, reason)) = observed.failures.first() {
        return Err(SimError::AgentFailed {
            agent: agent.clone(),
            reason: reason.clone(),
        });
    }
    let turns = turns?;

    progress.phase("hibernating");
    let memory =
        measure_memory(plan, &fleet.agents, rss_before_bytes, sample.observer_bytes).await?;
    let wake = if plan.wake_sample == 0 {
        WakePhase::default()
    } else {
        progress.phase("waking a sample");
        wake_sample(plan, &fleet.agents).await?
    };
    let store_ceiling = if plan.ceiling_ms == 0 {
        None
    } else {
        progress.phase("measuring the store ceiling");
        let event_bytes = mean_event_bytes(&store.shared(), fleet.agents[0].id()).await?;
        let batch_events = (turns.events as f64 / turns.appends.max(1) as f64)
            .round()
            .max(1.0) as usize;
        Some(
            store_ceiling(
                &store.shared(),
                &plan.ceiling_prefix(),
                plan.agents,
                batch_events,
                event_bytes,
                Duration::from_millis(plan.ceiling_ms),
            )
            .await?,
        )
    };
    Ok(SimReport::assemble(
        plan,
        &fleet,
        turns,
        memory,
        wake,
        store_ceiling,
        observed,
    ))
}

/// The agents of a run, and how fast they were created.
pub(super) struct Fleet {
    /// Every agent, in index order.
    pub(super) agents: Vec<AgentHandle>,
    /// Agents created per second, one after the other.
    pub(super) created_per_sec: f64,
}

/// Creates the run's agents one after the other, counting them for the progress line.
async fn create_agents(
    plan: &SimPlan,
    host: &Host,
    counters: &Counters,
) -> Result<Fleet, SimError> {
    let created_at = Instant::now();
    let mut agents = Vec::with_capacity(plan.agents);
    let mut config = AgentConfig::new("sim", "sim-1");
    config.system = Some("You are a simulated agent under load.".to_string());
    config.compaction.context_window = plan.context_window;
    let prefix = plan.agent_prefix();
    for agent_idx in 0..plan.agents {
        let id = SessionId::new(&format!("{prefix}{agent_idx:07}"))
            .map_err(|e| SimError::Task(format!("agent id: {e}")))?;
        agents.push(
            host.create(AgentSpec::new(config.clone()).with_id(id))
                .await?,
        );
        counters.agents_created.fetch_add(1, Ordering::Relaxed);
    }
    Ok(Fleet {
        agents,
        created_per_sec: per_sec(plan.agents as u64, created_at.elapsed()),
    })
}

/// The observed sample of agents and the observer thread reading their subscriptions.
struct Sample {
    /// Whether each agent (by index) is observed.
    observed: Vec<bool>,
    observer: std::thread::JoinHandle<ObserverTally>,
    /// Stops the observer once everything buffered is read.
    stop: CancellationToken,
    /// Resident memory the subscriptions' buffers took, left out of the per-agent figure.
    observer_bytes: u64,
}

/// Subscribes to a sample of agents, spread evenly, and starts the observer. Only a sample is
/// observed: observing costs each observed agent a copy of every event and a channel send, which
/// would otherwise be measured as the runtime's own cost.
fn observe_sample(
    plan: &SimPlan,
    agents: &[AgentHandle],
    steers: &SteersInFlight,
) -> Result<Sample, SimError> {
    let mut observed = vec![false; plan.agents];
    for k in 0..plan.observe_agents {
        observed[k * plan.agents / plan.observe_agents] = true;
    }
    let (rss_unobserved_bytes, _) = memory_status();
    let subscriptions: Vec<Subscription> = agents
        .iter()
        .zip(&observed)
        .filter(|(_, observed)| **observed)
        .map(|(agent, _)| agent.subscribe())
        .collect();
    let (rss_observed_bytes, _) = memory_status();
    let observer_bytes = match (rss_unobserved_bytes, rss_observed_bytes) {
        (Some(before), Some(after)) => after.saturating_sub(before),
        _ => 0,
    };
    let stop = CancellationToken::new();
    let observer = spawn_observer(subscriptions, Arc::clone(steers), stop.clone())?;
    Ok(Sample {
        observed,
        observer,
        stop,
        observer_bytes,
    })
}

/// What the turns phase measured.
pub(super) struct TurnsPhase {
    /// Wall time of the phase.
    pub(super) elapsed: Duration,
    /// Turns the host ran.
    pub(super) turns: u64,
    /// Events the host made durable.
    pub(super) events: u64,
    /// Compactions that ended, and how many of them failed.
    pub(super) compactions: (u64, u64),
    /// Appends the store took.
    pub(super) appends: u64,
    /// Commit groups the store made (sqlite only).
    pub(super) store_groups: Option<u64>,
    /// WAL bytes those groups wrote (sqlite only).
    pub(super) store_wal_bytes: Option<u64>,
    /// Catch-ups of the WAL the writer ran between groups (sqlite only).
    pub(super) store_catch_ups: Option<u64>,
    /// Times SQLite started the WAL over in place (sqlite only).
    pub(super) store_wal_resets: Option<u64>,
    /// Times the writer checkpointed the whole WAL and truncated it (sqlite only).
    pub(super) store_wal_truncations: Option<u64>,
    /// Wall time the writer held the commits for its catch-ups and WAL restarts (sqlite only).
    pub(super) store_commits_held: Option<Duration>,
    /// Zeros the writer wrote ahead of SQLite at the `-wal` file's end, and the time their chunks
    /// took (sqlite only).
    pub(super) store_wal_prefill: Option<(u64, Duration)>,
    /// CPU time the whole process spent during the phase (every thread).
    pub(super) process_cpu: Duration,
    /// Of which the store's writer spent in its blocking jobs (sqlite only).
    pub(super) store_writer_cpu: Option<Duration>,
    /// Every driver's measurements, merged.
    pub(super) tally: DriverTally,
}

/// Drives every agent through its turns and measures the phase. With `--ramp-ms`, each agent's
/// driver task is spawned only when its first input is due (in the order of the seeded delays),
/// and the drivers are collected in that order as they finish, so the run holds only the drivers
/// of the agents that are working: a million sleeping tasks would cost the process more than the
/// hibernated agents themselves. Their tallies are merged as they come in.
async fn run_turns(
    plan: &Arc<SimPlan>,
    store: &SimStore,
    host: &Host,
    progress: &Progress,
    agents: &[AgentHandle],
    sample: &Sample,
    steers: &SteersInFlight,
) -> Result<TurnsPhase, SimError> {
    let appends_before = store.n_appends();
    let groups_before = store.n_groups();
    let sqlite_before = store.sqlite_stats();
    let process_cpu_before = process_cpu();
    let turns_before = host.metrics().turns();
    let events_before = host.metrics().events();
    let compactions_before = (
        host.metrics().compactions(),
        host.metrics().compactions_failed(),
    );
    let (mirror, mirror_stop) = mirror_metrics(host, progress);
    let started = Instant::now();
    // Agents in the order their first input is due (all at once: index order).
    let mut order: Vec<(Duration, usize)> = (0..agents.len())
        .map(|agent_idx| (ramp_delay(plan, agent_idx), agent_idx))
        .collect();
    order.sort_unstable();
    let (handles, mut spawned) = tokio::sync::mpsc::unbounded_channel();
    let spawner = {
        let agents = agents.to_vec();
        let observed: Vec<usize> = (0..agents.len())
            .filter(|&idx| sample.observed[idx])
            .collect();
        let (plan, steers, counters) = (
            Arc::clone(plan),
            Arc::clone(steers),
            Arc::clone(&progress.counters),
        );
        let gate = Arc::new(tokio::sync::Semaphore::new(DRIVERS_UNSTARTED_MAX));
        tokio::spawn(async move {
            for (delay, agent_idx) in order {
                if !delay.is_zero() {
                    tokio::time::sleep_until((started + delay).into()).await;
                }
                let Ok(unstarted) = Arc::clone(&gate).acquire_owned().await else {
                    break;
                };
                let steers = observed
                    .binary_search(&agent_idx)
                    .is_ok()
                    .then(|| Arc::clone(&steers));
                // Beside its agent: with `--agent-threads`, on the agent's own thread, so the
                // driver's inputs and the agent's answers never wake another thread.
                let agent = &agents[agent_idx];
                let drive = drive(
                    agent.clone(),
                    agent_idx,
                    Arc::clone(&plan),
                    started,
                    steers,
                    Arc::clone(&counters),
                );
                let driver = agent.spawn_beside(async move {
                    drop(unstarted);
                    drive.await
                });
                if handles.send(driver).is_err() {
                    break;
                }
            }
        })
    };
    let mut tally = DriverTally::default();
    let mut first_error = None;
    while let Some(driver) = spawned.recv().await {
        match driver.await {
            Ok(Ok(one)) => tally.absorb(one),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(SimError::Task(e.to_string()));
            }
        }
    }
    if let Err(e) = spawner.await {
        first_error.get_or_insert(SimError::Task(e.to_string()));
    }
    let elapsed = started.elapsed();
    let process_cpu = process_cpu().saturating_sub(process_cpu_before);
    let sqlite_after = store.sqlite_stats();
    let sqlite_grown = |counter: fn(&StoreStats) -> u64| {
        counted_since(
            sqlite_after.as_ref().map(counter),
            sqlite_before.as_ref().map(counter),
        )
    };
    mirror_stop.cancel();
    let _ = mirror.await;
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(TurnsPhase {
        elapsed,
        turns: host.metrics().turns() - turns_before,
        events: host.metrics().events() - events_before,
        compactions: (
            host.metrics().compactions() - compactions_before.0,
            host.metrics().compactions_failed() - compactions_before.1,
        ),
        appends: store.n_appends().saturating_sub(appends_before),
        store_groups: counted_since(store.n_groups(), groups_before),
        store_wal_bytes: sqlite_grown(|s| s.n_wal_bytes_committed),
        store_catch_ups: sqlite_grown(|s| s.n_catch_ups),
        store_wal_resets: sqlite_grown(|s| s.n_wal_resets),
        store_wal_truncations: sqlite_grown(|s| s.n_wal_restarts),
        store_commits_held: sqlite_grown(|s| s.commits_held_ns).map(Duration::from_nanos),
        store_wal_prefill: sqlite_grown(|s| s.n_wal_prefill_bytes)
            .zip(sqlite_grown(|s| s.wal_prefill_ns).map(Duration::from_nanos)),
        process_cpu,
        store_writer_cpu: sqlite_grown(|s| s.writer_cpu_ns).map(Duration::from_nanos),
        tally,
    })
}

/// What a store counter (`None` where the store has none) grew by since `before`.
fn counted_since(after: Option<u64>, before: Option<u64>) -> Option<u64> {
    after
        .zip(before)
        .map(|(after, before)| after.saturating_sub(before))
}

/// CPU time the process has used so far, every thread's (`CLOCK_PROCESS_CPUTIME_ID`).
fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Copies the host's durable-event count to the progress line every 100 ms until stopped.
fn mirror_metrics(
    host: &Host,
    progress: &Progress,
) -> (tokio::task::JoinHandle<()>, CancellationToken) {
    let metrics_mirror = Arc::clone(&progress.metrics_events);
    let stop = CancellationToken::new();
    let host = host.clone();
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        while !stopped.is_cancelled() {
            tokio::select! {
                () = stopped.cancelled() => {}
                _ = tick.tick() => metrics_mirror.store(host.metrics().events(), Ordering::Relaxed),
            }
        }
    });
    (task, stop)
}

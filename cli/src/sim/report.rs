//! What `dsh sim` reports: latency percentiles, the store's ceiling and the whole report, as one
//! JSON object (`--json`) or as text.

use super::*;

/// p50, p99 and max of one latency, in milliseconds; `null` when nothing was measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    /// The median, in ms.
    pub p50: Option<f64>,
    /// The 99th percentile, in ms.
    pub p99: Option<f64>,
    /// The largest sample, in ms.
    pub max: Option<f64>,
    /// How many samples were taken.
    pub n: u64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples_ns` (sorted in place).
    pub fn of(samples_ns: &mut [u64]) -> Percentiles {
        samples_ns.sort_unstable();
        let n = samples_ns.len();
        let rank = |p: f64| -> Option<f64> {
            if n == 0 {
                return None;
            }
            let idx = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            Some(ms(samples_ns[idx]))
        };
        Percentiles {
            p50: rank(0.50),
            p99: rank(0.99),
            max: rank(1.0),
            n: n as u64,
        }
    }
}

pub(super) fn ms(ns: u64) -> f64 {
    // Microsecond resolution is all a report needs.
    (ns / 1_000) as f64 / 1_000.0
}

pub(super) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The store's own group-commit ceiling, measured in the same run.
#[derive(Clone, Debug, Serialize)]
pub struct CeilingReport {
    /// Durable events per second the store took.
    pub events_per_sec: f64,
    /// Concurrent appenders (one per agent of the run).
    pub appenders: usize,
    /// Events appended during the measurement.
    pub events: u64,
    /// Events per append (the run's mean, rounded, at least 1).
    pub batch_events: usize,
    /// Bytes of one event's JSON (the run's mean).
    pub event_bytes: usize,
    /// How long the measurement ran.
    pub duration_ms: f64,
}

/// Everything `dsh sim` reports. `--json` prints it as one object (SPEC §10 names the required keys).
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    /// Agents hosted.
    pub agents: usize,
    /// Turns that ended, over all agents (`host.metrics()`).
    pub turns: u64,
    /// Turns each agent was driven through.
    pub turns_per_agent: usize,
    /// From the first input sent to the last agent idle.
    pub duration_ms: f64,
    /// `turns` per second of `duration_ms`.
    pub turns_per_sec: f64,
    /// Events acknowledged durable by the store during the run.
    pub events: u64,
    /// `events` per second of `duration_ms`.
    pub events_per_sec: f64,
    /// The store used.
    pub store: StoreChoice,
    /// Where the sqlite store is, when `--keep-store` kept it.
    pub store_dir: Option<PathBuf>,
    /// The store's own ceiling, when measured.
    pub store_ceiling: Option<CeilingReport>,
    /// Appends the runtime made during the run (each one batch of one agent's events).
    pub store_appends: u64,
    /// Commit groups (one fsync each) the sqlite store made during the run.
    pub store_groups: Option<u64>,
    /// `store_groups` / `turns`: the syncs one turn cost (with many agents at once, groups are
    /// shared and this falls below one).
    pub syncs_per_turn: Option<f64>,
    /// WAL bytes the sqlite store's commit groups wrote during the run: whole pages (each
    /// modified B-tree page and the database header page) with a 24-byte frame header, what
    /// every sync must write; a lone agent's text turn writes ~43 KiB (~10 frames) for ~5 KB of
    /// events.
    pub store_wal_bytes: Option<u64>,
    /// Catch-ups the sqlite store's writer ran during the run: between two commit groups, with the
    /// commits waiting, it copies the WAL frames committed while a checkpoint ran beside them, so
    /// that SQLite can start the WAL over (one per `checkpoint_after_bytes` of WAL, about).
    pub store_catch_ups: Option<u64>,
    /// Times SQLite started the WAL over from its beginning during the run, at the first commit
    /// after a catch-up (or a checkpoint) had copied all of it: how the `-wal` file stays bounded
    /// without being truncated.
    pub store_wal_resets: Option<u64>,
    /// Times the sqlite store's writer checkpointed the whole WAL and truncated it during the run
    /// (`wal_restart_after_bytes` written with no reset: a reader was in the way).
    pub store_wal_truncations: Option<u64>,
    /// Wall time the sqlite store's writer held the commits for its catch-ups and WAL truncations
    /// during the run, in all: what those added to the acknowledgements waiting behind them.
    pub store_commits_held_ms: Option<f64>,
    /// Zeros the sqlite store's writer wrote at the `-wal` file's end during the run, ahead of
    /// SQLite, so that its commits overwrite blocks the file has instead of growing it
    /// (`SqliteConfig::wal_prefill_bytes`; up to 64 MiB in a store's life, then none).
    pub store_wal_prefill_bytes: Option<u64>,
    /// The time those chunks' writes and syncs took, in all. The writer runs them only with
    /// nothing to commit; a commit that arrives meanwhile waits for the chunk.
    pub store_wal_prefill_ms: Option<f64>,
    /// The time of one sync (a 4 KiB write and `fdatasync` of a scratch file beside the sqlite
    /// store), measured in the same run right after the turns: what a commit group costs at least.
    pub sync_ms: Option<Percentiles>,
    /// `events_per_sec` / `store_ceiling.events_per_sec`.
    pub store_ceiling_ratio: Option<f64>,
    /// CPU time the whole process spent during the turns (every thread: the runtime, the drivers,
    /// the simulated model, the store).
    pub turns_cpu_ms: f64,
    /// Of `turns_cpu_ms`, what the sqlite store's writer spent in its blocking jobs (commit groups,
    /// checkpoints): the store's own work. The rest is the runtime's, the drivers' and the model's.
    /// With the writer beside a runtime that needs R of CPU per turn against the writer's W, two
    /// cores give the writer about 2 / (1 + R/W) of one core, and the ceiling ratio follows it.
    pub store_writer_cpu_ms: Option<f64>,
    /// Agents created per second, one after the other.
    pub agents_created_per_sec: f64,
    /// `VmHWM` once the agents hibernated: the most resident memory the process had during the run
    /// (before the store-ceiling burst).
    pub peak_rss_bytes: Option<u64>,
    /// `VmRSS` before the agents were created.
    pub rss_before_bytes: Option<u64>,
    /// `VmRSS` after the agents hibernated, once the allocator returned its free memory (glibc
    /// `malloc_trim`): what the agents hold, not what the run's transient logs left behind.
    pub rss_hibernated_bytes: Option<u64>,
    /// (`rss_hibernated_bytes` - `rss_before_bytes` - `observer_bytes`) / `agents`.
    pub bytes_per_agent: Option<u64>,
    /// The same before the allocator returned its free memory: what a process that just ran this
    /// load actually keeps resident.
    pub bytes_per_agent_untrimmed: Option<u64>,
    /// `VmRSS` growth while the observed agents were subscribed (their subscription buffers).
    pub observer_bytes: u64,
    /// Agents that hibernated before the memory was read.
    pub hibernated_agents: usize,
    /// From `step/start` to `step/end` on the observed agents.
    pub step_latency_ms: Percentiles,
    /// A followup or steer call, until the input was durable.
    pub ack_latency_ms: Percentiles,
    /// Each agent's first followup, from when it was due (the start of the turns, plus its
    /// `--ramp-ms` delay) until the input was durable: `ack_latency_ms` plus the time the input
    /// waited for its driver to run, which a burst of thousands spends in the runtime's queues.
    pub arrival_ack_ms: Percentiles,
    /// From a steer to its claim at a step boundary, on the observed agents.
    pub steer_to_claim_ms: Percentiles,
    /// From a cancel until the agent was idle.
    pub cancel_to_idle_ms: Percentiles,
    /// A hibernated agent's first followup (`--wake-sample` agents, one at a time, once all
    /// hibernated), until the input was durable.
    pub wake_ack_ms: Percentiles,
    /// The same followup until the turn it started ended (the log read back included).
    pub wake_turn_ms: Percentiles,
    /// Followups sent.
    pub followups: u64,
    /// Steers sent.
    pub steers: u64,
    /// Steers of the observed agents claimed at a step boundary.
    pub steers_claimed: u64,
    /// Steers of the observed agents a cancel discarded before a step boundary claimed them.
    pub steers_discarded: u64,
    /// Cancels sent.
    pub cancels: u64,
    /// Turns of the observed agents whose first claimed message was a followup, or a steer (a
    /// steer that arrived after the turn it chased had ended starts a turn of its own).
    pub turns_started_by_followup: u64,
    /// See `turns_started_by_followup`.
    pub turns_started_by_steer: u64,
    /// `turn/end` reasons of the observed agents, by kind.
    pub turn_ends: BTreeMap<String, u64>,
    /// Compactions that ended during the run, over all agents (`--context-window`, SPEC §15).
    pub compactions: u64,
    /// Of those, the ones that failed (logged, the history unchanged).
    pub compactions_failed: u64,
    /// How many agents were observed (step, steer and turn-end figures come from them).
    pub observed_agents: usize,
    /// Observations the host-wide observer missed (its samples are then incomplete).
    pub observer_lagged: u64,
    /// The flags of the run.
    pub config: SimPlan,
}

impl SimReport {
    /// The report of a finished run from what each of its phases measured.
    pub(super) fn assemble(
        plan: &SimPlan,
        fleet: &Fleet,
        turns: TurnsPhase,
        memory: MemoryPhase,
        mut wake: WakePhase,
        store_ceiling: Option<CeilingReport>,
        mut observed: ObserverTally,
    ) -> SimReport {
        let DriverTally {
            mut ack_ns,
            mut arrival_ack_ns,
            mut cancel_to_idle_ns,
            followups,
            steers: steers_sent,
            cancels,
        } = turns.tally;
        let elapsed = turns.elapsed;
        let events_per_sec = per_sec(turns.events, elapsed);
        SimReport {
            agents: plan.agents,
            turns: turns.turns,
            turns_per_agent: plan.turns_per_agent,
            duration_ms: elapsed.as_secs_f64() * 1000.0,
            turns_per_sec: per_sec(turns.turns, elapsed),
            events: turns.events,
            events_per_sec,
            store: plan.store,
            store_dir: None,
            store_appends: turns.appends,
            store_groups: turns.store_groups,
            syncs_per_turn: turns
                .store_groups
                .filter(|_| turns.turns > 0)
                .map(|g| g as f64 / turns.turns as f64),
            store_wal_bytes: turns.store_wal_bytes,
            store_catch_ups: turns.store_catch_ups,
            store_wal_resets: turns.store_wal_resets,
            store_wal_truncations: turns.store_wal_truncations,
            store_commits_held_ms: turns.store_commits_held.map(|d| d.as_secs_f64() * 1000.0),
            store_wal_prefill_bytes: turns.store_wal_prefill.map(|(bytes, _)| bytes),
            store_wal_prefill_ms: turns
                .store_wal_prefill
                .map(|(_, took)| took.as_secs_f64() * 1000.0),
            sync_ms: None,
            store_ceiling_ratio: store_ceiling
                .as_ref()
                .filter(|c| c.events_per_sec > 0.0)
                .map(|c| events_per_sec / c.events_per_sec),
            store_ceiling,
            turns_cpu_ms: turns.process_cpu.as_secs_f64() * 1000.0,
            store_writer_cpu_ms: turns.store_writer_cpu.map(|d| d.as_secs_f64() * 1000.0),
            agents_created_per_sec: fleet.created_per_sec,
            peak_rss_bytes: memory.peak_rss_bytes,
            rss_before_bytes: memory.rss_before_bytes,
            rss_hibernated_bytes: memory.rss_hibernated_bytes,
            bytes_per_agent: memory.bytes_per_agent,
            bytes_per_agent_untrimmed: memory.bytes_per_agent_untrimmed,
            observer_bytes: memory.observer_bytes,
            hibernated_agents: memory.hibernated_agents,
            step_latency_ms: Percentiles::of(&mut observed.step_ns),
            ack_latency_ms: Percentiles::of(&mut ack_ns),
            arrival_ack_ms: Percentiles::of(&mut arrival_ack_ns),
            steer_to_claim_ms: Percentiles::of(&mut observed.steer_to_claim_ns),
            cancel_to_idle_ms: Percentiles::of(&mut cancel_to_idle_ns),
            wake_ack_ms: Percentiles::of(&mut wake.ack_ns),
            wake_turn_ms: Percentiles::of(&mut wake.turn_ns),
            followups,
            steers: steers_sent,
            steers_claimed: observed.steers_claimed,
            steers_discarded: observed.steers_discarded,
            cancels,
            turns_started_by_followup: observed.turns_started_by_followup,
            turns_started_by_steer: observed.turns_started_by_steer,
            turn_ends: observed.turn_ends,
            compactions: turns.compactions.0,
            compactions_failed: turns.compactions.1,
            observed_agents: plan.observe_agents,
            observer_lagged: observed.lagged,
            config: plan.clone(),
        }
    }

    /// The human-readable report.
    ///
    /// # Errors
    /// When `out` cannot be written.
    pub fn render(&self, out: &mut dyn Write) -> std::io::Result<()> {
        self.render_header(out)?;
        self.render_throughput(out)?;
        self.render_latencies(out)?;
        self.render_memory_and_inputs(out)
    }

    /// The run's settings, on one line.
    fn render_header(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let c = &self.config;
        writeln!(
            out,
            "dsh sim: {} agents x {} turns, store {}, model: first token {} ms, {} tokens/s, {} tokens/reply, tool rate {}, tool {} ms; steer rate {}, cancel rate {}, seed {}",
            self.agents,
            c.turns_per_agent,
            store_name(c.store),
            c.latency_ms,
            if c.tokens_per_sec == 0 {
                "unpaced".to_string()
            } else {
                c.tokens_per_sec.to_string()
            },
            c.reply_tokens,
            c.tool_rate,
            c.tool_ms,
            c.steer_rate,
            c.cancel_rate,
            c.seed,
        )?;
        if c.agent_threads > 0 {
            writeln!(
                out,
                "  agents pinned to {} threads of the host's own",
                c.agent_threads
            )?;
        }
        Ok(())
    }

    /// Turns, durable events against the store's ceiling, appends and agent creation.
    fn render_throughput(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(
            out,
            "  turns           {:>10} in {:.3} s   {:>12.0} turns/s",
            self.turns,
            self.duration_ms / 1000.0,
            self.turns_per_sec
        )?;
        write!(
            out,
            "  durable events  {:>10}              {:>12.0} events/s",
            self.events, self.events_per_sec
        )?;
        match (&self.store_ceiling, self.store_ceiling_ratio) {
            (Some(ceiling), Some(ratio)) => writeln!(
                out,
                "   ({:.0} % of the store's ceiling, {:.0} events/s with {} appenders)",
                ratio * 100.0,
                ceiling.events_per_sec,
                ceiling.appenders
            )?,
            _ => writeln!(out)?,
        }
        writeln!(
            out,
            "  store appends   {:>10}{}",
            self.store_appends,
            self.store_groups.map_or_else(String::new, |g| format!(
                " in {g} commit groups ({:.1} appends/group)",
                self.store_appends as f64 / g.max(1) as f64
            ))
        )?;
        if let Some(per_turn) = self.syncs_per_turn {
            let sync = self
                .sync_ms
                .as_ref()
                .and_then(|p| p.p50)
                .map_or_else(String::new, |p50| {
                    format!(
                        "; one sync {p50:.3} ms (p50), {:.3} ms a turn at that count",
                        p50 * per_turn
                    )
                });
            writeln!(out, "  syncs per turn  {per_turn:>10.2}{sync}")?;
        }
        if let Some(wal) = self.store_wal_bytes {
            writeln!(
                out,
                "  WAL per turn    {:>10.1} KiB{}",
                wal as f64 / 1024.0 / self.turns.max(1) as f64,
                self.store_groups.map_or_else(String::new, |g| format!(
                    " ({:.1} KiB a sync)",
                    wal as f64 / 1024.0 / g.max(1) as f64
                ))
            )?;
        }
        if let Some((n, held_ms)) = self.store_catch_ups.zip(self.store_commits_held_ms) {
            writeln!(
                out,
                "  WAL catch-ups   {n:>10} holding the commits {held_ms:.1} ms in all{}",
                if n > 0 {
                    format!(" ({:.2} ms each, truncations included)", held_ms / n as f64)
                } else {
                    String::new()
                }
            )?;
        }
        if let Some((resets, truncations)) = self.store_wal_resets.zip(self.store_wal_truncations) {
            writeln!(
                out,
                "  WAL starts over {resets:>10} in place, {truncations} truncated"
            )?;
        }
        if let Some((bytes, ms)) = self.store_wal_prefill_bytes.zip(self.store_wal_prefill_ms) {
            writeln!(
                out,
                "  WAL prefill     {:>10.1} MiB written ahead of SQLite in {ms:.1} ms",
                bytes as f64 / f64::from(1u32 << 20)
            )?;
        }
        let per_turn = |ms: f64| ms * 1000.0 / self.turns.max(1) as f64;
        writeln!(
            out,
            "  CPU per turn    {:>10.1} µs{}",
            per_turn(self.turns_cpu_ms),
            self.store_writer_cpu_ms
                .map_or_else(String::new, |w| format!(
                    " (store writer {:.1} µs, the rest {:.1} µs)",
                    per_turn(w),
                    per_turn(self.turns_cpu_ms - w)
                ))
        )?;
        writeln!(
            out,
            "  agents created  {:>10.0} /s",
            self.agents_created_per_sec
        )
    }

    /// The latency table.
    fn render_latencies(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(
            out,
            "  latency (ms)              p50        p99        max          n"
        )?;
        let mut rows = vec![
            ("step", &self.step_latency_ms),
            ("input ack", &self.ack_latency_ms),
            ("due -> ack", &self.arrival_ack_ms),
            ("steer -> claim", &self.steer_to_claim_ms),
            ("cancel -> idle", &self.cancel_to_idle_ms),
        ];
        if self.config.wake_sample > 0 {
            rows.push(("wake ack", &self.wake_ack_ms));
            rows.push(("wake turn", &self.wake_turn_ms));
        }
        for (name, p) in rows {
            let cell = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.3}"));
            writeln!(
                out,
                "    {name:<16} {:>10} {:>10} {:>10} {:>10}",
                cell(p.p50),
                cell(p.p99),
                cell(p.max),
                p.n
            )?;
        }
        Ok(())
    }

    /// Memory, inputs, turn endings and notes.
    fn render_memory_and_inputs(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let mib = |b: Option<u64>| {
            b.map_or_else(
                || "unknown".to_string(),
                |b| format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
            )
        };
        let bytes =
            |b: Option<u64>| b.map_or_else(|| "unknown".to_string(), |b| format!("{b} bytes"));
        writeln!(
            out,
            "  memory: peak RSS {}; {} per hibernated agent, {} before the allocator returned free memory ({} of {} hibernated)",
            mib(self.peak_rss_bytes),
            bytes(self.bytes_per_agent),
            bytes(self.bytes_per_agent_untrimmed),
            self.hibernated_agents,
            self.agents
        )?;
        writeln!(
            out,
            "  inputs: {} followups, {} steers ({} claimed, {} discarded by a cancel), {} cancels",
            self.followups, self.steers, self.steers_claimed, self.steers_discarded, self.cancels
        )?;
        let ends: Vec<String> = self
            .turn_ends
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect();
        writeln!(
            out,
            "  turn ends ({} observed agents): {}",
            self.observed_agents,
            ends.join(", ")
        )?;
        if let Some(window) = self.config.context_window {
            writeln!(
                out,
                "  compactions: {} ({} failed), context window {window} tokens",
                self.compactions, self.compactions_failed
            )?;
        }
        if self.observer_lagged > 0 {
            writeln!(
                out,
                "  note: the observer missed {} notifications; step and steer samples are incomplete",
                self.observer_lagged
            )?;
        }
        if let Some(dir) = &self.store_dir {
            writeln!(out, "  store kept in {}", dir.display())?;
        }
        Ok(())
    }
}

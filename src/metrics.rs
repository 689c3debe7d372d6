//! Prometheus metrics (`GET /metrics`, text exposition format). Counters and the commit
//! histogram live here and are bumped by the driver; gauges about stored state (runs by
//! state, outbox depth and age, dead letters) are read from the store at scrape time,
//! through counters and indexes kept in the same transactions, never a scan.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    /// A failure class, or `none` (succeeded, or stopped by a cancel or the budget).
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecutorLabel {
    pub executor: String,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    pub runs: Family<StateLabel, Gauge>,
    pub run_transitions: Family<StateLabel, Counter>,
    pub attempts: Family<ClassLabel, Counter>,
    pub retries: Counter,
    pub dead_letters: Counter,
    pub dead_letter_queue: Gauge,
    pub outbox_depth: Gauge,
    pub outbox_oldest_age: Gauge,
    pub commit_seconds: Histogram,
    pub commit_failures: Counter,
    pub sweep_passes: Counter,
    pub sweep_scheduled: Counter,
    pub sweep_quarantined: Counter,
    pub sweep_skipped: Family<ReasonLabel, Counter>,
    pub sweep_pass_seconds: Histogram,
    pub executor_available: Family<ExecutorLabel, Gauge>,
    pub ready: Gauge,
    /// Non-terminal runs whose stored records do not decode (or whose pipeline no longer
    /// validates), as of the last forward-progress check.
    pub unreadable_runs: Gauge,
    /// Stored records that failed to decode, counted where they were read.
    pub unreadable_records: Counter,
    /// Admission control: slots in use and the limit per pool, queued steps by what they
    /// wait for, and how long admitted steps waited.
    pub pool_slots_used: Family<PoolLabel, Gauge>,
    pub pool_slots_limit: Family<PoolLabel, Gauge>,
    pub queued_steps: Family<ReasonLabel, Gauge>,
    pub queued_seconds: Histogram,
    /// 1 while the state dir's disk is full (submissions refused with 507).
    pub disk_full: Gauge,
    pub disk_full_events: Counter,
    /// The wall clock minus Scarab's time, whole seconds.
    pub clock_skew: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("scarab");
        let metrics = Metrics {
            registry: Mutex::new(Registry::default()),
            runs: Family::default(),
            run_transitions: Family::default(),
            attempts: Family::default(),
            retries: Counter::default(),
            dead_letters: Counter::default(),
            dead_letter_queue: Gauge::default(),
            outbox_depth: Gauge::default(),
            outbox_oldest_age: Gauge::default(),
            // 100 µs .. ~3.3 s: a commit is an fsync or a few.
            commit_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 16),
            ),
            commit_failures: Counter::default(),
            sweep_passes: Counter::default(),
            sweep_scheduled: Counter::default(),
            sweep_quarantined: Counter::default(),
            sweep_skipped: Family::default(),
            sweep_pass_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.0005, 2.0, 14),
            ),
            executor_available: Family::default(),
            ready: Gauge::default(),
            unreadable_runs: Gauge::default(),
            unreadable_records: Counter::default(),
            pool_slots_used: Family::default(),
            pool_slots_limit: Family::default(),
            queued_steps: Family::default(),
            // 10 ms .. ~1.5 days.
            queued_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.01, 4.0, 14),
            ),
            disk_full: Gauge::default(),
            disk_full_events: Counter::default(),
            clock_skew: Gauge::default(),
        };
        registry.register("runs", "Runs by state", metrics.runs.clone());
        registry.register(
            "run_state_changes",
            "Run state changes, by the state entered",
            metrics.run_transitions.clone(),
        );
        registry.register(
            "attempts_finished",
            "Finished attempts by failure class (none: succeeded or stopped)",
            metrics.attempts.clone(),
        );
        registry.register("retries", "Retries scheduled", metrics.retries.clone());
        registry.register(
            "outbox_dead_letters",
            "Outbox messages dead-lettered",
            metrics.dead_letters.clone(),
        );
        registry.register(
            "dead_letter_queue_depth",
            "Messages in the dead-letter queue",
            metrics.dead_letter_queue.clone(),
        );
        registry.register(
            "outbox_depth",
            "Outbox messages not yet delivered",
            metrics.outbox_depth.clone(),
        );
        registry.register_with_unit(
            "outbox_oldest_message_age",
            "Age of the oldest undelivered outbox message",
            prometheus_client::registry::Unit::Seconds,
            metrics.outbox_oldest_age.clone(),
        );
        registry.register_with_unit(
            "commit_duration",
            "Durable write transactions (group commits), from open to fsync",
            prometheus_client::registry::Unit::Seconds,
            metrics.commit_seconds.clone(),
        );
        registry.register(
            "commit_failures",
            "Write transactions that failed (state reloaded from the store)",
            metrics.commit_failures.clone(),
        );
        registry.register(
            "auto_retry_passes",
            "Auto-retry sweep passes",
            metrics.sweep_passes.clone(),
        );
        registry.register(
            "auto_retry_scheduled",
            "Runs resubmitted by the auto-retry sweep",
            metrics.sweep_scheduled.clone(),
        );
        registry.register(
            "auto_retry_quarantined",
            "Runs quarantined by the auto-retry sweep",
            metrics.sweep_quarantined.clone(),
        );
        registry.register(
            "auto_retry_skipped",
            "Candidates the auto-retry sweep skipped, by reason",
            metrics.sweep_skipped.clone(),
        );
        registry.register_with_unit(
            "auto_retry_pass_duration",
            "Auto-retry sweep pass duration",
            prometheus_client::registry::Unit::Seconds,
            metrics.sweep_pass_seconds.clone(),
        );
        registry.register(
            "executor_available",
            "1 if the executor's last delivery succeeded (or it was not used yet), else 0",
            metrics.executor_available.clone(),
        );
        registry.register(
            "ready",
            "1 once recovery and re-adoption are done",
            metrics.ready.clone(),
        );
        registry.register(
            "unreadable_runs",
            "Non-terminal runs whose stored records cannot be read, at the last progress check",
            metrics.unreadable_runs.clone(),
        );
        registry.register(
            "unreadable_records",
            "Stored records that failed to decode when read",
            metrics.unreadable_records.clone(),
        );
        registry.register(
            "pool_slots_used",
            "Slots held by active steps, per pool (local, kubernetes)",
            metrics.pool_slots_used.clone(),
        );
        registry.register(
            "pool_slots_limit",
            "The limit of each pool (engine.max_parallel_local, kubernetes.max_pods)",
            metrics.pool_slots_limit.clone(),
        );
        registry.register(
            "queued_steps",
            "Steps waiting for admission, by what they wait for (pool, lock, group, parallelism)",
            metrics.queued_steps.clone(),
        );
        registry.register_with_unit(
            "queued_duration",
            "Time admitted steps spent queued",
            prometheus_client::registry::Unit::Seconds,
            metrics.queued_seconds.clone(),
        );
        registry.register(
            "disk_full",
            "1 while the state dir's disk is full: submissions are refused (507), what runs is still recorded",
            metrics.disk_full.clone(),
        );
        registry.register(
            "disk_full_events",
            "Times the state dir's disk filled",
            metrics.disk_full_events.clone(),
        );
        registry.register_with_unit(
            "clock_skew",
            "The wall clock minus Scarab's own time (monotonic since start), after the last commit",
            prometheus_client::registry::Unit::Seconds,
            metrics.clock_skew.clone(),
        );
        if let Ok(mut slot) = metrics.registry.lock() {
            *slot = registry;
        }
        metrics
    }

    pub fn attempt_finished(&self, class: &str) {
        self.attempts
            .get_or_create(&ClassLabel {
                class: class.to_string(),
            })
            .inc();
    }

    pub fn run_entered(&self, state: &str) {
        self.run_transitions
            .get_or_create(&StateLabel {
                state: state.to_string(),
            })
            .inc();
    }

    /// A pool's slots in use and limit.
    pub fn pool(&self, pool: &str, used: u64, limit: u64) {
        let label = PoolLabel {
            pool: pool.to_string(),
        };
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.pool_slots_used.get_or_create(&label).set(gauge(used));
        self.pool_slots_limit
            .get_or_create(&label)
            .set(gauge(limit));
    }

    /// Steps queued for `reason`.
    pub fn queued(&self, reason: &str, count: usize) {
        let label = ReasonLabel {
            reason: reason.to_string(),
        };
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        self.queued_steps.get_or_create(&label).set(count);
    }

    /// A queued step was admitted after `waited_ms`.
    pub fn admitted(&self, waited_ms: u64) {
        self.queued_seconds.observe(waited_ms as f64 / 1000.0);
    }

    /// The text exposition (OpenMetrics text, which Prometheus scrapes).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        let registry = self.registry.lock().map_err(|_| std::fmt::Error)?;
        prometheus_client::encoding::text::encode(&mut text, &registry)?;
        Ok(text)
    }
}

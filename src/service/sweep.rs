//! The auto-retry sweep (docs/auto-retry.md): a periodic pass that reads at most `scan_limit`
//! rows of the auto-retry index (dead-lettered, auto-retryable runs by eligibility time;
//! never the runs table) and hands them to the driver, which re-checks each inside its
//! write transaction and resubmits, quarantines or skips it. Off by default: a pass of a
//! disabled sweep returns at once.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::Command;
use crate::engine::{AutoRetrySettings, SkipReason};
use crate::store::{Store, StoreError};

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassOutcome {
    /// Index rows read.
    pub scanned: usize,
    /// Runs that were eligible for a resubmit (some may wait for the next pass).
    pub eligible: usize,
    pub resubmitted: usize,
    pub quarantined: usize,
    pub skipped: BTreeMap<&'static str, usize>,
    pub duration: Duration,
}

impl PassOutcome {
    pub fn skip(&mut self, reason: SkipReason) {
        *self.skipped.entry(reason.as_str()).or_default() += 1;
    }

    pub fn skipped_total(&self) -> usize {
        self.skipped.values().sum()
    }
}

/// Counters since start, for `/metrics`.
#[derive(Debug, Default)]
pub struct SweepStats {
    pub passes: AtomicU64,
    pub scheduled: AtomicU64,
    pub quarantined: AtomicU64,
    pub skipped: Mutex<BTreeMap<&'static str, u64>>,
    pub last_pass_micros: AtomicU64,
}

impl SweepStats {
    fn record(&self, outcome: &PassOutcome) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.scheduled
            .fetch_add(outcome.resubmitted as u64, Ordering::Relaxed);
        self.quarantined
            .fetch_add(outcome.quarantined as u64, Ordering::Relaxed);
        self.last_pass_micros.store(
            u64::try_from(outcome.duration.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if let Ok(mut skipped) = self.skipped.lock() {
            for (reason, count) in &outcome.skipped {
                *skipped.entry(reason).or_default() += *count as u64;
            }
        }
    }
}

fn settings_now(settings: &super::Settings) -> AutoRetrySettings {
    settings.live().auto_retry.clone()
}

/// Where a pass's outcome is counted.
pub(super) type Stats = (
    std::sync::Arc<SweepStats>,
    std::sync::Arc<crate::metrics::Metrics>,
);

/// One pass: read the due candidates, let the driver act on them, log one summary line.
pub(super) async fn pass(
    store: &Store,
    commands: &mpsc::Sender<Command>,
    settings: &AutoRetrySettings,
    (stats, metrics): &Stats,
) -> Result<PassOutcome, StoreError> {
    let started = Instant::now();
    let now = crate::clock::now();
    let candidates = store.read()?.auto_retry_due(now, settings.scan_limit)?;
    let (reply, answer) = oneshot::channel();
    let shutting_down = || StoreError::Corrupt("the service is shutting down".into());
    commands
        .send(Command::Sweep { candidates, reply })
        .await
        .map_err(|_| shutting_down())?;
    let mut outcome = answer.await.map_err(|_| shutting_down())?;
    outcome.duration = started.elapsed();
    stats.record(&outcome);
    metrics.sweep_passes.inc();
    metrics.sweep_scheduled.inc_by(outcome.resubmitted as u64);
    metrics.sweep_quarantined.inc_by(outcome.quarantined as u64);
    for (reason, count) in &outcome.skipped {
        metrics
            .sweep_skipped
            .get_or_create(&crate::metrics::ReasonLabel {
                reason: reason.to_string(),
            })
            .inc_by(*count as u64);
    }
    metrics
        .sweep_pass_seconds
        .observe(outcome.duration.as_secs_f64());
    tracing::info!(
        scanned = outcome.scanned,
        eligible = outcome.eligible,
        resubmitted = outcome.resubmitted,
        quarantined = outcome.quarantined,
        skipped = outcome.skipped_total(),
        duration_ms = outcome.duration.as_secs_f64() * 1000.0,
        "auto-retry sweep pass"
    );
    Ok(outcome)
}

/// The periodic task. It reads the settings at every tick, so a reload takes effect at
/// the next one; a disabled sweep does nothing at all.
pub(super) async fn run(
    store: std::sync::Arc<Store>,
    commands: mpsc::Sender<Command>,
    settings: std::sync::Arc<super::Settings>,
    stats: Stats,
    mut shutdown: watch::Receiver<bool>,
) {
    let settings_source = settings;
    loop {
        let settings = settings_now(&settings_source);
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(settings.interval) => {}
        }
        // Read again after the sleep: a reload that turned the sweep off holds at once.
        let settings = settings_now(&settings_source);
        if !settings.enabled {
            continue;
        }
        if let Err(error) = pass(&store, &commands, &settings, &stats).await {
            tracing::error!(%error, "auto-retry sweep pass failed");
        }
    }
}

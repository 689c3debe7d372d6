//! The driver loop: the only caller of the engine and the only writer of the store.
//!
//! It folds every input that is waiting (up to `COMMIT_BATCH_MAX`; for a lone one, after
//! letting the runtime's other ready tasks send theirs) into one write transaction
//! (group commit): runs' new state, history, outbox messages and timers land
//! together, durably, before any reply is sent or any message is dispatched. After a
//! small batch's commit it yields once, so that the tasks the commit woke run before
//! the next batch is gathered. Every read the driver makes while a batch is open goes
//! through that write transaction, so the batch sees its own writes.
//!
//! Layout: this file is the loop and the group commit; `recovery` loads the store and
//! re-adopts at start; `commands` answers the service's commands; `deliveries` settles
//! outbox deliveries, dead letters and due timers; `effects` feeds one input to the
//! engine and writes what it decided (history, outbox messages, timers, rows).

mod backstops;
mod commands;
mod deliveries;
mod effects;
mod recovery;
mod schedules;

pub(crate) use effects::timer_key;
pub use recovery::{parse_stored, rebuild};

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::dispatch::{Outbox, redelivery_delay};
use super::protocol::{
    Answer, Command, DecideRejected, Decided, DeliveryFailure, DlqRejected, OutputRejected,
    RunRejected, ServiceError, SubmitRejected, Submitted,
};
use super::{Settings, history, webhooks};
use crate::clock;
use crate::config::WebhookEvent;
use crate::engine::admission::Scheduler;
use crate::engine::{
    Effects, Engine, FenceCounter, Input, Intent, RejectedInput, Run, RunId, RunState, Timer,
    Timestamp, Undelivered,
};
use crate::executor::{Adoption, Executor, Report};
use crate::limits;
use crate::pipeline::{self, Format, Pipeline};
use crate::store::records::{
    DeadLetter, DeadLetterCategory, ExecutorKind, HistoryRecord, LaunchAction, LaunchRecord,
    OutboxMessage, OutboxPayload, PipelineSource, SourceFormat, StoredRun, TimerKey, TimerKind,
};
use crate::store::{RunRows, Store, StoreError, WriteTx};

pub struct Driver<E: Executor> {
    store: Arc<Store>,
    settings: Arc<Settings>,
    engine: Engine,
    executor: E,
    outbox: Outbox,
    /// Every non-terminal run, as last committed (or being changed by the open batch).
    runs: HashMap<RunId, Run>,
    /// Finished runs `load` brought into `runs` during the open batch: they leave it
    /// again after the batch unless an input made them active.
    loaded: Vec<RunId>,
    fences: FenceCounter,
    /// The earliest due time of the store's timers and schedules.
    next_timer: Option<Timestamp>,
    /// The backstops of the running attempts (`backstops`): in memory, not in the store.
    backstops: backstops::Backstops,
    /// When the retention sweep has work next (`deliveries::sweep_retention`): derived
    /// from the state index, moved earlier by each run that ends.
    next_retention: Option<Timestamp>,
    metrics: Arc<crate::metrics::Metrics>,
    /// Admission control: who holds which slot and who waits, rebuilt from `runs`.
    scheduler: Scheduler,
    /// The last run id issued, so the next one sorts after it.
    last_run_id: Option<RunId>,
    /// The state dir's reserve file (`service::disk`).
    reserve: std::path::PathBuf,
    /// The clock skew last logged.
    reported_skew_ms: i64,
    /// When this process's driver started: schedule fires due before it were missed.
    started_at: Timestamp,
    /// The live event stream: each batch's history records once it committed.
    events: Arc<super::events::Events>,
    /// Launches delivered (their supervisor waits at the launch handshake) that may not
    /// start yet (`Scheduler::may_start`): prepared ahead while the pool is full. Their
    /// messages stay in the outbox, claimed, until a batch starts them. At most the
    /// pool's admitted launches.
    parked: Vec<Parked>,
}

/// A delivered launch waiting for its slot.
#[derive(Clone, Copy)]
struct Parked {
    message: u64,
    run: RunId,
    step: usize,
    fence: crate::engine::Fence,
}

/// What one batch changed, to write once per run at its end.
#[derive(Default)]
struct Touched {
    /// The run's (state, updated_at) as stored before this batch; `None` for new runs.
    previous: Option<(RunState, Timestamp)>,
    /// Its key in the auto-retry index as stored before this batch, if it had one.
    previous_sweep_key: Option<Timestamp>,
    steps: BTreeSet<usize>,
    attempts: BTreeSet<(usize, usize)>,
}

/// An answer to a command, sent once the batch's fate is known: with `None` when it
/// committed, with the store's error when nothing of it happened.
type Reply = Box<dyn FnOnce(Option<&StoreError>) + Send>;

/// A reply that sends the domain's answer once the batch committed, or the store's error
/// if it did not.
fn answer<T, E>(to: Answer<T, E>, result: Result<T, E>) -> Reply
where
    T: Send + 'static,
    E: std::error::Error + Send + 'static,
{
    Box::new(move |error| {
        let _ = to.send(match error {
            None => result.map_err(ServiceError::Domain),
            Some(error) if error.is_disk_full() => Err(ServiceError::DiskFull(error.to_string())),
            Some(error) => Err(ServiceError::Store(error.to_string())),
        });
    })
}

#[derive(Default)]
struct Batch {
    touched: HashMap<RunId, Touched>,
    replies: Vec<Reply>,
    settled_messages: Vec<u64>,
    new_messages: usize,
    /// Launches whose confirmation this batch records.
    recorded_launches: Vec<crate::engine::Fence>,
    /// Metric increments, applied only once the batch is committed.
    counts: Vec<Count>,
}

enum Count {
    RunEntered(RunState),
    AttemptFinished(&'static str),
    Retry,
    DeadLetter,
    /// A queued step was admitted after waiting this long.
    Admitted(u64),
}

enum Pending {
    Command(Command),
    Report(Report),
}

impl<E: Executor> Driver<E> {
    pub async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut reports: mpsc::Receiver<Report>,
        mut shutdown: watch::Receiver<bool>,
        ready: watch::Sender<bool>,
    ) {
        self.readopt(Some(ready));
        self.outbox.wake();
        loop {
            if self.scheduler.has_decided() || self.parked_may_start() {
                // Admissions decided outside a batch (at start, after a reload of the
                // limits), and prepared launches a reload made room for, are committed
                // before anything else.
                self.commit(Vec::new()).await;
                continue;
            }
            let next_due = [
                self.next_timer,
                self.backstops.next_due(),
                self.next_retention,
            ]
            .into_iter()
            .flatten()
            .min();
            let mut timer_wait = next_due.map(|due| due.since(clock::now()));
            if self.disk_full() {
                // A full disk is checked again every second.
                let recheck = limits::DISK_RECHECK;
                timer_wait = Some(timer_wait.map_or(recheck, |wait| wait.min(recheck)));
                self.recheck_disk();
            }
            let mut batch = Vec::new();
            tokio::select! {
                _ = shutdown.changed() => break,
                Some(command) = commands.recv() => batch.push(Pending::Command(command)),
                Some(report) = reports.recv() => batch.push(Pending::Report(report)),
                _ = sleep_or_forever(timer_wait) => {}
                else => break,
            }
            gather(&mut batch, &mut commands, &mut reports);
            if batch.len() == 1 {
                // A lone input: tasks that are already runnable (a launch just delivered,
                // a verdict just read, a submission just parsed) usually send theirs
                // within microseconds, and letting them run first puts it in this batch
                // rather than in the next, one commit (an fsync) later. Under a queue of
                // inputs this is skipped: the batch is already full of them.
                tokio::task::yield_now().await;
                gather(&mut batch, &mut commands, &mut reports);
            }
            let small = batch.len() <= SMALL_BATCH_MAX;
            self.commit(batch).await;
            if small {
                // The commit woke the tasks waiting on it (replies, the dispatcher with
                // the next launches), and the runtime keeps the last one woken in this
                // worker's slot, which no other worker takes, until the driver yields.
                // Under light load those tasks' next inputs are most of the next batch, so
                // they run first. Under heavy load the batch is full anyway, and the
                // driver keeps its worker: it is the one serial part.
                tokio::task::yield_now().await;
            }
        }
        tracing::info!("driver stopped; in-flight steps are left running for re-adoption");
    }

    async fn commit(&mut self, pending: Vec<Pending>) {
        let now = clock::now();
        let started = std::time::Instant::now();
        let mut batch = Batch::default();
        self.apply_limits();
        // A reconciliation that finished in the background raises the counter before
        // anything is minted in this batch.
        if let Some(seen) = self.executor.fence_floor()
            && !self.fences.raise_above(seen)
        {
            tracing::error!(%seen, "an executor reported an implausible fence; the counter is not raised");
        }
        let result = self.store.write().and_then(|mut tx| {
            self.fire_timers(&mut tx, now, &mut batch)?;
            self.fire_schedules(&mut tx, now, &mut batch)?;
            for item in pending {
                match item {
                    Pending::Command(command) => {
                        self.on_command(&mut tx, command, now, &mut batch)?
                    }
                    Pending::Report(report) => self.on_report(&mut tx, report, now, &mut batch)?,
                }
            }
            // Launches prepared ahead start first, in the slots this batch freed; then
            // what the batch admitted.
            self.start_parked(&mut tx, now, &mut batch)?;
            self.admit_decided(&mut tx, now, &mut batch)?;
            self.flush(&mut tx, &batch)?;
            tx.set_fence_next(self.fences.next_value())?;
            tx.set_clock(now)?;
            let appended = tx.take_appended();
            // Read before the commit, in it: no read transaction of its own afterwards.
            let next_timer = tx.next_timer_due()?;
            tx.commit().map(|()| (appended, next_timer))
        });
        match result {
            Ok((appended, next_timer)) => {
                self.metrics
                    .commit_seconds
                    .observe(started.elapsed().as_secs_f64());
                self.release_effects(&batch);
                self.next_timer = next_timer;
                self.events.publish(appended);
                self.after_commit(batch)
            }
            Err(error) => {
                self.metrics.commit_failures.inc();
                self.after_failed_commit(batch, &error).await
            }
        }
    }

    /// What waits on the commit to reach a step, done first once it is durable: the go of
    /// each launch it recorded as confirmed, and the dispatcher woken for the messages it
    /// settled or added (the next step's launch).
    fn release_effects(&self, batch: &Batch) {
        for fence in &batch.recorded_launches {
            self.executor.launch_recorded(*fence);
        }
        self.outbox.settle(&batch.settled_messages);
        if batch.new_messages > 0 {
            self.outbox.wake();
        }
    }

    fn after_commit(&mut self, batch: Batch) {
        for count in &batch.counts {
            match count {
                Count::RunEntered(state) => self.metrics.run_entered(state.as_str()),
                Count::AttemptFinished(class) => self.metrics.attempt_finished(class),
                Count::Retry => {
                    self.metrics.retries.inc();
                }
                Count::DeadLetter => {
                    self.metrics.dead_letters.inc();
                }
                Count::Admitted(waited_ms) => self.metrics.admitted(*waited_ms),
            }
        }
        self.publish_admission();
        self.watch_clock();
        for reply in batch.replies {
            reply(None);
        }
        // Runs that finished leave the cache. Only the batch's own runs can have: a run's
        // state changes only by an input, which touches it, or it was loaded finished.
        // Not a pass over every run, which grows with the queue.
        for id in batch.touched.keys().chain(&self.loaded) {
            if self
                .runs
                .get(id)
                .is_some_and(|run| run.header.state.is_terminal())
            {
                self.runs.remove(id);
            }
        }
        self.loaded.clear();
    }

    /// Shows how far the wall clock is from Scarab's time, and says so when it stepped.
    fn watch_clock(&mut self) {
        let skew = clock::skew_ms();
        self.metrics.clock_skew.set(skew / 1000);
        if (skew - self.reported_skew_ms).abs() > limits::CLOCK_STEP_NOTICED_MS {
            tracing::warn!(
                skew_ms = skew,
                "the wall clock stepped; timers keep Scarab's own time (monotonic since start) until the next start"
            );
            self.reported_skew_ms = skew;
        }
    }

    fn disk_full(&self) -> bool {
        self.metrics.disk_full.get() != 0
    }

    /// While the disk is full: once it has room again, the reserve is made again and
    /// submissions are taken again.
    fn recheck_disk(&self) {
        if super::disk::has_room(&self.reserve) && super::disk::make_reserve(&self.reserve).is_ok()
        {
            self.metrics.disk_full.set(0);
            tracing::warn!("the state dir's disk has room again: submissions are taken again");
        }
    }

    /// Nothing of the batch happened. The engine already changed the cached runs, so they
    /// are reloaded from the store, and in-flight attempts re-adopted, as after a restart.
    /// After an I/O error the store is opened again first (redb refuses everything until
    /// then); a full disk gives up the reserve so that what runs can still be recorded.
    async fn after_failed_commit(&mut self, batch: Batch, error: &StoreError) {
        tracing::error!(%error, "commit failed; reloading state from the store");
        if error.is_disk_full() {
            if !self.disk_full() {
                self.metrics.disk_full.set(1);
                self.metrics.disk_full_events.inc();
                tracing::error!(
                    "operator alert: the state dir's disk is full; submissions are refused (507) until space returns, running steps are still recorded"
                );
            }
            if super::disk::release_reserve(&self.reserve) {
                tracing::warn!(path = %self.reserve.display(), "reserve given up to record what runs");
            } else {
                // Nothing left to free: wait before the reload's re-adoption reports
                // the same verdicts into the same full disk again.
                tokio::time::sleep(limits::DISK_RECHECK).await;
            }
        }
        if error.needs_reopen() {
            match self.store.reopen() {
                Ok(()) => tracing::warn!("store reopened after an I/O error"),
                Err(error) => {
                    tracing::error!(%error, "reopening the store failed; retrying at the next batch")
                }
            }
        }
        // A sweep's candidates stay in the index for the next pass: its caller gets an
        // empty outcome.
        for reply in batch.replies {
            reply(Some(error));
        }
        self.outbox.settle(&batch.settled_messages);
        // Prepared launches are delivered again: each finds its supervisor still waiting.
        let parked: Vec<u64> = self.parked.drain(..).map(|p| p.message).collect();
        self.outbox.settle(&parked);
        if let Err(error) = self.reload().await {
            tracing::error!(%error, "reload after a failed commit failed");
        }
        self.readopt(None);
    }
}

/// The most inputs a batch may hold for the driver to yield to the runtime after its
/// commit. Measured (docs/benchmarks.md, "Letting a commit's wakes run"): a tenth fewer
/// commits per run and about 4% more runs a second under the side-by-side load
/// (batches of two or three), while yielding after batches of every size took a tenth
/// off group commit with 256 clients.
const SMALL_BATCH_MAX: usize = 4;

/// Adds every input already waiting to the batch, up to `COMMIT_BATCH_MAX`.
fn gather(
    batch: &mut Vec<Pending>,
    commands: &mut mpsc::Receiver<Command>,
    reports: &mut mpsc::Receiver<Report>,
) {
    while batch.len() < limits::COMMIT_BATCH_MAX {
        if let Ok(command) = commands.try_recv() {
            batch.push(Pending::Command(command));
        } else if let Ok(report) = reports.try_recv() {
            batch.push(Pending::Report(report));
        } else {
            break;
        }
    }
}

async fn sleep_or_forever(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

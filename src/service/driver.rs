//! The driver loop: the only caller of the engine and the only writer of the store.
//!
//! It folds every input that is waiting (up to `COMMIT_BATCH_MAX`) into one write
//! transaction (group commit): runs' new state, history, outbox messages and timers land
//! together, durably, before any reply is sent or any message is dispatched.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::dispatch::{Outbox, redelivery_delay};
use super::{Command, DeliveryFailure, Settings, history, webhooks};
use crate::clock;
use crate::config::WebhookEvent;
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
use crate::store::{Store, StoreError, WriteTx};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    pub id: RunId,
    /// True when an `Idempotency-Key` matched an earlier submission.
    pub existing: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("Idempotency-Key already names run {0}, submitted with a different pipeline")]
    IdempotencyConflict(RunId),
    #[error("{0}")]
    Store(String),
    #[error("the service is shutting down")]
    ShuttingDown,
}

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The writer's fence is not the step's current attempt: a zombie or a late writer.
    #[error("stale_fence")]
    StaleFence {
        current: Option<crate::engine::Fence>,
    },
    #[error("{0}")]
    Store(String),
    #[error("the service is shutting down")]
    ShuttingDown,
}

#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error("dead letter {0} not found")]
    NotFound(u64),
    #[error("cannot requeue: {0}")]
    Rejected(String),
    #[error("{0}")]
    Store(String),
    #[error("the service is shutting down")]
    ShuttingDown,
}

#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("run {0} not found")]
    NotFound(RunId),
    #[error(transparent)]
    Rejected(#[from] RejectedInput),
    #[error("{0}")]
    Store(String),
    #[error("the service is shutting down")]
    ShuttingDown,
}

#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("run {0} not found")]
    RunNotFound(RunId),
    #[error("run {run} has no step {step:?}")]
    StepNotFound { run: RunId, step: String },
    #[error(transparent)]
    Rejected(#[from] RejectedInput),
    #[error("{0}")]
    Store(String),
    #[error("the service is shutting down")]
    ShuttingDown,
}

#[derive(Debug, thiserror::Error)]
pub enum RunActionError {
    #[error("run {0} not found")]
    NotFound(RunId),
    #[error("{0}")]
    Rejected(String),
    #[error("{0}")]
    Store(String),
    #[error("the service is shutting down")]
    ShuttingDown,
}

/// A gate decision, as it was recorded.
pub type Decided = crate::engine::GateDecision;

pub struct Driver<E: Executor> {
    store: Arc<Store>,
    settings: Arc<Settings>,
    engine: Engine,
    executor: E,
    outbox: Outbox,
    /// Every non-terminal run, as last committed (or being changed by the open batch).
    runs: HashMap<RunId, Run>,
    fences: FenceCounter,
    next_timer: Option<Timestamp>,
    metrics: Arc<crate::metrics::Metrics>,
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

/// A reply that sends `result` after the commit, or `failed(error)` if the commit failed.
fn answer<T: Send + 'static>(to: oneshot::Sender<T>, result: T, failed: fn(String) -> T) -> Reply {
    Box::new(move |error| {
        let _ = to.send(match error {
            None => result,
            Some(error) => failed(error.to_string()),
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
}

enum Pending {
    Command(Command),
    Report(Report),
}

impl<E: Executor> Driver<E> {
    /// Loads every non-terminal run (through the state index only) and raises the fence
    /// counter above every fence the executor has seen.
    pub async fn recover(
        store: Arc<Store>,
        settings: Arc<Settings>,
        executor: E,
        outbox: Outbox,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Result<Driver<E>, StoreError> {
        let engine = Engine::new(settings.engine.clone());
        let mut driver = Driver {
            store,
            settings,
            engine,
            executor,
            outbox,
            runs: HashMap::new(),
            fences: FenceCounter::starting_at(1),
            next_timer: None,
            metrics,
        };
        driver.reload().await?;
        Ok(driver)
    }

    /// Loads every non-terminal run, lets the executor recover (stop foreign attempts,
    /// report the highest fence it holds) and raises the fence counter above it, all
    /// before anything new can be minted.
    async fn reload(&mut self) -> Result<(), StoreError> {
        let read = self.store.read()?;
        let stored_next = read.fence_next()?;
        self.fences = FenceCounter::starting_at(stored_next);
        self.runs.clear();
        for id in read.active_run_ids()? {
            // One run that cannot be read back must not keep the others from starting: it
            // is logged, counted and named by /readyz (the progress check), and left as
            // it is.
            let stored = match read.run(id) {
                Ok(Some(stored)) => Ok(stored),
                Ok(None) => continue,
                Err(error) => {
                    self.metrics.unreadable_records.inc();
                    Err(error.to_string())
                }
            };
            match stored.and_then(rebuild) {
                Ok(run) => {
                    self.runs.insert(id, run);
                }
                Err(error) => {
                    tracing::error!(run = %id, %error, "cannot restore a stored run; it is left as it is")
                }
            }
        }
        self.next_timer = read.next_timer_due()?;
        drop(read);
        let inflight = self.in_flight(|_| true);
        match self
            .executor
            .recover(&inflight, crate::engine::Fence(stored_next))
            .await
        {
            Ok(Some(seen)) => {
                if !self.fences.raise_above(seen) {
                    tracing::error!(%seen, "an executor reported an implausible fence; the counter is not raised");
                }
            }
            Ok(None) => {}
            Err(error) => {
                tracing::error!(%error, "executor recovery failed; fences it holds may be unknown")
            }
        }
        if self.fences.next_value() > stored_next {
            tracing::warn!(
                from = stored_next,
                to = self.fences.next_value(),
                "fence counter raised above fences found on the executor"
            );
            let mut tx = self.store.write()?;
            tx.set_fence_next(self.fences.next_value())?;
            tx.commit()?;
        }
        Ok(())
    }

    /// The in-flight attempts of the loaded runs that `which` selects.
    fn in_flight(&self, which: impl Fn(&crate::engine::Attempt) -> bool) -> Vec<Adoption> {
        let mut found = Vec::new();
        for run in self.runs.values() {
            for (step, progress) in run.steps.iter().enumerate() {
                let executor = ExecutorKind::of(&run.pipeline.steps[step].action);
                let attempt = progress.in_flight().filter(|a| which(a));
                if let Some((attempt, executor)) = attempt.zip(executor) {
                    found.push(Adoption {
                        run: run.id(),
                        step,
                        fence: attempt.fence,
                        executor,
                    });
                }
            }
        }
        found
    }

    /// Hands every attempt confirmed before the restart back to the executor, then
    /// declares the service ready. Attempts whose launch was never confirmed still have
    /// their launch message in the outbox, which the dispatcher redelivers under the same
    /// fence. Runs as its own task: adoption may report verdicts, which this loop applies.
    fn readopt(&self, ready: Option<watch::Sender<bool>>) {
        let adoptions =
            self.in_flight(|a| matches!(a.state, crate::engine::AttemptState::Running { .. }));
        tracing::info!(
            attempts = adoptions.len(),
            runs = self.runs.len(),
            "re-adopting in-flight attempts"
        );
        let executor = self.executor.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let count = adoptions.len();
            for adoption in adoptions {
                if let Err(error) = executor.adopt(&adoption).await {
                    tracing::error!(fence = %adoption.fence, %error, "re-adoption failed");
                }
            }
            tracing::info!(
                attempts = count,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "re-adoption complete"
            );
            if let Some(ready) = ready {
                let _ = ready.send(true);
            }
        });
    }

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
            let timer_wait = self.next_timer.map(|due| due.since(clock::now()));
            let mut batch = Vec::new();
            tokio::select! {
                _ = shutdown.changed() => break,
                Some(command) = commands.recv() => batch.push(Pending::Command(command)),
                Some(report) = reports.recv() => batch.push(Pending::Report(report)),
                _ = sleep_or_forever(timer_wait) => {}
                else => break,
            }
            while batch.len() < limits::COMMIT_BATCH_MAX {
                if let Ok(command) = commands.try_recv() {
                    batch.push(Pending::Command(command));
                } else if let Ok(report) = reports.try_recv() {
                    batch.push(Pending::Report(report));
                } else {
                    break;
                }
            }
            self.commit(batch).await;
        }
        tracing::info!("driver stopped; in-flight steps are left running for re-adoption");
    }

    async fn commit(&mut self, pending: Vec<Pending>) {
        let now = clock::now();
        let started = std::time::Instant::now();
        let mut batch = Batch::default();
        let result = self.store.write().and_then(|mut tx| {
            self.fire_timers(&mut tx, now, &mut batch)?;
            for item in pending {
                match item {
                    Pending::Command(command) => {
                        self.on_command(&mut tx, command, now, &mut batch)?
                    }
                    Pending::Report(report) => self.on_report(&mut tx, report, now, &mut batch)?,
                }
            }
            self.flush(&mut tx, &batch, now)?;
            tx.set_fence_next(self.fences.next_value())?;
            tx.commit()
        });
        match result {
            Ok(()) => {
                self.metrics
                    .commit_seconds
                    .observe(started.elapsed().as_secs_f64());
                self.after_commit(batch)
            }
            Err(error) => {
                self.metrics.commit_failures.inc();
                self.after_failed_commit(batch, &error).await
            }
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
            }
        }
        for reply in batch.replies {
            reply(None);
        }
        for fence in &batch.recorded_launches {
            self.executor.launch_recorded(*fence);
        }
        self.outbox.settle(&batch.settled_messages);
        if batch.new_messages > 0 {
            self.outbox.wake();
        }
        self.runs.retain(|_, run| !run.header.state.is_terminal());
        match self.store.read().and_then(|r| r.next_timer_due()) {
            Ok(next) => self.next_timer = next,
            Err(error) => tracing::error!(%error, "cannot read the next timer"),
        }
    }

    /// Nothing of the batch happened. The engine already changed the cached runs, so they
    /// are reloaded from the store, and in-flight attempts re-adopted, as after a restart.
    async fn after_failed_commit(&mut self, batch: Batch, error: &StoreError) {
        tracing::error!(%error, "commit failed; reloading state from the store");
        // A sweep's candidates stay in the index for the next pass: its caller gets an
        // empty outcome.
        for reply in batch.replies {
            reply(Some(error));
        }
        self.outbox.settle(&batch.settled_messages);
        if let Err(error) = self.reload().await {
            tracing::error!(%error, "reload after a failed commit failed");
        }
        self.readopt(None);
    }

    fn fire_timers(
        &mut self,
        tx: &mut WriteTx,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        if self.next_timer.is_none_or(|due| due > now) {
            return Ok(());
        }
        for key in tx.take_due_timers(now, limits::TIMER_BATCH_MAX)? {
            let step = usize::from(key.step);
            let timer = match key.kind {
                TimerKind::RetryDue => Timer::RetryDue { step },
                TimerKind::Backstop => Timer::Backstop {
                    step,
                    fence: key.fence,
                },
                TimerKind::GateRelease => Timer::GateRelease { step },
                TimerKind::GateExpiry => Timer::GateExpiry { step },
                TimerKind::Budget => Timer::Budget,
                TimerKind::Retention => {
                    self.clean_up(tx, key.run, now, batch)?;
                    continue;
                }
            };
            let _ = self.apply_input(tx, key.run, Input::TimerFired(timer), now, batch)?;
        }
        Ok(())
    }

    /// A finished run's retention is over: ask the executor to remove each attempt's
    /// traces (bounded by the pipeline's steps × attempts).
    fn clean_up(
        &mut self,
        tx: &mut WriteTx,
        run: RunId,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        let Some(stored) = self.store.read()?.run(run)? else {
            return Ok(());
        };
        // A run put back in progress since (resubmitted, requeued) keeps its traces; when
        // it ends again, a newer retention timer comes due for it.
        let retention = u64::try_from(self.settings.log_retention.as_millis()).unwrap_or(u64::MAX);
        if !stored.header.state.is_terminal()
            || stored.header.updated_at.0.saturating_add(retention) > now.0
        {
            return Ok(());
        }
        // A gate has no executor and no attempts: nothing to clean up.
        let kinds: Vec<Option<ExecutorKind>> = match parse_stored(&stored.source) {
            Ok(pipeline) => pipeline
                .steps
                .iter()
                .map(|s| ExecutorKind::of(&s.action))
                .collect(),
            Err(error) => {
                tracing::warn!(%run, %error, "cleaning up a run whose pipeline no longer validates: assuming local steps");
                vec![Some(ExecutorKind::Local); stored.steps.len()]
            }
        };
        for (progress, executor) in stored.steps.iter().zip(kinds) {
            let Some(executor) = executor else {
                continue;
            };
            for attempt in &progress.attempts {
                let payload = OutboxPayload::CleanUp {
                    run,
                    fence: attempt.fence,
                    executor,
                };
                self.enqueue(tx, payload, now, batch)?;
            }
        }
        Ok(())
    }

    fn on_command(
        &mut self,
        tx: &mut WriteTx,
        command: Command,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        match command {
            Command::Submit {
                source,
                pipeline,
                origin,
                idempotency_key,
                reply,
            } => {
                let submitted =
                    self.submit(tx, source, pipeline, origin, idempotency_key, now, batch)?;
                batch
                    .replies
                    .push(answer(reply, submitted, |e| Err(SubmitError::Store(e))));
            }
            Command::Cancel { run, by, reply } => {
                let result = self.cancel(tx, run, by, now, batch)?;
                batch
                    .replies
                    .push(answer(reply, result, |e| Err(CancelError::Store(e))));
            }
            Command::SetOutputs {
                run,
                step,
                fence,
                outputs,
                reply,
            } => {
                let input = Input::SetOutputs {
                    step,
                    fence,
                    outputs,
                };
                let result = match self.apply_input(tx, run, input, now, batch)? {
                    Ok(()) if self.runs.contains_key(&run) => Ok(()),
                    // A finished run has no attempt in flight: whoever writes is late.
                    Ok(()) => Err(OutputError::StaleFence { current: None }),
                    Err(RejectedInput::StaleFence { current }) => {
                        Err(OutputError::StaleFence { current })
                    }
                    Err(other) => Err(OutputError::Store(other.to_string())),
                };
                batch
                    .replies
                    .push(answer(reply, result, |e| Err(OutputError::Store(e))));
            }
            Command::Decide {
                run,
                step,
                approve,
                by,
                caller,
                comment,
                reply,
            } => {
                let result =
                    self.decide(tx, run, &step, approve, by, caller, comment, now, batch)?;
                batch
                    .replies
                    .push(answer(reply, result, |e| Err(DecideError::Store(e))));
            }
            Command::Ping { reply } => {
                let _ = reply.send(());
            }
            Command::Sweep { candidates, reply } => {
                let outcome = self.sweep(tx, candidates, now, batch)?;
                batch
                    .replies
                    .push(answer(reply, outcome, |_| Default::default()));
            }
            Command::Release { run, by, reply } => {
                let result = self.release(tx, run, by, now, batch)?;
                batch
                    .replies
                    .push(answer(reply, result, |e| Err(RunActionError::Store(e))));
            }
            Command::DiscardRun {
                run,
                by,
                reason,
                reply,
            } => {
                let result = self.discard_run(tx, run, by, reason, now, batch)?;
                batch
                    .replies
                    .push(answer(reply, result, |e| Err(RunActionError::Store(e))));
            }
            Command::Requeue { id, by, reply } => {
                let result = self.requeue(tx, id, by, now, batch)?;
                batch
                    .replies
                    .push(answer(reply, result, |e| Err(DlqError::Store(e))));
            }
            Command::Discard {
                id,
                by,
                reason,
                reply,
            } => {
                let result = self.discard(tx, id, by, reason, now)?;
                batch
                    .replies
                    .push(answer(reply, result, |e| Err(DlqError::Store(e))));
            }
            Command::Delivered { message, result } => {
                self.on_delivered(tx, message, result, now, batch)?
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn submit(
        &mut self,
        tx: &mut WriteTx,
        source: PipelineSource,
        pipeline: Arc<Pipeline>,
        origin: String,
        idempotency_key: Option<String>,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<Submitted, SubmitError>, StoreError> {
        if let Some(key) = &idempotency_key
            && let Some(existing) = tx.idempotency_get(key)?
        {
            // The same key with another pipeline is a client bug, not a replay.
            if tx
                .pipeline(existing)?
                .is_some_and(|stored| stored != source)
            {
                return Ok(Err(SubmitError::IdempotencyConflict(existing)));
            }
            return Ok(Ok(Submitted {
                id: existing,
                existing: true,
            }));
        }
        let id = RunId(ulid::Ulid::from_parts(now.0, rand_bits()).0);
        let (run, effects) = self
            .engine
            .submit(id, pipeline, origin, &mut self.fences, now);
        tx.put_pipeline(id, &source)?;
        if let Some(key) = &idempotency_key {
            tx.idempotency_put(key, id)?;
        }
        batch.touched.insert(id, Touched::default());
        self.runs.insert(id, run);
        self.record(tx, id, effects, now, batch)?;
        Ok(Ok(Submitted {
            id,
            existing: false,
        }))
    }

    fn cancel(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        by: String,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), CancelError>, StoreError> {
        if !self.runs.contains_key(&id) {
            return Ok(match self.store_header(tx, id)? {
                Some(state) => Err(CancelError::Rejected(RejectedInput::RunTerminal(
                    state.as_str(),
                ))),
                None => Err(CancelError::NotFound(id)),
            });
        }
        Ok(self
            .apply_input(tx, id, Input::Cancel { by }, now, batch)?
            .map_err(CancelError::from))
    }

    /// Brings a stored run into the cache (a finished run leaves it) so an input can change
    /// it. `Ok(Err(reason))` when it cannot be restored.
    fn load(&mut self, id: RunId) -> Result<Option<Result<(), String>>, StoreError> {
        if self.runs.contains_key(&id) {
            return Ok(Some(Ok(())));
        }
        let Some(stored) = self.store.read()?.run(id)? else {
            return Ok(None);
        };
        Ok(Some(rebuild(stored).map(|run| {
            self.runs.insert(id, run);
        })))
    }

    /// An operator input on a (possibly finished) run.
    fn run_action(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        input: Input,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), RunActionError>, StoreError> {
        match self.load(id)? {
            None => return Ok(Err(RunActionError::NotFound(id))),
            Some(Err(error)) => {
                return Ok(Err(RunActionError::Rejected(format!(
                    "run {id} cannot be restored: {error}"
                ))));
            }
            Some(Ok(())) => {}
        }
        Ok(self
            .apply_input(tx, id, input, now, batch)?
            .map_err(|rejected| RunActionError::Rejected(rejected.to_string())))
    }

    /// An operator discards a quarantined run; one whose pipeline no longer restores is
    /// discarded at the header level (it could never run again anyway).
    fn discard_run(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        by: String,
        reason: String,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), RunActionError>, StoreError> {
        if let Some(Err(_)) = self.load(id)? {
            let Some(mut header) = self.store.read()?.run_header(id)? else {
                return Ok(Err(RunActionError::NotFound(id)));
            };
            if header.state != RunState::Quarantined {
                return Ok(Err(RunActionError::Rejected(format!(
                    "run is {}, not quarantined",
                    header.state.as_str()
                ))));
            }
            header.auto_retry.discarded = Some(format!("discarded by {by}: {reason}"));
            header.auto_retry.eligible_at = None;
            let event = (
                "quarantine_discarded",
                serde_json::json!({"by": by, "reason": reason}),
            );
            self.move_header(tx, header, RunState::DeadLettered, event, now)?;
            return Ok(Ok(()));
        }
        self.run_action(tx, id, Input::Discard { by, reason }, now, batch)
    }

    /// An operator releases a quarantined run: a fresh try, counted like a resubmit.
    fn release(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        by: String,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), RunActionError>, StoreError> {
        let state = match self.load(id)? {
            None => return Ok(Err(RunActionError::NotFound(id))),
            Some(Err(error)) => {
                return Ok(Err(RunActionError::Rejected(format!(
                    "run {id} cannot be restored: {error}"
                ))));
            }
            Some(Ok(())) => self.runs[&id].header.state,
        };
        if state != RunState::Quarantined {
            return Ok(Err(RunActionError::Rejected(format!(
                "run is {}, not quarantined",
                state.as_str()
            ))));
        }
        let attempts = self.runs[&id].header.auto_retry.attempts;
        let next_at = now.plus(self.settings.live().auto_retry.backoff(attempts + 1));
        self.run_action(tx, id, Input::Resubmit { by, next_at }, now, batch)
    }

    /// One sweep pass over the index rows read: each candidate is re-checked here, in the
    /// write transaction (the double-submit guard: the driver is the only writer, so two
    /// passes or a pass and an operator are serialized, and the second finds the run no
    /// longer dead-lettered).
    fn sweep(
        &mut self,
        tx: &mut WriteTx,
        candidates: Vec<(Timestamp, RunId)>,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<super::sweep::PassOutcome, StoreError> {
        use crate::engine::{Eligibility, SkipReason, eligibility};
        let settings = self.settings.live().auto_retry.clone();
        let mut outcome = super::sweep::PassOutcome {
            scanned: candidates.len(),
            ..Default::default()
        };
        for (key, id) in candidates {
            match self.load(id)? {
                None => {
                    tx.auto_retry_index_delete(key, id)?;
                    outcome.skip(SkipReason::NotDeadLettered);
                    continue;
                }
                Some(Err(error)) => {
                    // Restore-or-quarantine: never resubmit what cannot be validated.
                    self.quarantine_unrestorable(tx, key, id, &error, now)?;
                    outcome.quarantined += 1;
                    continue;
                }
                Some(Ok(())) => {}
            }
            let run = &self.runs[&id];
            match eligibility(run, &settings, now) {
                Eligibility::Resubmit if outcome.resubmitted < settings.sweep_limit => {
                    outcome.eligible += 1;
                    let attempt = run.header.auto_retry.attempts + 1;
                    let next_at = now.plus(settings.backoff(attempt));
                    let input = Input::Resubmit {
                        by: "auto-retry".into(),
                        next_at,
                    };
                    if self.apply_input(tx, id, input, now, batch)?.is_ok() {
                        outcome.resubmitted += 1;
                        tracing::info!(run = %id, attempt, max = settings.max, "auto-retry: run resubmitted");
                    }
                }
                Eligibility::Resubmit => {
                    outcome.eligible += 1;
                    outcome.skip(SkipReason::SweepLimit);
                }
                Eligibility::Quarantine(reason) => {
                    tracing::warn!(run = %id, %reason, "operator alert: run quarantined");
                    if self
                        .apply_input(tx, id, Input::Quarantine { reason }, now, batch)?
                        .is_ok()
                    {
                        outcome.quarantined += 1;
                    }
                }
                Eligibility::Skip(SkipReason::Backoff) => outcome.skip(SkipReason::Backoff),
                Eligibility::Skip(reason) => {
                    // Never eligible again (or not any more): out of the index.
                    tx.auto_retry_index_delete(key, id)?;
                    outcome.skip(reason);
                }
            }
        }
        Ok(outcome)
    }

    /// A run whose stored pipeline no longer restores is quarantined at the header level
    /// (there is no engine run to change), with its reason in the history.
    fn quarantine_unrestorable(
        &mut self,
        tx: &mut WriteTx,
        key: Timestamp,
        id: RunId,
        error: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        tx.auto_retry_index_delete(key, id)?;
        let Some(mut header) = self.store.read()?.run_header(id)? else {
            return Ok(());
        };
        if header.state != RunState::DeadLettered {
            return Ok(());
        }
        let reason = format!("the stored pipeline cannot be restored: {error}");
        tracing::warn!(run = %id, %reason, "operator alert: run quarantined");
        header.auto_retry.quarantined = Some(reason.clone());
        let event = (
            "auto_retry_quarantined",
            serde_json::json!({"reason": reason}),
        );
        self.move_header(tx, header, RunState::Quarantined, event, now)
    }

    /// A state change written at the header level, for a run the engine cannot hold (its
    /// pipeline no longer restores): the header, a `run_state` and one other history event,
    /// and the retention timer of its new terminal state.
    fn move_header(
        &mut self,
        tx: &mut WriteTx,
        mut header: crate::engine::RunHeader,
        to: RunState,
        (kind, detail): (&str, serde_json::Value),
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let id = header.id;
        let previous = (header.state, header.updated_at);
        header.state = to;
        header.updated_at = now;
        tx.put_run(&header, Some(previous))?;
        for (kind, detail) in [
            (
                "run_state",
                serde_json::json!({"from": previous.0.as_str(), "to": to.as_str()}),
            ),
            (kind, detail),
        ] {
            let record = HistoryRecord {
                at: now,
                kind: kind.into(),
                detail: detail.to_string(),
            };
            tx.append_history(id, &record)?;
        }
        tx.insert_timer(TimerKey {
            due: now.plus(self.settings.log_retention),
            run: id,
            step: 0,
            kind: TimerKind::Retention,
            fence: crate::engine::Fence(0),
        })?;
        Ok(())
    }

    /// Approves or rejects a gate by name. A run that is no longer active is loaded only to
    /// say precisely why nothing can be decided.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        step_name: &str,
        approve: bool,
        by: String,
        caller: String,
        comment: Option<String>,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<Decided, DecideError>, StoreError> {
        let not_found = || DecideError::StepNotFound {
            run: id,
            step: step_name.to_string(),
        };
        let input = |step| Input::Decide {
            step,
            approve,
            by: by.clone(),
            caller: caller.clone(),
            comment: comment.clone(),
        };
        let Some(run) = self.runs.get(&id) else {
            let Some(stored) = self.store.read()?.run(id)? else {
                return Ok(Err(DecideError::RunNotFound(id)));
            };
            let mut run = match rebuild(stored) {
                Ok(run) => run,
                Err(error) => return Ok(Err(DecideError::Store(error))),
            };
            let Some(step) = run.pipeline.step_index(step_name) else {
                return Ok(Err(not_found()));
            };
            // A finished run refuses every decision without changing anything.
            let mut scratch = self.fences;
            return Ok(
                match self.engine.handle(&mut run, &mut scratch, input(step), now) {
                    Err(rejected) => Err(rejected.into()),
                    Ok(_) => Err(RejectedInput::RunTerminal(run.header.state.as_str()).into()),
                },
            );
        };
        let Some(step) = run.pipeline.step_index(step_name) else {
            return Ok(Err(not_found()));
        };
        if let Err(rejected) = self.apply_input(tx, id, input(step), now, batch)? {
            return Ok(Err(rejected.into()));
        }
        let decision = self
            .runs
            .get(&id)
            .and_then(|run| run.steps[step].gate.as_ref())
            .and_then(|gate| gate.decision.clone());
        Ok(decision.ok_or_else(|| DecideError::Store("the decision was not recorded".into())))
    }

    fn store_header(&self, _tx: &WriteTx, id: RunId) -> Result<Option<RunState>, StoreError> {
        Ok(self.store.read()?.run_header(id)?.map(|h| h.state))
    }

    fn on_delivered(
        &mut self,
        tx: &mut WriteTx,
        id: u64,
        result: Result<(), DeliveryFailure>,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        batch.settled_messages.push(id);
        match result {
            Ok(()) => {
                let Some(message) = tx.outbox_delete(id)? else {
                    return Ok(());
                };
                if let OutboxPayload::Launch(launch) = message.payload {
                    let step = usize::from(launch.step);
                    let input = Input::LaunchConfirmed {
                        step,
                        fence: launch.fence,
                    };
                    let _ = self.apply_input(tx, launch.run, input, now, batch)?;
                    // The step may start only if this commit makes it a running attempt
                    // nobody asked to stop; otherwise its kill (or its end) settles it.
                    if self.confirmed_and_wanted(launch.run, step, launch.fence) {
                        batch.recorded_launches.push(launch.fence);
                    }
                }
            }
            Err(failure) => {
                let Some(mut message) = tx.outbox_get(id)? else {
                    return Ok(());
                };
                let previous = message.next_at;
                message.delivery_attempts = message.delivery_attempts.saturating_add(1);
                message.last_error = Some(failure.error);
                if message.delivery_attempts >= message.max_deliveries {
                    let category = if failure.unavailable {
                        DeadLetterCategory::ExecutorUnavailable
                    } else {
                        DeadLetterCategory::OutboxPoison
                    };
                    return self.dead_letter(tx, message, category, now, batch);
                }
                message.next_at = now.plus(redelivery_delay(message.delivery_attempts));
                tx.outbox_put(&message, Some(previous))?;
            }
        }
        Ok(())
    }

    /// The message's deliveries are exhausted: it moves to the dead-letter queue in this
    /// transaction, the operator is alerted, and if its run depends on it (a launch, a
    /// kill) the step is dead-lettered; a clean-up never changes a verdict.
    fn dead_letter(
        &mut self,
        tx: &mut WriteTx,
        message: OutboxMessage,
        category: DeadLetterCategory,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        let last_error = message.last_error.clone().unwrap_or_default();
        let detail = format!(
            "{} dead-lettered ({}) after {} deliveries: {last_error}",
            message.payload.kind(),
            category.as_str(),
            message.delivery_attempts
        );
        tracing::error!(
            message = message.id,
            kind = message.payload.kind(),
            category = category.as_str(),
            deliveries = message.delivery_attempts,
            error = %last_error,
            run = %message.payload.run(),
            "operator alert: outbox message dead-lettered"
        );
        let record = HistoryRecord {
            at: now,
            kind: "message_dead_lettered".into(),
            detail: serde_json::json!({
                "message": message.id, "kind": message.payload.kind(), "category": category.as_str(),
                "deliveries": message.delivery_attempts, "last_error": last_error,
            })
            .to_string(),
        };
        tx.append_history(message.payload.run(), &record)?;
        // An alert about a failed alert could loop: those are logged only.
        if !matches!(message.payload, OutboxPayload::Webhook { alert: true, .. }) {
            let diagnostics = serde_json::json!({
                "id": message.id, "kind": message.payload.kind(), "category": category.as_str(),
                "deliveries": message.delivery_attempts, "last_error": last_error,
            });
            let run = message.payload.run();
            let event_id = webhooks::new_event_id();
            let body = webhooks::message_alert(&event_id, run, diagnostics, now);
            self.notify(
                tx,
                run,
                WebhookEvent::DeadLettered,
                &event_id,
                &body,
                now,
                batch,
            )?;
        }
        let input = match &message.payload {
            OutboxPayload::Launch(launch) => {
                Some((launch.run, usize::from(launch.step), launch.fence, true))
            }
            OutboxPayload::Kill {
                run, step, fence, ..
            } => Some((*run, usize::from(*step), *fence, false)),
            OutboxPayload::CleanUp { .. } | OutboxPayload::Webhook { .. } => None,
        };
        batch.counts.push(Count::DeadLetter);
        let letter = DeadLetter {
            message,
            dead_at: now,
            category,
        };
        tx.dead_letter(&letter)?;
        if let Some((run, step, fence, launch)) = input {
            let reason = match category {
                DeadLetterCategory::ExecutorUnavailable => Undelivered::ExecutorUnavailable,
                DeadLetterCategory::OutboxPoison => Undelivered::OutboxPoison,
            };
            let input = Input::Undeliverable {
                step,
                fence,
                launch,
                reason,
                detail,
            };
            let _ = self.apply_input(tx, run, input, now, batch)?;
        }
        Ok(())
    }

    /// An operator puts a dead letter back with a fresh delivery budget; a launch's run is
    /// in progress again (its same attempt, same fence).
    fn requeue(
        &mut self,
        tx: &mut WriteTx,
        id: u64,
        by: String,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), DlqError>, StoreError> {
        let Some(letter) = tx.take_dead_letter(id)? else {
            return Ok(Err(DlqError::NotFound(id)));
        };
        let run = letter.message.payload.run();
        if let OutboxPayload::Launch(launch) = &letter.message.payload {
            if !self.runs.contains_key(&run) {
                // A terminal run leaves the cache; bring it back to change it.
                let stored = self.store.read()?.run(run)?;
                match stored.map(rebuild) {
                    Some(Ok(loaded)) => {
                        self.runs.insert(run, loaded);
                    }
                    _ => {
                        tx.dead_letter(&letter)?;
                        return Ok(Err(DlqError::Rejected(format!(
                            "run {run} cannot be loaded"
                        ))));
                    }
                }
            }
            let input = Input::Requeue {
                step: usize::from(launch.step),
                fence: launch.fence,
            };
            if let Err(rejected) = self.apply_input(tx, run, input, now, batch)? {
                tx.dead_letter(&letter)?;
                return Ok(Err(DlqError::Rejected(rejected.to_string())));
            }
        }
        self.enqueue(tx, letter.message.payload, now, batch)?;
        let record = HistoryRecord {
            at: now,
            kind: "dlq_requeued".into(),
            detail: serde_json::json!({"message": id, "by": by}).to_string(),
        };
        tx.append_history(run, &record)?;
        Ok(Ok(()))
    }

    fn discard(
        &mut self,
        tx: &mut WriteTx,
        id: u64,
        by: String,
        reason: String,
        now: Timestamp,
    ) -> Result<Result<(), DlqError>, StoreError> {
        let Some(letter) = tx.take_dead_letter(id)? else {
            return Ok(Err(DlqError::NotFound(id)));
        };
        let record = HistoryRecord {
            at: now,
            kind: "dlq_discarded".into(),
            detail: serde_json::json!({"message": id, "by": by, "reason": reason}).to_string(),
        };
        tx.append_history(letter.message.payload.run(), &record)?;
        Ok(Ok(()))
    }

    fn confirmed_and_wanted(&self, run: RunId, step: usize, fence: crate::engine::Fence) -> bool {
        let attempt = self
            .runs
            .get(&run)
            .and_then(|r| r.steps.get(step))
            .and_then(|s| s.attempts.iter().find(|a| a.fence == fence));
        attempt.is_some_and(|a| {
            matches!(a.state, crate::engine::AttemptState::Running { .. }) && a.kill.is_none()
        })
    }

    fn on_report(
        &mut self,
        tx: &mut WriteTx,
        report: Report,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        let input = Input::Verdict {
            step: report.step,
            fence: report.fence,
            verdict: report.verdict,
        };
        let _ = self.apply_input(tx, report.run, input, now, batch)?;
        Ok(())
    }

    /// Feeds one input to the engine for a non-terminal run. Inputs for runs that are no
    /// longer active (a late duplicate verdict, a stale timer) are dropped.
    fn apply_input(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        input: Input,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), RejectedInput>, StoreError> {
        let Some(run) = self.runs.get_mut(&id) else {
            return Ok(Ok(()));
        };
        let previous = Some((run.header.state, run.header.updated_at));
        let previous_sweep_key = sweep_key(run);
        // The first touch in a batch remembers what the store holds; a run submitted in
        // this batch was entered with `previous: None` and keeps it.
        batch.touched.entry(id).or_insert_with(|| Touched {
            previous,
            previous_sweep_key,
            ..Touched::default()
        });
        match self.engine.handle(run, &mut self.fences, input, now) {
            Ok(effects) => {
                self.record(tx, id, effects, now, batch)?;
                Ok(Ok(()))
            }
            Err(rejected) => Ok(Err(rejected)),
        }
    }

    /// Writes an input's history and intents (outbox messages, timers) into the open
    /// transaction, and notes which rows of the run to rewrite at the end of the batch.
    fn record(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        effects: Effects,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        let Some(run) = self.runs.get(&id) else {
            return Ok(());
        };
        let mut state_changes = Vec::new();
        let mut gates_opened = Vec::new();
        for event in &effects.events {
            if !tx.append_history(id, &history::record(run, event, now))? {
                tracing::warn!(run = %id, limit = limits::HISTORY_EVENTS_PER_RUN_MAX, "history full: event not recorded");
            }
            match event {
                crate::engine::Event::RunState { from, to } => {
                    batch.counts.push(Count::RunEntered(*to));
                    state_changes.push((*from, *to));
                }
                crate::engine::Event::GateOpened { step } => gates_opened.push(*step),
                crate::engine::Event::AttemptFinished { class, .. } => batch
                    .counts
                    .push(Count::AttemptFinished(class.map_or("none", |c| c.as_str()))),
                crate::engine::Event::RetryScheduled { .. } => batch.counts.push(Count::Retry),
                _ => {}
            }
        }
        for (from, to) in state_changes {
            self.notify_run_state(tx, id, from, to, now, batch)?;
        }
        for step in gates_opened {
            self.notify_gate(tx, id, step, now, batch)?;
        }
        let Some(run) = self.runs.get(&id) else {
            return Ok(());
        };
        for intent in effects.intents {
            match intent {
                Intent::Launch(mut order) => {
                    self.add_step_token(&mut order);
                    let Some(action) = LaunchAction::of(&order.action) else {
                        tracing::error!(run = %id, step = order.step, "bug: a launch for a gate step; ignored");
                        continue;
                    };
                    let launch = LaunchRecord {
                        run: order.run,
                        step: step_key(order.step)?,
                        step_name: order.step_name,
                        attempt: order.attempt,
                        fence: order.fence,
                        timeout_ms: u64::try_from(order.timeout.as_millis()).unwrap_or(u64::MAX),
                        action,
                    };
                    self.enqueue(tx, OutboxPayload::Launch(launch), now, batch)?;
                }
                Intent::Kill {
                    step,
                    fence,
                    reason,
                } => {
                    let Some(executor) = ExecutorKind::of(&run.pipeline.steps[step].action) else {
                        tracing::error!(run = %id, step, "bug: a kill for a gate step; ignored");
                        continue;
                    };
                    let payload = OutboxPayload::Kill {
                        run: id,
                        step: step_key(step)?,
                        fence,
                        reason,
                        executor,
                    };
                    self.enqueue(tx, payload, now, batch)?;
                }
                Intent::ScheduleTimer { due, timer } => {
                    tx.insert_timer(timer_key(id, due, timer)?)?
                }
                Intent::CancelTimer { due, timer } => {
                    tx.delete_timer(timer_key(id, due, timer)?)?;
                }
            }
        }
        let touched = batch.touched.entry(id).or_default();
        touched.steps.extend(effects.steps_changed);
        touched.attempts.extend(effects.attempts_changed);
        Ok(())
    }

    /// Local steps get the API's URL and their attempt's token, for `scarab output set`.
    /// (A Pod cannot reach a loopback API; Pod steps get neither.)
    fn add_step_token(&self, order: &mut crate::engine::LaunchOrder) {
        let Some(tokens) = &self.settings.step_tokens else {
            return;
        };
        if let crate::pipeline::StepAction::Local(command) = &mut order.action {
            let token = tokens.token(order.run, order.step, order.fence);
            command.env.push(("SCARAB_URL".into(), tokens.url.clone()));
            command.env.push(("SCARAB_STEP_TOKEN".into(), token));
        }
    }

    /// Webhook events for a run's state change, and the operator alert when it is
    /// dead-lettered.
    fn notify_run_state(
        &self,
        tx: &mut WriteTx,
        id: RunId,
        from: RunState,
        to: RunState,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        if to == RunState::DeadLettered {
            tracing::error!(run = %id, "operator alert: run dead-lettered");
        }
        if self.settings.live().webhooks.is_empty() {
            return Ok(());
        }
        let Some(run) = self.runs.get(&id) else {
            return Ok(());
        };
        let mut kinds = vec![WebhookEvent::RunState];
        if to == RunState::DeadLettered {
            kinds.push(WebhookEvent::DeadLettered);
        }
        if to == RunState::Quarantined {
            kinds.push(WebhookEvent::Quarantined);
        }
        for kind in kinds {
            let event_id = webhooks::new_event_id();
            let body = webhooks::run_event(kind, &event_id, run, from.as_str(), now);
            self.notify(tx, id, kind, &event_id, &body, now, batch)?;
        }
        Ok(())
    }

    /// A `gate_waiting` webhook event for a gate that opened.
    fn notify_gate(
        &self,
        tx: &mut WriteTx,
        id: RunId,
        step: usize,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        let Some(run) = self.runs.get(&id) else {
            return Ok(());
        };
        tracing::info!(run = %id, step = %run.pipeline.steps[step].name, "gate waiting for a decision");
        if self.settings.live().webhooks.is_empty() {
            return Ok(());
        }
        let event_id = webhooks::new_event_id();
        let body = webhooks::gate_event(&event_id, run, step, now);
        self.notify(
            tx,
            id,
            WebhookEvent::GateWaiting,
            &event_id,
            &body,
            now,
            batch,
        )
    }

    /// One outbox message per webhook subscribed to `kind`, all with the same event id.
    #[allow(clippy::too_many_arguments)]
    fn notify(
        &self,
        tx: &mut WriteTx,
        run: RunId,
        kind: WebhookEvent,
        event_id: &str,
        body: &str,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        let live = self.settings.live();
        for hook in live.webhooks.iter().filter(|h| h.events.contains(&kind)) {
            let payload = OutboxPayload::Webhook {
                run,
                url: hook.url.clone(),
                event_id: event_id.to_string(),
                body: body.to_string(),
                alert: matches!(kind, WebhookEvent::DeadLettered | WebhookEvent::Quarantined),
            };
            self.enqueue(tx, payload, now, batch)?;
        }
        Ok(())
    }

    fn enqueue(
        &self,
        tx: &mut WriteTx,
        payload: OutboxPayload,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        tx.outbox_insert(OutboxMessage {
            id: 0,
            payload,
            created_at: now,
            next_at: now,
            delivery_attempts: 0,
            max_deliveries: self.settings.max_deliveries,
            last_error: None,
        })?;
        batch.new_messages += 1;
        Ok(())
    }

    /// Rewrites each touched run once: header (and its state index), changed steps and
    /// changed attempts (and the in-flight index).
    /// A run that became terminal also gets its retention timer here.
    fn flush(&self, tx: &mut WriteTx, batch: &Batch, now: Timestamp) -> Result<(), StoreError> {
        for (id, touched) in &batch.touched {
            let Some(run) = self.runs.get(id) else {
                continue;
            };
            tx.put_run(&run.header, touched.previous)?;
            // The auto-retry index holds exactly the dead-lettered runs the sweep may act on.
            let key = sweep_key(run);
            if touched.previous_sweep_key != key {
                if let Some(at) = touched.previous_sweep_key {
                    tx.auto_retry_index_delete(at, *id)?;
                }
                if let Some(at) = key {
                    tx.auto_retry_index_put(at, *id)?;
                }
            }
            // Every arrival in a terminal state (also from another one: quarantined,
            // discarded) starts the retention clock again; earlier timers find the run
            // updated since and leave it.
            let arrived = touched.previous.map(|(state, _)| state) != Some(run.header.state);
            if run.header.state.is_terminal() && arrived {
                tx.insert_timer(TimerKey {
                    due: now.plus(self.settings.log_retention),
                    run: *id,
                    step: 0,
                    kind: TimerKind::Retention,
                    fence: crate::engine::Fence(0),
                })?;
            }
            for &step in &touched.steps {
                tx.put_step(*id, step, &run.steps[step])?;
            }
            for &(step, index) in &touched.attempts {
                tx.put_attempt(*id, step, &run.steps[step].attempts[index])?;
            }
        }
        Ok(())
    }
}

/// A run's key in the auto-retry index: a dead-lettered run whose failure is
/// auto-retryable and that no operator discarded.
fn sweep_key(run: &Run) -> Option<Timestamp> {
    let retry = &run.header.auto_retry;
    let candidate = run.header.state == RunState::DeadLettered
        && retry.discarded.is_none()
        && crate::engine::classify_run(run).is_some_and(|c| c.auto_retryable);
    retry.eligible_at.filter(|_| candidate)
}

/// Rebuilds the engine's run from its stored parts, re-validating the stored pipeline.
pub fn rebuild(stored: StoredRun) -> Result<Run, String> {
    let pipeline = parse_stored(&stored.source)?;
    if pipeline.steps.len() != stored.steps.len() {
        return Err(format!(
            "stored run has {} steps but its pipeline has {}",
            stored.steps.len(),
            pipeline.steps.len()
        ));
    }
    Ok(Run {
        header: stored.header,
        pipeline: Arc::new(pipeline),
        steps: stored.steps,
    })
}

pub fn parse_stored(source: &PipelineSource) -> Result<Pipeline, String> {
    let format = match source.format {
        SourceFormat::Yaml => Format::Yaml,
        SourceFormat::Json => Format::Json,
    };
    pipeline::parse(&source.text, format)
        .map(|outcome| outcome.pipeline)
        .map_err(|errors| {
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        })
}

pub(crate) fn timer_key(run: RunId, due: Timestamp, timer: Timer) -> Result<TimerKey, StoreError> {
    let (step, kind, fence) = match timer {
        Timer::RetryDue { step } => (step, TimerKind::RetryDue, crate::engine::Fence(0)),
        Timer::Backstop { step, fence } => (step, TimerKind::Backstop, fence),
        Timer::GateRelease { step } => (step, TimerKind::GateRelease, crate::engine::Fence(0)),
        Timer::GateExpiry { step } => (step, TimerKind::GateExpiry, crate::engine::Fence(0)),
        Timer::Budget => (0, TimerKind::Budget, crate::engine::Fence(0)),
    };
    Ok(TimerKey {
        due,
        run,
        step: step_key(step)?,
        kind,
        fence,
    })
}

fn step_key(step: usize) -> Result<u16, StoreError> {
    u16::try_from(step).map_err(|_| StoreError::Corrupt(format!("step index {step} out of range")))
}

/// Random low bits for run ids: two runs submitted in the same millisecond differ.
fn rand_bits() -> u128 {
    ulid::Ulid::new().random()
}

async fn sleep_or_forever(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

//! One input fed to the engine and everything it decided written into the open transaction: history, outbox messages, timers, and at the end of the batch each touched run's rows.

use super::backstops::Backstops;
use super::*;

impl<E: Executor> Driver<E> {
    /// Feeds an input to the engine for a run it can hold only by its header (its
    /// pipeline no longer restores), and writes what the engine decided: the header, its
    /// history and its timers.
    pub(super) fn change_header(
        &mut self,
        tx: &mut WriteTx,
        mut header: crate::engine::RunHeader,
        input: Input,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), RejectedInput>, StoreError> {
        let previous = (header.state, header.updated_at);
        let effects = match self.engine.handle_header(&mut header, input, now) {
            Ok(effects) => effects,
            Err(rejected) => return Ok(Err(rejected)),
        };
        tx.put_run(&header, Some(previous))?;
        let records: Vec<_> = effects
            .events
            .iter()
            .map(|event| history::header_record(&header, event, now))
            .collect();
        tx.append_history_all(header.id, &records)?;
        for event in &effects.events {
            if let crate::engine::Event::RunState { to, .. } = event {
                batch.counts.push(Count::RunEntered(*to));
            }
        }
        for intent in effects.intents {
            match intent {
                Intent::ScheduleTimer { due, timer } => schedule_timer(
                    tx,
                    &mut self.backstops,
                    &mut self.next_retention,
                    header.id,
                    due,
                    timer,
                )?,
                Intent::CancelTimer { due, timer } => {
                    cancel_timer(tx, &mut self.backstops, header.id, due, timer)?
                }
                Intent::Launch(_) | Intent::Kill { .. } => {
                    tracing::error!(run = %header.id, "bug: a launch or kill for a run known only by its header; ignored");
                }
            }
        }
        Ok(Ok(()))
    }

    pub(super) fn on_report(
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
    pub(super) fn apply_input(
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
        match self
            .engine
            .handle(run, &mut self.fences, &mut self.scheduler, input, now)
        {
            Ok(effects) => {
                self.scheduler.sync(run);
                self.record(tx, id, effects, now, batch)?;
                Ok(Ok(()))
            }
            Err(rejected) => Ok(Err(rejected)),
        }
    }

    /// Admits the steps the scheduler decided on, in the open transaction: what freed
    /// their slots commits together with their launches. Each admission may decide more
    /// (a gate that opens, a run that ends); the loop runs until none is left.
    pub(super) fn admit_decided(
        &mut self,
        tx: &mut WriteTx,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        loop {
            let decided = self.scheduler.take_decided();
            if decided.is_empty() {
                return Ok(());
            }
            for (id, step) in decided {
                if self.runs.contains_key(&id) {
                    let _ = self.apply_input(tx, id, Input::Admit { step }, now, batch)?;
                } else {
                    self.scheduler.forget(id);
                }
            }
        }
    }

    /// Takes a reloaded configuration's limits (SIGHUP) at the start of a batch.
    pub(super) fn apply_limits(&mut self) {
        let live = self.settings.live();
        if *self.scheduler.limits() != live.admission {
            tracing::info!(
                local = live.admission.local,
                pods = live.admission.pods,
                locks = live.admission.locks.len(),
                "admission limits changed"
            );
            self.scheduler.set_limits(live.admission.clone());
        }
    }

    /// Slots in use and queued steps, for `/metrics`.
    pub(super) fn publish_admission(&self) {
        use crate::engine::admission::{Pool, WaitingFor};
        for pool in Pool::ALL {
            let limit = self.scheduler.limits().pool(pool);
            self.metrics.pool(
                pool.as_str(),
                self.scheduler.started(pool),
                u64::from(limit),
            );
        }
        for reason in WaitingFor::ALL {
            self.metrics
                .queued(reason.as_str(), self.scheduler.waiting(reason));
        }
    }

    /// Writes an input's history and intents (outbox messages, timers) into the open
    /// transaction, and notes which rows of the run to rewrite at the end of the batch.
    pub(super) fn record(
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
        let records: Vec<_> = effects
            .events
            .iter()
            .map(|event| history::record(run, event, now))
            .collect();
        let unrecorded = records.len() - tx.append_history_all(id, &records)?;
        if unrecorded > 0 {
            tracing::warn!(run = %id, unrecorded, limit = limits::HISTORY_EVENTS_PER_RUN_MAX, "history full: events not recorded");
        }
        let mut state_changes = Vec::new();
        let mut gates_opened = Vec::new();
        for event in &effects.events {
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
                crate::engine::Event::Admitted { waited_ms, .. } => {
                    batch.counts.push(Count::Admitted(*waited_ms))
                }
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
                Intent::ScheduleTimer { due, timer } => schedule_timer(
                    tx,
                    &mut self.backstops,
                    &mut self.next_retention,
                    id,
                    due,
                    timer,
                )?,
                Intent::CancelTimer { due, timer } => {
                    cancel_timer(tx, &mut self.backstops, id, due, timer)?
                }
            }
        }
        let touched = batch.touched.entry(id).or_default();
        touched.steps.extend(effects.steps_changed);
        touched.attempts.extend(effects.attempts_changed);
        Ok(())
    }

    /// Local steps get the API's URL and their attempt's token, for `scarab output set`.
    /// Pod steps get them only with `kubernetes.callback_url` (the URL the cluster reaches
    /// the API at; a Pod cannot reach a loopback one).
    pub(super) fn add_step_token(&self, order: &mut crate::engine::LaunchOrder) {
        let Some(tokens) = &self.settings.step_tokens else {
            return;
        };
        let (env, url) = match &mut order.action {
            crate::pipeline::StepAction::Local(command) => (&mut command.env, &tokens.url),
            crate::pipeline::StepAction::Kubernetes(template) => {
                let Some(url) = self
                    .settings
                    .kubernetes
                    .as_ref()
                    .and_then(|k| k.callback_url.as_ref())
                else {
                    return;
                };
                (&mut template.env, url)
            }
            _ => return,
        };
        let token = tokens.token(order.run, order.step, order.fence);
        env.push(("SCARAB_URL".into(), url.clone()));
        env.push(("SCARAB_STEP_TOKEN".into(), token));
    }

    /// Webhook events for a run's state change, and the operator alert when it is
    /// dead-lettered.
    pub(super) fn notify_run_state(
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
    pub(super) fn notify_gate(
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
    pub(super) fn notify(
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

    pub(super) fn enqueue(
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
    pub(super) fn flush(&self, tx: &mut WriteTx, batch: &Batch) -> Result<(), StoreError> {
        let mut rows = Vec::with_capacity(batch.touched.len());
        for (id, touched) in &batch.touched {
            let Some(run) = self.runs.get(id) else {
                continue;
            };
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
            rows.push(RunRows {
                header: &run.header,
                previous: touched.previous,
                steps: touched
                    .steps
                    .iter()
                    .map(|&step| (step, &run.steps[step]))
                    .collect(),
                attempts: touched
                    .attempts
                    .iter()
                    .map(|&(step, index)| (step, &run.steps[step].attempts[index]))
                    .collect(),
            });
        }
        tx.put_runs(&rows)
    }
}

/// A run's key in the auto-retry index: a dead-lettered run whose failure is
/// auto-retryable and that no operator discarded.
pub(super) fn sweep_key(run: &Run) -> Option<Timestamp> {
    let retry = &run.header.auto_retry;
    let candidate = run.header.state == RunState::DeadLettered
        && retry.discarded.is_none()
        && crate::engine::classify_run(run).is_some_and(|c| c.auto_retryable);
    retry.eligible_at.filter(|_| candidate)
}

/// A timer the engine set: a backstop in memory (its attempt's record holds it), a run's
/// retention as the sweep's next due time (the state index holds when the run ended), any
/// other in the store's timer table.
fn schedule_timer(
    tx: &mut WriteTx,
    backstops: &mut Backstops,
    next_retention: &mut Option<Timestamp>,
    run: RunId,
    due: Timestamp,
    timer: Timer,
) -> Result<(), StoreError> {
    match timer {
        Timer::Backstop { step, fence } => {
            backstops.schedule(due, run, step, fence);
            Ok(())
        }
        Timer::Retention => {
            *next_retention = Some(next_retention.map_or(due, |next| next.min(due)));
            Ok(())
        }
        other => tx.insert_timer(timer_key(run, due, other)?),
    }
}

fn cancel_timer(
    tx: &mut WriteTx,
    backstops: &mut Backstops,
    run: RunId,
    due: Timestamp,
    timer: Timer,
) -> Result<(), StoreError> {
    match timer {
        Timer::Backstop { step, fence } => backstops.cancel(due, run, step, fence),
        other => {
            tx.delete_timer(timer_key(run, due, other)?)?;
        }
    }
    Ok(())
}

pub(crate) fn timer_key(run: RunId, due: Timestamp, timer: Timer) -> Result<TimerKey, StoreError> {
    let (step, kind, fence) = match timer {
        Timer::RetryDue { step } => (step, TimerKind::RetryDue, crate::engine::Fence(0)),
        Timer::Backstop { step, fence } => (step, TimerKind::Backstop, fence),
        Timer::GateRelease { step } => (step, TimerKind::GateRelease, crate::engine::Fence(0)),
        Timer::GateExpiry { step } => (step, TimerKind::GateExpiry, crate::engine::Fence(0)),
        Timer::Budget => (0, TimerKind::Budget, crate::engine::Fence(0)),
        Timer::Retention => (0, TimerKind::Retention, crate::engine::Fence(0)),
    };
    Ok(TimerKey {
        due,
        run,
        step: step_key(step)?,
        kind,
        fence,
    })
}

pub(super) fn step_key(step: usize) -> Result<u16, StoreError> {
    u16::try_from(step).map_err(|_| StoreError::Corrupt(format!("step index {step} out of range")))
}

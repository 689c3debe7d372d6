//! Outbox deliveries settled (a launch confirmed, a failure counted, a message dead-lettered), the operator's dead-letter actions, and due timers.

use super::*;

impl<E: Executor> Driver<E> {
    pub(super) fn fire_timers(
        &mut self,
        tx: &mut WriteTx,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        for (run, step, fence) in self.backstops.take_due(now, limits::TIMER_BATCH_MAX) {
            let timer = Timer::Backstop { step, fence };
            let _ = self.apply_input(tx, run, Input::TimerFired(timer), now, batch)?;
        }
        if self.next_retention.is_some_and(|due| due <= now) {
            self.sweep_retention(tx, now, batch)?;
        }
        if self.next_timer.is_none_or(|due| due > now) {
            return Ok(());
        }
        for key in tx.take_due_timers(now, limits::TIMER_BATCH_MAX)? {
            let step = usize::from(key.step);
            let timer = match key.kind {
                TimerKind::RetryDue => Timer::RetryDue { step },
                // Schema 1 stored backstops; the migration to schema 2 removed them, and the
                // running attempt's own backstop is in memory: one left over is dropped
                // rather than fired twice.
                TimerKind::Backstop => {
                    tracing::warn!(run = %key.run, "a stored backstop timer (schema 1) dropped: backstops are kept in memory");
                    continue;
                }
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

    pub(super) fn retention_ms(&self) -> u64 {
        u64::try_from(self.settings.engine.log_retention.as_millis()).unwrap_or(u64::MAX)
    }

    /// Hands the runs whose retention is over to `clean_up`, oldest first, through the
    /// state index: runs in a terminal state ordered by when they last changed, after the
    /// store's cursor. Only changes before this batch's time are taken (whatever changes
    /// later sorts after the cursor), at most `TIMER_BATCH_MAX` per terminal state.
    fn sweep_retention(
        &mut self,
        tx: &mut WriteTx,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        let retention = self.retention_ms();
        let until = Timestamp(now.0.saturating_sub(retention).min(now.0.saturating_sub(1)));
        let mut more = false;
        for state in RunState::terminal() {
            let due = tx.take_retention_due(state, until, limits::TIMER_BATCH_MAX)?;
            more |= due.len() == limits::TIMER_BATCH_MAX;
            for run in due {
                self.clean_up(tx, run, now, batch)?;
            }
        }
        self.next_retention = if more {
            Some(now)
        } else {
            tx.next_retention_due(retention)?
        };
        Ok(())
    }

    /// A finished run's retention is over: ask the executor to remove each attempt's
    /// traces (bounded by the pipeline's steps × attempts).
    pub(super) fn clean_up(
        &mut self,
        tx: &mut WriteTx,
        run: RunId,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        let Some(stored) = tx.run(run)? else {
            return Ok(());
        };
        // A run put back in progress since (resubmitted, requeued) keeps its traces; when
        // it ends again, its retention starts again (the sweep meets it again later).
        let retention = self.retention_ms();
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

    pub(super) fn on_delivered(
        &mut self,
        tx: &mut WriteTx,
        id: u64,
        result: Result<(), DeliveryFailure>,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        match result {
            Ok(()) => {
                if let Some(OutboxMessage {
                    payload: OutboxPayload::Launch(launch),
                    ..
                }) = tx.outbox_get(id)?
                {
                    let parked = Parked {
                        message: id,
                        run: launch.run,
                        step: usize::from(launch.step),
                        fence: launch.fence,
                    };
                    if self.waits_for_slot(parked) {
                        // Its message stays in the outbox, claimed: a restart (or a failed
                        // commit) delivers it again.
                        self.parked.push(parked);
                        return Ok(());
                    }
                }
                self.settle_delivered(tx, id, now, batch)?;
            }
            Err(failure) => {
                batch.settled_messages.push(id);
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
    pub(super) fn dead_letter(
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
    pub(super) fn requeue(
        &mut self,
        tx: &mut WriteTx,
        id: u64,
        by: String,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), DlqRejected>, StoreError> {
        let Some(letter) = tx.take_dead_letter(id)? else {
            return Ok(Err(DlqRejected::NotFound(id)));
        };
        let run = letter.message.payload.run();
        if let OutboxPayload::Launch(launch) = &letter.message.payload {
            // A terminal run leaves the cache; bring it back to change it.
            if !matches!(self.load(tx, run)?, Some(Ok(()))) {
                tx.dead_letter(&letter)?;
                return Ok(Err(DlqRejected::Rejected(format!(
                    "run {run} cannot be loaded"
                ))));
            }
            let input = Input::Requeue {
                step: usize::from(launch.step),
                fence: launch.fence,
            };
            if let Err(rejected) = self.apply_input(tx, run, input, now, batch)? {
                tx.dead_letter(&letter)?;
                return Ok(Err(DlqRejected::Rejected(rejected.to_string())));
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

    pub(super) fn discard(
        &mut self,
        tx: &mut WriteTx,
        id: u64,
        by: String,
        reason: String,
        now: Timestamp,
    ) -> Result<Result<(), DlqRejected>, StoreError> {
        let Some(letter) = tx.take_dead_letter(id)? else {
            return Ok(Err(DlqRejected::NotFound(id)));
        };
        let record = HistoryRecord {
            at: now,
            kind: "dlq_discarded".into(),
            detail: serde_json::json!({"message": id, "by": by, "reason": reason}).to_string(),
        };
        tx.append_history(letter.message.payload.run(), &record)?;
        Ok(Ok(()))
    }

    /// A delivered message leaves the outbox; a launch is recorded as confirmed, and its
    /// go follows the commit.
    fn settle_delivered(
        &mut self,
        tx: &mut WriteTx,
        id: u64,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        batch.settled_messages.push(id);
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
        Ok(())
    }

    /// Whether a delivered launch must wait for a slot: its attempt is still launching,
    /// nobody asked to stop it, and the pool has no room for it yet. A launch that no
    /// longer waits (its run ended, it was stopped) is settled as any other.
    fn waits_for_slot(&self, launch: Parked) -> bool {
        let launching = self
            .runs
            .get(&launch.run)
            .and_then(|r| r.steps.get(launch.step))
            .and_then(|s| s.attempts.iter().find(|a| a.fence == launch.fence))
            .is_some_and(|a| a.state == crate::engine::AttemptState::Launching && a.kill.is_none());
        launching && !self.scheduler.may_start(launch.run, launch.step)
    }

    /// Whether a prepared launch could start now (a reload raised the limit).
    pub(super) fn parked_may_start(&self) -> bool {
        self.parked.iter().any(|p| !self.waits_for_slot(*p))
    }

    /// Starts every prepared launch that has its slot now, and settles those that no
    /// longer wait. Each is recorded as confirmed in this batch, and its go follows the
    /// commit.
    pub(super) fn start_parked(
        &mut self,
        tx: &mut WriteTx,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        let mut index = 0;
        while index < self.parked.len() {
            let parked = self.parked[index];
            if self.waits_for_slot(parked) {
                index += 1;
                continue;
            }
            self.parked.swap_remove(index);
            // Should the batch fail, the settled message is delivered again.
            self.settle_delivered(tx, parked.message, now, batch)?;
        }
        Ok(())
    }

    pub(super) fn confirmed_and_wanted(
        &self,
        run: RunId,
        step: usize,
        fence: crate::engine::Fence,
    ) -> bool {
        let attempt = self
            .runs
            .get(&run)
            .and_then(|r| r.steps.get(step))
            .and_then(|s| s.attempts.iter().find(|a| a.fence == fence));
        attempt.is_some_and(|a| {
            matches!(a.state, crate::engine::AttemptState::Running { .. }) && a.kill.is_none()
        })
    }
}

//! The service's commands, each answered after its batch commits.

use super::*;

impl<E: Executor> Driver<E> {
    pub(super) fn on_command(
        &mut self,
        tx: &mut WriteTx,
        command: Command,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        match command {
            Command::CreateSchedule { schedule, reply } => {
                let created = self.create_schedule(tx, *schedule, now)?;
                batch.replies.push(answer(reply, created));
            }
            Command::Schedule {
                name,
                action,
                reply,
            } => {
                let result = self.schedule_action(tx, &name, action, now)?;
                batch.replies.push(answer(reply, result));
            }
            Command::Submit {
                source,
                pipeline,
                origin,
                admission,
                idempotency_key,
                reply,
            } => {
                let submitted = self.submit(
                    tx,
                    source,
                    pipeline,
                    origin,
                    admission,
                    idempotency_key,
                    now,
                    batch,
                )?;
                batch.replies.push(answer(reply, submitted));
            }
            Command::Queue { run, reply } => {
                let _ = reply.send(self.queue_view(run));
            }
            Command::Cancel { run, by, reply } => {
                let result = self.cancel(tx, run, by, now, batch)?;
                batch.replies.push(answer(reply, result));
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
                    Ok(()) => Err(OutputRejected::StaleFence { current: None }),
                    Err(RejectedInput::StaleFence { current }) => {
                        Err(OutputRejected::StaleFence { current })
                    }
                    Err(other) => Err(OutputRejected::Rejected(other)),
                };
                batch.replies.push(answer(reply, result));
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
                batch.replies.push(answer(reply, result));
            }
            Command::Ping { reply } => {
                let _ = reply.send(());
            }
            Command::Sweep { candidates, reply } => {
                let outcome = self.sweep(tx, candidates, now, batch)?;
                // A failed commit resubmitted nothing: the caller gets an empty outcome and
                // the candidates stay in the index for the next pass.
                batch.replies.push(Box::new(move |error| {
                    let _ = reply.send(if error.is_none() {
                        outcome
                    } else {
                        Default::default()
                    });
                }));
            }
            Command::Retry {
                run,
                from,
                by,
                reply,
            } => {
                let result = self.retry(tx, run, from, by, now, batch)?;
                batch.replies.push(answer(reply, result));
            }
            Command::Release { run, by, reply } => {
                let result = self.release(tx, run, by, now, batch)?;
                batch.replies.push(answer(reply, result));
            }
            Command::DiscardRun {
                run,
                by,
                reason,
                reply,
            } => {
                let result = self.discard_run(tx, run, by, reason, now, batch)?;
                batch.replies.push(answer(reply, result));
            }
            Command::Requeue { id, by, reply } => {
                let result = self.requeue(tx, id, by, now, batch)?;
                batch.replies.push(answer(reply, result));
            }
            Command::Discard {
                id,
                by,
                reason,
                reply,
            } => {
                let result = self.discard(tx, id, by, reason, now)?;
                batch.replies.push(answer(reply, result));
            }
            Command::Delivered { message, result } => {
                self.on_delivered(tx, message, result, now, batch)?
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit(
        &mut self,
        tx: &mut WriteTx,
        source: PipelineSource,
        pipeline: Arc<Pipeline>,
        origin: String,
        admission: crate::engine::RunAdmission,
        idempotency_key: Option<String>,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<Submitted, SubmitRejected>, StoreError> {
        if let Some(key) = &idempotency_key
            && let Some(existing) = tx.idempotency_get(key)?
        {
            // The same key with another pipeline is a client bug, not a replay.
            if tx
                .pipeline(existing)?
                .is_some_and(|stored| stored != source)
            {
                return Ok(Err(SubmitRejected::IdempotencyConflict(existing)));
            }
            return Ok(Ok(Submitted {
                id: existing,
                existing: true,
            }));
        }
        // A replay of a known key is answered above whatever the load; a new run only
        // while fewer than the limit are in progress, which bounds the queue too.
        let limit = self.scheduler.limits().active_runs;
        if self.runs.len() >= limit as usize {
            return Ok(Err(SubmitRejected::Full { limit }));
        }
        if self.metrics.disk_full.get() != 0 {
            return Ok(Err(SubmitRejected::DiskFull));
        }
        let id = self.next_run_id(now);
        let group = admission.group.clone();
        let (run, effects) = self.engine.submit(
            id,
            pipeline,
            origin,
            admission,
            &mut self.fences,
            &mut self.scheduler,
            now,
        );
        tx.put_pipeline(id, &source)?;
        if let Some(key) = &idempotency_key {
            tx.idempotency_put(key, id)?;
        }
        batch.touched.insert(id, Touched::default());
        self.scheduler.sync(&run);
        self.runs.insert(id, run);
        self.record(tx, id, effects, now, batch)?;
        if let Some(group) = group.filter(|g| g.supersede) {
            // The group's older runs that are still waiting for a slot make way.
            for older in self.scheduler.group_waiting(&group.group) {
                if older < id {
                    let cancel = Input::Cancel {
                        by: format!("run {id}"),
                        reason: Some(SUPERSEDED.to_string()),
                    };
                    let _ = self.apply_input(tx, older, cancel, now, batch)?;
                }
            }
        }
        Ok(Ok(Submitted {
            id,
            existing: false,
        }))
    }

    pub(super) fn cancel(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        by: String,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), RunRejected>, StoreError> {
        if !self.runs.contains_key(&id) {
            return Ok(match tx.run_header(id)? {
                Some(header) => Err(RunRejected::Rejected(
                    RejectedInput::RunTerminal(header.state.as_str()).to_string(),
                )),
                None => Err(RunRejected::NotFound(id)),
            });
        }
        Ok(self
            .apply_input(tx, id, Input::Cancel { by, reason: None }, now, batch)?
            .map_err(|rejected| RunRejected::Rejected(rejected.to_string())))
    }

    /// Brings a stored run into the cache (a finished run leaves it) so an input can change
    /// it. `Ok(Err(reason))` when it cannot be restored.
    pub(super) fn load(
        &mut self,
        tx: &WriteTx,
        id: RunId,
    ) -> Result<Option<Result<(), String>>, StoreError> {
        if self.runs.contains_key(&id) {
            return Ok(Some(Ok(())));
        }
        let Some(stored) = tx.run(id)? else {
            return Ok(None);
        };
        Ok(Some(rebuild(stored).map(|run| {
            self.runs.insert(id, run);
            self.loaded.push(id);
        })))
    }

    /// `load` for an operator's action: an unknown run is 404, one that cannot be
    /// restored is refused naming why.
    fn load_for_action(
        &mut self,
        tx: &WriteTx,
        id: RunId,
    ) -> Result<Result<(), RunRejected>, StoreError> {
        Ok(match self.load(tx, id)? {
            None => Err(RunRejected::NotFound(id)),
            Some(Err(error)) => Err(RunRejected::Rejected(format!(
                "run {id} cannot be restored: {error}"
            ))),
            Some(Ok(())) => Ok(()),
        })
    }

    /// An operator input on a (possibly finished) run.
    pub(super) fn run_action(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        input: Input,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), RunRejected>, StoreError> {
        if let Err(refused) = self.load_for_action(tx, id)? {
            return Ok(Err(refused));
        }
        Ok(self
            .apply_input(tx, id, input, now, batch)?
            .map_err(|rejected| RunRejected::Rejected(rejected.to_string())))
    }

    /// An operator's re-run of a finished run, `from` a step by name.
    pub(super) fn retry(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        from: Option<String>,
        by: String,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<Vec<String>, RunRejected>, StoreError> {
        if let Err(refused) = self.load_for_action(tx, id)? {
            return Ok(Err(refused));
        }
        let run = &self.runs[&id];
        let from = match from {
            None => None,
            Some(step) => match run.pipeline.step_index(&step) {
                Some(index) => Some(index),
                None => return Ok(Err(RunRejected::StepNotFound { run: id, step })),
            },
        };
        let names: Vec<String> = crate::engine::retry_plan(run, from)
            .into_iter()
            .map(|step| run.pipeline.steps[step].name.clone())
            .collect();
        Ok(self
            .run_action(tx, id, Input::Retry { by, from }, now, batch)?
            .map(|()| names))
    }

    /// An operator discards a quarantined run; one whose pipeline no longer restores is
    /// discarded at the header level (it could never run again anyway).
    pub(super) fn discard_run(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        by: String,
        reason: String,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), RunRejected>, StoreError> {
        if let Some(Err(_)) = self.load(tx, id)? {
            let Some(header) = tx.run_header(id)? else {
                return Ok(Err(RunRejected::NotFound(id)));
            };
            let input = Input::Discard { by, reason };
            if let Err(rejected) = self.change_header(tx, header, input, now, batch)? {
                return Ok(Err(RunRejected::Rejected(rejected.to_string())));
            }
            return Ok(Ok(()));
        }
        self.run_action(tx, id, Input::Discard { by, reason }, now, batch)
    }

    /// An operator releases a quarantined run: a fresh try, counted like a resubmit.
    pub(super) fn release(
        &mut self,
        tx: &mut WriteTx,
        id: RunId,
        by: String,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<(), RunRejected>, StoreError> {
        if let Err(refused) = self.load_for_action(tx, id)? {
            return Ok(Err(refused));
        }
        let state = self.runs[&id].header.state;
        if state != RunState::Quarantined {
            return Ok(Err(RunRejected::Rejected(format!(
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
    pub(super) fn sweep(
        &mut self,
        tx: &mut WriteTx,
        candidates: Vec<(Timestamp, RunId)>,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<crate::service::sweep::PassOutcome, StoreError> {
        use crate::engine::{Eligibility, SkipReason, eligibility};
        let settings = self.settings.live().auto_retry.clone();
        let mut outcome = crate::service::sweep::PassOutcome {
            scanned: candidates.len(),
            ..Default::default()
        };
        for (key, id) in candidates {
            match self.load(tx, id)? {
                None => {
                    tx.auto_retry_index_delete(key, id)?;
                    outcome.skip(SkipReason::NotDeadLettered);
                    continue;
                }
                Some(Err(error)) => {
                    // Restore-or-quarantine: never resubmit what cannot be validated.
                    self.quarantine_unrestorable(tx, key, id, &error, now, batch)?;
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
    pub(super) fn quarantine_unrestorable(
        &mut self,
        tx: &mut WriteTx,
        key: Timestamp,
        id: RunId,
        error: &str,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        tx.auto_retry_index_delete(key, id)?;
        let Some(header) = tx.run_header(id)? else {
            return Ok(());
        };
        let reason = format!("the stored pipeline cannot be restored: {error}");
        if self
            .change_header(
                tx,
                header,
                Input::Quarantine {
                    reason: reason.clone(),
                },
                now,
                batch,
            )?
            .is_ok()
        {
            tracing::warn!(run = %id, %reason, "operator alert: run quarantined");
        }
        Ok(())
    }

    /// Approves or rejects a gate by name. A run that is no longer active is loaded only to
    /// say precisely why nothing can be decided.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide(
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
    ) -> Result<Result<Decided, DecideRejected>, StoreError> {
        let not_found = || DecideRejected::StepNotFound {
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
            let Some(stored) = tx.run(id)? else {
                return Ok(Err(DecideRejected::RunNotFound(id)));
            };
            let mut run = match rebuild(stored) {
                Ok(run) => run,
                Err(error) => return Ok(Err(DecideRejected::Unreadable { run: id, error })),
            };
            let Some(step) = run.pipeline.step_index(step_name) else {
                return Ok(Err(not_found()));
            };
            // A finished run refuses every decision without changing anything.
            let mut scratch = self.fences;
            return Ok(
                match self.engine.handle(
                    &mut run,
                    &mut scratch,
                    &mut crate::engine::Unlimited,
                    input(step),
                    now,
                ) {
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
        Ok(decision.ok_or_else(|| DecideRejected::Unreadable {
            run: id,
            error: "the decision was not recorded".into(),
        }))
    }
}

/// The cancel reason of a run a newer run of its concurrency group superseded.
pub const SUPERSEDED: &str = "superseded";

impl<E: Executor> Driver<E> {
    fn queue_view(&self, run: Option<RunId>) -> super::super::protocol::QueueView {
        use crate::engine::admission::{Pool, WaitingFor};
        let scheduler = &self.scheduler;
        let limits = scheduler.limits();
        let waits = match run {
            Some(id) => match self.runs.get(&id) {
                Some(run) => (0..run.steps.len())
                    .filter_map(|step| scheduler.wait(id, step))
                    .collect(),
                None => Vec::new(),
            },
            None => scheduler.queue(limits::QUEUE_LIST_MAX),
        };
        let name = |wait: &crate::engine::admission::Wait| {
            self.runs
                .get(&wait.run)
                .and_then(|run| run.pipeline.steps.get(wait.step))
                .map(|step| step.name.clone())
                .unwrap_or_default()
        };
        let waits = waits
            .into_iter()
            .map(|wait| {
                let step = name(&wait);
                (wait, step)
            })
            .collect();
        super::super::protocol::QueueView {
            pools: Pool::ALL
                .into_iter()
                .map(|p| (p.as_str(), scheduler.started(p), limits.pool(p)))
                .collect(),
            locks: limits
                .locks
                .iter()
                .map(|(name, limit)| (name.clone(), scheduler.lock_used(name), *limit))
                .collect(),
            waiting: WaitingFor::ALL
                .into_iter()
                .map(|w| (w.as_str(), scheduler.waiting(w)))
                .collect(),
            waits,
        }
    }

    /// A new run's id: a ULID of `now`, above every id this driver issued, so ids sort in
    /// submit order (admission's tie-break) even within one millisecond.
    fn next_run_id(&mut self, now: Timestamp) -> RunId {
        let fresh = RunId(ulid::Ulid::from_parts(now.0, rand_bits()).0);
        let id = match self.last_run_id {
            Some(last) if fresh <= last => RunId(last.0 + 1),
            _ => fresh,
        };
        self.last_run_id = Some(id);
        id
    }
}

/// Random low bits for run ids: two runs submitted in the same millisecond differ.
pub(super) fn rand_bits() -> u128 {
    ulid::Ulid::new().random()
}

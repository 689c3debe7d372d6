//! Schedules: created, paused, resumed and deleted by operators, and fired when due. A
//! fire and the run it starts commit in one transaction with the schedule's next fire,
//! so after a crash a fire has either happened completely or not at all.

use super::*;
use crate::engine::RunAdmission;
use crate::engine::schedule::{Decision, Spec};
use crate::service::protocol::{ScheduleAction, ScheduleRejected};
use crate::store::records::StoredSchedule;

impl<E: Executor> Driver<E> {
    pub(super) fn create_schedule(
        &mut self,
        tx: &mut WriteTx,
        mut stored: StoredSchedule,
        now: Timestamp,
    ) -> Result<Result<StoredSchedule, ScheduleRejected>, StoreError> {
        let name = stored.schedule.name.clone();
        if tx.schedule(&name)?.is_some() {
            return Ok(Err(ScheduleRejected::Exists(name)));
        }
        if tx.schedule_count()? >= limits::SCHEDULES_MAX as u64 {
            return Ok(Err(ScheduleRejected::Full {
                limit: limits::SCHEDULES_MAX,
            }));
        }
        let spec = match Spec::parse(&stored.schedule.cron, &stored.schedule.timezone) {
            Ok(spec) => spec,
            Err(error) => return Ok(Err(ScheduleRejected::Invalid(error.to_string()))),
        };
        let schedule = &mut stored.schedule;
        schedule.created_at = now;
        schedule.next_fire = if schedule.paused {
            None
        } else {
            spec.next_after(now)
        };
        tx.put_schedule(&stored, None)?;
        tracing::info!(
            schedule = %name,
            next_fire = ?stored.schedule.next_fire.map(clock::rfc3339),
            "schedule created"
        );
        Ok(Ok(stored))
    }

    pub(super) fn schedule_action(
        &mut self,
        tx: &mut WriteTx,
        name: &str,
        action: ScheduleAction,
        now: Timestamp,
    ) -> Result<Result<Option<StoredSchedule>, ScheduleRejected>, StoreError> {
        let Some(mut stored) = tx.schedule(name)? else {
            return Ok(Err(ScheduleRejected::NotFound(name.to_string())));
        };
        let was_due = stored.schedule.next_fire;
        match action {
            ScheduleAction::Delete => {
                tx.delete_schedule(name)?;
                tracing::info!(schedule = %name, "schedule deleted");
                return Ok(Ok(None));
            }
            ScheduleAction::Pause => {
                stored.schedule.paused = true;
                stored.schedule.next_fire = None;
            }
            ScheduleAction::Resume if stored.schedule.paused => {
                // Fires that fell in the pause are not caught up: the next one after now.
                let spec = match Spec::parse(&stored.schedule.cron, &stored.schedule.timezone) {
                    Ok(spec) => spec,
                    Err(error) => return Ok(Err(ScheduleRejected::Invalid(error.to_string()))),
                };
                stored.schedule.paused = false;
                stored.schedule.next_fire = spec.next_after(now);
            }
            ScheduleAction::Resume => {}
        }
        tx.put_schedule(&stored, was_due)?;
        tracing::info!(schedule = %name, action = ?action, "schedule changed");
        Ok(Ok(Some(stored)))
    }

    /// Takes every schedule fire due by `now` (up to a batch's worth; the rest come in
    /// the next batch, which the due timer wakes at once).
    pub(super) fn fire_schedules(
        &mut self,
        tx: &mut WriteTx,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        if self.next_timer.is_none_or(|due| due > now) {
            return Ok(());
        }
        for (due, name) in tx.due_schedules(now, limits::SCHEDULE_FIRE_BATCH_MAX)? {
            let Some(mut stored) = tx.schedule(&name)? else {
                continue;
            };
            let was_due = stored.schedule.next_fire;
            if was_due != Some(due) {
                continue;
            }
            let decision = match Spec::parse(&stored.schedule.cron, &stored.schedule.timezone) {
                Ok(spec) => {
                    let active = stored
                        .schedule
                        .last_run
                        .filter(|run| self.runs.contains_key(run));
                    stored.schedule.on_due(&spec, now, self.started_at, active)
                }
                // Stored by a build that read it; this one cannot: the schedule stops
                // until an operator replaces it, and says why.
                Err(error) => Decision {
                    start: false,
                    missed: 0,
                    skip: Some(format!(
                        "the schedule no longer reads ({error}); it is paused"
                    )),
                    next: None,
                },
            };
            let mut decision = decision;
            let started = if decision.start {
                match self.start_scheduled(tx, &stored, now, batch)? {
                    Ok(run) => Some(run),
                    Err(reason) => {
                        decision.skip = Some(reason);
                        None
                    }
                }
            } else {
                None
            };
            if decision.next.is_none() {
                stored.schedule.paused = true;
            }
            if let Some(reason) = &mut decision.skip {
                *reason = limits::clip(reason, limits::SCHEDULE_REASON_MAX_BYTES);
            }
            stored.schedule.took(&decision, now, started);
            match (&started, &decision.skip) {
                (Some(run), _) => tracing::info!(
                    schedule = %name, run = %run, missed = decision.missed,
                    "schedule fired"
                ),
                (None, Some(reason)) => tracing::warn!(
                    schedule = %name, missed = decision.missed, reason = %reason,
                    "schedule fire skipped"
                ),
                (None, None) => {}
            }
            tx.put_schedule(&stored, was_due)?;
        }
        Ok(())
    }

    /// Submits the schedule's pipeline as a new run; why not, when it cannot.
    fn start_scheduled(
        &mut self,
        tx: &mut WriteTx,
        stored: &StoredSchedule,
        now: Timestamp,
        batch: &mut Batch,
    ) -> Result<Result<RunId, String>, StoreError> {
        let pipeline = match parse_stored(&stored.source) {
            Ok(pipeline) => pipeline,
            Err(errors) => return Ok(Err(format!("the pipeline no longer validates: {errors}"))),
        };
        let refused = self.settings.check_pipeline(&pipeline);
        if !refused.is_empty() {
            let errors: Vec<_> = refused.iter().map(ToString::to_string).collect();
            return Ok(Err(format!(
                "the configuration refuses the pipeline: {}",
                errors.join("; ")
            )));
        }
        let admission = RunAdmission::of(&pipeline);
        let origin = format!(
            "{}{}",
            crate::engine::run_failure::SCHEDULE_ORIGIN_PREFIX,
            stored.schedule.name
        );
        let submitted = self.submit(
            tx,
            stored.source.clone(),
            Arc::new(pipeline),
            origin,
            admission,
            None,
            now,
            batch,
        )?;
        Ok(submitted
            .map(|s| s.id)
            .map_err(|rejected| rejected.to_string()))
    }
}

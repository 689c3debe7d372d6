//! The state machine: submit, launch confirmation, verdicts, timers and cancel.

use std::sync::Arc;
use std::time::Duration;

use super::admission::Admission;
use super::retry::{self, Decision};
use super::state::{
    Attempt, AttemptState, BudgetClock, CancelRequest, GateDecision, GateOutcome, GateProgress,
    KillReason, Run, RunAdmission, RunHeader, RunState, RunStep, StepState,
};
use super::{
    Effects, EngineSettings, Event, FenceCounter, Input, Intent, LaunchOrder, Outcome, RunId,
    Timer, Timestamp, Verdict,
};
use crate::pipeline::Pipeline;

/// An input the engine refuses, with nothing changed. The API turns these into 4xx.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RejectedInput {
    #[error("run is already {0}")]
    RunTerminal(&'static str),
    #[error("the step's last attempt is not a dead-lettered launch with that fence")]
    NotRequeueable,
    /// A zombie (or a late attempt) wrote with a fence that is not the step's current one.
    #[error("stale_fence")]
    StaleFence { current: Option<super::Fence> },
    #[error("step {0} is not a gate")]
    NotAGate(String),
    #[error("run is {0}, not {1}")]
    WrongState(&'static str, &'static str),
    /// The gate is not open: not reached yet, or already decided.
    #[error("gate {step} is {state}, not waiting for a decision")]
    GateNotOpen { step: String, state: String },
    /// The input names a step the run does not have (an executor or a stored timer that
    /// does not belong to this run).
    #[error("run has no step {0}")]
    NoSuchStep(usize),
    /// An attempt may hold at most `limit` outputs; `key` would be one more.
    #[error("{key}: an attempt stores at most {limit} outputs")]
    TooManyOutputs { key: String, limit: usize },
    /// Only quarantine and discard apply to a run whose pipeline no longer restores.
    #[error("the run's pipeline cannot be restored")]
    NeedsPipeline,
    /// A retry of a run that is still in progress, or that succeeded with no `from`.
    #[error("{0}")]
    NothingToRetry(String),
}

/// The step reason of a gate that was rejected.
pub const GATE_REJECTED: &str = "GateRejected";
/// The step reason of a gate nobody approved before it expired.
pub const GATE_EXPIRED: &str = "GateExpired";
/// The step reason of steps stopped because the run's budget ran out.
pub const BUDGET_EXCEEDED: &str = "BudgetExceeded";
/// Who decides a gate through its own timers.
pub const SYSTEM: &str = "system";

pub struct Engine {
    settings: EngineSettings,
}

impl Engine {
    pub fn new(settings: EngineSettings) -> Self {
        Engine { settings }
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// Creates a run and launches the steps that need nothing (those admission lets start;
    /// the others are queued).
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &self,
        id: RunId,
        pipeline: Arc<Pipeline>,
        origin: String,
        admission: RunAdmission,
        fences: &mut FenceCounter,
        gate: &mut dyn Admission,
        now: Timestamp,
    ) -> (Run, Effects) {
        let header = RunHeader {
            id,
            pipeline_name: pipeline.name.clone(),
            origin,
            state: RunState::Queued,
            created_at: now,
            updated_at: now,
            cancel: None,
            budget: pipeline.budget.map(|limit| BudgetClock::new(limit, now)),
            auto_retry: Default::default(),
            admission,
        };
        let steps = vec![RunStep::new(); pipeline.steps.len()];
        let mut run = Run {
            header,
            pipeline,
            steps,
        };
        let mut effects = Effects::default();
        effects.events.push(Event::Submitted {
            steps: run.steps.len(),
        });
        effects.steps_changed.extend(0..run.steps.len());
        if let Some(due) = run.header.budget.as_ref().and_then(|b| b.due) {
            effects.intents.push(Intent::ScheduleTimer {
                due,
                timer: Timer::Budget,
            });
        }
        self.advance(&mut run, fences, gate, now, &mut effects);
        self.schedule_retention(now, &mut effects);
        (run, effects)
    }

    /// Applies one input. Inputs about attempts that are no longer in flight (a duplicate
    /// verdict, a stale timer) change nothing: delivery is at-least-once.
    pub fn handle(
        &self,
        run: &mut Run,
        fences: &mut FenceCounter,
        gate: &mut dyn Admission,
        input: Input,
        now: Timestamp,
    ) -> Result<Effects, RejectedInput> {
        // Every later index into the run's steps trusts this: an input naming a step that
        // is not there changes nothing.
        if let Some(step) = input.step()
            && (step >= run.steps.len() || step >= run.pipeline.steps.len())
        {
            return Err(RejectedInput::NoSuchStep(step));
        }
        let mut effects = Effects::default();
        match input {
            Input::LaunchConfirmed { step, fence } => {
                self.on_launch_confirmed(run, step, fence, now, &mut effects)
            }
            Input::Verdict {
                step,
                fence,
                verdict,
            } => self.on_verdict(run, step, fence, verdict, now, &mut effects),
            Input::TimerFired(Timer::RetryDue { step }) => {
                self.on_retry_due(run, step, &mut effects)
            }
            Input::TimerFired(Timer::Backstop { step, fence }) => {
                self.on_backstop(run, step, fence, now, &mut effects)
            }
            Input::TimerFired(Timer::GateRelease { step }) => {
                on_gate_timer(run, step, GateOutcome::AutoReleased, now, &mut effects)
            }
            Input::TimerFired(Timer::GateExpiry { step }) => {
                on_gate_timer(run, step, GateOutcome::Expired, now, &mut effects)
            }
            Input::TimerFired(Timer::Budget) => on_budget(run, now, &mut effects),
            // The driver removes the traces itself; nothing of the run changes.
            Input::TimerFired(Timer::Retention) => {}
            Input::Decide {
                step,
                approve,
                by,
                caller,
                comment,
            } => on_decide(run, step, approve, by, caller, comment, now, &mut effects)?,
            Input::Resubmit { by, next_at } => on_resubmit(run, by, next_at, now, &mut effects)?,
            Input::Retry { by, from } => on_retry(run, by, from, now, &mut effects)?,
            Input::Quarantine { reason } => on_quarantine(&mut run.header, reason, &mut effects)?,
            Input::Discard { by, reason } => on_discard(&mut run.header, by, reason, &mut effects)?,
            Input::Cancel { by, reason } => on_cancel(run, by, reason, now, &mut effects)?,
            Input::Undeliverable {
                step,
                fence,
                launch,
                reason,
                detail,
            } => on_undeliverable(run, step, fence, launch, reason, detail, now, &mut effects),
            Input::Requeue { step, fence } => on_requeue(run, step, fence, &mut effects)?,
            Input::SetOutputs {
                step,
                fence,
                outputs,
            } => on_outputs(run, step, fence, outputs, &mut effects)?,
            Input::Admit { step } => self.on_admit(run, step, fences, now, &mut effects),
        }
        self.advance(run, fences, gate, now, &mut effects);
        self.schedule_retention(now, &mut effects);
        Ok(effects)
    }

    /// An input for a run whose pipeline no longer restores, so only its header can
    /// change: quarantine and discard, the sweep's and the operator's ways out for it.
    /// Anything else needs the whole run.
    pub fn handle_header(
        &self,
        header: &mut RunHeader,
        input: Input,
        now: Timestamp,
    ) -> Result<Effects, RejectedInput> {
        let mut effects = Effects::default();
        match input {
            Input::Quarantine { reason } => on_quarantine(header, reason, &mut effects)?,
            Input::Discard { by, reason } => on_discard(header, by, reason, &mut effects)?,
            _ => return Err(RejectedInput::NeedsPipeline),
        }
        header.updated_at = now;
        self.schedule_retention(now, &mut effects);
        Ok(effects)
    }

    /// Every arrival in a terminal state (also from another one: quarantined, discarded)
    /// starts the retention clock again; earlier timers find the run updated since and
    /// leave it.
    fn schedule_retention(&self, now: Timestamp, effects: &mut Effects) {
        let terminal = effects
            .events
            .iter()
            .any(|event| matches!(event, Event::RunState { to, .. } if to.is_terminal()));
        if terminal {
            effects.intents.push(Intent::ScheduleTimer {
                due: now.plus(self.settings.log_retention),
                timer: Timer::Retention,
            });
        }
    }

    fn on_launch_confirmed(
        &self,
        run: &mut Run,
        step: usize,
        fence: super::Fence,
        now: Timestamp,
        effects: &mut Effects,
    ) {
        let timeout = run.step_timeout(step, self.settings.default_step_timeout);
        let Some((index, attempt)) = attempt_by_fence(run, step, fence) else {
            return;
        };
        if attempt.state != AttemptState::Launching {
            return;
        }
        let backstop_due = now.plus(timeout + self.settings.backstop_slack);
        attempt.state = AttemptState::Running {
            confirmed_at: now,
            backstop_due,
        };
        let number = attempt.number;
        effects.attempt_changed(step, index);
        effects.events.push(Event::AttemptLaunched {
            step,
            attempt: number,
            fence,
        });
        effects.intents.push(Intent::ScheduleTimer {
            due: backstop_due,
            timer: Timer::Backstop { step, fence },
        });
        if run.header.state == RunState::Queued {
            set_run_state(run, RunState::Running, effects);
        }
    }

    fn on_verdict(
        &self,
        run: &mut Run,
        step: usize,
        fence: super::Fence,
        verdict: Verdict,
        now: Timestamp,
        effects: &mut Effects,
    ) {
        let Some((index, attempt)) = attempt_by_fence(run, step, fence) else {
            return;
        };
        if let AttemptState::Running { backstop_due, .. } = attempt.state {
            effects.intents.push(Intent::CancelTimer {
                due: backstop_due,
                timer: Timer::Backstop { step, fence },
            });
        } else if attempt.state != AttemptState::Launching {
            return;
        }
        let number = attempt.number;
        effects.events.push(Event::AttemptFinished {
            step,
            attempt: number,
            fence,
            class: verdict.class(),
            reason: verdict.reason.clone(),
        });
        let outcome = verdict.outcome.clone();
        attempt.state = AttemptState::Finished(verdict);
        effects.attempt_changed(step, index);

        let next = match outcome {
            Outcome::Succeeded => StepState::Succeeded,
            _ if run.header.cancel.is_some() => StepState::Cancelled,
            _ if budget_exceeded(run) => budget_failure(),
            // Scarab only stops an attempt for a cancel or a timeout; a stop without a
            // pending cancel means the executor lost track of why: no verdict.
            Outcome::Stopped => {
                self.after_failure(run, step, super::FailureClass::Lost, now, effects)
            }
            Outcome::Failed(class) => self.after_failure(run, step, class, now, effects),
        };
        set_step_state(run, step, next, effects);
    }

    /// Retry or give up, per the retry table.
    fn after_failure(
        &self,
        run: &Run,
        step: usize,
        class: super::FailureClass,
        now: Timestamp,
        effects: &mut Effects,
    ) -> StepState {
        let spec = &run.pipeline.steps[step];
        let attempts_used = u32::try_from(run.steps[step].current_try().len()).unwrap_or(u32::MAX);
        let infra_retries = self.settings.infra_retries;
        match retry::decide(class, spec.retry.as_ref(), infra_retries, attempts_used) {
            Decision::Retry => {
                let backoff = spec.retry.map(|p| p.backoff).unwrap_or_default();
                let delay = retry::backoff_delay(
                    &backoff,
                    attempts_used,
                    self.settings.jitter_seed,
                    run.id(),
                    step,
                );
                let due = retry::retry_due(now, delay);
                effects.events.push(Event::RetryScheduled { step, due });
                effects.intents.push(Intent::ScheduleTimer {
                    due,
                    timer: Timer::RetryDue { step },
                });
                StepState::RetryWaiting { due }
            }
            Decision::Failed { reason } => StepState::Failed {
                reason: reason.to_string(),
            },
            Decision::DeadLettered { reason } => StepState::DeadLettered {
                reason: reason.to_string(),
            },
        }
    }

    /// The engine's own timeout, for an executor that never reported one. The first
    /// firing asks the executor to stop the attempt and waits once more; the second
    /// concludes that no verdict can be obtained (`lost`), so a run never waits forever.
    fn on_backstop(
        &self,
        run: &mut Run,
        step: usize,
        fence: super::Fence,
        now: Timestamp,
        effects: &mut Effects,
    ) {
        let slack = self.settings.backstop_slack;
        let Some((index, attempt)) = attempt_by_fence(run, step, fence) else {
            return;
        };
        let AttemptState::Running { confirmed_at, .. } = attempt.state else {
            return;
        };
        effects.attempt_changed(step, index);
        if attempt.kill.is_none() {
            let backstop_due = now.plus(slack);
            attempt.kill = Some(KillReason::Timeout);
            attempt.state = AttemptState::Running {
                confirmed_at,
                backstop_due,
            };
            effects.events.push(Event::KillRequested {
                step,
                fence,
                reason: KillReason::Timeout,
            });
            effects.intents.push(Intent::Kill {
                step,
                fence,
                reason: KillReason::Timeout,
            });
            effects.intents.push(Intent::ScheduleTimer {
                due: backstop_due,
                timer: Timer::Backstop { step, fence },
            });
            return;
        }
        let verdict = Verdict {
            outcome: Outcome::Failed(super::FailureClass::Lost),
            started: true,
            reason: "no verdict from the executor after the engine backstop asked it to stop the attempt".into(),
            exit_code: None,
            started_at: None,
            finished_at: now,
        };
        effects.events.push(Event::AttemptFinished {
            step,
            attempt: attempt.number,
            fence,
            class: verdict.class(),
            reason: verdict.reason.clone(),
        });
        attempt.state = AttemptState::Finished(verdict);
        let next = if run.header.cancel.is_some() {
            StepState::Cancelled
        } else if budget_exceeded(run) {
            budget_failure()
        } else {
            self.after_failure(run, step, super::FailureClass::Lost, now, effects)
        };
        set_step_state(run, step, next, effects);
    }

    fn on_retry_due(&self, run: &mut Run, step: usize, effects: &mut Effects) {
        let Some(progress) = run.steps.get(step) else {
            return;
        };
        if matches!(progress.state, StepState::RetryWaiting { .. }) && run.header.cancel.is_none() {
            // `advance` mints the attempt; marking the step pending lets it.
            set_step_state(run, step, StepState::Pending, effects);
        }
    }

    /// Settles everything that follows from the current state: skips dependents of
    /// failed steps, launches ready steps, and decides the run's outcome.
    fn advance(
        &self,
        run: &mut Run,
        fences: &mut FenceCounter,
        gate: &mut dyn Admission,
        now: Timestamp,
        effects: &mut Effects,
    ) {
        loop {
            let mut progressed = false;
            for step in 0..run.steps.len() {
                if run.steps[step].state != StepState::Pending {
                    continue;
                }
                match readiness(run, step) {
                    Readiness::Blocked => {}
                    Readiness::Doomed => {
                        set_step_state(run, step, StepState::Skipped, effects);
                        progressed = true;
                    }
                    Readiness::Ready if run.header.cancel.is_some() => {
                        set_step_state(run, step, StepState::Cancelled, effects);
                        progressed = true;
                    }
                    Readiness::Ready if budget_exceeded(run) => {
                        set_step_state(run, step, StepState::Skipped, effects);
                        progressed = true;
                    }
                    Readiness::Ready => {
                        // A gate needs admission only for its run's concurrency group.
                        let is_gate = run.pipeline.steps[step].action.gate().is_some();
                        let group = &run.header.admission;
                        let free = is_gate && (group.group.is_none() || group.group_held);
                        if free || gate.admit(run, step, now) {
                            self.start(run, step, fences, now, effects);
                            progressed = true;
                        } else {
                            set_step_state(run, step, StepState::Queued { since: now }, effects);
                        }
                    }
                }
            }
            if !progressed {
                break;
            }
        }
        settle_run_state(run, now, effects);
        run.header.updated_at = now;
    }

    /// An admitted step starts: a gate opens, anything else gets its first attempt. The
    /// run now holds its concurrency group's slot.
    fn start(
        &self,
        run: &mut Run,
        step: usize,
        fences: &mut FenceCounter,
        now: Timestamp,
        effects: &mut Effects,
    ) {
        if run.header.admission.group.is_some() {
            run.header.admission.group_held = true;
        }
        if run.pipeline.steps[step].action.gate().is_some() {
            open_gate(run, step, now, effects);
        } else {
            self.mint_attempt(run, step, fences, now, effects);
        }
    }

    /// The scheduler admitted a queued step. A step no longer queued (cancelled, skipped
    /// since) is left as it is.
    fn on_admit(
        &self,
        run: &mut Run,
        step: usize,
        fences: &mut FenceCounter,
        now: Timestamp,
        effects: &mut Effects,
    ) {
        let StepState::Queued { since } = run.steps[step].state else {
            return;
        };
        if run.header.cancel.is_some() || budget_exceeded(run) || run.header.state.is_terminal() {
            return;
        }
        effects.events.push(Event::Admitted {
            step,
            waited_ms: now.0.saturating_sub(since.0),
        });
        self.start(run, step, fences, now, effects);
    }

    fn mint_attempt(
        &self,
        run: &mut Run,
        step: usize,
        fences: &mut FenceCounter,
        now: Timestamp,
        effects: &mut Effects,
    ) {
        let Ok(fence) = fences.mint() else {
            // Never reached in practice (see `limits::FENCE_MAX`); the step cannot get a
            // fence, so it never starts and the operator is told.
            set_step_state(
                run,
                step,
                StepState::DeadLettered {
                    reason: "FencesExhausted".into(),
                },
                effects,
            );
            return;
        };
        let spec = &run.pipeline.steps[step];
        let progress = &mut run.steps[step];
        let number = u32::try_from(progress.attempts.len() + 1).unwrap_or(u32::MAX);
        debug_assert!(
            progress.in_flight().is_none(),
            "attempts of one step never overlap"
        );
        progress.attempts.push(Attempt {
            number,
            fence,
            created_at: now,
            state: AttemptState::Launching,
            kill: None,
            outputs: Vec::new(),
        });
        let index = progress.attempts.len() - 1;
        effects.intents.push(Intent::Launch(LaunchOrder {
            run: run.header.id,
            step,
            step_name: spec.name.clone(),
            attempt: number,
            fence,
            action: with_resolved_env(run, &spec.action),
            timeout: spec.timeout.unwrap_or(self.settings.default_step_timeout),
        }));
        effects.attempt_changed(step, index);
        effects.events.push(Event::AttemptCreated {
            step,
            attempt: number,
            fence,
        });
        set_step_state(run, step, StepState::Active, effects);
    }
}

#[allow(clippy::too_many_arguments)]
fn on_undeliverable(
    run: &mut Run,
    step: usize,
    fence: super::Fence,
    launch: bool,
    reason: super::Undelivered,
    detail: String,
    now: Timestamp,
    effects: &mut Effects,
) {
    let Some((index, attempt)) = attempt_by_fence(run, step, fence) else {
        return;
    };
    if !attempt.is_in_flight() {
        return;
    }
    if let AttemptState::Running { backstop_due, .. } = attempt.state {
        effects.intents.push(Intent::CancelTimer {
            due: backstop_due,
            timer: Timer::Backstop { step, fence },
        });
    }
    // An undelivered launch never started anything; an undelivered kill leaves a process
    // that may still run, with no verdict to be had.
    let (class, started) = if launch {
        (super::FailureClass::InfraNeverStarted, false)
    } else {
        (super::FailureClass::Lost, true)
    };
    let verdict = Verdict {
        outcome: Outcome::Failed(class),
        started,
        reason: detail,
        exit_code: None,
        started_at: None,
        finished_at: now,
    };
    effects.events.push(Event::AttemptFinished {
        step,
        attempt: attempt.number,
        fence,
        class: Some(class),
        reason: verdict.reason.clone(),
    });
    attempt.state = AttemptState::Finished(verdict);
    effects.attempt_changed(step, index);
    let next = if run.header.cancel.is_some() {
        StepState::Cancelled
    } else {
        StepState::DeadLettered {
            reason: reason.reason().to_string(),
        }
    };
    set_step_state(run, step, next, effects);
}

/// Puts a dead-lettered launch back: the same attempt (same fence) is launching again,
/// steps skipped because of it may run, and the run is in progress again.
fn on_requeue(
    run: &mut Run,
    step: usize,
    fence: super::Fence,
    effects: &mut Effects,
) -> Result<(), super::RejectedInput> {
    let requeueable = run.steps.get(step).is_some_and(|progress| {
        let undelivered = matches!(&progress.state, StepState::DeadLettered { reason }
            if reason == super::Undelivered::ExecutorUnavailable.reason()
                || reason == super::Undelivered::OutboxPoison.reason());
        let last = progress.attempts.last().is_some_and(|a| a.fence == fence);
        undelivered && last && run.header.cancel.is_none()
    });
    if !requeueable {
        return Err(super::RejectedInput::NotRequeueable);
    }
    let index = run.steps[step].attempts.len() - 1;
    run.steps[step].attempts[index].state = AttemptState::Launching;
    effects.attempt_changed(step, index);
    set_step_state(run, step, StepState::Active, effects);
    // Steps skipped because of it are reconsidered; `advance` skips again whatever still
    // cannot run.
    for other in 0..run.steps.len() {
        if run.steps[other].state == StepState::Skipped {
            set_step_state(run, other, StepState::Pending, effects);
        }
    }
    if run.header.state.is_terminal() {
        set_run_state(run, RunState::Queued, effects);
    }
    Ok(())
}

fn with_resolved_env(
    run: &Run,
    action: &crate::pipeline::StepAction,
) -> crate::pipeline::StepAction {
    match action {
        crate::pipeline::StepAction::Local(command) => {
            let mut command = command.clone();
            command.env = resolve_env(run, &command.env);
            crate::pipeline::StepAction::Local(command)
        }
        crate::pipeline::StepAction::Kubernetes(pod) => {
            let mut pod = pod.clone();
            pod.env = resolve_env(run, &pod.env);
            crate::pipeline::StepAction::Kubernetes(pod)
        }
        crate::pipeline::StepAction::Gate(gate) => crate::pipeline::StepAction::Gate(gate.clone()),
    }
}

/// Scarab as a cooperating sink: outputs are stored only for the step's current attempt
/// while it is in flight; anything else is a zombie or a late writer.
fn on_outputs(
    run: &mut Run,
    step: usize,
    fence: super::Fence,
    outputs: Vec<(String, String)>,
    effects: &mut Effects,
) -> Result<(), super::RejectedInput> {
    let Some(progress) = run.steps.get_mut(step) else {
        return Err(super::RejectedInput::StaleFence { current: None });
    };
    let current = progress.attempts.last().map(|a| a.fence);
    let index = progress.attempts.len().saturating_sub(1);
    match progress.attempts.last_mut() {
        Some(attempt) if attempt.fence == fence && attempt.is_in_flight() => {
            // Bounded per attempt, not only per request: a write that would take the
            // attempt past the bound is refused whole, naming the first name that does
            // not fit (existing names may always be overwritten).
            let mut names = attempt.outputs.len();
            for (key, _) in &outputs {
                if !attempt.outputs.iter().any(|(k, _)| k == key) {
                    names += 1;
                    if names > crate::limits::OUTPUTS_PER_ATTEMPT_MAX {
                        return Err(super::RejectedInput::TooManyOutputs {
                            key: key.clone(),
                            limit: crate::limits::OUTPUTS_PER_ATTEMPT_MAX,
                        });
                    }
                }
            }
            for (key, value) in outputs {
                match attempt.outputs.iter_mut().find(|(k, _)| *k == key) {
                    Some(slot) => slot.1 = value,
                    None => attempt.outputs.push((key, value)),
                }
            }
            effects.attempt_changed(step, index);
            Ok(())
        }
        _ => Err(super::RejectedInput::StaleFence { current }),
    }
}

/// `${steps.NAME.outputs.KEY}` in an env value: the named (needed) step's output, empty
/// when it reported none.
pub fn resolve_env(run: &Run, env: &[(String, String)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(key, value)| (key.clone(), substitute_outputs(run, value)))
        .collect()
}

fn substitute_outputs(run: &Run, value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${steps.") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let reference = &after[..end];
        out.push_str(&lookup_output(run, reference).unwrap_or_default());
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

fn lookup_output(run: &Run, reference: &str) -> Option<String> {
    let mut parts = reference.splitn(4, '.');
    let (Some("steps"), Some(name), Some("outputs"), Some(key)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let index = run.pipeline.step_index(name)?;
    let attempt = run.steps[index].attempts.last()?;
    attempt
        .outputs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
}

fn on_cancel(
    run: &mut Run,
    by: String,
    reason: Option<String>,
    now: Timestamp,
    effects: &mut Effects,
) -> Result<(), super::RejectedInput> {
    if run.header.state.is_terminal() {
        return Err(super::RejectedInput::RunTerminal(run.header.state.as_str()));
    }
    if run.header.cancel.is_some() {
        return Ok(());
    }
    run.header.cancel = Some(CancelRequest {
        by: by.clone(),
        at: now,
        reason: reason.clone(),
    });
    effects.events.push(Event::CancelRequested { by, reason });
    for step in 0..run.steps.len() {
        match run.steps[step].state {
            StepState::Pending | StepState::Queued { .. } | StepState::RetryWaiting { .. } => {
                set_step_state(run, step, StepState::Cancelled, effects);
            }
            StepState::Active => request_kill(run, step, KillReason::Cancel, effects),
            StepState::Waiting => {
                cancel_gate_timers(run, step, effects);
                set_step_state(run, step, StepState::Cancelled, effects);
            }
            StepState::Succeeded
            | StepState::Failed { .. }
            | StepState::DeadLettered { .. }
            | StepState::Skipped
            | StepState::Cancelled => {}
        }
    }
    Ok(())
}

fn request_kill(run: &mut Run, step: usize, reason: KillReason, effects: &mut Effects) {
    let progress = &mut run.steps[step];
    let Some(index) = progress.attempts.iter().rposition(Attempt::is_in_flight) else {
        return;
    };
    let attempt = &mut progress.attempts[index];
    attempt.kill = Some(reason);
    let fence = attempt.fence;
    effects.attempt_changed(step, index);
    effects.events.push(Event::KillRequested {
        step,
        fence,
        reason,
    });
    effects.intents.push(Intent::Kill {
        step,
        fence,
        reason,
    });
}

pub(super) enum Readiness {
    Blocked,
    Ready,
    /// A step it needs ended without success: it can never run.
    Doomed,
}

pub(super) fn readiness(run: &Run, step: usize) -> Readiness {
    let mut ready = true;
    for &need in &run.pipeline.steps[step].needs {
        match run.steps[need].state {
            StepState::Succeeded => {}
            StepState::Failed { .. }
            | StepState::DeadLettered { .. }
            | StepState::Skipped
            | StepState::Cancelled => return Readiness::Doomed,
            StepState::Pending
            | StepState::Queued { .. }
            | StepState::Active
            | StepState::RetryWaiting { .. }
            | StepState::Waiting => ready = false,
        }
    }
    if ready {
        Readiness::Ready
    } else {
        Readiness::Blocked
    }
}

/// §6: dead-lettered if any step is, else failed if any is (or the budget ran out), else
/// cancelled if a cancel stopped anything, else succeeded.
fn run_outcome(run: &Run) -> RunState {
    let any = |pred: fn(&StepState) -> bool| run.steps.iter().any(|s| pred(&s.state));
    if any(|s| matches!(s, StepState::DeadLettered { .. })) {
        RunState::DeadLettered
    } else if any(|s| matches!(s, StepState::Failed { .. })) || budget_exceeded(run) {
        RunState::Failed
    } else if run.header.cancel.is_some()
        && any(|s| matches!(s, StepState::Cancelled | StepState::Skipped))
    {
        RunState::Cancelled
    } else {
        RunState::Succeeded
    }
}

fn attempt_by_fence(
    run: &mut Run,
    step: usize,
    fence: super::Fence,
) -> Option<(usize, &mut Attempt)> {
    let progress = run.steps.get_mut(step)?;
    progress
        .attempts
        .iter_mut()
        .enumerate()
        .rev()
        .find(|(_, a)| a.fence == fence)
}

fn set_step_state(run: &mut Run, step: usize, state: StepState, effects: &mut Effects) {
    if run.steps[step].state == state {
        return;
    }
    let reason = match &state {
        StepState::Failed { reason } | StepState::DeadLettered { reason } => Some(reason.clone()),
        _ => None,
    };
    effects.events.push(Event::StepState {
        step,
        state: state.as_str(),
        reason,
    });
    run.steps[step].state = state;
    effects.step_changed(step);
}

fn set_run_state(run: &mut Run, to: RunState, effects: &mut Effects) {
    set_header_state(&mut run.header, to, effects);
}

fn set_header_state(header: &mut RunHeader, to: RunState, effects: &mut Effects) {
    let from = header.state;
    if from == to {
        return;
    }
    header.state = to;
    effects.events.push(Event::RunState { from, to });
}

// --- Gates -------------------------------------------------------------------------------

/// A gate whose needs succeeded opens: it waits for a decision, and its timers (if any)
/// are scheduled.
fn open_gate(run: &mut Run, step: usize, now: Timestamp, effects: &mut Effects) {
    let spec = run.pipeline.steps[step]
        .action
        .gate()
        .cloned()
        .unwrap_or_default();
    let release_at = spec.auto_release.map(|wait| now.plus(wait));
    let expires_at = spec.expires.map(|wait| now.plus(wait));
    if let Some(due) = release_at {
        effects.intents.push(Intent::ScheduleTimer {
            due,
            timer: Timer::GateRelease { step },
        });
    }
    if let Some(due) = expires_at {
        effects.intents.push(Intent::ScheduleTimer {
            due,
            timer: Timer::GateExpiry { step },
        });
    }
    run.steps[step].gate = Some(GateProgress {
        opened_at: now,
        release_at,
        expires_at,
        decision: None,
    });
    effects.events.push(Event::GateOpened { step });
    set_step_state(run, step, StepState::Waiting, effects);
}

fn cancel_gate_timers(run: &Run, step: usize, effects: &mut Effects) {
    let Some(gate) = &run.steps[step].gate else {
        return;
    };
    if let Some(due) = gate.release_at {
        effects.intents.push(Intent::CancelTimer {
            due,
            timer: Timer::GateRelease { step },
        });
    }
    if let Some(due) = gate.expires_at {
        effects.intents.push(Intent::CancelTimer {
            due,
            timer: Timer::GateExpiry { step },
        });
    }
}

#[allow(clippy::too_many_arguments)]
fn on_decide(
    run: &mut Run,
    step: usize,
    approve: bool,
    by: String,
    caller: String,
    comment: Option<String>,
    now: Timestamp,
    effects: &mut Effects,
) -> Result<(), RejectedInput> {
    let Some(spec) = run.pipeline.steps.get(step) else {
        return Err(RejectedInput::NotAGate(format!("#{step}")));
    };
    if spec.action.gate().is_none() {
        return Err(RejectedInput::NotAGate(spec.name.clone()));
    }
    let progress = &run.steps[step];
    if progress.state != StepState::Waiting || run.header.state.is_terminal() {
        let state = match progress.gate.as_ref().and_then(|g| g.decision.as_ref()) {
            Some(decision) => format!("already {} by {}", decision.outcome.as_str(), decision.by),
            None => progress.state.as_str().to_string(),
        };
        return Err(RejectedInput::GateNotOpen {
            step: spec.name.clone(),
            state,
        });
    }
    let outcome = if approve {
        GateOutcome::Approved
    } else {
        GateOutcome::Rejected
    };
    let decision = GateDecision {
        outcome,
        by,
        caller,
        at: now,
        comment,
    };
    decide(run, step, decision, effects);
    Ok(())
}

/// A gate's own timer: approve (`auto_release`) or fail (`expires`) if it is still open.
/// A timer of a gate already decided changes nothing.
fn on_gate_timer(
    run: &mut Run,
    step: usize,
    outcome: GateOutcome,
    now: Timestamp,
    effects: &mut Effects,
) {
    if run.steps.get(step).map(|s| &s.state) != Some(&StepState::Waiting) {
        return;
    }
    let comment = match outcome {
        GateOutcome::AutoReleased => "auto_release came due",
        _ => "expired: nobody approved in time",
    };
    let decision = GateDecision {
        outcome,
        by: SYSTEM.to_string(),
        caller: SYSTEM.to_string(),
        at: now,
        comment: Some(comment.to_string()),
    };
    decide(run, step, decision, effects);
}

fn decide(run: &mut Run, step: usize, decision: GateDecision, effects: &mut Effects) {
    cancel_gate_timers(run, step, effects);
    let next = match decision.outcome {
        GateOutcome::Approved | GateOutcome::AutoReleased => StepState::Succeeded,
        GateOutcome::Rejected => StepState::Failed {
            reason: GATE_REJECTED.to_string(),
        },
        GateOutcome::Expired => StepState::Failed {
            reason: GATE_EXPIRED.to_string(),
        },
    };
    if let Some(gate) = run.steps[step].gate.as_mut() {
        gate.decision = Some(decision.clone());
    }
    effects.events.push(Event::GateDecided { step, decision });
    set_step_state(run, step, next, effects);
}

// --- The run's state and its budget -----------------------------------------------------

/// Decides the run's state from its steps: an outcome once every step is terminal,
/// `waiting` while only gates are left, and back to `running` when anything else is in
/// progress again. The budget clock pauses and resumes with `waiting`.
fn settle_run_state(run: &mut Run, now: Timestamp, effects: &mut Effects) {
    if run.header.state.is_terminal() {
        return;
    }
    if run.steps.iter().all(|s| s.state.is_terminal()) {
        let outcome = run_outcome(run);
        pause_budget(run, now, effects);
        // Every end gives the run's concurrency group slot back.
        run.header.admission.group_held = false;
        if outcome == RunState::DeadLettered {
            let retry = &mut run.header.auto_retry;
            retry.eligible_at = Some(retry.next_at.map_or(now, |at| at.max(now)));
        }
        set_run_state(run, outcome, effects);
        return;
    }
    let busy = run.steps.iter().any(|s| {
        matches!(
            s.state,
            StepState::Active | StepState::Queued { .. } | StepState::RetryWaiting { .. }
        )
    });
    let gated = run.steps.iter().any(|s| s.state == StepState::Waiting);
    if !busy && gated {
        pause_budget(run, now, effects);
        set_run_state(run, RunState::Waiting, effects);
    } else if busy && run.header.state == RunState::Waiting {
        resume_budget(run, now, effects);
        set_run_state(run, RunState::Running, effects);
    }
}

fn budget_exceeded(run: &Run) -> bool {
    run.header
        .budget
        .as_ref()
        .is_some_and(|b| b.exceeded_at.is_some())
}

fn budget_failure() -> StepState {
    StepState::Failed {
        reason: BUDGET_EXCEEDED.to_string(),
    }
}

fn pause_budget(run: &mut Run, now: Timestamp, effects: &mut Effects) {
    let Some(clock) = run.header.budget.as_mut() else {
        return;
    };
    clock.used_ms = clock.used_at(now);
    clock.active_since = None;
    if let Some(due) = clock.due.take() {
        effects.intents.push(Intent::CancelTimer {
            due,
            timer: Timer::Budget,
        });
    }
}

fn resume_budget(run: &mut Run, now: Timestamp, effects: &mut Effects) {
    let Some(clock) = run.header.budget.as_mut() else {
        return;
    };
    if clock.active_since.is_some() || clock.exceeded_at.is_some() {
        return;
    }
    clock.active_since = Some(now);
    let due = now.plus(clock.remaining_at(now));
    clock.due = Some(due);
    effects.intents.push(Intent::ScheduleTimer {
        due,
        timer: Timer::Budget,
    });
}

/// The budget timer: if the run has used up its active time, everything in progress is
/// stopped and nothing new starts; the run fails with category `budget`. A timer that
/// finds the clock paused (or time left) is stale and changes nothing but its own slot.
fn on_budget(run: &mut Run, now: Timestamp, effects: &mut Effects) {
    let Some(clock) = run.header.budget.as_mut() else {
        return;
    };
    if clock.exceeded_at.is_some() || clock.active_since.is_none() || run.header.state.is_terminal()
    {
        return;
    }
    let used = clock.used_at(now);
    if used < clock.limit_ms {
        let due = now.plus(clock.remaining_at(now));
        clock.due = Some(due);
        effects.intents.push(Intent::ScheduleTimer {
            due,
            timer: Timer::Budget,
        });
        return;
    }
    clock.used_ms = used;
    clock.active_since = None;
    clock.due = None;
    clock.exceeded_at = Some(now);
    let limit_ms = clock.limit_ms;
    effects.events.push(Event::BudgetExceeded {
        used_ms: used,
        limit_ms,
    });
    for step in 0..run.steps.len() {
        match run.steps[step].state.clone() {
            StepState::Active => request_kill(run, step, KillReason::Budget, effects),
            StepState::RetryWaiting { due } => {
                effects.intents.push(Intent::CancelTimer {
                    due,
                    timer: Timer::RetryDue { step },
                });
                set_step_state(run, step, budget_failure(), effects);
            }
            StepState::Waiting => {
                cancel_gate_timers(run, step, effects);
                set_step_state(run, step, StepState::Skipped, effects);
            }
            StepState::Pending | StepState::Queued { .. } => {
                set_step_state(run, step, StepState::Skipped, effects)
            }
            StepState::Succeeded
            | StepState::Failed { .. }
            | StepState::DeadLettered { .. }
            | StepState::Skipped
            | StepState::Cancelled => {}
        }
    }
}

// --- Re-run: an operator's retry ----------------------------------------------------------

/// The steps a retry starts over, in pipeline order: those that did not succeed and,
/// with `from`, that step and every step that needs it, directly or not. Empty for a
/// succeeded run without `from`.
pub fn retry_plan(run: &Run, from: Option<usize>) -> Vec<usize> {
    let steps = &run.pipeline.steps;
    let mut again: Vec<bool> = run
        .steps
        .iter()
        .map(|s| s.state != StepState::Succeeded)
        .collect();
    if let Some(from) = from.filter(|&f| f < steps.len()) {
        let mut downstream = vec![false; steps.len()];
        downstream[from] = true;
        // `needs` may point either way in the file: repeat until nothing changes (at most
        // one pass per step, as the graph has no cycles).
        let mut changed = true;
        while changed {
            changed = false;
            for (index, step) in steps.iter().enumerate() {
                if !downstream[index] && step.needs.iter().any(|&n| downstream[n]) {
                    downstream[index] = true;
                    changed = true;
                }
            }
        }
        for (index, is_downstream) in downstream.into_iter().enumerate() {
            again[index] |= is_downstream;
        }
    }
    (0..again.len()).filter(|&i| again[i]).collect()
}

/// A fresh try of the steps `retry_plan` names: their earlier attempts stay (before
/// `try_start`), a gate opens again, the run is queued again with any cancel request
/// and quarantine cleared and, if its budget ran out, a fresh budget; `advance` mints
/// the new attempts with new fences in this same transaction.
fn on_retry(
    run: &mut Run,
    by: String,
    from: Option<usize>,
    now: Timestamp,
    effects: &mut Effects,
) -> Result<(), RejectedInput> {
    let state = run.header.state;
    if !state.is_terminal() {
        return Err(RejectedInput::NothingToRetry(format!(
            "run is {}: only a finished run can be retried (cancel it first)",
            state.as_str()
        )));
    }
    if let Some(from) = from
        && from >= run.steps.len()
    {
        return Err(RejectedInput::NoSuchStep(from));
    }
    let steps = retry_plan(run, from);
    if steps.is_empty() {
        return Err(RejectedInput::NothingToRetry(format!(
            "run {}: every step succeeded; name a step to re-run it and what follows it",
            state.as_str()
        )));
    }
    for &step in &steps {
        let progress = &mut run.steps[step];
        progress.try_start = progress.attempts.len();
        progress.gate = None;
        set_step_state(run, step, StepState::Pending, effects);
    }
    run.header.cancel = None;
    run.header.auto_retry.quarantined = None;
    if let Some(clock) = run.header.budget.as_mut()
        && clock.exceeded_at.is_some()
    {
        *clock = BudgetClock {
            active_since: None,
            due: None,
            ..BudgetClock::new(Duration::from_millis(clock.limit_ms), now)
        };
    }
    effects.events.push(Event::Retried { by, from, steps });
    set_run_state(run, RunState::Queued, effects);
    resume_budget(run, now, effects);
    Ok(())
}

// --- Auto-retry: resubmit, quarantine, discard -------------------------------------------

/// A fresh try: every dead-lettered or skipped step starts over (its earlier
/// attempts stay, before `try_start`), the run is queued again, and `advance` mints the
/// new attempts with new fences in this same transaction.
fn on_resubmit(
    run: &mut Run,
    by: String,
    next_at: Timestamp,
    now: Timestamp,
    effects: &mut Effects,
) -> Result<(), RejectedInput> {
    let state = run.header.state;
    if !matches!(state, RunState::DeadLettered | RunState::Quarantined) {
        return Err(RejectedInput::WrongState(
            state.as_str(),
            "dead_lettered or quarantined",
        ));
    }
    let retry = &mut run.header.auto_retry;
    retry.attempts = retry.attempts.saturating_add(1);
    retry.next_at = Some(next_at);
    retry.quarantined = None;
    let attempt = retry.attempts;
    for step in 0..run.steps.len() {
        if matches!(
            run.steps[step].state,
            StepState::DeadLettered { .. } | StepState::Skipped
        ) {
            run.steps[step].try_start = run.steps[step].attempts.len();
            set_step_state(run, step, StepState::Pending, effects);
        }
    }
    effects.events.push(Event::AutoRetryScheduled {
        attempt,
        by,
        next_at,
    });
    set_run_state(run, RunState::Queued, effects);
    resume_budget(run, now, effects);
    Ok(())
}

fn on_quarantine(
    header: &mut RunHeader,
    reason: String,
    effects: &mut Effects,
) -> Result<(), RejectedInput> {
    if header.state != RunState::DeadLettered {
        return Err(RejectedInput::WrongState(
            header.state.as_str(),
            "dead_lettered",
        ));
    }
    header.auto_retry.quarantined = Some(reason.clone());
    effects.events.push(Event::AutoRetryQuarantined { reason });
    set_header_state(header, RunState::Quarantined, effects);
    Ok(())
}

fn on_discard(
    header: &mut RunHeader,
    by: String,
    reason: String,
    effects: &mut Effects,
) -> Result<(), RejectedInput> {
    if header.state != RunState::Quarantined {
        return Err(RejectedInput::WrongState(
            header.state.as_str(),
            "quarantined",
        ));
    }
    let retry = &mut header.auto_retry;
    retry.discarded = Some(format!("discarded by {by}: {reason}"));
    retry.eligible_at = None;
    effects
        .events
        .push(Event::QuarantineDiscarded { by, reason });
    set_header_state(header, RunState::DeadLettered, effects);
    Ok(())
}

//! `failure_classification`: the one place that explains why a run did not succeed.
//!
//! Computed from the stored attempts, so every surface (API list and detail, CLI,
//! history) shows the same answer.

use super::Undelivered;
use super::machine::{BUDGET_EXCEEDED, GATE_EXPIRED, GATE_REJECTED};
use super::state::{Run, RunState, StepState};
use super::verdict::FailureClass;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureClassification {
    /// One of the six failure classes, or `cancelled`.
    pub category: &'static str,
    /// Only a never-started failure of a locally submitted run may be resubmitted.
    pub auto_retryable: bool,
    pub step: Option<String>,
    pub reason: String,
}

/// The origin of runs submitted through Scarab's own CLI and API without naming one.
pub const LOCAL_ORIGIN: &str = "local";
/// The origin of runs a schedule started is this followed by the schedule's name.
pub const SCHEDULE_ORIGIN_PREFIX: &str = "schedule:";

/// Whether Scarab itself started runs of this origin (its CLI and API, or a schedule),
/// so nobody outside retries them: only such runs are auto-retried.
pub fn is_own_origin(origin: &str) -> bool {
    origin == LOCAL_ORIGIN || origin.starts_with(SCHEDULE_ORIGIN_PREFIX)
}

/// `None` while the run is in progress or succeeded.
pub fn classify_run(run: &Run) -> Option<FailureClassification> {
    match run.header.state {
        RunState::Queued | RunState::Running | RunState::Waiting | RunState::Succeeded => None,
        RunState::Cancelled => Some(FailureClassification {
            category: "cancelled",
            auto_retryable: false,
            step: None,
            reason: match &run.header.cancel {
                Some(cancel) => format!("cancelled by {}", cancel.by),
                None => "cancelled".to_string(),
            },
        }),
        RunState::Failed | RunState::DeadLettered | RunState::Quarantined => first_failure(run),
    }
}

/// The failed step that decided the run's state: a dead-lettered one first (it decides a
/// `dead_lettered` run), else the first failed one in pipeline order; a gate's refusal is
/// `gate` and a run stopped by its budget is `budget`, whatever the attempts say.
fn first_failure(run: &Run) -> Option<FailureClassification> {
    let decided = run.steps.iter().position(|s| match &s.state {
        StepState::Failed { reason } => {
            reason == GATE_REJECTED || reason == GATE_EXPIRED || reason == BUDGET_EXCEEDED
        }
        _ => false,
    });
    let dead_first = run
        .steps
        .iter()
        .position(|s| matches!(s.state, StepState::DeadLettered { .. }));
    let first_failed = run
        .steps
        .iter()
        .position(|s| matches!(s.state, StepState::Failed { .. }));
    if dead_first.is_none() && decided.is_some() && decided == first_failed {
        return decided.and_then(|step| decided_failure(run, step));
    }
    if dead_first.is_none()
        && first_failed.is_none()
        && let Some(clock) = &run.header.budget
        && clock.exceeded_at.is_some()
    {
        return Some(budget_failure(None, clock.used_ms, clock.limit_ms));
    }
    attempt_failure(run)
}

/// A failure the engine decided itself: a gate's refusal or the budget.
fn decided_failure(run: &Run, step: usize) -> Option<FailureClassification> {
    let name = run.pipeline.steps[step].name.clone();
    let progress = &run.steps[step];
    let StepState::Failed { reason } = &progress.state else {
        return None;
    };
    if reason == BUDGET_EXCEEDED {
        let (used, limit) = run
            .header
            .budget
            .as_ref()
            .map_or((0, 0), |c| (c.used_ms, c.limit_ms));
        return Some(budget_failure(Some(name), used, limit));
    }
    let decision = progress.gate.as_ref().and_then(|g| g.decision.as_ref());
    let reason = match decision {
        Some(d) if reason == GATE_REJECTED => match &d.comment {
            Some(comment) => format!("{reason}: rejected by {} ({comment})", d.by),
            None => format!("{reason}: rejected by {}", d.by),
        },
        _ => format!("{reason}: nobody approved before the gate expired"),
    };
    Some(FailureClassification {
        category: "gate",
        auto_retryable: false,
        step: Some(name),
        reason,
    })
}

fn budget_failure(step: Option<String>, used_ms: u64, limit_ms: u64) -> FailureClassification {
    let format = |ms: u64| humantime::format_duration(std::time::Duration::from_millis(ms));
    FailureClassification {
        category: "budget",
        auto_retryable: false,
        step,
        reason: format!(
            "{BUDGET_EXCEEDED}: active time {} exceeded the budget of {}",
            format(used_ms / 1000 * 1000),
            format(limit_ms)
        ),
    }
}

/// A failure the attempts decided: their class, or the outbox's category.
fn attempt_failure(run: &Run) -> Option<FailureClassification> {
    let dead = run
        .steps
        .iter()
        .position(|s| matches!(s.state, StepState::DeadLettered { .. }));
    let failed = || {
        run.steps
            .iter()
            .position(|s| matches!(s.state, StepState::Failed { .. }))
    };
    let step = dead.or_else(failed)?;
    let attempt = run.steps[step].attempts.last()?;
    let verdict = attempt.verdict()?;
    let class = verdict.class()?;
    // A delivery the outbox gave up on is its own category, whatever the attempt's class.
    let undelivered = match &run.steps[step].state {
        StepState::DeadLettered { reason }
            if reason == Undelivered::ExecutorUnavailable.reason() =>
        {
            Some("executor_unavailable")
        }
        StepState::DeadLettered { reason } if reason == Undelivered::OutboxPoison.reason() => {
            Some("outbox_poison")
        }
        _ => None,
    };
    Some(FailureClassification {
        category: undelivered.unwrap_or(class.as_str()),
        auto_retryable: undelivered.is_none()
            && class == FailureClass::InfraNeverStarted
            && is_own_origin(&run.header.origin)
            && run.header.cancel.is_none()
            && only_never_started(run),
        step: Some(run.pipeline.steps[step].name.clone()),
        reason: verdict.reason.clone(),
    })
}

/// Every step that did not succeed either never started (dead-lettered
/// `infra_never_started`, not an undelivered message) or was skipped because of one: a
/// fresh try would re-run exactly those. A failed step (a code verdict) rules it out.
fn only_never_started(run: &Run) -> bool {
    run.steps.iter().all(|progress| match &progress.state {
        StepState::DeadLettered { reason } => {
            reason != Undelivered::ExecutorUnavailable.reason()
                && reason != Undelivered::OutboxPoison.reason()
                && progress.attempts.last().and_then(|a| a.class())
                    == Some(FailureClass::InfraNeverStarted)
        }
        StepState::Failed { .. } | StepState::Cancelled => false,
        _ => true,
    })
}

//! `failure_classification`: the one place that explains why a run did not succeed.
//!
//! Computed from the stored attempts, so every surface (API list and detail, CLI,
//! history) shows the same answer.

use super::Undelivered;
use super::class::FailureClass;
use super::state::{Run, RunState, StepState};

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
/// `dead_lettered` run), else the first failed one in pipeline order.
fn first_failure(run: &Run) -> Option<FailureClassification> {
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
            && run.header.origin == LOCAL_ORIGIN,
        step: Some(run.pipeline.steps[step].name.clone()),
        reason: verdict.reason.clone(),
    })
}

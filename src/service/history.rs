//! Engine events rendered as history records (kind + JSON detail), with step names.

use serde_json::json;

use crate::clock;
use crate::engine::{Event, Run, RunHeader, Timestamp};
use crate::store::records::HistoryRecord;

/// The history record of an event of `run`.
pub fn record(run: &Run, event: &Event, at: Timestamp) -> HistoryRecord {
    render(&run.header, Some(run), event, at)
}

/// The history record of an event of a run known only by its header (its pipeline no
/// longer restores): step names and the failure classification are not known.
pub fn header_record(header: &RunHeader, event: &Event, at: Timestamp) -> HistoryRecord {
    render(header, None, event, at)
}

fn render(header: &RunHeader, run: Option<&Run>, event: &Event, at: Timestamp) -> HistoryRecord {
    let name = |step: &usize| {
        run.and_then(|run| run.pipeline.steps.get(*step))
            .map(|s| s.name.clone())
            .unwrap_or_default()
    };
    let (kind, detail) = match event {
        Event::Submitted { steps } => (
            "submitted",
            json!({"pipeline": header.pipeline_name, "steps": steps, "origin": header.origin}),
        ),
        Event::RunState { from, to } => {
            // Why a run did not succeed, as every other surface shows it.
            let classification = run.and_then(crate::engine::classify_run).map(|c| {
                json!({"category": c.category, "auto_retryable": c.auto_retryable,
                       "step": c.step, "reason": c.reason})
            });
            (
                "run_state",
                json!({"from": from.as_str(), "to": to.as_str(),
                       "failure_classification": classification}),
            )
        }
        Event::AttemptCreated {
            step,
            attempt,
            fence,
        } => (
            "attempt_created",
            json!({"step": name(step), "attempt": attempt, "fence": fence.0}),
        ),
        Event::AttemptLaunched {
            step,
            attempt,
            fence,
        } => (
            "attempt_launched",
            json!({"step": name(step), "attempt": attempt, "fence": fence.0}),
        ),
        Event::AttemptFinished {
            step,
            attempt,
            fence,
            class,
            reason,
        } => (
            "attempt_finished",
            json!({"step": name(step), "attempt": attempt, "fence": fence.0,
                   "class": class.map(|c| c.as_str()), "reason": reason}),
        ),
        Event::RetryScheduled { step, due } => (
            "retry_scheduled",
            json!({"step": name(step), "due": clock::rfc3339(*due)}),
        ),
        Event::StepState {
            step,
            state,
            reason,
        } => (
            "step_state",
            json!({"step": name(step), "state": state, "reason": reason}),
        ),
        Event::KillRequested {
            step,
            fence,
            reason,
        } => (
            "kill_requested",
            json!({"step": name(step), "fence": fence.0, "reason": reason.as_str()}),
        ),
        Event::CancelRequested { by, reason } => {
            ("cancel_requested", json!({"by": by, "reason": reason}))
        }
        Event::Admitted { step, waited_ms } => (
            "admitted",
            json!({"step": name(step), "waited_ms": waited_ms}),
        ),
        Event::GateOpened { step } => {
            let gate = run
                .and_then(|run| run.steps.get(*step))
                .and_then(|s| s.gate.as_ref());
            let message = run
                .and_then(|run| run.pipeline.steps.get(*step))
                .and_then(|s| s.action.gate())
                .and_then(|g| g.message.clone());
            (
                "gate_opened",
                json!({"step": name(step), "message": message,
                       "auto_release_at": gate.and_then(|g| g.release_at).map(clock::rfc3339),
                       "expires_at": gate.and_then(|g| g.expires_at).map(clock::rfc3339)}),
            )
        }
        Event::GateDecided { step, decision } => (
            "gate_decided",
            json!({"step": name(step), "decision": decision.outcome.as_str(), "by": decision.by,
                   "caller": decision.caller, "comment": decision.comment}),
        ),
        Event::AutoRetryScheduled {
            attempt,
            by,
            next_at,
        } => (
            "auto_retry_scheduled",
            json!({"attempt": attempt, "by": by, "next_eligible_at": clock::rfc3339(*next_at)}),
        ),
        Event::Retried { by, from, steps } => (
            "retried",
            json!({"by": by, "from": from.map(|s| name(&s)),
                   "steps": steps.iter().map(name).collect::<Vec<_>>()}),
        ),
        Event::AutoRetryQuarantined { reason } => {
            ("auto_retry_quarantined", json!({"reason": reason}))
        }
        Event::QuarantineDiscarded { by, reason } => {
            ("quarantine_discarded", json!({"by": by, "reason": reason}))
        }
        Event::BudgetExceeded { used_ms, limit_ms } => (
            "budget_exceeded",
            json!({"used_ms": used_ms, "limit_ms": limit_ms}),
        ),
    };
    HistoryRecord {
        at,
        kind: kind.to_string(),
        detail: detail.to_string(),
    }
}

//! The forward-progress rule (docs/pipeline.md, gates and budgets): every non-terminal run must be waiting on
//! a timer, an executor or a gate. Anything else is a bug in the engine, and this module
//! is how tests and `/readyz` find one.

use super::machine::{Readiness, readiness};
use super::state::{AttemptState, Run, RunState, StepState};
use super::{Fence, RunId, Timer, Timestamp};

/// One thing a run is waiting on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A durable timer that must exist in the store.
    Timer { due: Timestamp, timer: Timer },
    /// An attempt whose launch must be in the outbox (the executor has not confirmed it).
    Launch { step: usize, fence: Fence },
    /// An open gate: a person (or its timers) decides.
    Gate { step: usize },
    /// A queued step: admission control starts it when its slot is free.
    Admission { step: usize },
}

/// A run that waits on nothing: it would never move again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stuck {
    pub run: RunId,
    pub problem: String,
}

/// What a run is waiting on, or why it is stuck. A terminal run waits on nothing and is
/// never stuck.
pub fn waits(run: &Run) -> Result<Vec<Wait>, Stuck> {
    let stuck = |problem: String| Stuck {
        run: run.id(),
        problem,
    };
    if run.header.state.is_terminal() {
        return Ok(Vec::new());
    }
    let name = |step: usize| run.pipeline.steps[step].name.as_str();
    let mut found = Vec::new();
    for (step, progress) in run.steps.iter().enumerate() {
        let in_flight = progress.in_flight();
        match &progress.state {
            StepState::Pending => match readiness(run, step) {
                Readiness::Blocked => {}
                Readiness::Ready => {
                    return Err(stuck(format!(
                        "step {} is pending with every need met but was not started",
                        name(step)
                    )));
                }
                Readiness::Doomed => {
                    return Err(stuck(format!(
                        "step {} can never run but was not skipped",
                        name(step)
                    )));
                }
            },
            StepState::Active => match in_flight.map(|a| (&a.state, a.fence)) {
                Some((AttemptState::Launching, fence)) => found.push(Wait::Launch { step, fence }),
                Some((AttemptState::Running { backstop_due, .. }, fence)) => {
                    found.push(Wait::Timer {
                        due: *backstop_due,
                        timer: Timer::Backstop { step, fence },
                    })
                }
                Some((AttemptState::Finished(_), _)) | None => {
                    return Err(stuck(format!(
                        "step {} is active without an attempt in flight",
                        name(step)
                    )));
                }
            },
            StepState::Queued { .. } => found.push(Wait::Admission { step }),
            StepState::RetryWaiting { due } => found.push(Wait::Timer {
                due: *due,
                timer: Timer::RetryDue { step },
            }),
            StepState::Waiting => {
                let Some(gate) = &progress.gate else {
                    return Err(stuck(format!(
                        "gate {} is waiting without a gate record",
                        name(step)
                    )));
                };
                found.push(Wait::Gate { step });
                if let Some(due) = gate.release_at {
                    found.push(Wait::Timer {
                        due,
                        timer: Timer::GateRelease { step },
                    });
                }
                if let Some(due) = gate.expires_at {
                    found.push(Wait::Timer {
                        due,
                        timer: Timer::GateExpiry { step },
                    });
                }
            }
            StepState::Succeeded
            | StepState::Failed { .. }
            | StepState::DeadLettered { .. }
            | StepState::Skipped
            | StepState::Cancelled => {
                if in_flight.is_some() {
                    return Err(stuck(format!(
                        "step {} is {} with an attempt still in flight",
                        name(step),
                        progress.state.as_str()
                    )));
                }
            }
        }
    }
    let busy = run.steps.iter().any(|s| {
        matches!(
            s.state,
            StepState::Active | StepState::Queued { .. } | StepState::RetryWaiting { .. }
        )
    });
    let gated = run.steps.iter().any(|s| s.state == StepState::Waiting);
    if !busy && !gated {
        return Err(stuck(format!(
            "run is {} but no step is in progress or waiting on a gate",
            run.header.state.as_str()
        )));
    }
    let waiting = run.header.state == RunState::Waiting;
    if waiting == busy {
        return Err(stuck(format!(
            "run is {} but {}",
            run.header.state.as_str(),
            if busy {
                "steps are in progress"
            } else {
                "only gates are left"
            }
        )));
    }
    if let Some(clock) = &run.header.budget
        && clock.exceeded_at.is_none()
    {
        match (clock.active_since, clock.due) {
            (Some(_), Some(due)) if !waiting => found.push(Wait::Timer {
                due,
                timer: Timer::Budget,
            }),
            (None, None) if waiting => {}
            _ => {
                return Err(stuck(format!(
                    "budget clock inconsistent with a {} run",
                    run.header.state.as_str()
                )));
            }
        }
    }
    Ok(found)
}

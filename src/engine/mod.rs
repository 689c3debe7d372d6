//! The pure engine (sans-IO): given a run's state, an input and `now`, it decides.
//!
//! It never reads a clock, spawns a task, touches a file or a socket. Inputs are one
//! closed enum; outputs ([`Effects`]) name what changed and what must happen next
//! (intents), and the driver commits both in one transaction before acting.

pub mod admission;
#[cfg(test)]
mod admission_tests;
pub mod auto_retry;
#[cfg(test)]
mod gate_tests;
pub mod ids;
mod machine;
pub mod retry;
pub mod run_failure;
pub mod schedule;
#[cfg(test)]
mod simulation;
pub mod state;
#[cfg(test)]
mod tests;
pub mod verdict;
pub mod waits;

use std::time::Duration;

pub use admission::{Admission, Unlimited};
pub use auto_retry::{AutoRetrySettings, Eligibility, SkipReason, eligibility};
pub use ids::{Fence, FenceCounter, RunId, Timestamp};
pub use machine::{
    BUDGET_EXCEEDED, Engine, GATE_EXPIRED, GATE_REJECTED, RejectedInput, SYSTEM, retry_plan,
};
pub use run_failure::{FailureClassification, classify_run};
pub use state::{
    Attempt, AttemptState, AutoRetryState, BudgetClock, CancelRequest, GateDecision, GateOutcome,
    GateProgress, KillReason, Run, RunAdmission, RunHeader, RunState, RunStep, StepState,
};
pub use verdict::{FailureClass, Outcome, Verdict};
pub use waits::{Stuck, Wait, waits};

use crate::pipeline::StepAction;

/// Settings the engine decides with (the global part of retries, timeouts and retention).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSettings {
    /// Step timeout when the step names none.
    pub default_step_timeout: Duration,
    /// Never-started retries every step gets, whatever its own policy.
    pub infra_retries: u32,
    /// How long past a step's timeout the engine backstop waits for the executor.
    pub backstop_slack: Duration,
    /// Seeds retry jitter, so a simulation is reproducible.
    pub jitter_seed: u64,
    /// How long a finished run's traces (attempt directories, step logs, Pods) are kept:
    /// every arrival in a terminal state schedules a `Retention` timer this far ahead.
    pub log_retention: Duration,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            default_step_timeout: Duration::from_secs(3600),
            infra_retries: 3,
            backstop_slack: crate::limits::BACKSTOP_SLACK,
            jitter_seed: 0x5CA2_AB00,
            log_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// Everything that can happen to a run. Closed: the engine matches it exhaustively.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// The executor has the attempt (the Pod exists, the supervisor runs).
    LaunchConfirmed {
        step: usize,
        fence: Fence,
    },
    /// The executor's final word on an attempt.
    Verdict {
        step: usize,
        fence: Fence,
        verdict: Verdict,
    },
    TimerFired(Timer),
    Cancel {
        by: String,
        /// Why, when the system cancels (`superseded`).
        reason: Option<String>,
    },
    /// Admission control admitted a queued step: it starts now.
    Admit {
        step: usize,
    },
    /// The outbox gave up delivering this attempt's launch (or kill): no verdict can come.
    Undeliverable {
        step: usize,
        fence: Fence,
        launch: bool,
        reason: Undelivered,
        detail: String,
    },
    /// An operator put a dead-lettered launch back: the same attempt is launched again.
    Requeue {
        step: usize,
        fence: Fence,
    },
    /// The attempt with this fence reports outputs; only the step's current attempt may.
    SetOutputs {
        step: usize,
        fence: Fence,
        outputs: Vec<(String, String)>,
    },
    /// Resubmit a dead-lettered (or, by an operator, a quarantined) run: its failed and
    /// skipped steps start a fresh try with new attempts and fences. `next_at` is when it
    /// may be auto-retried again should it dead-letter again.
    Resubmit {
        by: String,
        next_at: Timestamp,
    },
    /// An operator re-runs a finished run: its steps that did not succeed, and with
    /// `from` that step and every step downstream of it, start a fresh try with new
    /// attempts and fences; succeeded steps keep their attempts and outputs.
    Retry {
        by: String,
        from: Option<usize>,
    },
    /// Set a dead-lettered run aside: the sweep will not touch it again.
    Quarantine {
        reason: String,
    },
    /// An operator gives up on a quarantined run: it goes back to `dead_lettered`, never to
    /// be auto-retried.
    Discard {
        by: String,
        reason: String,
    },
    /// A person approves or rejects an open gate.
    Decide {
        step: usize,
        approve: bool,
        /// The name the person gave (or the caller's identity when they gave none).
        by: String,
        /// The authenticated caller.
        caller: String,
        comment: Option<String>,
    },
}

impl Input {
    /// The step the input is about, for those about one.
    pub fn step(&self) -> Option<usize> {
        match self {
            Input::LaunchConfirmed { step, .. }
            | Input::Verdict { step, .. }
            | Input::Undeliverable { step, .. }
            | Input::Requeue { step, .. }
            | Input::SetOutputs { step, .. }
            | Input::Admit { step }
            | Input::Decide { step, .. } => Some(*step),
            Input::TimerFired(timer) => timer.step(),
            Input::Cancel { .. }
            | Input::Resubmit { .. }
            | Input::Retry { .. }
            | Input::Quarantine { .. }
            | Input::Discard { .. } => None,
        }
    }
}

/// Why the outbox gave up (the step's terminal reason and the run's category).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undelivered {
    ExecutorUnavailable,
    OutboxPoison,
}

impl Undelivered {
    /// The step's terminal reason.
    pub fn reason(self) -> &'static str {
        match self {
            Undelivered::ExecutorUnavailable => "ExecutorUnavailable",
            Undelivered::OutboxPoison => "OutboxPoison",
        }
    }
}

/// A durable timer's meaning. Its identity (for deletion) is `(due, run, timer)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timer {
    /// A step's backoff has elapsed: mint its next attempt.
    RetryDue { step: usize },
    /// The engine backstop for an attempt's timeout.
    Backstop { step: usize, fence: Fence },
    /// A gate's `auto_release` came due.
    GateRelease { step: usize },
    /// A gate's `expires` came due.
    GateExpiry { step: usize },
    /// The run's active-time budget runs out now unless it was paused.
    Budget,
    /// A finished run's retention is over: its traces may be removed (the driver asks
    /// the executors; the run itself does not change).
    Retention,
}

impl Timer {
    pub fn step(&self) -> Option<usize> {
        match self {
            Timer::RetryDue { step }
            | Timer::Backstop { step, .. }
            | Timer::GateRelease { step }
            | Timer::GateExpiry { step } => Some(*step),
            Timer::Budget | Timer::Retention => None,
        }
    }
}

/// What a launch needs: everything the executor must know, fixed at minting time.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchOrder {
    pub run: RunId,
    pub step: usize,
    pub step_name: String,
    pub attempt: u32,
    pub fence: Fence,
    pub action: StepAction,
    pub timeout: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Intent {
    Launch(LaunchOrder),
    Kill {
        step: usize,
        fence: Fence,
        reason: KillReason,
    },
    ScheduleTimer {
        due: Timestamp,
        timer: Timer,
    },
    CancelTimer {
        due: Timestamp,
        timer: Timer,
    },
}

/// A fact for the run's append-only history.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Submitted {
        steps: usize,
    },
    RunState {
        from: RunState,
        to: RunState,
    },
    AttemptCreated {
        step: usize,
        attempt: u32,
        fence: Fence,
    },
    AttemptLaunched {
        step: usize,
        attempt: u32,
        fence: Fence,
    },
    AttemptFinished {
        step: usize,
        attempt: u32,
        fence: Fence,
        class: Option<FailureClass>,
        reason: String,
    },
    RetryScheduled {
        step: usize,
        due: Timestamp,
    },
    StepState {
        step: usize,
        state: &'static str,
        reason: Option<String>,
    },
    KillRequested {
        step: usize,
        fence: Fence,
        reason: KillReason,
    },
    CancelRequested {
        by: String,
        reason: Option<String>,
    },
    /// Admission control let a queued step start after `waited_ms` in the queue.
    Admitted {
        step: usize,
        waited_ms: u64,
    },
    GateOpened {
        step: usize,
    },
    GateDecided {
        step: usize,
        decision: GateDecision,
    },
    BudgetExceeded {
        used_ms: u64,
        limit_ms: u64,
    },
    AutoRetryScheduled {
        attempt: u32,
        by: String,
        next_at: Timestamp,
    },
    AutoRetryQuarantined {
        reason: String,
    },
    /// An operator's re-run: these steps start a fresh try.
    Retried {
        by: String,
        from: Option<usize>,
        steps: Vec<usize>,
    },
    QuarantineDiscarded {
        by: String,
        reason: String,
    },
}

/// The outcome of one input: what changed (for the driver to write) and what to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Effects {
    /// Steps whose `StepState` changed.
    pub steps_changed: Vec<usize>,
    /// Attempts (step, index in that step's list) that were created or changed.
    pub attempts_changed: Vec<(usize, usize)>,
    pub intents: Vec<Intent>,
    pub events: Vec<Event>,
}

impl Effects {
    fn step_changed(&mut self, step: usize) {
        if !self.steps_changed.contains(&step) {
            self.steps_changed.push(step);
        }
    }

    fn attempt_changed(&mut self, step: usize, index: usize) {
        if !self.attempts_changed.contains(&(step, index)) {
            self.attempts_changed.push((step, index));
        }
    }
}

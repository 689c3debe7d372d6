//! The state the engine decides on: a run, its steps and their attempts.
//!
//! These are plain values with no serde: what is stored is the store's own versioned
//! records (`store::records::v2`), converted from and to these.

use std::sync::Arc;
use std::time::Duration;

use super::ids::{Fence, RunId, Timestamp};
use super::verdict::{FailureClass, Outcome, Verdict};
use crate::pipeline::Pipeline;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunState {
    /// Accepted; no attempt confirmed launched yet.
    Queued,
    Running,
    /// Only gates are left.
    Waiting,
    Succeeded,
    Failed,
    DeadLettered,
    Cancelled,
    Quarantined,
}

impl RunState {
    pub const ALL: [RunState; 8] = [
        RunState::Queued,
        RunState::Running,
        RunState::Waiting,
        RunState::Succeeded,
        RunState::Failed,
        RunState::DeadLettered,
        RunState::Cancelled,
        RunState::Quarantined,
    ];

    /// The states a run ends in, in `ALL`'s order.
    pub fn terminal() -> impl Iterator<Item = RunState> {
        Self::ALL.into_iter().filter(|state| state.is_terminal())
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::Running => "running",
            RunState::Waiting => "waiting",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::DeadLettered => "dead_lettered",
            RunState::Cancelled => "cancelled",
            RunState::Quarantined => "quarantined",
        }
    }

    pub fn parse(name: &str) -> Option<RunState> {
        RunState::ALL.into_iter().find(|s| s.as_str() == name)
    }

    pub fn is_terminal(self) -> bool {
        match self {
            RunState::Queued | RunState::Running | RunState::Waiting => false,
            RunState::Succeeded
            | RunState::Failed
            | RunState::DeadLettered
            | RunState::Cancelled
            | RunState::Quarantined => true,
        }
    }

    /// A small stable code for index keys: the state's position in `ALL`.
    pub const fn code(self) -> u8 {
        match self {
            RunState::Queued => 0,
            RunState::Running => 1,
            RunState::Waiting => 2,
            RunState::Succeeded => 3,
            RunState::Failed => 4,
            RunState::DeadLettered => 5,
            RunState::Cancelled => 6,
            RunState::Quarantined => 7,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CancelRequest {
    pub by: String,
    pub at: Timestamp,
    /// Why, when the system cancelled (`superseded`); `None` for a person's cancel.
    pub reason: Option<String>,
}

/// Everything about a run except its pipeline and steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunHeader {
    pub id: RunId,
    pub pipeline_name: String,
    pub origin: String,
    pub state: RunState,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub cancel: Option<CancelRequest>,
    /// The active-time budget's clock, for pipelines that set `budget:`.
    pub budget: Option<BudgetClock>,
    /// The auto-retry sweep's bookkeeping (docs/auto-retry.md).
    pub auto_retry: AutoRetryState,
    /// What admission control needs of the run (docs/admission.md).
    pub admission: RunAdmission,
}

impl RunAdmission {
    /// What the pipeline itself asks for.
    pub fn of(pipeline: &crate::pipeline::Pipeline) -> RunAdmission {
        RunAdmission {
            priority: pipeline.priority,
            parallelism: pipeline.parallelism,
            group: pipeline.concurrency.clone(),
            group_held: false,
        }
    }
}

/// A run's place in admission control: fixed at submit (the pipeline's values, or the
/// submitter's), except `group_held`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunAdmission {
    /// Higher is admitted first; ties in submit order.
    pub priority: i32,
    /// At most this many of the run's steps active at once.
    pub parallelism: Option<u32>,
    pub group: Option<crate::pipeline::Concurrency>,
    /// The run holds a slot of its group: from its first admission until it ends.
    pub group_held: bool,
}

/// What the auto-retry sweep did to a run and may do next.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AutoRetryState {
    /// Resubmissions so far (by the sweep or an operator's release).
    pub attempts: u32,
    /// Not eligible again before this (the backoff after the last resubmit).
    pub next_at: Option<Timestamp>,
    /// When the run last became dead-lettered and eligible: its key in the sweep's index.
    pub eligible_at: Option<Timestamp>,
    /// Why the run was quarantined, while it is.
    pub quarantined: Option<String>,
    /// Set when an operator discarded the quarantined run: never auto-retried again.
    pub discarded: Option<String>,
}

/// Active time of a run against its budget. Time while the run is `waiting` (only gates
/// left) is not counted: the clock is paused then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetClock {
    pub limit_ms: u64,
    /// Active time banked before the current stretch.
    pub used_ms: u64,
    /// Start of the current active stretch; `None` while paused.
    pub active_since: Option<Timestamp>,
    /// When the budget runs out if nothing pauses it (the durable timer's due time).
    pub due: Option<Timestamp>,
    /// Set once the budget ran out.
    pub exceeded_at: Option<Timestamp>,
}

impl BudgetClock {
    pub fn new(limit: Duration, now: Timestamp) -> BudgetClock {
        let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        BudgetClock {
            limit_ms,
            used_ms: 0,
            active_since: Some(now),
            due: Some(now.plus(limit)),
            exceeded_at: None,
        }
    }

    /// Active time so far, counting the current stretch up to `now`.
    pub fn used_at(&self, now: Timestamp) -> u64 {
        let current = self
            .active_since
            .map_or(0, |since| now.0.saturating_sub(since.0));
        self.used_ms.saturating_add(current)
    }

    pub fn remaining_at(&self, now: Timestamp) -> Duration {
        Duration::from_millis(self.limit_ms.saturating_sub(self.used_at(now)))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepState {
    /// Waiting for the steps it needs.
    Pending,
    /// Ready, waiting for admission: a slot of its pool, its locks, its run's parallelism
    /// or its run's concurrency group. No attempt exists yet.
    Queued {
        since: Timestamp,
    },
    /// An attempt is in flight (its own state says launching or running).
    Active,
    /// The last attempt failed and a retry is due at this time.
    RetryWaiting {
        due: Timestamp,
    },
    Succeeded,
    /// The code's verdict, reason e.g. `StepFailed`, `TimedOut`, `ConfigError`.
    Failed {
        reason: String,
    },
    /// No verdict could be obtained in budget: an operator's signal.
    DeadLettered {
        reason: String,
    },
    /// A step it needs ended without success.
    Skipped,
    Cancelled,
    /// A gate that is open: waiting for a decision or one of its timers.
    Waiting,
}

impl StepState {
    pub fn as_str(&self) -> &'static str {
        match self {
            StepState::Pending => "pending",
            StepState::Queued { .. } => "queued",
            StepState::Active => "active",
            StepState::RetryWaiting { .. } => "retry_waiting",
            StepState::Succeeded => "succeeded",
            StepState::Failed { .. } => "failed",
            StepState::DeadLettered { .. } => "dead_lettered",
            StepState::Skipped => "skipped",
            StepState::Cancelled => "cancelled",
            StepState::Waiting => "waiting",
        }
    }

    pub fn is_terminal(&self) -> bool {
        match self {
            StepState::Pending
            | StepState::Queued { .. }
            | StepState::Active
            | StepState::RetryWaiting { .. }
            | StepState::Waiting => false,
            StepState::Succeeded
            | StepState::Failed { .. }
            | StepState::DeadLettered { .. }
            | StepState::Skipped
            | StepState::Cancelled => true,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillReason {
    /// The engine backstop found the attempt past its timeout.
    Timeout,
    Cancel,
    /// The run's active-time budget ran out.
    Budget,
}

impl KillReason {
    pub fn as_str(self) -> &'static str {
        match self {
            KillReason::Timeout => "timeout",
            KillReason::Cancel => "cancel",
            KillReason::Budget => "budget",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttemptState {
    /// Minted and its launch enqueued; the executor has not confirmed it yet.
    Launching,
    Running {
        confirmed_at: Timestamp,
        backstop_due: Timestamp,
    },
    Finished(Verdict),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub number: u32,
    pub fence: Fence,
    pub created_at: Timestamp,
    pub state: AttemptState,
    /// Set once the engine asked the executor to stop it.
    pub kill: Option<KillReason>,
    /// Key/value outputs the attempt reported through the fenced output API.
    pub outputs: Vec<(String, String)>,
}

impl Attempt {
    pub fn is_in_flight(&self) -> bool {
        !matches!(self.state, AttemptState::Finished(_))
    }

    pub fn verdict(&self) -> Option<&Verdict> {
        match &self.state {
            AttemptState::Finished(verdict) => Some(verdict),
            AttemptState::Launching | AttemptState::Running { .. } => None,
        }
    }

    pub fn class(&self) -> Option<FailureClass> {
        self.verdict().and_then(Verdict::class)
    }

    pub fn succeeded(&self) -> bool {
        matches!(self.verdict(), Some(v) if v.outcome == Outcome::Succeeded)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunStep {
    pub state: StepState,
    /// A gate step's record once it opened; `None` for other steps.
    pub gate: Option<GateProgress>,
    /// Index in `attempts` of the current try's first attempt: a resubmitted run starts a
    /// fresh try (with a fresh retry budget); earlier attempts stay for the record.
    pub try_start: usize,
    pub attempts: Vec<Attempt>,
}

/// A gate since it opened: its timers and, once made, the decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateProgress {
    pub opened_at: Timestamp,
    pub release_at: Option<Timestamp>,
    pub expires_at: Option<Timestamp>,
    pub decision: Option<GateDecision>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateDecision {
    pub outcome: GateOutcome,
    /// Who decided, as they named themselves (`system` for the gate's own timers).
    pub by: String,
    /// The authenticated identity that made the request (`system` for timers).
    pub caller: String,
    pub at: Timestamp,
    pub comment: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateOutcome {
    Approved,
    Rejected,
    /// Approved by the gate's `auto_release` timer.
    AutoReleased,
    /// Nobody approved before `expires`.
    Expired,
}

impl GateOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            GateOutcome::Approved => "approved",
            GateOutcome::Rejected => "rejected",
            GateOutcome::AutoReleased => "auto_released",
            GateOutcome::Expired => "expired",
        }
    }

    pub fn approves(self) -> bool {
        matches!(self, GateOutcome::Approved | GateOutcome::AutoReleased)
    }
}

impl RunStep {
    pub fn new() -> Self {
        RunStep {
            state: StepState::Pending,
            gate: None,
            try_start: 0,
            attempts: Vec::new(),
        }
    }

    /// The attempts of the current try.
    pub fn current_try(&self) -> &[Attempt] {
        self.attempts.get(self.try_start..).unwrap_or_default()
    }

    /// A step in `state` with no gate record and no attempts.
    pub fn in_state(state: StepState) -> Self {
        RunStep {
            state,
            ..RunStep::new()
        }
    }

    pub fn in_flight(&self) -> Option<&Attempt> {
        self.attempts.last().filter(|a| a.is_in_flight())
    }
}

impl Default for RunStep {
    fn default() -> Self {
        RunStep::new()
    }
}

/// A run as the engine holds it.
#[derive(Clone, Debug)]
pub struct Run {
    pub header: RunHeader,
    pub pipeline: Arc<Pipeline>,
    pub steps: Vec<RunStep>,
}

impl Run {
    pub fn id(&self) -> RunId {
        self.header.id
    }

    pub fn step_timeout(&self, step: usize, default: Duration) -> Duration {
        self.pipeline.steps[step].timeout.unwrap_or(default)
    }
}

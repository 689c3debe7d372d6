//! The state the engine decides on: a run, its steps and their attempts.
//!
//! These are plain values. They derive serde only so the store's codec can persist them;
//! the engine itself never encodes anything.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::class::{FailureClass, Outcome, Verdict};
use super::ids::{Fence, RunId, Timestamp};
use crate::pipeline::Pipeline;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

    /// A small stable code for index keys.
    pub fn code(self) -> u8 {
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    pub by: String,
    pub at: Timestamp,
}

/// Everything about a run except its pipeline and steps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunHeader {
    pub id: RunId,
    pub pipeline_name: String,
    pub origin: String,
    pub state: RunState,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub cancel: Option<CancelRequest>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepState {
    /// Waiting for the steps it needs.
    Pending,
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
}

impl StepState {
    pub fn as_str(&self) -> &'static str {
        match self {
            StepState::Pending => "pending",
            StepState::Active => "active",
            StepState::RetryWaiting { .. } => "retry_waiting",
            StepState::Succeeded => "succeeded",
            StepState::Failed { .. } => "failed",
            StepState::DeadLettered { .. } => "dead_lettered",
            StepState::Skipped => "skipped",
            StepState::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(&self) -> bool {
        match self {
            StepState::Pending | StepState::Active | StepState::RetryWaiting { .. } => false,
            StepState::Succeeded
            | StepState::Failed { .. }
            | StepState::DeadLettered { .. }
            | StepState::Skipped
            | StepState::Cancelled => true,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KillReason {
    /// The engine backstop found the attempt past its timeout.
    Timeout,
    Cancel,
}

impl KillReason {
    pub fn as_str(self) -> &'static str {
        match self {
            KillReason::Timeout => "timeout",
            KillReason::Cancel => "cancel",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptState {
    /// Minted and its launch enqueued; the executor has not confirmed it yet.
    Launching,
    Running {
        confirmed_at: Timestamp,
        backstop_due: Timestamp,
    },
    Finished(Verdict),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepProgress {
    pub state: StepState,
    pub attempts: Vec<Attempt>,
}

impl StepProgress {
    pub fn new() -> Self {
        StepProgress {
            state: StepState::Pending,
            attempts: Vec::new(),
        }
    }

    pub fn in_flight(&self) -> Option<&Attempt> {
        self.attempts.last().filter(|a| a.is_in_flight())
    }
}

impl Default for StepProgress {
    fn default() -> Self {
        StepProgress::new()
    }
}

/// A run as the engine holds it.
#[derive(Clone, Debug)]
pub struct Run {
    pub header: RunHeader,
    pub pipeline: Arc<Pipeline>,
    pub steps: Vec<StepProgress>,
}

impl Run {
    pub fn id(&self) -> RunId {
        self.header.id
    }

    pub fn step_timeout(&self, step: usize, default: Duration) -> Duration {
        self.pipeline.steps[step].timeout.unwrap_or(default)
    }
}

//! Record format 4. **Frozen** once released, like formats 2 and 3: a run's header
//! carries what admission control needs (`admission`: priority, parallelism, concurrency
//! group and whether the run holds its group slot) and a cancel's `reason`; a step may be
//! `Queued` (ready, waiting for admission). Every other record is format 3's, re-exported.
//! `tests/fixtures/stores/format-4` is a store of this format.

use serde::{Deserialize, Serialize};

use super::v2::{self, Implausible};
pub use super::v3::{
    Attempt, DeadLetter, DeadLetterCategory, ExecutorKind, HistoryRecord, KillReason, LaunchAction,
    LaunchRecord, OutboxMessage, OutboxPayload, PipelineSource, PodRecord, Verdict,
};
use crate::engine;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunHeader {
    pub id: u128,
    pub pipeline_name: String,
    pub origin: String,
    pub state: v2::RunState,
    pub created_at: u64,
    pub updated_at: u64,
    pub cancel: Option<CancelRequest>,
    pub budget: Option<v2::BudgetClock>,
    pub auto_retry: v2::AutoRetryState,
    pub admission: Admission,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    pub by: String,
    pub at: u64,
    pub reason: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    pub priority: i32,
    pub parallelism: Option<u32>,
    pub group: Option<Group>,
    pub group_held: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub name: String,
    pub limit: u32,
    pub supersede: bool,
}

impl From<&engine::RunHeader> for RunHeader {
    fn from(header: &engine::RunHeader) -> Self {
        let old = v2::RunHeader::from(header);
        let admission = &header.admission;
        RunHeader {
            id: old.id,
            pipeline_name: old.pipeline_name,
            origin: old.origin,
            state: old.state,
            created_at: old.created_at,
            updated_at: old.updated_at,
            cancel: header.cancel.as_ref().map(|c| CancelRequest {
                by: c.by.clone(),
                at: c.at.0,
                reason: c.reason.clone(),
            }),
            budget: old.budget,
            auto_retry: old.auto_retry,
            admission: Admission {
                priority: admission.priority,
                parallelism: admission.parallelism,
                group: admission.group.as_ref().map(|g| Group {
                    name: g.group.clone(),
                    limit: g.limit,
                    supersede: g.supersede,
                }),
                group_held: admission.group_held,
            },
        }
    }
}

impl TryFrom<RunHeader> for engine::RunHeader {
    type Error = Implausible;
    fn try_from(header: RunHeader) -> Result<Self, Implausible> {
        let reason = header.cancel.as_ref().and_then(|c| c.reason.clone());
        let admission = header.admission;
        let old = v2::RunHeader {
            id: header.id,
            pipeline_name: header.pipeline_name,
            origin: header.origin,
            state: header.state,
            created_at: header.created_at,
            updated_at: header.updated_at,
            cancel: header
                .cancel
                .map(|c| v2::CancelRequest { by: c.by, at: c.at }),
            budget: header.budget,
            auto_retry: header.auto_retry,
        };
        let mut run = engine::RunHeader::try_from(old)?;
        if let Some(cancel) = run.cancel.as_mut() {
            cancel.reason = reason;
        }
        if admission.parallelism == Some(0) {
            return Err(v2::implausible(
                "run",
                "admission.parallelism",
                "parallelism 0 admits nothing",
            ));
        }
        let group = match admission.group {
            Some(group) if group.limit == 0 || group.name.is_empty() => {
                return Err(v2::implausible(
                    "run",
                    "admission.group",
                    "a concurrency group has a name and a limit of at least 1",
                ));
            }
            group => group.map(|g| crate::pipeline::Concurrency {
                group: g.name,
                limit: g.limit,
                supersede: g.supersede,
            }),
        };
        run.admission = engine::RunAdmission {
            priority: admission.priority,
            parallelism: admission.parallelism,
            group,
            group_held: admission.group_held,
        };
        Ok(run)
    }
}

/// The steps table's row.
pub type StepRow = (StepState, Option<v2::GateProgress>, u64);

/// Format 2's step states (same variants, same order) and `Queued`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepState {
    Pending,
    Active,
    RetryWaiting { due: u64 },
    Succeeded,
    Failed { reason: String },
    DeadLettered { reason: String },
    Skipped,
    Cancelled,
    Waiting,
    Queued { since: u64 },
}

/// A step's row, without its attempts (they are rows of their own).
pub fn step_row(progress: &engine::RunStep) -> StepRow {
    let (old, gate, try_start) = v2::step_row(progress);
    let state = match (&progress.state, old) {
        (engine::StepState::Queued { since }, _) => StepState::Queued { since: since.0 },
        (_, v2::StepState::Pending) => StepState::Pending,
        (_, v2::StepState::Active) => StepState::Active,
        (_, v2::StepState::RetryWaiting { due }) => StepState::RetryWaiting { due },
        (_, v2::StepState::Succeeded) => StepState::Succeeded,
        (_, v2::StepState::Failed { reason }) => StepState::Failed { reason },
        (_, v2::StepState::DeadLettered { reason }) => StepState::DeadLettered { reason },
        (_, v2::StepState::Skipped) => StepState::Skipped,
        (_, v2::StepState::Cancelled) => StepState::Cancelled,
        (_, v2::StepState::Waiting) => StepState::Waiting,
    };
    (state, gate, try_start)
}

/// A step rebuilt from its row, with no attempts yet.
pub fn step_from_row((state, gate, try_start): StepRow) -> Result<engine::RunStep, Implausible> {
    let (old, queued) = match state {
        StepState::Queued { since } => (v2::StepState::Pending, Some(since)),
        StepState::Pending => (v2::StepState::Pending, None),
        StepState::Active => (v2::StepState::Active, None),
        StepState::RetryWaiting { due } => (v2::StepState::RetryWaiting { due }, None),
        StepState::Succeeded => (v2::StepState::Succeeded, None),
        StepState::Failed { reason } => (v2::StepState::Failed { reason }, None),
        StepState::DeadLettered { reason } => (v2::StepState::DeadLettered { reason }, None),
        StepState::Skipped => (v2::StepState::Skipped, None),
        StepState::Cancelled => (v2::StepState::Cancelled, None),
        StepState::Waiting => (v2::StepState::Waiting, None),
    };
    let mut step = v2::step_from_row((old, gate, try_start))?;
    if let Some(since) = queued {
        step.state = engine::StepState::Queued {
            since: engine::Timestamp(since),
        };
    }
    Ok(step)
}

//! The service's typed protocol: what callers ask the driver ([`Command`]), what it
//! answers, and how a request fails: [`ServiceError`] is the domain's refusal `E` (which
//! changed nothing), the store's failure (nothing of the batch happened), or a service
//! that is shutting down. The HTTP API turns every one of them into a response in one
//! place (`api::errors`).

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::engine::{Fence, GateDecision, RejectedInput, RunId, Timestamp};
use crate::pipeline::Pipeline;
use crate::store::records::{PipelineSource, StoredSchedule};

use super::sweep;

/// How a request to the service failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError<E: std::error::Error + 'static> {
    /// Refused: the request does not apply (not found, wrong state, stale fence...).
    #[error(transparent)]
    Domain(E),
    /// The store failed; nothing of the request happened.
    #[error("store: {0}")]
    Store(String),
    /// The state dir's disk is full; nothing of the request happened.
    #[error("the state dir's disk is full; nothing was recorded: {0}")]
    DiskFull(String),
    #[error("the service is shutting down")]
    ShuttingDown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    pub id: RunId,
    /// True when an `Idempotency-Key` matched an earlier submission.
    pub existing: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitRejected {
    #[error("Idempotency-Key already names run {0}, submitted with a different pipeline")]
    IdempotencyConflict(RunId),
    /// As many runs are in progress as `engine.max_active_runs` allows.
    #[error(
        "{limit} runs are in progress (engine.max_active_runs); submit again when some have ended"
    )]
    Full { limit: u32 },
    /// The state dir's disk is full: new runs wait until space returns.
    #[error("the state dir's disk is full; no run was created: submit again when space returns")]
    DiskFull,
}

/// Refusals of schedule commands.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleRejected {
    #[error("schedule {0:?} not found")]
    NotFound(String),
    #[error("a schedule named {0:?} exists already; delete it first to replace it")]
    Exists(String),
    #[error("{limit} schedules exist, the most the store holds; delete one first")]
    Full { limit: usize },
    /// The stored expression no longer reads (a time zone this build does not know).
    #[error("{0}")]
    Invalid(String),
}

/// What an operator does to an existing schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleAction {
    Pause,
    Resume,
    Delete,
}

#[derive(Debug, thiserror::Error)]
pub enum OutputRejected {
    /// The writer's fence is not the step's current attempt: a zombie or a late writer.
    #[error("stale_fence")]
    StaleFence { current: Option<Fence> },
    #[error(transparent)]
    Rejected(RejectedInput),
}

/// Refusals of operator actions on a run: cancel, release and discard of a quarantined
/// run.
#[derive(Debug, thiserror::Error)]
pub enum RunRejected {
    #[error("run {0} not found")]
    NotFound(RunId),
    #[error("run {run} has no step {step:?}")]
    StepNotFound { run: RunId, step: String },
    #[error("{0}")]
    Rejected(String),
}

#[derive(Debug, thiserror::Error)]
pub enum DecideRejected {
    #[error("run {0} not found")]
    RunNotFound(RunId),
    #[error("run {run} has no step {step:?}")]
    StepNotFound { run: RunId, step: String },
    #[error(transparent)]
    Rejected(#[from] RejectedInput),
    #[error("run {run} cannot be read back: {error}")]
    Unreadable { run: RunId, error: String },
}

#[derive(Debug, thiserror::Error)]
pub enum DlqRejected {
    #[error("dead letter {0} not found")]
    NotFound(u64),
    #[error("cannot requeue: {0}")]
    Rejected(String),
}

pub type SubmitError = ServiceError<SubmitRejected>;
pub type OutputError = ServiceError<OutputRejected>;
pub type RunActionError = ServiceError<RunRejected>;
pub type DecideError = ServiceError<DecideRejected>;
pub type DlqError = ServiceError<DlqRejected>;

/// A gate decision, as it was recorded.
pub type Decided = GateDecision;

/// A reply channel for a request whose domain can refuse it with `E`.
pub type Answer<T, E> = oneshot::Sender<Result<T, ServiceError<E>>>;

/// Why a delivery failed, as the driver records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryFailure {
    pub error: String,
    /// The executor could not be reached or refused (as opposed to a message it cannot
    /// act on): exhausting such deliveries is `executor_unavailable`, else `outbox_poison`.
    pub unavailable: bool,
}

/// Admission control's state, as `GET /v1/queue` shows it.
#[derive(Clone, Debug)]
pub struct QueueView {
    /// (pool, slots in use, limit).
    pub pools: Vec<(&'static str, u64, u32)>,
    /// (lock, holders, limit).
    pub locks: Vec<(String, u32, u32)>,
    /// Queued steps by what they wait for.
    pub waiting: Vec<(&'static str, usize)>,
    /// Queued steps in admission order (at most `limits::QUEUE_LIST_MAX`), each with its
    /// step's name.
    pub waits: Vec<(crate::engine::admission::Wait, String)>,
}

/// Everything the driver loop is asked, each with where its answer goes.
pub enum Command {
    /// A new schedule; the driver sets its creation time and first fire.
    CreateSchedule {
        schedule: Box<StoredSchedule>,
        reply: Answer<StoredSchedule, ScheduleRejected>,
    },
    /// Pause, resume or delete a schedule: the schedule as it is now (`None` once deleted).
    Schedule {
        name: String,
        action: ScheduleAction,
        reply: Answer<Option<StoredSchedule>, ScheduleRejected>,
    },
    Submit {
        source: PipelineSource,
        pipeline: Arc<Pipeline>,
        origin: String,
        /// The run's priority, parallelism and concurrency group (the pipeline's, or the
        /// submitter's).
        admission: crate::engine::RunAdmission,
        idempotency_key: Option<String>,
        reply: Answer<Submitted, SubmitRejected>,
    },
    /// Admission control as it stands: the pools, the locks and what waits (all runs, or
    /// one run's queued steps).
    Queue {
        run: Option<RunId>,
        reply: oneshot::Sender<QueueView>,
    },
    Cancel {
        run: RunId,
        by: String,
        reply: Answer<(), RunRejected>,
    },
    SetOutputs {
        run: RunId,
        step: usize,
        fence: Fence,
        outputs: Vec<(String, String)>,
        reply: Answer<(), OutputRejected>,
    },
    Requeue {
        id: u64,
        by: String,
        reply: Answer<(), DlqRejected>,
    },
    /// Answered by the driver loop: proof it is alive (the systemd watchdog).
    Ping { reply: oneshot::Sender<()> },
    /// One auto-retry pass over candidates read from the index.
    Sweep {
        candidates: Vec<(Timestamp, RunId)>,
        reply: oneshot::Sender<sweep::PassOutcome>,
    },
    /// An operator re-runs a finished run (`from`: a step name); answers the names of the
    /// steps that start over.
    Retry {
        run: RunId,
        from: Option<String>,
        by: String,
        reply: Answer<Vec<String>, RunRejected>,
    },
    /// An operator releases a quarantined run: a fresh try, like a sweep's resubmit.
    Release {
        run: RunId,
        by: String,
        reply: Answer<(), RunRejected>,
    },
    /// An operator discards a quarantined run: it stays dead-lettered for good.
    DiscardRun {
        run: RunId,
        by: String,
        reason: String,
        reply: Answer<(), RunRejected>,
    },
    Decide {
        run: RunId,
        step: String,
        approve: bool,
        by: String,
        caller: String,
        comment: Option<String>,
        reply: Answer<Decided, DecideRejected>,
    },
    Discard {
        id: u64,
        by: String,
        reason: String,
        reply: Answer<(), DlqRejected>,
    },
    /// An outbox delivery finished.
    Delivered {
        message: u64,
        result: Result<(), DeliveryFailure>,
    },
}

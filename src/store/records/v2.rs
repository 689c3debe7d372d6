//! Record format 2, the first released format. **Frozen**: these types are the bytes of
//! every store written by that release (bincode 2, standard configuration, after the
//! format byte), and the JSON of the attempt files its supervisors wrote. Never add,
//! remove, reorder or rename a field or a variant here; a new format gets a new module
//! (`v3.rs`) with its own types, and this one keeps decoding the old stores forever
//! (`tests/fixtures/stores/format-2` is such a store, opened by every test run).
//!
//! The conversions below are the only bridge between these records and the engine's or
//! the store's own types: `From` towards the record, `TryFrom` back, which checks what
//! the types cannot (a fence is never 0, numbers fit the engine's index types).

use serde::{Deserialize, Serialize};

use crate::engine;
use crate::store::records as domain;

/// A decoded value the engine's types cannot hold.
#[derive(Debug, thiserror::Error)]
#[error("{record}.{field}: {problem}")]
pub struct Implausible {
    pub record: &'static str,
    pub field: &'static str,
    pub problem: String,
}

pub(super) fn implausible(
    record: &'static str,
    field: &'static str,
    problem: impl Into<String>,
) -> Implausible {
    Implausible {
        record,
        field,
        problem: problem.into(),
    }
}

fn fence(record: &'static str, value: u64) -> Result<engine::Fence, Implausible> {
    if value == 0 {
        return Err(implausible(record, "fence", "fence 0 is never minted"));
    }
    Ok(engine::Fence(value))
}

fn at(ms: u64) -> engine::Timestamp {
    engine::Timestamp(ms)
}

fn opt_at(ms: Option<u64>) -> Option<engine::Timestamp> {
    ms.map(engine::Timestamp)
}

fn opt_ms(at: Option<engine::Timestamp>) -> Option<u64> {
    at.map(|t| t.0)
}

// ---------------------------------------------------------------------------------------
// Runs

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunHeader {
    pub id: u128,
    pub pipeline_name: String,
    pub origin: String,
    pub state: RunState,
    pub created_at: u64,
    pub updated_at: u64,
    pub cancel: Option<CancelRequest>,
    pub budget: Option<BudgetClock>,
    pub auto_retry: AutoRetryState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunState {
    Queued,
    Running,
    Waiting,
    Succeeded,
    Failed,
    DeadLettered,
    Cancelled,
    Quarantined,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    pub by: String,
    pub at: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetClock {
    pub limit_ms: u64,
    pub used_ms: u64,
    pub active_since: Option<u64>,
    pub due: Option<u64>,
    pub exceeded_at: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoRetryState {
    pub attempts: u32,
    pub next_at: Option<u64>,
    pub eligible_at: Option<u64>,
    pub quarantined: Option<String>,
    pub discarded: Option<String>,
}

impl From<engine::RunState> for RunState {
    fn from(state: engine::RunState) -> Self {
        match state {
            engine::RunState::Queued => RunState::Queued,
            engine::RunState::Running => RunState::Running,
            engine::RunState::Waiting => RunState::Waiting,
            engine::RunState::Succeeded => RunState::Succeeded,
            engine::RunState::Failed => RunState::Failed,
            engine::RunState::DeadLettered => RunState::DeadLettered,
            engine::RunState::Cancelled => RunState::Cancelled,
            engine::RunState::Quarantined => RunState::Quarantined,
        }
    }
}

impl From<RunState> for engine::RunState {
    fn from(state: RunState) -> Self {
        match state {
            RunState::Queued => engine::RunState::Queued,
            RunState::Running => engine::RunState::Running,
            RunState::Waiting => engine::RunState::Waiting,
            RunState::Succeeded => engine::RunState::Succeeded,
            RunState::Failed => engine::RunState::Failed,
            RunState::DeadLettered => engine::RunState::DeadLettered,
            RunState::Cancelled => engine::RunState::Cancelled,
            RunState::Quarantined => engine::RunState::Quarantined,
        }
    }
}

impl From<&engine::RunHeader> for RunHeader {
    fn from(header: &engine::RunHeader) -> Self {
        RunHeader {
            id: header.id.0,
            pipeline_name: header.pipeline_name.clone(),
            origin: header.origin.clone(),
            state: header.state.into(),
            created_at: header.created_at.0,
            updated_at: header.updated_at.0,
            cancel: header.cancel.as_ref().map(|c| CancelRequest {
                by: c.by.clone(),
                at: c.at.0,
            }),
            budget: header.budget.as_ref().map(|b| BudgetClock {
                limit_ms: b.limit_ms,
                used_ms: b.used_ms,
                active_since: opt_ms(b.active_since),
                due: opt_ms(b.due),
                exceeded_at: opt_ms(b.exceeded_at),
            }),
            auto_retry: AutoRetryState {
                attempts: header.auto_retry.attempts,
                next_at: opt_ms(header.auto_retry.next_at),
                eligible_at: opt_ms(header.auto_retry.eligible_at),
                quarantined: header.auto_retry.quarantined.clone(),
                discarded: header.auto_retry.discarded.clone(),
            },
        }
    }
}

impl TryFrom<RunHeader> for engine::RunHeader {
    type Error = Implausible;
    fn try_from(header: RunHeader) -> Result<Self, Implausible> {
        if header.id == 0 {
            return Err(implausible("run", "id", "run id 0 is never issued"));
        }
        Ok(engine::RunHeader {
            id: engine::RunId(header.id),
            pipeline_name: header.pipeline_name,
            origin: header.origin,
            state: header.state.into(),
            created_at: at(header.created_at),
            updated_at: at(header.updated_at),
            cancel: header.cancel.map(|c| engine::CancelRequest {
                by: c.by,
                at: at(c.at),
                reason: None,
            }),
            budget: header.budget.map(|b| engine::BudgetClock {
                limit_ms: b.limit_ms,
                used_ms: b.used_ms,
                active_since: opt_at(b.active_since),
                due: opt_at(b.due),
                exceeded_at: opt_at(b.exceeded_at),
            }),
            auto_retry: engine::AutoRetryState {
                attempts: header.auto_retry.attempts,
                next_at: opt_at(header.auto_retry.next_at),
                eligible_at: opt_at(header.auto_retry.eligible_at),
                quarantined: header.auto_retry.quarantined,
                discarded: header.auto_retry.discarded,
            },
            // Format 2 predates admission control: no priority, no group.
            admission: engine::RunAdmission::default(),
        })
    }
}

// ---------------------------------------------------------------------------------------
// Steps: one row per step, (state, gate, index of the current try's first attempt).

/// The steps table's row.
pub type StepRow = (StepState, Option<GateProgress>, u64);

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
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateProgress {
    pub opened_at: u64,
    pub release_at: Option<u64>,
    pub expires_at: Option<u64>,
    pub decision: Option<GateDecision>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateDecision {
    pub outcome: GateOutcome,
    pub by: String,
    pub caller: String,
    pub at: u64,
    pub comment: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GateOutcome {
    Approved,
    Rejected,
    AutoReleased,
    Expired,
}

/// A step's row, without its attempts (they are rows of their own).
pub fn step_row(progress: &engine::RunStep) -> StepRow {
    let state = match &progress.state {
        // Format 2 has no queued steps; this build writes format 4 (`v4::step_row`),
        // which keeps `Queued` apart.
        engine::StepState::Pending | engine::StepState::Queued { .. } => StepState::Pending,
        engine::StepState::Active => StepState::Active,
        engine::StepState::RetryWaiting { due } => StepState::RetryWaiting { due: due.0 },
        engine::StepState::Succeeded => StepState::Succeeded,
        engine::StepState::Failed { reason } => StepState::Failed {
            reason: reason.clone(),
        },
        engine::StepState::DeadLettered { reason } => StepState::DeadLettered {
            reason: reason.clone(),
        },
        engine::StepState::Skipped => StepState::Skipped,
        engine::StepState::Cancelled => StepState::Cancelled,
        engine::StepState::Waiting => StepState::Waiting,
    };
    let gate = progress.gate.as_ref().map(|gate| GateProgress {
        opened_at: gate.opened_at.0,
        release_at: opt_ms(gate.release_at),
        expires_at: opt_ms(gate.expires_at),
        decision: gate.decision.as_ref().map(|d| GateDecision {
            outcome: match d.outcome {
                engine::GateOutcome::Approved => GateOutcome::Approved,
                engine::GateOutcome::Rejected => GateOutcome::Rejected,
                engine::GateOutcome::AutoReleased => GateOutcome::AutoReleased,
                engine::GateOutcome::Expired => GateOutcome::Expired,
            },
            by: d.by.clone(),
            caller: d.caller.clone(),
            at: d.at.0,
            comment: d.comment.clone(),
        }),
    });
    (state, gate, progress.try_start as u64)
}

/// A step rebuilt from its row, with no attempts yet.
pub fn step_from_row((state, gate, try_start): StepRow) -> Result<engine::RunStep, Implausible> {
    let state = match state {
        StepState::Pending => engine::StepState::Pending,
        StepState::Active => engine::StepState::Active,
        StepState::RetryWaiting { due } => engine::StepState::RetryWaiting { due: at(due) },
        StepState::Succeeded => engine::StepState::Succeeded,
        StepState::Failed { reason } => engine::StepState::Failed { reason },
        StepState::DeadLettered { reason } => engine::StepState::DeadLettered { reason },
        StepState::Skipped => engine::StepState::Skipped,
        StepState::Cancelled => engine::StepState::Cancelled,
        StepState::Waiting => engine::StepState::Waiting,
    };
    let gate = gate.map(|gate| engine::GateProgress {
        opened_at: at(gate.opened_at),
        release_at: opt_at(gate.release_at),
        expires_at: opt_at(gate.expires_at),
        decision: gate.decision.map(|d| engine::GateDecision {
            outcome: match d.outcome {
                GateOutcome::Approved => engine::GateOutcome::Approved,
                GateOutcome::Rejected => engine::GateOutcome::Rejected,
                GateOutcome::AutoReleased => engine::GateOutcome::AutoReleased,
                GateOutcome::Expired => engine::GateOutcome::Expired,
            },
            by: d.by,
            caller: d.caller,
            at: at(d.at),
            comment: d.comment,
        }),
    });
    let try_start = usize::try_from(try_start)
        .map_err(|_| implausible("step", "try_start", format!("{try_start} is out of range")))?;
    Ok(engine::RunStep {
        state,
        gate,
        try_start,
        attempts: Vec::new(),
    })
}

// ---------------------------------------------------------------------------------------
// Attempts and verdicts (also the JSON of an attempt's verdict record and `kill.json`)

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub number: u32,
    pub fence: u64,
    pub created_at: u64,
    pub state: AttemptState,
    pub kill: Option<KillReason>,
    pub outputs: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptState {
    Launching,
    Running {
        confirmed_at: u64,
        backstop_due: u64,
    },
    Finished(Verdict),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KillReason {
    Timeout,
    Cancel,
    Budget,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub outcome: Outcome,
    pub started: bool,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub started_at: Option<u64>,
    pub finished_at: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Succeeded,
    Failed(FailureClass),
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureClass {
    InfraNeverStarted,
    Config,
    InfraPostStart,
    Step,
    Timeout,
    Lost,
}

impl From<engine::KillReason> for KillReason {
    fn from(reason: engine::KillReason) -> Self {
        match reason {
            engine::KillReason::Timeout => KillReason::Timeout,
            engine::KillReason::Cancel => KillReason::Cancel,
            engine::KillReason::Budget => KillReason::Budget,
        }
    }
}

impl From<KillReason> for engine::KillReason {
    fn from(reason: KillReason) -> Self {
        match reason {
            KillReason::Timeout => engine::KillReason::Timeout,
            KillReason::Cancel => engine::KillReason::Cancel,
            KillReason::Budget => engine::KillReason::Budget,
        }
    }
}

impl From<engine::FailureClass> for FailureClass {
    fn from(class: engine::FailureClass) -> Self {
        match class {
            engine::FailureClass::InfraNeverStarted => FailureClass::InfraNeverStarted,
            engine::FailureClass::Config => FailureClass::Config,
            engine::FailureClass::InfraPostStart => FailureClass::InfraPostStart,
            engine::FailureClass::Step => FailureClass::Step,
            engine::FailureClass::Timeout => FailureClass::Timeout,
            engine::FailureClass::Lost => FailureClass::Lost,
        }
    }
}

impl From<FailureClass> for engine::FailureClass {
    fn from(class: FailureClass) -> Self {
        match class {
            FailureClass::InfraNeverStarted => engine::FailureClass::InfraNeverStarted,
            FailureClass::Config => engine::FailureClass::Config,
            FailureClass::InfraPostStart => engine::FailureClass::InfraPostStart,
            FailureClass::Step => engine::FailureClass::Step,
            FailureClass::Timeout => engine::FailureClass::Timeout,
            FailureClass::Lost => engine::FailureClass::Lost,
        }
    }
}

impl From<&engine::Verdict> for Verdict {
    fn from(verdict: &engine::Verdict) -> Self {
        Verdict {
            outcome: match verdict.outcome {
                engine::Outcome::Succeeded => Outcome::Succeeded,
                engine::Outcome::Failed(class) => Outcome::Failed(class.into()),
                engine::Outcome::Stopped => Outcome::Stopped,
            },
            started: verdict.started,
            reason: verdict.reason.clone(),
            exit_code: verdict.exit_code,
            started_at: opt_ms(verdict.started_at),
            finished_at: verdict.finished_at.0,
        }
    }
}

impl From<Verdict> for engine::Verdict {
    fn from(verdict: Verdict) -> Self {
        engine::Verdict {
            outcome: match verdict.outcome {
                Outcome::Succeeded => engine::Outcome::Succeeded,
                Outcome::Failed(class) => engine::Outcome::Failed(class.into()),
                Outcome::Stopped => engine::Outcome::Stopped,
            },
            started: verdict.started,
            reason: verdict.reason,
            exit_code: verdict.exit_code,
            started_at: opt_at(verdict.started_at),
            finished_at: at(verdict.finished_at),
        }
    }
}

impl From<&engine::Attempt> for Attempt {
    fn from(attempt: &engine::Attempt) -> Self {
        Attempt {
            number: attempt.number,
            fence: attempt.fence.0,
            created_at: attempt.created_at.0,
            state: match &attempt.state {
                engine::AttemptState::Launching => AttemptState::Launching,
                engine::AttemptState::Running {
                    confirmed_at,
                    backstop_due,
                } => AttemptState::Running {
                    confirmed_at: confirmed_at.0,
                    backstop_due: backstop_due.0,
                },
                engine::AttemptState::Finished(verdict) => AttemptState::Finished(verdict.into()),
            },
            kill: attempt.kill.map(KillReason::from),
            outputs: attempt.outputs.clone(),
        }
    }
}

impl TryFrom<Attempt> for engine::Attempt {
    type Error = Implausible;
    fn try_from(attempt: Attempt) -> Result<Self, Implausible> {
        if attempt.number == 0 {
            return Err(implausible(
                "attempt",
                "number",
                "attempts are numbered from 1",
            ));
        }
        Ok(engine::Attempt {
            number: attempt.number,
            fence: fence("attempt", attempt.fence)?,
            created_at: at(attempt.created_at),
            state: match attempt.state {
                AttemptState::Launching => engine::AttemptState::Launching,
                AttemptState::Running {
                    confirmed_at,
                    backstop_due,
                } => engine::AttemptState::Running {
                    confirmed_at: at(confirmed_at),
                    backstop_due: at(backstop_due),
                },
                AttemptState::Finished(verdict) => engine::AttemptState::Finished(verdict.into()),
            },
            kill: attempt.kill.map(engine::KillReason::from),
            outputs: attempt.outputs,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Pipelines as submitted

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineSource {
    pub format: SourceFormat,
    pub text: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourceFormat {
    Yaml,
    Json,
}

impl From<&domain::PipelineSource> for PipelineSource {
    fn from(source: &domain::PipelineSource) -> Self {
        PipelineSource {
            format: match source.format {
                domain::SourceFormat::Yaml => SourceFormat::Yaml,
                domain::SourceFormat::Json => SourceFormat::Json,
            },
            text: source.text.clone(),
        }
    }
}

impl From<PipelineSource> for domain::PipelineSource {
    fn from(source: PipelineSource) -> Self {
        domain::PipelineSource {
            format: match source.format {
                SourceFormat::Yaml => domain::SourceFormat::Yaml,
                SourceFormat::Json => domain::SourceFormat::Json,
            },
            text: source.text,
            params: None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Launches (also the `launch` of an attempt's spec record)
//
// A launch, and the outbox message and dead letter that carry one, are generic over what
// they carry: the parameter changes no byte of the encoding, and lets a later format that
// changes only the launch's action (format 3) reuse these types and their conversions.
// The defaults are format 2's own.

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRecord<A = LaunchAction> {
    pub run: u128,
    pub step: u16,
    pub step_name: String,
    pub attempt: u32,
    pub fence: u64,
    pub timeout_ms: u64,
    pub action: A,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LaunchAction {
    Local {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        workdir: Option<String>,
    },
    Kubernetes(Box<PodRecord>),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub requests: Vec<(String, String)>,
    pub limits: Vec<(String, String)>,
    pub service_account: Option<String>,
    pub node_selector: Vec<(String, String)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecutorKind {
    Local,
    Kubernetes,
}

impl From<domain::ExecutorKind> for ExecutorKind {
    fn from(kind: domain::ExecutorKind) -> Self {
        match kind {
            domain::ExecutorKind::Local => ExecutorKind::Local,
            domain::ExecutorKind::Kubernetes => ExecutorKind::Kubernetes,
        }
    }
}

impl From<ExecutorKind> for domain::ExecutorKind {
    fn from(kind: ExecutorKind) -> Self {
        match kind {
            ExecutorKind::Local => domain::ExecutorKind::Local,
            ExecutorKind::Kubernetes => domain::ExecutorKind::Kubernetes,
        }
    }
}

/// Format 2 had no secrets: a format-2 launch references none. (There is no conversion
/// the other way: format 2 cannot hold a launch's secrets, so it is never written.)
impl From<LaunchAction> for domain::LaunchAction {
    fn from(action: LaunchAction) -> Self {
        match action {
            LaunchAction::Local { argv, env, workdir } => domain::LaunchAction::Local {
                argv,
                env,
                secrets: Vec::new(),
                workdir,
            },
            LaunchAction::Kubernetes(pod) => {
                let pod = *pod;
                domain::LaunchAction::Kubernetes(Box::new(domain::PodRecord {
                    image: pod.image,
                    command: pod.command,
                    args: pod.args,
                    env: pod.env,
                    secrets: Vec::new(),
                    workdir: pod.workdir,
                    requests: pod.requests,
                    limits: pod.limits,
                    service_account: pod.service_account,
                    node_selector: pod.node_selector,
                }))
            }
        }
    }
}

impl<'a, A: From<&'a domain::LaunchAction>> From<&'a domain::LaunchRecord> for LaunchRecord<A> {
    fn from(launch: &'a domain::LaunchRecord) -> Self {
        LaunchRecord {
            run: launch.run.0,
            step: launch.step,
            step_name: launch.step_name.clone(),
            attempt: launch.attempt,
            fence: launch.fence.0,
            timeout_ms: launch.timeout_ms,
            action: A::from(&launch.action),
        }
    }
}

impl<A: Into<domain::LaunchAction>> TryFrom<LaunchRecord<A>> for domain::LaunchRecord {
    type Error = Implausible;
    fn try_from(launch: LaunchRecord<A>) -> Result<Self, Implausible> {
        if launch.attempt == 0 {
            return Err(implausible(
                "launch",
                "attempt",
                "attempts are numbered from 1",
            ));
        }
        Ok(domain::LaunchRecord {
            run: engine::RunId(launch.run),
            step: launch.step,
            step_name: launch.step_name,
            attempt: launch.attempt,
            fence: fence("launch", launch.fence)?,
            timeout_ms: launch.timeout_ms,
            action: launch.action.into(),
        })
    }
}

// ---------------------------------------------------------------------------------------
// The outbox and the dead-letter queue

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutboxPayload<L = LaunchRecord> {
    Launch(L),
    Kill {
        run: u128,
        step: u16,
        fence: u64,
        reason: KillReason,
        executor: ExecutorKind,
    },
    Webhook {
        run: u128,
        url: String,
        event_id: String,
        body: String,
        alert: bool,
    },
    CleanUp {
        run: u128,
        fence: u64,
        executor: ExecutorKind,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxMessage<L = LaunchRecord> {
    pub id: u64,
    pub payload: OutboxPayload<L>,
    pub created_at: u64,
    pub next_at: u64,
    pub delivery_attempts: u32,
    pub max_deliveries: u32,
    pub last_error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter<L = LaunchRecord> {
    pub message: OutboxMessage<L>,
    pub dead_at: u64,
    pub category: DeadLetterCategory,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeadLetterCategory {
    ExecutorUnavailable,
    OutboxPoison,
}

impl<'a, L: From<&'a domain::LaunchRecord>> From<&'a domain::OutboxMessage> for OutboxMessage<L> {
    fn from(message: &'a domain::OutboxMessage) -> Self {
        let payload = match &message.payload {
            domain::OutboxPayload::Launch(launch) => OutboxPayload::Launch(L::from(launch)),
            domain::OutboxPayload::Kill {
                run,
                step,
                fence,
                reason,
                executor,
            } => OutboxPayload::Kill {
                run: run.0,
                step: *step,
                fence: fence.0,
                reason: (*reason).into(),
                executor: (*executor).into(),
            },
            domain::OutboxPayload::Webhook {
                run,
                url,
                event_id,
                body,
                alert,
            } => OutboxPayload::Webhook {
                run: run.0,
                url: url.clone(),
                event_id: event_id.clone(),
                body: body.clone(),
                alert: *alert,
            },
            domain::OutboxPayload::CleanUp {
                run,
                fence,
                executor,
            } => OutboxPayload::CleanUp {
                run: run.0,
                fence: fence.0,
                executor: (*executor).into(),
            },
        };
        OutboxMessage {
            id: message.id,
            payload,
            created_at: message.created_at.0,
            next_at: message.next_at.0,
            delivery_attempts: message.delivery_attempts,
            max_deliveries: message.max_deliveries,
            last_error: message.last_error.clone(),
        }
    }
}

impl<L> TryFrom<OutboxMessage<L>> for domain::OutboxMessage
where
    L: TryInto<domain::LaunchRecord, Error = Implausible>,
{
    type Error = Implausible;
    fn try_from(message: OutboxMessage<L>) -> Result<Self, Implausible> {
        let payload = match message.payload {
            OutboxPayload::Launch(launch) => domain::OutboxPayload::Launch(launch.try_into()?),
            OutboxPayload::Kill {
                run,
                step,
                fence: value,
                reason,
                executor,
            } => domain::OutboxPayload::Kill {
                run: engine::RunId(run),
                step,
                fence: fence("kill", value)?,
                reason: reason.into(),
                executor: executor.into(),
            },
            OutboxPayload::Webhook {
                run,
                url,
                event_id,
                body,
                alert,
            } => domain::OutboxPayload::Webhook {
                run: engine::RunId(run),
                url,
                event_id,
                body,
                alert,
            },
            OutboxPayload::CleanUp {
                run,
                fence: value,
                executor,
            } => domain::OutboxPayload::CleanUp {
                run: engine::RunId(run),
                fence: fence("clean_up", value)?,
                executor: executor.into(),
            },
        };
        Ok(domain::OutboxMessage {
            id: message.id,
            payload,
            created_at: at(message.created_at),
            next_at: at(message.next_at),
            delivery_attempts: message.delivery_attempts,
            max_deliveries: message.max_deliveries,
            last_error: message.last_error,
        })
    }
}

impl<'a, L: From<&'a domain::LaunchRecord>> From<&'a domain::DeadLetter> for DeadLetter<L> {
    fn from(letter: &'a domain::DeadLetter) -> Self {
        DeadLetter {
            message: OutboxMessage::from(&letter.message),
            dead_at: letter.dead_at.0,
            category: match letter.category {
                domain::DeadLetterCategory::ExecutorUnavailable => {
                    DeadLetterCategory::ExecutorUnavailable
                }
                domain::DeadLetterCategory::OutboxPoison => DeadLetterCategory::OutboxPoison,
            },
        }
    }
}

impl<L> TryFrom<DeadLetter<L>> for domain::DeadLetter
where
    L: TryInto<domain::LaunchRecord, Error = Implausible>,
{
    type Error = Implausible;
    fn try_from(letter: DeadLetter<L>) -> Result<Self, Implausible> {
        Ok(domain::DeadLetter {
            message: letter.message.try_into()?,
            dead_at: at(letter.dead_at),
            category: match letter.category {
                DeadLetterCategory::ExecutorUnavailable => {
                    domain::DeadLetterCategory::ExecutorUnavailable
                }
                DeadLetterCategory::OutboxPoison => domain::DeadLetterCategory::OutboxPoison,
            },
        })
    }
}

// ---------------------------------------------------------------------------------------
// History

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRecord {
    pub at: u64,
    pub kind: String,
    pub detail: String,
}

impl From<&domain::HistoryRecord> for HistoryRecord {
    fn from(record: &domain::HistoryRecord) -> Self {
        HistoryRecord {
            at: record.at.0,
            kind: record.kind.clone(),
            detail: record.detail.clone(),
        }
    }
}

impl From<HistoryRecord> for domain::HistoryRecord {
    fn from(record: HistoryRecord) -> Self {
        domain::HistoryRecord {
            at: at(record.at),
            kind: record.kind,
            detail: record.detail,
        }
    }
}

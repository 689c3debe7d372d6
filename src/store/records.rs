//! What the store holds, as the rest of Scarab sees it: pipelines as submitted, outbox
//! messages, history events, timer keys, and [`Record`] for each stored kind, engine
//! state included. These types carry no serde: the bytes on disk are the versioned
//! record types of `v2`, `v3` and `v4` (and of each later format), converted here.

pub mod v2;
pub mod v3;
pub mod v4;
pub mod v5;

use crate::engine::{self, Fence, KillReason, RunId, Timestamp};
use crate::store::codec::{self, CodecError, Record};

/// The pipeline exactly as submitted; it is re-validated whenever a run is loaded, so a
/// stored run can always be explained by its source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineSource {
    pub format: SourceFormat,
    pub text: String,
    /// The run's parameter values (name, value), sorted by name; `None` for a run
    /// stored before parameters existed (format 4 and older): its text is taken literally.
    pub params: Option<Vec<(String, String)>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    Yaml,
    Json,
}

/// Everything an executor needs to start one attempt; fixed when the attempt is minted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchRecord {
    pub run: RunId,
    pub step: u16,
    pub step_name: String,
    pub attempt: u32,
    pub fence: Fence,
    pub timeout_ms: u64,
    pub action: LaunchAction,
}

/// What runs, per executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LaunchAction {
    Local {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        /// (variable, secret name): resolved only when the step starts, never stored.
        secrets: Vec<(String, String)>,
        workdir: Option<String>,
    },
    Kubernetes(Box<PodRecord>),
}

impl LaunchAction {
    pub fn executor(&self) -> ExecutorKind {
        match self {
            LaunchAction::Local { .. } => ExecutorKind::Local,
            LaunchAction::Kubernetes(_) => ExecutorKind::Kubernetes,
        }
    }
}

/// A Pod step as launched (see `pipeline::PodTemplate`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRecord {
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// (variable, Kubernetes Secret name).
    pub secrets: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub requests: Vec<(String, String)>,
    pub limits: Vec<(String, String)>,
    pub service_account: Option<String>,
    pub node_selector: Vec<(String, String)>,
}

/// Which executor owns an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExecutorKind {
    Local,
    Kubernetes,
}

impl ExecutorKind {
    /// The executor of a step's attempts; a gate has none (and never has attempts).
    pub fn of(action: &crate::pipeline::StepAction) -> Option<ExecutorKind> {
        match action {
            crate::pipeline::StepAction::Local(_) => Some(ExecutorKind::Local),
            crate::pipeline::StepAction::Kubernetes(_) => Some(ExecutorKind::Kubernetes),
            crate::pipeline::StepAction::Gate(_) => None,
        }
    }
}

impl LaunchAction {
    /// What an executor launches for a step; a gate launches nothing.
    pub fn of(action: &crate::pipeline::StepAction) -> Option<LaunchAction> {
        Some(match action {
            crate::pipeline::StepAction::Gate(_) => return None,
            crate::pipeline::StepAction::Local(command) => LaunchAction::Local {
                argv: command.argv.clone(),
                env: command.env.clone(),
                secrets: command.secrets.clone(),
                workdir: command.workdir.clone(),
            },
            crate::pipeline::StepAction::Kubernetes(pod) => {
                LaunchAction::Kubernetes(Box::new(PodRecord {
                    image: pod.image.clone(),
                    command: pod.command.clone(),
                    args: pod.args.clone(),
                    env: pod.env.clone(),
                    secrets: pod.secrets.clone(),
                    workdir: pod.workdir.clone(),
                    requests: pod.resources.requests.clone(),
                    limits: pod.resources.limits.clone(),
                    service_account: pod.service_account.clone(),
                    node_selector: pod.node_selector.clone(),
                }))
            }
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutboxPayload {
    Launch(LaunchRecord),
    Kill {
        run: RunId,
        step: u16,
        fence: Fence,
        reason: KillReason,
        executor: ExecutorKind,
    },
    /// A signed webhook event; `url` names the configured webhook.
    Webhook {
        run: RunId,
        url: String,
        event_id: String,
        body: String,
        /// An operator alert: when it cannot be delivered, it is logged, not alerted
        /// again (which could loop).
        alert: bool,
    },
    /// Remove a finished attempt's traces (its directory and logs) after the retention.
    CleanUp {
        run: RunId,
        fence: Fence,
        executor: ExecutorKind,
    },
}

impl OutboxPayload {
    pub fn kind(&self) -> &'static str {
        match self {
            OutboxPayload::Launch(_) => "launch",
            OutboxPayload::Kill { .. } => "kill",
            OutboxPayload::CleanUp { .. } => "clean_up",
            OutboxPayload::Webhook { .. } => "webhook",
        }
    }

    pub fn run(&self) -> RunId {
        match self {
            OutboxPayload::Launch(launch) => launch.run,
            OutboxPayload::Kill { run, .. }
            | OutboxPayload::CleanUp { run, .. }
            | OutboxPayload::Webhook { run, .. } => *run,
        }
    }

    /// Executors are idempotent per fence, so the fence plus the kind is the key.
    pub fn idempotency_key(&self) -> String {
        match self {
            OutboxPayload::Launch(launch) => format!("launch/{}", launch.fence),
            OutboxPayload::Kill { fence, reason, .. } => {
                format!("kill/{fence}/{}", reason.as_str())
            }
            OutboxPayload::CleanUp { fence, .. } => format!("clean_up/{fence}"),
            OutboxPayload::Webhook { event_id, .. } => format!("webhook/{event_id}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxMessage {
    pub id: u64,
    pub payload: OutboxPayload,
    pub created_at: Timestamp,
    pub next_at: Timestamp,
    pub delivery_attempts: u32,
    pub max_deliveries: u32,
    pub last_error: Option<String>,
}

/// An outbox message whose deliveries were exhausted: the operator's to requeue or
/// discard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    pub message: OutboxMessage,
    pub dead_at: Timestamp,
    pub category: DeadLetterCategory,
}

/// Why a message could not be delivered (a stable public name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadLetterCategory {
    /// The executor stayed unreachable, forbidden or misconfigured.
    ExecutorUnavailable,
    /// The message itself could not be acted on.
    OutboxPoison,
}

impl DeadLetterCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterCategory::ExecutorUnavailable => "executor_unavailable",
            DeadLetterCategory::OutboxPoison => "outbox_poison",
        }
    }
}

/// One entry of a run's append-only history. `detail` is a JSON object as text (the
/// codec is not self-describing, so free-form JSON travels as a string).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryRecord {
    pub at: Timestamp,
    pub kind: String,
    pub detail: String,
}

/// A durable timer's identity, which is also its key: due time first, so the earliest
/// timers are the first keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimerKey {
    pub due: Timestamp,
    pub run: RunId,
    pub step: u16,
    pub kind: TimerKind,
    /// The attempt's fence for backstops; 0 otherwise.
    pub fence: Fence,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerKind {
    RetryDue = 1,
    Backstop = 2,
    /// A finished run's attempt directories (logs) are due for removal.
    Retention = 3,
    GateRelease = 4,
    GateExpiry = 5,
    /// The run's active-time budget.
    Budget = 6,
}

impl TimerKind {
    pub fn from_code(code: u8) -> Option<TimerKind> {
        match code {
            1 => Some(TimerKind::RetryDue),
            2 => Some(TimerKind::Backstop),
            3 => Some(TimerKind::Retention),
            4 => Some(TimerKind::GateRelease),
            5 => Some(TimerKind::GateExpiry),
            6 => Some(TimerKind::Budget),
            _ => None,
        }
    }
}

/// A stored run, as read back: everything needed to rebuild the engine's `Run`.
#[derive(Clone, Debug)]
pub struct StoredRun {
    pub header: crate::engine::RunHeader,
    pub source: PipelineSource,
    pub steps: Vec<crate::engine::RunStep>,
}

/// A schedule with the pipeline it starts, its parameter values included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSchedule {
    pub schedule: crate::engine::schedule::Schedule,
    pub source: PipelineSource,
    /// The pipeline's `name`, kept for lists (the source is parsed only to fire).
    pub pipeline_name: String,
}

/// Implements [`Record`] for a stored kind: `to` makes the current format's record from a
/// value, and each `format => from` reads one format's record back.
macro_rules! record {
    ($ty:ty, $name:literal, to: $to:expr, $($versions:pat => $from:expr),+ $(,)?) => {
        impl Record for $ty {
            const NAME: &'static str = $name;
            fn encode_current(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
                codec::to_bincode(Self::NAME, &($to)(self), out)
            }
            fn decode_format(version: u8, body: &[u8]) -> Result<Self, CodecError> {
                match version {
                    $($versions => ($from)(codec::from_bincode(Self::NAME, version, body)?)
                        .map_err(|e: v2::Implausible| CodecError::Implausible {
                            record: Self::NAME,
                            problem: e.to_string(),
                        }),)+
                    found => Err(CodecError::UnsupportedVersion { record: Self::NAME, found }),
                }
            }
        }
    };
}

record!(engine::RunHeader, "run",
    to: v5::RunHeader::from,
    2 | 3 => |r: v2::RunHeader| engine::RunHeader::try_from(r),
    4 | 5 => |r: v4::RunHeader| engine::RunHeader::try_from(r));
record!(engine::RunStep, "step",
    to: v5::step_row,
    2 | 3 => v2::step_from_row,
    4 | 5 => v4::step_from_row);
record!(engine::Attempt, "attempt",
    to: v5::Attempt::from,
    2..=5 => |r: v2::Attempt| engine::Attempt::try_from(r));
record!(PipelineSource, "pipeline",
    to: v5::PipelineSource::from,
    2..=4 => |r: v2::PipelineSource| Ok(PipelineSource::from(r)),
    5 => |r: v5::PipelineSource| PipelineSource::try_from(r));
record!(StoredSchedule, "schedule",
    to: v5::Schedule::from,
    5 => |r: v5::Schedule| StoredSchedule::try_from(r));
record!(OutboxMessage, "outbox_message",
    to: v5::OutboxMessage::from,
    2 => |r: v2::OutboxMessage| OutboxMessage::try_from(r),
    3..=5 => |r: v3::OutboxMessage| OutboxMessage::try_from(r));
record!(DeadLetter, "dead_letter",
    to: v5::DeadLetter::from,
    2 => |r: v2::DeadLetter| DeadLetter::try_from(r),
    3..=5 => |r: v3::DeadLetter| DeadLetter::try_from(r));
record!(HistoryRecord, "history",
    to: v5::HistoryRecord::from,
    2..=5 => |r: v2::HistoryRecord| Ok(HistoryRecord::from(r)));

//! Record format 3. **Frozen**, like format 2: it adds `secrets` (variable, secret name)
//! to a launch's local command and Pod. Every other record is byte for byte the format-2
//! record (the types are re-exported from `v2`); the launch, and the outbox messages and
//! dead letters that carry one, have their own types here. `tests/fixtures/stores/format-3`
//! is a store of this format.

use serde::{Deserialize, Serialize};

pub use super::v2::{
    Attempt, DeadLetterCategory, ExecutorKind, HistoryRecord, KillReason, PipelineSource,
    RunHeader, Verdict, step_from_row, step_row,
};
use super::v2::{Implausible, at, fence, implausible};
use crate::engine;
use crate::store::records as domain;

// ---------------------------------------------------------------------------------------
// Launches (also the `launch` of an attempt's `spec.json`): format 3 adds `secrets`

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRecord {
    pub run: u128,
    pub step: u16,
    pub step_name: String,
    pub attempt: u32,
    pub fence: u64,
    pub timeout_ms: u64,
    pub action: LaunchAction,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LaunchAction {
    Local {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        /// (variable, secret name): the values are never stored.
        #[serde(default)]
        secrets: Vec<(String, String)>,
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
    /// (variable, Kubernetes Secret name).
    #[serde(default)]
    pub secrets: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub requests: Vec<(String, String)>,
    pub limits: Vec<(String, String)>,
    pub service_account: Option<String>,
    pub node_selector: Vec<(String, String)>,
}

impl From<&domain::LaunchRecord> for LaunchRecord {
    fn from(launch: &domain::LaunchRecord) -> Self {
        LaunchRecord {
            run: launch.run.0,
            step: launch.step,
            step_name: launch.step_name.clone(),
            attempt: launch.attempt,
            fence: launch.fence.0,
            timeout_ms: launch.timeout_ms,
            action: match &launch.action {
                domain::LaunchAction::Local {
                    argv,
                    env,
                    secrets,
                    workdir,
                } => LaunchAction::Local {
                    argv: argv.clone(),
                    env: env.clone(),
                    secrets: secrets.clone(),
                    workdir: workdir.clone(),
                },
                domain::LaunchAction::Kubernetes(pod) => {
                    let pod = &**pod;
                    LaunchAction::Kubernetes(Box::new(PodRecord {
                        image: pod.image.clone(),
                        command: pod.command.clone(),
                        args: pod.args.clone(),
                        env: pod.env.clone(),
                        secrets: pod.secrets.clone(),
                        workdir: pod.workdir.clone(),
                        requests: pod.requests.clone(),
                        limits: pod.limits.clone(),
                        service_account: pod.service_account.clone(),
                        node_selector: pod.node_selector.clone(),
                    }))
                }
            },
        }
    }
}

impl TryFrom<LaunchRecord> for domain::LaunchRecord {
    type Error = Implausible;
    fn try_from(launch: LaunchRecord) -> Result<Self, Implausible> {
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
            action: match launch.action {
                LaunchAction::Local {
                    argv,
                    env,
                    secrets,
                    workdir,
                } => domain::LaunchAction::Local {
                    argv,
                    env,
                    secrets,
                    workdir,
                },
                LaunchAction::Kubernetes(pod) => {
                    let pod = *pod;
                    domain::LaunchAction::Kubernetes(Box::new(domain::PodRecord {
                        image: pod.image,
                        command: pod.command,
                        args: pod.args,
                        env: pod.env,
                        secrets: pod.secrets,
                        workdir: pod.workdir,
                        requests: pod.requests,
                        limits: pod.limits,
                        service_account: pod.service_account,
                        node_selector: pod.node_selector,
                    }))
                }
            },
        })
    }
}

// ---------------------------------------------------------------------------------------
// The outbox and the dead-letter queue

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutboxPayload {
    Launch(LaunchRecord),
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
pub struct OutboxMessage {
    pub id: u64,
    pub payload: OutboxPayload,
    pub created_at: u64,
    pub next_at: u64,
    pub delivery_attempts: u32,
    pub max_deliveries: u32,
    pub last_error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub message: OutboxMessage,
    pub dead_at: u64,
    pub category: DeadLetterCategory,
}

impl From<&domain::OutboxMessage> for OutboxMessage {
    fn from(message: &domain::OutboxMessage) -> Self {
        let payload = match &message.payload {
            domain::OutboxPayload::Launch(launch) => OutboxPayload::Launch(launch.into()),
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

impl TryFrom<OutboxMessage> for domain::OutboxMessage {
    type Error = Implausible;
    fn try_from(message: OutboxMessage) -> Result<Self, Implausible> {
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

impl From<&domain::DeadLetter> for DeadLetter {
    fn from(letter: &domain::DeadLetter) -> Self {
        DeadLetter {
            message: (&letter.message).into(),
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

impl TryFrom<DeadLetter> for domain::DeadLetter {
    type Error = Implausible;
    fn try_from(letter: DeadLetter) -> Result<Self, Implausible> {
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

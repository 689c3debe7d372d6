//! Record format 3. **Frozen**, like format 2: it adds `secrets` (variable, secret name)
//! to a launch's local command and Pod. Every other record is byte for byte the format-2
//! record: the types are format 2's, re-exported, and the launch, the outbox message and
//! the dead letter are format 2's generic types over this format's `LaunchAction`.
//! `tests/fixtures/stores/format-3` is a store of this format.

use serde::{Deserialize, Serialize};

pub use super::v2::{
    Attempt, DeadLetterCategory, ExecutorKind, HistoryRecord, KillReason, OutboxPayload,
    PipelineSource, RunHeader, Verdict, step_from_row, step_row,
};
use crate::store::records as domain;

/// A launch (also the `launch` of an attempt's spec record).
pub type LaunchRecord = super::v2::LaunchRecord<LaunchAction>;
pub type OutboxMessage = super::v2::OutboxMessage<LaunchRecord>;
pub type DeadLetter = super::v2::DeadLetter<LaunchRecord>;

// `secrets` defaults to none when absent: a format-2 `spec.json` (JSON, which names its
// fields) reads as format 3. Bincode ignores the default (every field is encoded).

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

impl From<&domain::LaunchAction> for LaunchAction {
    fn from(action: &domain::LaunchAction) -> Self {
        match action {
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
        }
    }
}

impl From<LaunchAction> for domain::LaunchAction {
    fn from(action: LaunchAction) -> Self {
        match action {
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
        }
    }
}

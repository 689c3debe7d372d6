//! The executor port: how the driver starts, stops and re-adopts attempts, and how
//! verdicts come back. Only adapters (`local`, later `kubernetes`) know processes or Pods;
//! everything else sees a [`Verdict`] with its failure class.

pub mod fake;
pub mod kubernetes;
pub mod local;

use std::future::Future;

use crate::engine::{Fence, KillReason, RunId, Verdict};
use crate::store::records::{ExecutorKind, LaunchRecord};

/// An executor's final word on one attempt, sent to the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub run: RunId,
    pub step: usize,
    pub fence: Fence,
    pub verdict: Verdict,
}

/// An attempt the store says was confirmed launched before a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adoption {
    pub run: RunId,
    pub step: usize,
    pub fence: Fence,
    pub executor: ExecutorKind,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The executor could not be reached or refused for now; the outbox retries.
    #[error("executor unavailable: {0}")]
    Unavailable(String),
    #[error("executor i/o on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub trait Executor: Clone + Send + Sync + 'static {
    /// Starts the attempt, or recognises it as already started: idempotent per fence.
    /// `Ok` means the executor has the attempt (launch confirmed); its verdict arrives as
    /// a [`Report`] later, possibly at once (a spawn that failed is a verdict too).
    fn launch(
        &self,
        order: &LaunchRecord,
    ) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// The store now durably holds this attempt's launch as confirmed. An executor whose
    /// launch is a two-step handshake (the local one) starts the step only now, so a step
    /// never runs under a launch the store could forget.
    fn launch_recorded(&self, fence: Fence) {
        let _ = fence;
    }

    /// The highest plausible fence this executor found after start-up (a reconciliation
    /// that finished in the background): the driver raises its counter above it before
    /// minting more. `None` when there is nothing (more) to raise.
    fn fence_floor(&self) -> Option<Fence> {
        None
    }

    /// Asks the attempt to stop. Idempotent; succeeds when there is nothing left to stop.
    fn kill(
        &self,
        target: Target,
        reason: KillReason,
    ) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// Re-adoption after a restart: resume supervising a confirmed attempt, or report the
    /// verdict it left, or report it `lost`. Never starts anything.
    fn adopt(&self, adoption: &Adoption) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// Removes a finished attempt's traces (a directory and logs, a Pod). Idempotent;
    /// refuses while the attempt still runs.
    fn clean_up(&self, target: Target) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// At start, before anything new is minted: looks at everything the executor holds,
    /// stops what does not belong to an in-flight attempt of this store (foreign zombies:
    /// superseded attempts, leftovers, fences at or above `minted_below` from a newer
    /// lineage), and returns the highest fence seen so the counter can be raised above it.
    /// Traces of finished attempts that `retained` answers true for are kept (their
    /// retention has not ended); what is left of other finished attempts may go.
    fn recover(
        &self,
        inflight: &[Adoption],
        minted_below: Fence,
        retained: &Retained,
    ) -> impl Future<Output = Result<Option<Fence>, ExecutorError>> + Send;
}

/// Whether the finished attempt (run, step index, fence) of this store is still within
/// its log retention, so its traces (a kept Pod) stay. Answers false for an attempt the
/// store does not know.
pub type Retained = std::sync::Arc<dyn Fn(RunId, usize, Fence) -> bool + Send + Sync>;

/// An attempt as the outbox names it to the executors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub executor: ExecutorKind,
    pub fence: Fence,
}

/// Both adapters behind the port: launches go by the step's action, everything else by
/// the executor recorded with the attempt.
#[derive(Clone)]
pub struct Executors {
    pub local: local::LocalExecutor,
    pub kubernetes: Option<kubernetes::KubeExecutor>,
}

impl Executors {
    fn kube(&self) -> Result<&kubernetes::KubeExecutor, ExecutorError> {
        self.kubernetes.as_ref().ok_or_else(|| {
            ExecutorError::Unavailable(
                "no kubernetes executor is configured on this service".into(),
            )
        })
    }
}

impl Executor for Executors {
    async fn launch(&self, order: &LaunchRecord) -> Result<(), ExecutorError> {
        match order.action.executor() {
            ExecutorKind::Local => self.local.launch(order).await,
            ExecutorKind::Kubernetes => self.kube()?.launch(order).await,
        }
    }

    fn launch_recorded(&self, fence: Fence) {
        self.local.launch_recorded(fence);
    }

    fn fence_floor(&self) -> Option<Fence> {
        self.kubernetes.as_ref().and_then(|k| k.fence_floor())
    }

    async fn kill(&self, target: Target, reason: KillReason) -> Result<(), ExecutorError> {
        match target.executor {
            ExecutorKind::Local => self.local.kill(target, reason).await,
            ExecutorKind::Kubernetes => self.kube()?.kill(target, reason).await,
        }
    }

    async fn adopt(&self, adoption: &Adoption) -> Result<(), ExecutorError> {
        match adoption.executor {
            ExecutorKind::Local => self.local.adopt(adoption).await,
            ExecutorKind::Kubernetes => self.kube()?.adopt(adoption).await,
        }
    }

    async fn clean_up(&self, target: Target) -> Result<(), ExecutorError> {
        match target.executor {
            ExecutorKind::Local => self.local.clean_up(target).await,
            ExecutorKind::Kubernetes => self.kube()?.clean_up(target).await,
        }
    }

    async fn recover(
        &self,
        inflight: &[Adoption],
        minted_below: Fence,
        retained: &Retained,
    ) -> Result<Option<Fence>, ExecutorError> {
        let of = |kind| {
            inflight
                .iter()
                .filter(|a| a.executor == kind)
                .cloned()
                .collect::<Vec<_>>()
        };
        let mut highest = self
            .local
            .recover(&of(ExecutorKind::Local), minted_below, retained)
            .await?;
        if let Some(kube) = &self.kubernetes {
            // A cluster that cannot be listed must not cost the local executor its fences.
            match kube
                .recover(&of(ExecutorKind::Kubernetes), minted_below, retained)
                .await
            {
                Ok(seen) => highest = highest.max(seen),
                Err(error) => tracing::error!(
                    %error,
                    "kubernetes recovery failed: it is retried in the background; no Pod is created until it succeeds"
                ),
            }
        }
        Ok(highest)
    }
}

//! The executor port: how the driver starts, stops and re-adopts attempts, and how
//! verdicts come back. Only adapters (`local`, later `kubernetes`) know processes or Pods;
//! everything else sees a [`Verdict`] with its failure class.

pub mod fake;
pub mod kubernetes;
pub mod local;

use std::future::Future;

use crate::engine::{Fence, KillReason, RunId, Verdict};
use crate::store::records::LaunchRecord;

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

    /// Asks the attempt to stop. Idempotent; succeeds when there is nothing left to stop.
    fn kill(
        &self,
        fence: Fence,
        reason: KillReason,
    ) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// Re-adoption after a restart: resume supervising a confirmed attempt, or report the
    /// verdict it left, or report it `lost`. Never starts anything.
    fn adopt(&self, adoption: &Adoption) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// Removes a finished attempt's traces (for the local executor: its directory and
    /// logs). Idempotent; refuses while the attempt still runs.
    fn clean_up(&self, fence: Fence) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// Stops every attempt still running whose fence is in `from..below` — fences this
    /// store never minted (a newer lineage after a restore from an older backup): foreign
    /// zombies. `below` is the counter after it was raised at start, so nothing minted
    /// since is touched. Returns their fences.
    fn stop_foreign(
        &self,
        from: Fence,
        below: Fence,
    ) -> impl Future<Output = Result<Vec<Fence>, ExecutorError>> + Send;

    /// The highest fence this executor has ever seen, so the counter can be raised above it.
    fn highest_fence(&self) -> Result<Option<Fence>, ExecutorError>;
}

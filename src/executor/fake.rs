//! A deterministic in-memory executor for tests and benchmarks: every launch is
//! confirmed at once and answered with the verdict a script chooses, so the driver,
//! store and outbox can be exercised without processes. Faults are injected by the script
//! (a failure class, or a launch the executor refuses).

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::{Adoption, Executor, ExecutorError, Report};
use crate::engine::{Fence, KillReason, Outcome, Verdict};
use crate::store::records::LaunchRecord;

/// What the fake does with one launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Script {
    /// Confirm the launch and report this outcome at once.
    Finish(Outcome),
    /// Refuse the delivery (the executor is "unavailable").
    Refuse(String),
    /// Confirm the launch and never report: an executor that lost track of the attempt,
    /// which only the engine's backstop ends.
    Hang,
}

type Chooser = dyn Fn(&LaunchRecord) -> Script + Send + Sync;

#[derive(Clone)]
pub struct FakeExecutor {
    reports: mpsc::Sender<Report>,
    choose: Arc<Chooser>,
    highest: Arc<Mutex<Option<Fence>>>,
    /// Re-adoption reports nothing either (see `hanging`).
    adopt_hangs: bool,
}

impl FakeExecutor {
    pub fn new(
        reports: mpsc::Sender<Report>,
        choose: impl Fn(&LaunchRecord) -> Script + Send + Sync + 'static,
    ) -> Self {
        FakeExecutor {
            reports,
            choose: Arc::new(choose),
            highest: Arc::new(Mutex::new(None)),
            adopt_hangs: false,
        }
    }

    /// Confirms every launch and never reports, not even for an attempt re-adopted after
    /// a restart.
    pub fn hanging(reports: mpsc::Sender<Report>) -> Self {
        FakeExecutor {
            adopt_hangs: true,
            ..FakeExecutor::new(reports, |_| Script::Hang)
        }
    }

    /// Every launch succeeds.
    pub fn succeeding(reports: mpsc::Sender<Report>) -> Self {
        FakeExecutor::new(reports, |_| Script::Finish(Outcome::Succeeded))
    }
}

impl Executor for FakeExecutor {
    async fn launch(&self, order: &LaunchRecord) -> Result<(), ExecutorError> {
        if let Ok(mut highest) = self.highest.lock() {
            *highest = (*highest).max(Some(order.fence));
        }
        match (self.choose)(order) {
            Script::Refuse(reason) => Err(ExecutorError::Unavailable(reason)),
            Script::Hang => Ok(()),
            Script::Finish(outcome) => {
                let now = crate::clock::now();
                let verdict = Verdict {
                    started: !matches!(
                        outcome,
                        Outcome::Failed(
                            crate::engine::FailureClass::InfraNeverStarted
                                | crate::engine::FailureClass::Config
                        )
                    ),
                    reason: format!("fake: {outcome:?}"),
                    exit_code: matches!(outcome, Outcome::Succeeded).then_some(0),
                    started_at: Some(now),
                    finished_at: now,
                    outcome,
                };
                let report = Report {
                    run: order.run,
                    step: usize::from(order.step),
                    fence: order.fence,
                    verdict,
                };
                let reports = self.reports.clone();
                // Reported after the launch is acknowledged, as a real executor would.
                tokio::spawn(async move {
                    let _ = reports.send(report).await;
                });
                Ok(())
            }
        }
    }

    async fn kill(&self, _target: super::Target, _reason: KillReason) -> Result<(), ExecutorError> {
        Ok(())
    }

    async fn adopt(&self, adoption: &Adoption) -> Result<(), ExecutorError> {
        if self.adopt_hangs {
            return Ok(());
        }
        let verdict = Verdict {
            outcome: Outcome::Failed(crate::engine::FailureClass::Lost),
            started: true,
            reason: "fake executor keeps nothing across restarts".into(),
            exit_code: None,
            started_at: None,
            finished_at: crate::clock::now(),
        };
        let report = Report {
            run: adoption.run,
            step: adoption.step,
            fence: adoption.fence,
            verdict,
        };
        let _ = self.reports.send(report).await;
        Ok(())
    }

    async fn clean_up(&self, _target: super::Target) -> Result<(), ExecutorError> {
        Ok(())
    }

    async fn recover(
        &self,
        _inflight: &[Adoption],
        _minted_below: Fence,
        _retained: &super::Retained,
    ) -> Result<Option<Fence>, ExecutorError> {
        Ok(self.highest.lock().ok().and_then(|h| *h))
    }
}

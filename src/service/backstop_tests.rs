//! The engine's backstop, kept in the driver's memory: it still fires twice (a kill
//! request, then `lost`) for an attempt whose executor never reports, and it is rebuilt
//! from the running attempt's record after a restart.

use std::time::Duration;

use super::{Running, Settings, StateDir, start_with};
use crate::engine::{Attempt, AttemptState, FailureClass, KillReason, Outcome, RunId};
use crate::executor::fake::FakeExecutor;

const PIPELINE: &str = "name: p\nsteps:\n  - name: hangs\n    timeout: 1s\n    run: [/bin/true]\n";

async fn service(dir: &std::path::Path) -> Running {
    let mut settings = Settings::default();
    settings.engine.backstop_slack = Duration::from_millis(200);
    start_with(StateDir::new(dir), settings, |reports| {
        Ok(FakeExecutor::hanging(reports))
    })
    .await
    .expect("start")
}

async fn submit(running: &Running) -> RunId {
    super::sweep_tests::submit_yaml(running, PIPELINE).await
}

/// The run's first attempt once `done` holds for it (at most 10 s).
async fn first_attempt(running: &Running, id: RunId, done: impl Fn(&Attempt) -> bool) -> Attempt {
    for _ in 0..1000 {
        let stored = super::sweep_tests::stored_run(running, id);
        if let Some(attempt) = stored.and_then(|s| s.steps[0].attempts.first().cloned())
            && done(&attempt)
        {
            return attempt;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("run {id}: its first attempt never got there");
}

fn running(attempt: &Attempt) -> bool {
    matches!(attempt.state, AttemptState::Running { .. })
}

fn finished(attempt: &Attempt) -> bool {
    !attempt.is_in_flight()
}

fn assert_ended_by_the_backstop(attempt: &Attempt) {
    assert_eq!(
        attempt.kill,
        Some(KillReason::Timeout),
        "first firing: a kill request"
    );
    let AttemptState::Finished(verdict) = &attempt.state else {
        panic!("not finished: {attempt:?}");
    };
    assert_eq!(verdict.outcome, Outcome::Failed(FailureClass::Lost));
    assert!(verdict.reason.contains("backstop"), "{}", verdict.reason);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_no_executor_reports_on_is_asked_to_stop_then_judged_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let running = service(dir.path()).await;
    let id = submit(&running).await;
    let attempt = first_attempt(&running, id, finished).await;
    assert_ended_by_the_backstop(&attempt);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_attempts_backstop_is_rebuilt_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = service(dir.path()).await;
    let id = submit(&first).await;
    let confirmed = first_attempt(&first, id, running).await;
    first.stop().await;
    let second = service(dir.path()).await;
    let attempt = first_attempt(&second, id, finished).await;
    assert_ended_by_the_backstop(&attempt);
    let AttemptState::Running { backstop_due, .. } = confirmed.state else {
        unreachable!("waited for a running attempt");
    };
    let AttemptState::Finished(verdict) = &attempt.state else {
        unreachable!("checked above");
    };
    assert!(
        verdict.finished_at >= backstop_due,
        "not before its backstop was due"
    );
    second.stop().await;
}

//! The sweep against the real driver, store and outbox, with the fake executor: the
//! double-submit guard, a disabled sweep, restore-or-quarantine, operator release and
//! discard.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{Running, Settings, StateDir, start_with};
use crate::engine::{AutoRetrySettings, FailureClass, Outcome, RunId, RunState};
use crate::executor::fake::{FakeExecutor, Script};
use crate::pipeline::{self, Format};
use crate::store::records::{PipelineSource, SourceFormat};

const PIPELINE: &str = "name: p\nsteps:\n  - name: pull\n    run: [/bin/true]\n  - name: after\n    needs: [pull]\n    run: [/bin/true]\n";

/// A service whose launches fail never-started until `pullable` is set.
async fn service(
    dir: &std::path::Path,
    auto_retry: AutoRetrySettings,
) -> (Running, Arc<AtomicBool>) {
    let pullable = Arc::new(AtomicBool::new(false));
    let mut settings = Settings::default();
    settings.replace_live(crate::config::Live {
        auto_retry,
        ..Default::default()
    });
    settings.engine.infra_retries = 0;
    let flag = pullable.clone();
    let running = start_with(StateDir::new(dir), settings, move |reports| {
        Ok(FakeExecutor::new(reports, move |_| {
            if flag.load(Ordering::SeqCst) {
                Script::Finish(Outcome::Succeeded)
            } else {
                Script::Finish(Outcome::Failed(FailureClass::InfraNeverStarted))
            }
        }))
    })
    .await
    .expect("start");
    (running, pullable)
}

fn enabled() -> AutoRetrySettings {
    AutoRetrySettings {
        enabled: true,
        interval: Duration::from_secs(3600),
        backoff_initial: Duration::from_secs(1),
        backoff_max: Duration::from_secs(1),
        ..AutoRetrySettings::default()
    }
}

async fn submit(running: &Running) -> RunId {
    submit_yaml(running, PIPELINE).await
}

/// Submits a pipeline given as YAML, as the API does once it parsed it.
pub(super) async fn submit_yaml(running: &Running, text: &str) -> RunId {
    let outcome = pipeline::parse(text, Format::Yaml).expect("valid");
    let source = PipelineSource {
        format: SourceFormat::Yaml,
        text: text.into(),
        params: Some(Vec::new()),
    };
    running
        .service
        .submit(
            source,
            Arc::new(outcome.pipeline.clone()),
            "local".into(),
            crate::engine::RunAdmission::of(&outcome.pipeline),
            None,
        )
        .await
        .expect("submit")
        .id
}

/// The run as the store holds it now.
pub(super) fn stored_run(running: &Running, id: RunId) -> Option<crate::store::records::StoredRun> {
    running
        .service
        .store
        .read()
        .expect("read")
        .run(id)
        .expect("run")
}

async fn wait_state(running: &Running, id: RunId, state: RunState) -> crate::engine::RunHeader {
    for _ in 0..400 {
        let header = running
            .service
            .store
            .read()
            .expect("read")
            .run_header(id)
            .expect("header");
        if let Some(header) = header.filter(|h| h.state == state) {
            return header;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("run {id} never became {}", state.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_passes_resubmit_a_run_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (running, _) = service(dir.path(), enabled()).await;
    let id = submit(&running).await;
    wait_state(&running, id, RunState::DeadLettered).await;
    let (a, b) = tokio::join!(running.service.sweep_pass(), running.service.sweep_pass());
    let (a, b) = (a.expect("pass"), b.expect("pass"));
    assert_eq!(a.resubmitted + b.resubmitted, 1, "{a:?} {b:?}");
    let header = wait_state(&running, id, RunState::DeadLettered).await;
    assert_eq!(header.auto_retry.attempts, 1);
    let stored = stored_run(&running, id).expect("some");
    assert_eq!(
        stored.steps[0].attempts.len(),
        2,
        "one fresh attempt, not two"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_sweep_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = AutoRetrySettings {
        enabled: false,
        interval: Duration::from_millis(20),
        ..enabled()
    };
    let (running, _) = service(dir.path(), settings).await;
    let id = submit(&running).await;
    wait_state(&running, id, RunState::DeadLettered).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let header = wait_state(&running, id, RunState::DeadLettered).await;
    assert_eq!(header.auto_retry.attempts, 0);
    assert_eq!(
        running.service.sweep_stats.passes.load(Ordering::Relaxed),
        0
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_then_quarantine_then_release_and_discard() {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = AutoRetrySettings {
        max: 1,
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(10),
        ..enabled()
    };
    let (running, pullable) = service(dir.path(), settings).await;
    let service = &running.service;
    let id = submit(&running).await;
    wait_state(&running, id, RunState::DeadLettered).await;
    assert_eq!(service.sweep_pass().await.expect("pass").resubmitted, 1);
    wait_state(&running, id, RunState::DeadLettered).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pass = service.sweep_pass().await.expect("pass");
    assert_eq!(pass.quarantined, 1, "{pass:?}");
    let header = wait_state(&running, id, RunState::Quarantined).await;
    assert!(header.auto_retry.quarantined.is_some());
    // A pass racing an operator's release: the run gets one fresh try, not two.
    pullable.store(true, Ordering::SeqCst);
    let (pass, released) = tokio::join!(service.sweep_pass(), service.release(id, "ops".into()));
    released.expect("release");
    assert_eq!(pass.expect("pass").resubmitted, 0);
    let header = wait_state(&running, id, RunState::Succeeded).await;
    assert_eq!(header.auto_retry.attempts, 2);
    let history = service
        .store
        .read()
        .expect("read")
        .history(id, None, 1000)
        .expect("history");
    let kinds: Vec<_> = history.iter().map(|(_, r)| r.kind.as_str()).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "auto_retry_scheduled")
            .count(),
        2,
        "{kinds:?}"
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "auto_retry_quarantined")
            .count(),
        1
    );
    // Releasing or discarding a run that is not quarantined is refused.
    assert!(service.release(id, "ops".into()).await.is_err());
    assert!(
        service
            .discard_run(id, "ops".into(), "x".into())
            .await
            .is_err()
    );

    // Discard: a second run, quarantined at once (max 0 via a fresh service is not needed:
    // spend its budget), then discarded and never picked up again.
    pullable.store(false, Ordering::SeqCst);
    let other = submit(&running).await;
    wait_state(&running, other, RunState::DeadLettered).await;
    service.sweep_pass().await.expect("pass");
    wait_state(&running, other, RunState::DeadLettered).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    service.sweep_pass().await.expect("pass");
    wait_state(&running, other, RunState::Quarantined).await;
    service
        .discard_run(other, "ops".into(), "registry retired".into())
        .await
        .expect("discard");
    let header = wait_state(&running, other, RunState::DeadLettered).await;
    assert!(header.auto_retry.discarded.is_some());
    let pass = service.sweep_pass().await.expect("pass");
    assert_eq!(
        (pass.scanned, pass.resubmitted, pass.quarantined),
        (0, 0, 0),
        "{pass:?}"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_pipeline_no_longer_restores_is_quarantined_not_resubmitted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (running, _) = service(dir.path(), enabled()).await;
    let id = submit(&running).await;
    wait_state(&running, id, RunState::DeadLettered).await;
    // The stored document no longer validates (as after a format change).
    let mut tx = running.service.store.write().expect("write");
    let broken = PipelineSource {
        format: SourceFormat::Yaml,
        text: "name: p\nsteps: []\n".into(),
        params: Some(Vec::new()),
    };
    tx.put_pipeline(id, &broken).expect("put");
    tx.commit().expect("commit");
    let pass = running.service.sweep_pass().await.expect("pass");
    assert_eq!((pass.resubmitted, pass.quarantined), (0, 1), "{pass:?}");
    let header = wait_state(&running, id, RunState::Quarantined).await;
    let reason = header.auto_retry.quarantined.expect("reason");
    assert!(reason.contains("cannot be restored"), "{reason}");
    running.stop().await;
}

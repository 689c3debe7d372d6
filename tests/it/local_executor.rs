//! The local executor on its own: real `scarab supervise` processes, the launch handshake
//! and re-adoption decisions, without the rest of the service.

use crate::common;
use crate::edge::{Tmpfs, fill};

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use scarab::engine::{Fence, Outcome, RunId};
use scarab::executor::local::files::{self, Spec};
use scarab::executor::local::{LocalExecutor, StepSettings};
use scarab::executor::{Adoption, Executor, Report, Target};
use scarab::store::records::{ExecutorKind, LaunchAction, LaunchRecord};
use tokio::sync::mpsc;

fn order(fence: u64, out: &Path) -> LaunchRecord {
    LaunchRecord {
        run: RunId(42),
        step: 0,
        step_name: "s".into(),
        attempt: 1,
        fence: Fence(fence),
        action: LaunchAction::Local {
            argv: vec![
                "sh".into(),
                "-c".into(),
                format!("echo $SCARAB_FENCE >> {}", out.display()),
            ],
            env: vec![],
            secrets: vec![],
            workdir: None,
        },
        timeout_ms: 60_000,
    }
}

/// A full disk cuts an append to an attempt's record file short part-way (its bytes up to
/// the last page that could be had): what it wrote is taken back, so the file still reads
/// as the records before it, and once there is room the next record lands whole behind
/// them.
#[test]
fn an_append_a_full_disk_cuts_short_is_taken_back() {
    let root = common::tempdir().expect("tempdir");
    let disk = root.path().join("disk");
    // Four pages of 4 KiB.
    let Some(_mounted) = Tmpfs::mount(&disk, "16k") else {
        return;
    };
    let dir = disk.join("7");
    std::fs::create_dir(&dir).expect("attempt dir");
    // A spec of about 3 KiB: its page of the record file has about 1 KiB left.
    let mut long = Spec {
        launch: order(7, &root.path().join("out")),
        kill_grace_ms: 500,
    };
    if let LaunchAction::Local { argv, .. } = &mut long.launch.action {
        argv.push("x".repeat(3000));
    }
    files::write_spec(&dir, &long).expect("spec");
    let spec_len = std::fs::metadata(dir.join(files::ATTEMPT))
        .expect("spec")
        .len();
    assert!((3000..4096).contains(&spec_len), "{spec_len}");
    // Every other page taken.
    let filler = disk.join("filler");
    fill(&filler);
    // A verdict of about 2 KiB needs a page more than there is.
    let big = scarab::engine::Verdict {
        outcome: Outcome::Succeeded,
        started: true,
        reason: "r".repeat(2000),
        exit_code: Some(0),
        started_at: None,
        finished_at: scarab::engine::Timestamp(1_796_624_821_539),
    };
    let error = files::write_verdict(&dir, files::Layout::Records, &big).expect_err("no room");
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    assert_eq!(
        std::fs::metadata(dir.join(files::ATTEMPT))
            .expect("file")
            .len(),
        spec_len
    );
    assert_eq!(files::read_verdict(&dir).expect("read"), None);
    assert_eq!(files::read_spec(&dir).expect("read"), Some(long));

    std::fs::remove_file(&filler).expect("room again");
    let me = files::ProcessIdentity::of(std::process::id() as i32).expect("own identity");
    files::write_supervisor(&dir, files::Layout::Records, &me).expect("supervisor");
    files::write_verdict(&dir, files::Layout::Records, &big).expect("verdict");
    assert_eq!(files::read_verdict(&dir).expect("read"), Some(big));
    let supervision = files::read_supervision(&dir)
        .expect("read")
        .expect("recorded");
    assert_eq!(supervision.supervisor, me);
}

fn executor(attempts: &Path) -> (LocalExecutor, mpsc::Receiver<Report>) {
    let (tx, rx) = mpsc::channel(16);
    let executor = LocalExecutor::new(
        attempts.to_path_buf(),
        common::BIN.into(),
        StepSettings {
            kill_grace: Duration::from_secs(1),
            ..StepSettings::default()
        },
        tx,
    )
    .expect("executor");
    (executor, rx)
}

/// Runs a supervisor for `fence` whose service goes away before the launch handshake.
fn abort_at_handshake(attempts: &Path, launch: LaunchRecord) {
    let dir = files::attempt_dir(attempts, launch.fence);
    std::fs::create_dir_all(&dir).expect("dir");
    files::write_spec(
        &dir,
        &Spec {
            launch,
            kill_grace_ms: 1000,
        },
    )
    .expect("spec");
    let status = Command::new(common::BIN)
        .arg("supervise")
        .arg(&dir)
        .stdin(Stdio::null())
        .status()
        .expect("supervise");
    assert!(status.success());
    assert!(
        dir.join(files::ABORTED).exists(),
        "the supervisor recorded that it gave up"
    );
    assert!(
        !files::supervisor_recorded(&dir),
        "the supervisor's record is gone again"
    );
    assert!(!files::verdict_recorded(&dir), "no verdict: nothing ran");
}

/// The adoption of `fence` as run 42's first step (what `order` launches).
fn adoption(fence: u64) -> Adoption {
    Adoption {
        run: RunId(42),
        step: 0,
        fence: Fence(fence),
        executor: ExecutorKind::Local,
    }
}

/// The next report is `fence`'s success, and its step ran once (it appends the fence to
/// `out`).
async fn succeeded_once(
    reports: &mut mpsc::Receiver<Report>,
    fence: u64,
    out: &Path,
    older_build: bool,
) {
    let report = next_report(reports).await;
    assert_eq!(report.fence, Fence(fence));
    assert_eq!(
        report.verdict.outcome,
        Outcome::Succeeded,
        "older build: {older_build}: {:?}",
        report.verdict
    );
    assert_eq!(
        std::fs::read_to_string(out).expect("out"),
        format!("{fence}\n")
    );
}

async fn next_report(reports: &mut mpsc::Receiver<Report>) -> Report {
    tokio::time::timeout(Duration::from_secs(30), reports.recv())
        .await
        .expect("a report in time")
        .expect("a report")
}

#[tokio::test]
async fn a_confirmed_attempt_cut_at_the_handshake_runs_once_under_its_fence_on_adoption() {
    let dir = common::tempdir().expect("tempdir");
    let attempts = dir.path().join("state").join("attempts");
    let (executor, mut reports) = executor(&attempts);
    // Cut under this build, and under an older one (its spec in `spec.json`).
    for (fence, older_build) in [(7, false), (8, true)] {
        let out = dir.path().join(format!("out-{fence}"));
        abort_at_handshake(&attempts, order(fence, &out));
        let attempt_dir = files::attempt_dir(&attempts, Fence(fence));
        if older_build {
            make_older_build(&attempt_dir);
        }
        let adoption = adoption(fence);
        executor.adopt(&adoption).await.expect("adopt");
        succeeded_once(&mut reports, fence, &out, older_build).await;
        // A supervisor of this build keeps the layout of the service that wrote the spec
        // (during an upgrade, that service may still be the one reading it).
        assert_eq!(
            attempt_dir.join(files::LEGACY_VERDICT).exists(),
            older_build
        );
        assert_eq!(attempt_dir.join(files::ATTEMPT).exists(), !older_build);
    }
}

/// A supervisor of an older build that gave up at the handshake wrote `aborted`, then
/// died before it removed its record: the step never started, and is started once,
/// whether the store still holds the launch unconfirmed (redelivered) or confirmed
/// (re-adopted).
#[tokio::test]
async fn an_older_builds_aborted_attempt_with_its_record_left_starts_once() {
    let dir = common::tempdir().expect("tempdir");
    let attempts = dir.path().join("state").join("attempts");
    let (executor, mut reports) = executor(&attempts);
    for (fence, confirmed) in [(31, false), (32, true)] {
        let out = dir.path().join(format!("out-{fence}"));
        let attempt_dir = new_attempt(&attempts, fence, &out);
        make_older_build(&attempt_dir);
        let dead = files::ProcessIdentity {
            pid: 999_998,
            start_ticks: 1,
        };
        files::write_supervisor(&attempt_dir, files::Layout::Legacy, &dead).expect("record");
        files::write_atomic(&attempt_dir, files::ABORTED, b"", false).expect("marker");
        if confirmed {
            executor.adopt(&adoption(fence)).await.expect("adopt");
        } else {
            executor.launch(&order(fence, &out)).await.expect("launch");
            executor.launch_recorded(Fence(fence));
        }
        succeeded_once(&mut reports, fence, &out, true).await;
    }
}

#[tokio::test]
async fn an_unconfirmed_launch_waits_for_the_store_before_the_step_starts() {
    let dir = common::tempdir().expect("tempdir");
    let attempts = dir.path().join("state").join("attempts");
    let out = dir.path().join("out");
    abort_at_handshake(&attempts, order(9, &out));
    let (executor, mut reports) = executor(&attempts);
    // The redelivered launch starts a new supervisor, which waits for the handshake.
    executor.launch(&order(9, &out)).await.expect("launch");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !out.exists(),
        "the step must not start before the launch is recorded"
    );
    executor.launch_recorded(Fence(9));
    let report = next_report(&mut reports).await;
    assert_eq!(report.verdict.outcome, Outcome::Succeeded);
    assert_eq!(std::fs::read_to_string(&out).expect("out"), "9\n");
    // Launching the same fence again never starts it twice: the verdict is reported again.
    executor
        .launch(&order(9, &out))
        .await
        .expect("launch again");
    let again = next_report(&mut reports).await;
    assert_eq!(again.verdict.outcome, Outcome::Succeeded);
    assert_eq!(std::fs::read_to_string(&out).expect("out"), "9\n");
}

#[tokio::test]
async fn a_confirmed_attempt_with_no_trace_is_lost_and_a_foreign_directory_is_not_adopted() {
    let dir = common::tempdir().expect("tempdir");
    let attempts = dir.path().join("state").join("attempts");
    let (executor, mut reports) = executor(&attempts);
    let adoption = adoption(3);
    executor.adopt(&adoption).await.expect("adopt");
    let report = next_report(&mut reports).await;
    assert_eq!(
        report.verdict.class(),
        Some(scarab::engine::FailureClass::Lost)
    );

    // A directory under fence 4 that belongs to another run.
    let out = dir.path().join("out");
    abort_at_handshake(&attempts, order(4, &out));
    let other = Adoption {
        run: RunId(43),
        step: 0,
        fence: Fence(4),
        executor: ExecutorKind::Local,
    };
    executor.adopt(&other).await.expect("adopt");
    let report = next_report(&mut reports).await;
    assert_eq!(report.run, RunId(43));
    assert_eq!(
        report.verdict.class(),
        Some(scarab::engine::FailureClass::Lost)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!out.exists(), "the other run's step was not started");
}

/// `fence`'s attempt directory with `order`'s spec written, as a launch leaves it.
fn new_attempt(attempts: &Path, fence: u64, out: &Path) -> std::path::PathBuf {
    let dir = files::attempt_dir(attempts, Fence(fence));
    std::fs::create_dir_all(&dir).expect("dir");
    let spec = Spec {
        launch: order(fence, out),
        kill_grace_ms: 1000,
    };
    files::write_spec(&dir, &spec).expect("spec");
    dir
}

/// An attempt directory as an older build left it: `spec.json`, `supervisor.json` in
/// pretty JSON, `verdict.json` (this build keeps all of it in `attempt.jsonl`).
/// Called with the spec alone written: the spec record is the whole of an older
/// `spec.json`.
fn make_older_build(dir: &Path) {
    std::fs::rename(dir.join(files::ATTEMPT), dir.join(files::LEGACY_SPEC)).expect("rename");
}

#[tokio::test]
async fn an_unconfirmed_launch_whose_supervisor_died_before_the_step_is_started_afresh() {
    let dir = common::tempdir().expect("tempdir");
    let attempts = dir.path().join("state").join("attempts");
    let (executor, mut reports) = executor(&attempts);
    // A supervisor recorded itself, then died (power cut, OOM kill) before its handshake:
    // of this build, and of an older one.
    for (fence, older_build) in [(11, false), (12, true)] {
        let out = dir.path().join(format!("out-{fence}"));
        let attempt_dir = new_attempt(&attempts, fence, &out);
        let dead = files::ProcessIdentity {
            pid: 999_999,
            start_ticks: 1,
        };
        if older_build {
            make_older_build(&attempt_dir);
        }
        files::write_supervisor(&attempt_dir, files::Layout::of(&attempt_dir), &dead)
            .expect("record");
        assert!(files::supervisor_recorded(&attempt_dir));
        assert!(!files::child_recorded(&attempt_dir));
        executor.launch(&order(fence, &out)).await.expect("launch");
        executor.launch_recorded(Fence(fence));
        succeeded_once(&mut reports, fence, &out, older_build).await;
    }
}

#[tokio::test]
async fn a_stop_during_the_handshake_means_the_step_never_starts() {
    let dir = common::tempdir().expect("tempdir");
    let attempts = dir.path().join("state").join("attempts");
    let out = dir.path().join("out");
    let (executor, mut reports) = executor(&attempts);
    executor.launch(&order(13, &out)).await.expect("launch");
    executor
        .kill(
            Target {
                executor: ExecutorKind::Local,
                fence: Fence(13),
            },
            scarab::engine::KillReason::Cancel,
        )
        .await
        .expect("kill");
    let report = next_report(&mut reports).await;
    assert_eq!(
        report.verdict.outcome,
        Outcome::Stopped,
        "{:?}",
        report.verdict
    );
    assert!(!report.verdict.started);
    // Even a late go byte cannot start it now.
    executor.launch_recorded(Fence(13));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!out.exists(), "the step never ran");
}

/// A supervisor from the zygote releases an attempt's lock once its verdict is written
/// and goes on to the next attempt without exiting. An adopted attempt is over at that
/// release, not when the process ends. This test process plays that supervisor: one of
/// this build (it locks the attempt directory), one of an older build (it held a `lock`
/// file and wrote pretty JSON), as a service finds them after an upgrade, and one of this
/// build caught half-way through appending its record, which the service waits for
/// rather than judging the attempt by.
#[tokio::test]
async fn an_adopted_attempt_ends_when_its_supervisor_releases_it_though_the_process_lives_on() {
    let dir = common::tempdir().expect("tempdir");
    let attempts = dir.path().join("state").join("attempts");
    let out = dir.path().join("out");
    let (executor, mut reports) = executor(&attempts);
    for (fence, older_build, appending) in
        [(21, false, false), (22, true, false), (23, false, true)]
    {
        let attempt_dir = new_attempt(&attempts, fence, &out);
        let me = files::ProcessIdentity::of(std::process::id() as i32).expect("own identity");
        let lock = if older_build {
            make_older_build(&attempt_dir);
            let lock = std::fs::File::create(attempt_dir.join(files::LEGACY_LOCK)).expect("lock");
            files::write_supervisor(&attempt_dir, files::Layout::Legacy, &me).expect("record");
            lock
        } else {
            files::write_supervisor(&attempt_dir, files::Layout::Records, &me).expect("record");
            files::open_lock(&attempt_dir).expect("lock")
        };
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).expect("flock");
        // Only half of the record's line is there when the service looks; the rest
        // lands 300 ms later.
        let finisher = appending.then(|| {
            let path = attempt_dir.join(files::ATTEMPT);
            let whole = std::fs::read(&path).expect("record file");
            let spec_end = whole.iter().position(|&b| b == b'\n').expect("spec line") + 1;
            let half = spec_end + (whole.len() - spec_end) / 2;
            std::fs::write(&path, &whole[..half]).expect("torn record");
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                let mut file = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .expect("open");
                std::io::Write::write_all(&mut file, &whole[half..]).expect("the rest");
            })
        });

        let adoption = adoption(fence);
        executor.adopt(&adoption).await.expect("adopt");
        if let Some(finisher) = finisher {
            finisher.join().expect("finisher");
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(
            reports.try_recv().is_err(),
            "still supervised: no verdict (older build: {older_build}, appending: {appending})"
        );

        let verdict = scarab::engine::Verdict {
            outcome: Outcome::Succeeded,
            started: true,
            reason: "exited 0".into(),
            exit_code: Some(0),
            started_at: None,
            finished_at: scarab::clock::now(),
        };
        files::write_verdict(&attempt_dir, files::Layout::of(&attempt_dir), &verdict)
            .expect("verdict");
        drop(lock);
        let report = next_report(&mut reports).await;
        assert_eq!(report.fence, Fence(fence));
        assert_eq!(report.verdict.outcome, Outcome::Succeeded);
    }
    assert!(
        files::ProcessIdentity::of(std::process::id() as i32).is_some(),
        "the supervisor lives on"
    );
}

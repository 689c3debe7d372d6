//! `scarab explain-pod FILE [--now RFC3339] [--container NAME] -o json` on captured Pods
//! (tests/fixtures/pods): the §9 contract, judged by the executor's own classifier.

use crate::common;
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pods")
        .join(name)
}

fn explain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_scarab"))
        .arg("explain-pod")
        .args(args)
        .output()
        .expect("running scarab explain-pod")
}

/// Runs explain-pod on a fixture as of `now` and returns its JSON line.
fn judged(name: &str, now: &str, container: Option<&str>) -> Value {
    let path = fixture(name);
    let path = path.to_str().expect("utf-8 path");
    let mut args = vec![path, "--now", now, "-o", "json"];
    if let Some(container) = container {
        args.extend(["--container", container]);
    }
    let output = explain(&args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{name}: exit {:?}, stderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.lines().count(), 1, "{name}: one line only: {stdout}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{name}: {e}: {stdout}"))
}

/// (fixture, now, container, verdict, class, started, rule)
type Case = (
    &'static str,
    &'static str,
    Option<&'static str>,
    &'static str,
    Option<&'static str>,
    bool,
    &'static str,
);

const END: &str = "2025-03-01T10:03:40Z";

const CASES: &[Case] = &[
    ("running.json", END, None, "running", None, true, "running"),
    (
        "succeeded.json",
        END,
        None,
        "succeeded",
        None,
        true,
        "succeeded",
    ),
    (
        "step-exit-1.json",
        END,
        None,
        "failed",
        Some("step"),
        true,
        "main-terminated-nonzero",
    ),
    (
        "oomkilled.json",
        END,
        None,
        "failed",
        Some("infra_post_start"),
        true,
        "oom-killed",
    ),
    // Scarab writes no init container: a failing one was injected, and the step never ran.
    (
        "init-container-failed.json",
        END,
        None,
        "failed",
        Some("infra_never_started"),
        false,
        "init-container-failed",
    ),
    // ImagePullBackOff: grace 5m from scheduling at 10:00:00.
    (
        "image-pull-backoff.json",
        "2025-03-01T10:04:59Z",
        None,
        "pending",
        None,
        false,
        "image-pull-waiting",
    ),
    (
        "image-pull-backoff.json",
        "2025-03-01T10:05:00Z",
        None,
        "failed",
        Some("infra_never_started"),
        false,
        "image-pull-expired",
    ),
    // CreateContainerConfigError (YAML): grace 2m.
    (
        "create-container-config-error.yaml",
        "2025-03-01T10:01:00Z",
        None,
        "pending",
        None,
        false,
        "create-config-waiting",
    ),
    (
        "create-container-config-error.yaml",
        "2025-03-01T10:02:00Z",
        None,
        "failed",
        Some("infra_never_started"),
        false,
        "create-config-expired",
    ),
    (
        "invalid-image-name.json",
        "2025-03-01T10:00:30Z",
        None,
        "failed",
        Some("config"),
        false,
        "image-unusable",
    ),
    // A missing Secret volume never produces CreateContainerConfigError: overall 30m deadline.
    (
        "container-creating-missing-secret.json",
        "2025-03-01T10:29:00Z",
        None,
        "pending",
        None,
        false,
        "pending",
    ),
    (
        "container-creating-missing-secret.json",
        "2025-03-01T10:30:00Z",
        None,
        "failed",
        Some("infra_never_started"),
        false,
        "pending-expired",
    ),
    // activeDeadlineSeconds: 60 never fires without startTime; Unschedulable decides at 10m.
    (
        "unschedulable-with-deadline.yaml",
        "2025-03-01T10:05:00Z",
        None,
        "pending",
        None,
        false,
        "unschedulable-waiting",
    ),
    (
        "unschedulable-with-deadline.yaml",
        "2025-03-01T10:10:00Z",
        None,
        "failed",
        Some("infra_never_started"),
        false,
        "unschedulable-expired",
    ),
    (
        "evicted-running.json",
        END,
        None,
        "failed",
        Some("infra_post_start"),
        true,
        "evicted-after-start",
    ),
    (
        "evicted-pending.json",
        END,
        None,
        "failed",
        Some("infra_never_started"),
        false,
        "evicted-before-start",
    ),
    (
        "admission-rejected-outofcpu.json",
        END,
        None,
        "failed",
        Some("infra_never_started"),
        false,
        "kubelet-admission-rejected",
    ),
    (
        "preempted-running.json",
        END,
        None,
        "failed",
        Some("infra_post_start"),
        true,
        "disrupted-after-start",
    ),
    (
        "node-shutdown.json",
        END,
        None,
        "failed",
        Some("infra_post_start"),
        true,
        "node-shutdown-after-start",
    ),
    (
        "deadline-exceeded.json",
        END,
        None,
        "failed",
        Some("timeout"),
        true,
        "active-deadline-exceeded",
    ),
    (
        "status-unknown-never-started.json",
        END,
        None,
        "failed",
        Some("infra_never_started"),
        false,
        "status-unknown-never-started",
    ),
    (
        "start-error-1970.json",
        END,
        None,
        "failed",
        Some("config"),
        false,
        "start-error-config",
    ),
    (
        "container-cannot-run.json",
        END,
        None,
        "failed",
        Some("config"),
        false,
        "start-error-config",
    ),
    (
        "deleted-while-running-succeeded.json",
        END,
        None,
        "failed",
        Some("lost"),
        true,
        "deleted-while-running",
    ),
    (
        "failed-node-lost.json",
        END,
        None,
        "failed",
        Some("lost"),
        true,
        "failed-while-running",
    ),
    // The first container is the step by default; --container picks another.
    (
        "two-containers.json",
        END,
        None,
        "failed",
        Some("step"),
        true,
        "other-container-failed",
    ),
    (
        "two-containers.json",
        END,
        Some("uploader"),
        "failed",
        Some("step"),
        true,
        "main-terminated-nonzero",
    ),
];

#[test]
fn fixtures_are_judged_per_the_contract() {
    for &(name, now, container, verdict, class, started, rule) in CASES {
        let got = judged(name, now, container);
        let keys: Vec<&str> = got
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            ["class", "reason", "rule", "started", "verdict"],
            "{name}: keys"
        );
        let want = json!({"verdict": verdict, "class": class, "started": started, "rule": rule});
        let seen = json!({"verdict": got["verdict"], "class": got["class"],
                          "started": got["started"], "rule": got["rule"]});
        assert_eq!(seen, want, "{name} at {now}: {}", got["reason"]);
        assert!(
            got["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{name}: reason"
        );
    }
}

#[test]
fn reasons_name_the_cause() {
    assert_eq!(
        judged("step-exit-1.json", END, None)["reason"],
        "exit code 1"
    );
    assert_eq!(judged("oomkilled.json", END, None)["reason"], "OOMKilled");
    let preempted = judged("preempted-running.json", END, None);
    let reason = preempted["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("PreemptionByScheduler"), "{reason}");
}

#[test]
fn human_output_is_one_short_line() {
    let path = fixture("step-exit-1.json");
    let output = explain(&[path.to_str().expect("utf-8 path"), "--now", END]);
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains("failed (step): exit code 1"), "{stdout}");
}

#[test]
fn bad_input_exits_2_with_a_clear_error() {
    let dir = common::tempdir().expect("temp dir");
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "{\"kind\": \"Pod\", \"status\": ").expect("write");
    let missing = dir.path().join("missing.json");
    let not_a_pod = fixture("not-a-pod.json");
    let running = fixture("running.json");
    let cases: [(Vec<&str>, &str); 5] = [
        (vec![not_a_pod.to_str().expect("path")], "not \"Pod\""),
        (vec![garbage.to_str().expect("path")], "not valid JSON"),
        (vec![missing.to_str().expect("path")], "missing.json"),
        (
            vec![running.to_str().expect("path"), "--now", "soon"],
            "RFC 3339",
        ),
        (
            vec![running.to_str().expect("path"), "--container", "nope"],
            "not in the Pod",
        ),
    ];
    for (args, expected) in cases {
        let output = explain(&[args.as_slice(), &["-o", "json"]].concat());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}: nothing on stdout");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

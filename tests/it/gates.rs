//! Gates and budgets end to end: the real service, real steps, HTTP on loopback, the CLI,
//! and a kill -9 while timers are due.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{BIN, Server, attempts, process_alive, wait_pid_file};
use serde_json::{Value, json};

const WITHIN: Duration = Duration::from_secs(60);

fn gated(name: &str, gate: &str) -> String {
    format!(
        "name: {name}\nsteps:\n  - name: build\n    run: [\"true\"]\n  - name: approve\n    needs: [build]\n    gate: {gate}\n  - name: deploy\n    needs: [approve]\n    run: [\"true\"]\n"
    )
}

fn waiting(run: &Value) -> bool {
    run["state"] == "waiting"
}

fn step<'a>(run: &'a Value, name: &str) -> &'a Value {
    run["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|s| s["name"] == name))
        .unwrap_or_else(|| panic!("no step {name} in {run:#}"))
}

fn count(kinds: &[String], kind: &str) -> usize {
    kinds.iter().filter(|k| *k == kind).count()
}

#[test]
fn approve_by_cli_and_reject_by_api_record_who_and_when_and_bad_decisions_change_nothing() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));

    let id = server.submit(&gated("approve-me", "{message: \"ship it?\"}"));
    let before = server.wait_for(&id, WITHIN, waiting);
    let gate = &step(&before, "approve")["gate"];
    assert_eq!(gate["message"], "ship it?");
    assert!(
        gate["opened_at"].is_string() && gate["decision"].is_null(),
        "{gate}"
    );

    let output = Command::new(BIN)
        .args([
            "approve",
            &id,
            "approve",
            "--comment",
            "green",
            "--by",
            "alice",
        ])
        .args(["--url", &server.url, "--token", &server.token])
        .output()
        .expect("scarab approve");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("approved by admin (alice)"), "{stdout}");

    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let decision = &step(&run, "approve")["gate"]["decision"];
    assert_eq!(decision["outcome"], "approved");
    assert_eq!(decision["by"], "admin (alice)", "the caller, annotated");
    assert_eq!(decision["caller"], "admin");
    assert_eq!(decision["comment"], "green");
    assert!(
        decision["at"].as_str().is_some_and(|at| at.ends_with('Z')),
        "{decision}"
    );
    let kinds = server.history_kinds(&id);
    assert_eq!(count(&kinds, "gate_opened"), 1, "{kinds:?}");
    assert_eq!(count(&kinds, "gate_decided"), 1, "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "run_state"), "{kinds:?}");

    // Already decided: 409, nothing changes.
    let path = format!("/v1/runs/{id}/gates/approve/reject");
    let (status, body) = server.post_json(&path, &json!({"by": "mallory"}));
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("already approved by admin (alice)"),
        "{body}"
    );
    assert_eq!(server.run(&id)["steps"], run["steps"], "nothing changed");

    // Reject through the API.
    let id = server.submit(&gated("reject-me", "{}"));
    server.wait_for(&id, WITHIN, waiting);
    let before = server.run(&id);
    let bad: [(&str, Value, u16, Option<&str>); 6] = [
        (
            &format!("/v1/runs/{id}/gates/build/approve") as &str,
            json!({}),
            400,
            Some("step"),
        ),
        (
            &format!("/v1/runs/{id}/gates/nope/approve"),
            json!({}),
            404,
            Some("step"),
        ),
        (
            "/v1/runs/r00000000000000000000000000/gates/approve/approve",
            json!({}),
            404,
            None,
        ),
        (
            &format!("/v1/runs/{id}/gates/approve/approve"),
            json!({"colour": 1}),
            400,
            Some("body"),
        ),
        (
            &format!("/v1/runs/{id}/gates/approve/approve"),
            json!({"by": ""}),
            400,
            Some("by"),
        ),
        (
            &format!("/v1/runs/{id}/gates/approve/approve"),
            json!({"comment": "x".repeat(5000)}),
            400,
            Some("comment"),
        ),
    ]
    .map(|(p, b, s, f)| (Box::leak(p.to_string().into_boxed_str()) as &str, b, s, f));
    for (path, body, expected, field) in bad {
        let (status, answer) = server.post_json(path, &body);
        assert_eq!(status, expected, "{path} {body}: {answer}");
        assert!(answer["error"].is_string(), "{answer}");
        if let Some(field) = field {
            assert_eq!(answer["field"], field, "{path}: {answer}");
        }
    }
    let after = server.run(&id);
    assert_eq!(
        after["steps"], before["steps"],
        "bad decisions changed nothing"
    );
    assert_eq!(after["state"], "waiting");

    let path = format!("/v1/runs/{id}/gates/approve/reject");
    let (status, body) = server.post_json(&path, &json!({"by": "bob", "comment": "not today"}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decision"]["outcome"], "rejected");
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(step(&run, "approve")["reason"], "GateRejected");
    assert_eq!(step(&run, "deploy")["state"], "skipped");
    let class = &run["failure_classification"];
    assert_eq!(class["category"], "gate", "{class}");
    assert_eq!(class["step"], "approve");
    assert_eq!(class["auto_retryable"], false);
    assert!(
        class["reason"].as_str().unwrap_or("").contains("bob"),
        "{class}"
    );

    // The CLI reports a refused decision and exits non-zero.
    let output = Command::new(BIN)
        .args([
            "reject",
            &id,
            "approve",
            "--url",
            &server.url,
            "--token",
            &server.token,
        ])
        .output()
        .expect("scarab reject");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("already rejected"),
        "{output:?}"
    );
}

#[test]
fn release_expiry_and_backoff_timers_due_while_stopped_fire_once_on_start() {
    let dir = common::tempdir().expect("tempdir");
    let mut server = Server::start(&dir.path().join("state"));
    let released = server.submit(&gated("release", "{auto_release: 3s, expires: 1h}"));
    let expired = server.submit(&gated("expire", "{expires: 3s}"));
    let marker = dir.path().join("marker");
    let retried = server.submit(&format!(
        "name: backoff\nsteps:\n  - name: flaky\n    run: [sh, -c, 'if [ -e {m} ]; then exit 0; fi; touch {m}; exit 1']\n    retry: {{on: step, max: 2, backoff: {{initial: 3s, factor: 1, max: 3s}}}}\n",
        m = marker.display()
    ));
    server.wait_for(&released, WITHIN, waiting);
    server.wait_for(&expired, WITHIN, waiting);
    server.wait_for(&retried, WITHIN, |run| {
        run["steps"][0]["state"] == "retry_waiting"
    });
    server.kill9();
    std::thread::sleep(Duration::from_secs(4));
    server.resume();

    let run = server.wait_terminal(&released, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let decision = &step(&run, "approve")["gate"]["decision"];
    assert_eq!(decision["outcome"], "auto_released");
    assert_eq!(decision["by"], "system");
    assert_eq!(count(&server.history_kinds(&released), "gate_decided"), 1);

    let run = server.wait_terminal(&expired, WITHIN);
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(step(&run, "approve")["reason"], "GateExpired");
    assert_eq!(
        step(&run, "approve")["gate"]["decision"]["outcome"],
        "expired"
    );
    assert_eq!(run["failure_classification"]["category"], "gate");
    assert_eq!(count(&server.history_kinds(&expired), "gate_decided"), 1);

    let run = server.wait_terminal(&retried, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(
        attempts(&run, 0).len(),
        2,
        "the backoff fired once: {run:#}"
    );
    assert_eq!(count(&server.history_kinds(&retried), "attempt_created"), 2);

    // Every run settled; the forward-progress check finds nothing stuck.
    let (status, ready) = server.get("/readyz");
    assert_eq!(status, 200);
    assert_eq!(ready["progress"]["stuck"], json!([]), "{ready}");
}

#[test]
fn a_budget_stops_the_step_that_runs_past_it() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let pid_file = dir.path().join("pid");
    let id = server.submit(&format!(
        "name: budgeted\nbudget: 3s\nsteps:\n  - name: slow\n    run: [sh, -c, 'echo $$ > {}; exec sleep 10']\n  - name: after\n    needs: [slow]\n    run: [\"true\"]\n",
        pid_file.display()
    ));
    let pid = wait_pid_file(&pid_file, WITHIN);
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(
        run["failure_classification"]["category"], "budget",
        "{run:#}"
    );
    assert_eq!(run["failure_classification"]["step"], "slow");
    assert_eq!(step(&run, "slow")["reason"], "BudgetExceeded");
    assert_eq!(attempts(&run, 0)[0]["kill_requested"], "budget");
    assert_eq!(step(&run, "after")["state"], "skipped");
    assert!(run["budget"]["exceeded_at"].is_string(), "{run:#}");
    assert!(!process_alive(pid), "the step's process is gone");
    assert_eq!(count(&server.history_kinds(&id), "budget_exceeded"), 1);
}

#[test]
fn time_waiting_on_a_gate_does_not_count_against_the_budget() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let pipeline = |name: &str, secs: u32| {
        format!(
            "name: {name}\nbudget: 3s\nsteps:\n  - name: a\n    run: [sleep, \"{secs}\"]\n  - name: approve\n    needs: [a]\n    gate: {{}}\n  - name: b\n    needs: [approve]\n    run: [sleep, \"{secs}\"]\n"
        )
    };
    let fits = server.submit(&pipeline("fits", 1));
    let over = server.submit(&pipeline("over", 2));
    server.wait_for(&fits, WITHIN, waiting);
    server.wait_for(&over, WITHIN, waiting);
    let paused = server.run(&fits);
    assert_eq!(paused["budget"]["running"], false, "{paused:#}");
    std::thread::sleep(Duration::from_secs(5));
    for id in [&fits, &over] {
        let (status, body) =
            server.post_json(&format!("/v1/runs/{id}/gates/approve/approve"), &json!({}));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["decision"]["by"], "admin", "by defaults to the caller");
    }
    let run = server.wait_terminal(&fits, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let used = run["budget"]["used_ms"].as_u64().expect("used");
    assert!(
        (2000..3000).contains(&used),
        "gate time excluded: {used} ms"
    );
    let run = server.wait_terminal(&over, WITHIN);
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(
        run["failure_classification"]["category"], "budget",
        "{run:#}"
    );
    assert_eq!(step(&run, "a")["state"], "succeeded");
    assert_eq!(step(&run, "b")["reason"], "BudgetExceeded");
}

//! The retry matrix through the real local executor: real supervisors, real processes,
//! a real redb file, real HTTP on loopback.

use crate::common;

use std::time::Duration;

use common::{Server, attempts, fences, process_alive, wait_pid_file};

const WITHIN: Duration = Duration::from_secs(60);

#[test]
fn exit_1_without_retry_fails_after_one_attempt() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let id =
        server.submit("name: p\nsteps:\n  - name: s\n    run: [sh, -c, 'echo boom >&2; exit 1']\n");
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "failed", "{run:#}");
    let attempts = attempts(&run, 0);
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["class"], "step");
    assert_eq!(attempts[0]["exit_code"], 1);
    assert_eq!(attempts[0]["reason"], "exit code 1");
    assert_eq!(run["steps"][0]["reason"], "StepFailed");
    assert_eq!(run["failure_classification"]["category"], "step");
    assert_eq!(run["failure_classification"]["auto_retryable"], false);
    assert_eq!(run["failure_classification"]["step"], "s");
    // stderr was captured and is readable after the end.
    let (status, log) = server.get(&format!("/v1/runs/{id}/steps/s/logs?stream=stderr"));
    assert_eq!(status, 200);
    assert_eq!(log, serde_json::Value::String("boom\n".into()));
}

#[test]
fn step_retry_heals_a_flaky_step_with_increasing_fences() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let yaml = r#"
name: p
steps:
  - name: flaky
    run: [sh, -c, 'test "$SCARAB_ATTEMPT" -ge 3']
    retry: { on: step, max: 2, backoff: { initial: 50ms } }
"#;
    let (status, body) = server.submit_yaml(yaml);
    assert_eq!(status, 201);
    assert!(
        body["warnings"][0]
            .as_str()
            .unwrap_or("")
            .contains("at-least-once"),
        "{body}"
    );
    let id = body["id"].as_str().expect("id");
    let run = server.wait_terminal(id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let attempts = attempts(&run, 0);
    let numbers: Vec<u64> = attempts
        .iter()
        .map(|a| a["number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, vec![1, 2, 3]);
    let fences = fences(&run, 0);
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences {fences:?}");
    assert_eq!(attempts[2]["class"], serde_json::Value::Null);
    assert_eq!(attempts[2]["exit_code"], 0);
    assert_eq!(attempts[0]["class"], "step");
}

#[test]
fn timeout_kills_the_step_and_fails_with_timed_out() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let pid_file = dir.path().join("pid");
    let yaml = format!(
        "name: p\nsteps:\n  - name: hang\n    run: [sh, -c, 'echo $$ > {}; exec sleep 60']\n    timeout: 1s\n",
        pid_file.display()
    );
    let id = server.submit(&yaml);
    let pid = wait_pid_file(&pid_file, WITHIN);
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(run["steps"][0]["reason"], "TimedOut");
    let attempts = attempts(&run, 0);
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["class"], "timeout");
    assert!(!process_alive(pid), "the timed-out process {pid} is gone");
}

#[test]
fn missing_executable_is_config_and_never_retried() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let yaml = "name: p\nsteps:\n  - name: s\n    run: [/nonexistent/tool]\n    retry: { on: failure, max: 3, backoff: { initial: 10ms } }\n";
    let id = server.submit(yaml);
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "failed", "{run:#}");
    let first = attempts(&run, 0);
    assert_eq!(first.len(), 1, "config errors are never retried");
    assert_eq!(first[0]["class"], "config");
    assert_eq!(first[0]["started"], false);
    assert_eq!(run["steps"][0]["reason"], "ConfigError");

    let not_executable = dir.path().join("script.sh");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").expect("write");
    let yaml = format!(
        "name: p\nsteps:\n  - name: s\n    run: [{}]\n",
        not_executable.display()
    );
    let run = server.wait_terminal(&server.submit(&yaml), WITHIN);
    assert_eq!(attempts(&run, 0)[0]["class"], "config", "{run:#}");

    let yaml =
        "name: p\nsteps:\n  - name: s\n    run: [sh, -c, 'true']\n    workdir: /nonexistent/dir\n";
    let run = server.wait_terminal(&server.submit(yaml), WITHIN);
    assert_eq!(attempts(&run, 0)[0]["class"], "config", "{run:#}");
}

/// A step that writes its pid, then (on attempt 1 only) waits to be killed.
fn killable_step(pid_file: &std::path::Path, retry: &str) -> String {
    format!(
        "name: p\nsteps:\n  - name: victim\n    run: [sh, -c, 'if [ \"$SCARAB_ATTEMPT\" = 1 ]; then echo $$ > {}; exec sleep 60; fi']\n{retry}",
        pid_file.display()
    )
}

#[test]
fn outside_sigkill_dead_letters_without_retry_and_is_retried_with_on_infra() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));

    let pid_file = dir.path().join("pid-a");
    let id = server.submit(&killable_step(&pid_file, ""));
    let pid = wait_pid_file(&pid_file, WITHIN);
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "dead_lettered", "{run:#}");
    let attempts_a = attempts(&run, 0);
    assert_eq!(attempts_a.len(), 1);
    assert_eq!(attempts_a[0]["class"], "infra_post_start");
    assert!(
        attempts_a[0]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("SIGKILL")
    );
    assert_eq!(
        run["failure_classification"]["category"],
        "infra_post_start"
    );

    let pid_file = dir.path().join("pid-b");
    let retry = "    retry: { on: infra, max: 1, backoff: { initial: 10ms } }\n";
    let id = server.submit(&killable_step(&pid_file, retry));
    let pid = wait_pid_file(&pid_file, WITHIN);
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let attempts_b = attempts(&run, 0);
    assert_eq!(attempts_b.len(), 2);
    assert_eq!(attempts_b[0]["class"], "infra_post_start");
    assert!(fences(&run, 0)[0] < fences(&run, 0)[1]);
}

#[test]
fn dag_runs_in_order_skips_dependents_of_failures_and_passes_environment() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let out = dir.path().join("order");
    let yaml = format!(
        r#"
name: dag
steps:
  - name: a
    run: [sh, -c, 'echo "a $SCARAB_STEP $SCARAB_ATTEMPT $SCARAB_FENCE $SCARAB_RUN_ID $GREETING" >> {out}']
    env: {{ GREETING: hello }}
  - name: b
    needs: [a]
    run: [sh, -c, 'echo b >> {out}; exit 3']
  - name: c
    needs: [b]
    run: [sh, -c, 'echo c >> {out}']
  - name: d
    needs: [a]
    run: [sh, -c, 'echo d >> {out}']
"#,
        out = out.display()
    );
    let id = server.submit(&yaml);
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "failed", "{run:#}");
    let states: Vec<&str> = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, vec!["succeeded", "failed", "skipped", "succeeded"]);
    let text = std::fs::read_to_string(&out).expect("output");
    let first = text.lines().next().unwrap_or("");
    let fence = fences(&run, 0)[0];
    assert_eq!(first, format!("a a 1 {fence} {id} hello"));
    assert!(!text.lines().any(|l| l == "c"), "c never ran: {text}");
    assert_eq!(attempts(&run, 1)[0]["exit_code"], 3);
}

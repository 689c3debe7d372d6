//! The HTTP API and the CLI contract: bad input, idempotency, auth, listing, cancel, logs.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{BIN, Server, attempts};
use serde_json::Value;

const WITHIN: Duration = Duration::from_secs(60);

fn run_count(server: &Server) -> usize {
    let (status, body) = server.get("/v1/runs?limit=500");
    assert_eq!(status, 200, "{body}");
    body["runs"].as_array().map_or(0, Vec::len)
}

#[test]
fn bad_input_is_a_4xx_naming_the_field_and_stores_nothing() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let cases: Vec<(&str, String, &str)> = vec![
        ("invalid yaml", "name: p\nsteps: [\n".to_string(), ""),
        ("unknown field", "name: p\nsteps:\n  - name: a\n    run: [x]\n    colour: red\n".into(), "steps[0].colour"),
        ("cycle", "name: p\nsteps:\n  - name: a\n    run: [x]\n    needs: [b]\n  - name: b\n    run: [x]\n    needs: [a]\n".into(), "steps[0].needs"),
        ("unknown need", "name: p\nsteps:\n  - name: a\n    run: [x]\n    needs: [ghost]\n".into(), "steps[0].needs[0]"),
        ("duplicate step", "name: p\nsteps:\n  - name: a\n    run: [x]\n  - name: a\n    run: [x]\n".into(), "steps[1].name"),
        ("over-limit retry", "name: p\nsteps:\n  - name: a\n    run: [x]\n    retry: { on: step, max: 21 }\n".into(), "steps[0].retry.max"),
        ("over-limit timeout", "name: p\nsteps:\n  - name: a\n    run: [x]\n    timeout: 30d\n".into(), "steps[0].timeout"),
        ("missing run", "name: p\nsteps:\n  - name: a\n".into(), "steps[0].run"),
    ];
    for (what, body, field) in &cases {
        let (status, answer) = server.submit_yaml(body);
        assert!(
            (400..500).contains(&status),
            "{what}: status {status} {answer}"
        );
        assert!(answer["error"].is_string(), "{what}: {answer}");
        if !field.is_empty() {
            assert_eq!(answer["field"], *field, "{what}: {answer}");
        }
    }
    // Oversized body: refused before it is parsed.
    let huge = format!(
        "name: p\nsteps:\n  - name: a\n    run: [x]\n# {}\n",
        "x".repeat(1024 * 1024 + 10)
    );
    let (status, answer) = server.submit_yaml(&huge);
    assert_eq!(status, 413, "{answer}");
    assert!(
        answer["error"].as_str().unwrap_or("").contains("exceeds"),
        "{answer}"
    );
    assert_eq!(run_count(&server), 0, "nothing was stored");
    let (status, history) = server.get("/v1/runs/r01m8xaz6t4hpa5m3jsn0p2xd4n/history");
    assert_eq!(status, 404, "{history}");
}

#[test]
fn cli_validate_and_submit_report_the_same_errors_with_exit_2() {
    let dir = common::tempdir().expect("tempdir");
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "name: p\nsteps:\n  - name: a\n    run: [x]\n    retry: { on: sometimes, max: 1 }\n",
    )
    .expect("write");
    let output = Command::new(BIN)
        .arg("validate")
        .arg(&file)
        .output()
        .expect("validate");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("steps[0].retry.on"), "{stderr}");

    let server = Server::start(&dir.path().join("state"));
    let output = Command::new(BIN)
        .args(["submit", "--url", &server.url, "--token", &server.token])
        .arg(&file)
        .output()
        .expect("submit");
    assert_eq!(output.status.code(), Some(2));
    let submit_stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        submit_stderr.contains("steps[0].retry.on"),
        "{submit_stderr}"
    );

    let good = dir.path().join("good.yaml");
    std::fs::write(&good, "name: p\nsteps:\n  - name: a\n    run: [true]\n").expect("write");
    let output = Command::new(BIN)
        .arg("validate")
        .arg(&good)
        .output()
        .expect("validate");
    assert_eq!(
        output.status.code(),
        Some(2),
        "run: [true] is a boolean, not a program"
    );
    std::fs::write(&good, "name: p\nsteps:\n  - name: a\n    run: ['true']\n").expect("write");
    let output = Command::new(BIN)
        .arg("validate")
        .arg(&good)
        .output()
        .expect("validate");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let output = Command::new(BIN)
        .args(["submit", "-q", "--url", &server.url, "--state-dir"])
        .arg(&server.state_dir)
        .arg(&good)
        .output()
        .expect("submit");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let id = String::from_utf8_lossy(&output.stdout).trim().to_string();
    assert!(
        id.starts_with('r') && !id.contains(char::is_whitespace),
        "{id:?}"
    );
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded");

    let output = Command::new(BIN)
        .args([
            "show",
            &id,
            "-o",
            "json",
            "--url",
            &server.url,
            "--token",
            &server.token,
        ])
        .output()
        .expect("show");
    let shown: Value = serde_json::from_slice(&output.stdout).expect("show -o json prints JSON");
    assert_eq!(shown["id"], id.as_str());
    assert_eq!(shown["state"], "succeeded");
    assert_eq!(shown["origin"], "local");
    assert!(shown["auto_retry"].is_object());
}

#[test]
fn idempotency_key_returns_the_same_run() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let yaml = b"name: p\nsteps:\n  - name: a\n    run: ['true']\n";
    let headers = [("Idempotency-Key", "deploy-42")];
    let (s1, first) = server.request("POST", "/v1/runs", "application/yaml", yaml, &headers);
    let (s2, second) = server.request("POST", "/v1/runs", "application/yaml", yaml, &headers);
    assert_eq!((s1, s2), (201, 200), "a replay answers 200");
    assert_eq!(first["id"], second["id"]);
    assert_eq!(second["existing"], true);
    assert_eq!(run_count(&server), 1);
    let other = server.request(
        "POST",
        "/v1/runs",
        "application/yaml",
        yaml,
        &[("Idempotency-Key", "deploy-43")],
    );
    assert_ne!(other.1["id"], first["id"]);
    let other_body = b"name: p\nsteps:\n  - name: b\n    run: ['true']\n";
    let (status, answer) =
        server.request("POST", "/v1/runs", "application/yaml", other_body, &headers);
    assert_eq!(status, 409, "the same key with another pipeline: {answer}");
    assert_eq!(answer["field"], "Idempotency-Key");
    assert_eq!(run_count(&server), 2);
    let too_long = "k".repeat(201);
    let (status, answer) = server.request(
        "POST",
        "/v1/runs",
        "application/yaml",
        yaml,
        &[("Idempotency-Key", &too_long)],
    );
    assert_eq!(status, 400);
    assert_eq!(answer["field"], "Idempotency-Key");
}

#[test]
fn json_submission_listing_paging_and_history() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let json = br#"{"name": "j", "steps": [{"name": "a", "run": ["true"]}]}"#;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let (status, body) = server.request("POST", "/v1/runs", "application/json", json, &[]);
        assert_eq!(status, 201, "{body}");
        ids.push(body["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        server.wait_terminal(id, WITHIN);
    }
    // Pages of 2, newest first, no duplicates, all five.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/runs?limit=2&cursor={c}"),
            None => "/v1/runs?limit=2".to_string(),
        };
        let (status, page) = server.get(&path);
        assert_eq!(status, 200, "{page}");
        for run in page["runs"].as_array().unwrap() {
            seen.push(run["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let mut expected = ids.clone();
    expected.reverse();
    assert_eq!(seen, expected);
    let (_, by_state) = server.get("/v1/runs?state=succeeded&limit=500");
    assert_eq!(by_state["runs"].as_array().unwrap().len(), 5);
    let (status, bad) = server.get("/v1/runs?state=sideways");
    assert_eq!(status, 400);
    assert_eq!(bad["field"], "state");
    let (status, bad) = server.get("/v1/runs?limit=100000");
    assert_eq!(status, 400);
    assert_eq!(bad["field"], "limit");

    let (status, history) = server.get(&format!("/v1/runs/{}/history", ids[0]));
    assert_eq!(status, 200);
    let kinds: Vec<&str> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"submitted"));
    assert!(kinds.contains(&"attempt_launched"), "{kinds:?}");
    assert!(kinds.contains(&"attempt_finished"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"run_state"));
}

#[test]
fn auth_is_required_and_health_is_open() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let agent = common::agent();
    let status = |path: &str, token: Option<&str>| {
        let mut request = agent.get(format!("{}{path}", server.url));
        if let Some(token) = token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        request.call().expect("call").status().as_u16()
    };
    assert_eq!(status("/healthz", None), 200);
    assert_eq!(status("/readyz", None), 200);
    assert_eq!(status("/v1/runs", None), 401);
    assert_eq!(status("/v1/runs", Some("wrong")), 401);
    assert_eq!(status("/v1/runs", Some(&server.token)), 200);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(server.state_dir.join("admin.token"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn cancel_stops_running_steps_and_is_refused_once_terminal() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let pid_file = dir.path().join("pid");
    let yaml = format!(
        "name: p\nsteps:\n  - name: long\n    run: [sh, -c, 'echo $$ > {}; exec sleep 60']\n  - name: after\n    needs: [long]\n    run: ['true']\n",
        pid_file.display()
    );
    let id = server.submit(&yaml);
    let pid = common::wait_pid_file(&pid_file, WITHIN);
    let (status, body) = server.request(
        "POST",
        &format!("/v1/runs/{id}/cancel"),
        "application/json",
        br#"{"by":"tester"}"#,
        &[],
    );
    assert_eq!(status, 202, "{body}");
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "cancelled", "{run:#}");
    assert_eq!(run["steps"][0]["state"], "cancelled");
    assert_eq!(run["steps"][1]["state"], "cancelled");
    assert_eq!(run["cancel_requested_by"], "admin (tester)");
    assert_eq!(run["failure_classification"]["category"], "cancelled");
    assert!(!common::process_alive(pid), "the step was stopped");
    let (status, body) = server.request(
        "POST",
        &format!("/v1/runs/{id}/cancel"),
        "application/json",
        b"{}",
        &[],
    );
    assert_eq!(status, 409, "{body}");
    let (status, _) = server.request(
        "POST",
        "/v1/runs/r01m8xaz6t4hpa5m3jsn0p2xd4n/cancel",
        "application/json",
        b"{}",
        &[],
    );
    assert_eq!(status, 404);
    let (status, body) = server.request(
        "POST",
        "/v1/runs/nonsense/cancel",
        "application/json",
        b"{}",
        &[],
    );
    assert_eq!(status, 400, "{body}");
}

#[test]
fn logs_are_readable_while_running_and_after() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let gate = dir.path().join("go");
    let yaml = format!(
        "name: p\nsteps:\n  - name: talk\n    run: [sh, -c, 'echo first; while [ ! -e {} ]; do sleep 0.05; done; echo second']\n",
        gate.display()
    );
    let id = server.submit(&yaml);
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let (status, log) = server.get(&format!("/v1/runs/{id}/steps/talk/logs"));
        assert_eq!(status, 200);
        if log == Value::String("first\n".into()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "log while running: {log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(&gate, "").expect("gate");
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(attempts(&run, 0).len(), 1);
    let output = Command::new(BIN)
        .args([
            "logs",
            &id,
            "talk",
            "--url",
            &server.url,
            "--token",
            &server.token,
        ])
        .output()
        .expect("logs");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "first\nsecond\n");
    let (status, body) = server.get(&format!("/v1/runs/{id}/steps/nope/logs"));
    assert_eq!(status, 404);
    assert_eq!(body["field"], "step");
}

#[test]
fn malformed_queries_and_bodies_get_json_errors() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let (status, body) = server.get("/v1/runs?limit=abc");
    assert_eq!(status, 400);
    assert_eq!(body["field"], "query", "{body}");
    let id = server.submit("name: p\nsteps:\n  - name: a\n    run: [sleep, '5']\n");
    let (status, body) = server.request(
        "POST",
        &format!("/v1/runs/{id}/cancel"),
        "application/json",
        b"{not json",
        &[],
    );
    assert_eq!(status, 400);
    assert_eq!(body["field"], "body", "{body}");
    let (status, body) = server.request(
        "POST",
        &format!("/v1/runs/{id}/cancel"),
        "application/json",
        b"",
        &[],
    );
    assert_eq!(status, 202, "an empty body is fine: {body}");
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(
        run["cancel_requested_by"], "admin",
        "by defaults to the caller"
    );
}

#[test]
fn logs_and_attempt_directories_are_removed_after_the_retention() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start_with(&dir.path().join("state"), &["--log-retention", "1s"]);
    let id = server.submit("name: p\nsteps:\n  - name: a\n    run: [echo, hi]\n");
    let run = server.wait_terminal(&id, WITHIN);
    let fence = common::fences(&run, 0)[0];
    let attempt_dir = server.state_dir.join("attempts").join(fence.to_string());
    let deadline = std::time::Instant::now() + WITHIN;
    while attempt_dir.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} was never removed",
            attempt_dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body) = server.get(&format!("/v1/runs/{id}/steps/a/logs"));
    assert_eq!(status, 410, "{body}");
    assert_eq!(
        server.run(&id)["state"],
        "succeeded",
        "the run itself is kept"
    );
}

/// A run that ended before a restart is still cleaned up once its retention is over: the
/// next start finds it through the state index (no timer of its own).
#[test]
fn a_run_that_ended_before_a_restart_is_cleaned_up_after_it() {
    let dir = common::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let mut server = Server::start_with(&state, &["--log-retention", "1h"]);
    let id = server.submit("name: p\nsteps:\n  - name: a\n    run: [echo, hi]\n");
    let run = server.wait_terminal(&id, WITHIN);
    let fence = common::fences(&run, 0)[0];
    let attempt_dir = server.state_dir.join("attempts").join(fence.to_string());
    server.terminate();
    assert!(attempt_dir.exists(), "kept while its retention lasts");
    let server = Server::start_with(&state, &["--log-retention", "1s"]);
    let deadline = std::time::Instant::now() + WITHIN;
    while attempt_dir.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} was never removed after the restart",
            attempt_dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(server.run(&id)["state"], "succeeded");
}

/// Every refusal is JSON, naming the field where one applies; a run id has one spelling;
/// `/readyz` shows details (which may name paths) only to a caller with a token.
#[test]
fn refusals_are_json_ids_have_one_spelling_and_readyz_hides_details_without_a_token() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let id = server.submit("name: a\nsteps:\n  - name: s\n    run: [\"true\"]\n");

    let (status, body) = server.get(&format!(
        "/v1/runs/{}",
        id.to_uppercase().replacen('R', "r", 1)
    ));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "id");
    assert!(
        body["error"].as_str().unwrap_or("").contains("canonical"),
        "{body}"
    );

    // One spelling per cursor, as issued: a signed time is refused.
    let (status, body) = server.get("/v1/runs?cursor=%2B1.r01m8xbayt95ytxfchtfz201rb4");
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "cursor", "{body}");

    let (status, body) = server.get("/v1/runs/r%FF%FE/history");
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "path", "{body}");

    let agent = common::agent();
    let mut response = agent
        .delete(format!("{}/v1/runs", server.url))
        .header("Authorization", format!("Bearer {}", server.token))
        .call()
        .expect("delete");
    assert_eq!(response.status(), 405);
    let allow = response
        .headers()
        .get("allow")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    assert!(
        allow.contains("GET") && allow.contains("POST"),
        "a 405 names the allowed methods: {allow:?}"
    );
    let body: Value = serde_json::from_str(&response.body_mut().read_to_string().expect("body"))
        .expect("a JSON refusal");
    assert!(body["error"].is_string(), "{body}");

    let mut bare = agent
        .get(format!("{}/readyz", server.url))
        .call()
        .expect("readyz");
    let bare: Value =
        serde_json::from_str(&bare.body_mut().read_to_string().expect("body")).expect("json");
    assert_eq!(
        bare,
        serde_json::json!({"ready": true}),
        "no details without a token"
    );
    let (status, full) = server.get("/readyz");
    assert_eq!(status, 200);
    assert!(
        full["progress"].is_object() && full["executors"].is_object(),
        "{full}"
    );
}

/// Text that would reach an operator's terminal is refused when it holds control
/// characters or bidirectional overrides, naming the field, and changes nothing.
#[test]
fn control_and_bidi_characters_are_refused_where_they_are_input() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let (status, body) = server
        .submit_yaml("name: \"deploy\\u202Eexe.txt\"\nsteps:\n  - name: s\n    run: [\"true\"]\n");
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["field"], "name");

    let id = server.submit("name: g\nsteps:\n  - name: s\n    run: [sleep, \"30\"]\n");
    for (body, field) in [
        (serde_json::json!({"by": "alice\u{1b}[2J"}), "by"),
        (serde_json::json!({"by": "bob\u{202E}"}), "by"),
    ] {
        let (status, answer) = server.post_json(&format!("/v1/runs/{id}/cancel"), &body);
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["field"], field);
    }
    assert_eq!(
        server.run(&id)["cancel_requested_by"],
        Value::Null,
        "nothing changed"
    );
    let (status, _) = server.post_json(&format!("/v1/runs/{id}/cancel"), &serde_json::json!({}));
    assert_eq!(status, 202);
}

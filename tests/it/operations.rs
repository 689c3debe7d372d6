//! Day-to-day operation through the real binary: re-running a finished run.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{BIN, Server, attempts, fences};

const WITHIN: Duration = Duration::from_secs(60);

/// `scarab retry RUN [--from STEP]` as a person would type it: (exit code, stdout, stderr).
fn retry(server: &Server, id: &str, from: Option<&str>) -> (i32, String, String) {
    let mut command = Command::new(BIN);
    command.args(["retry", id, "--url", &server.url, "--token", &server.token]);
    if let Some(from) = from {
        command.args(["--from", from]);
    }
    let output = command.output().expect("scarab retry");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// A chain a → b → c → d fails at c (c needs a file that is not there yet). A retry
/// runs c and d again with new, higher fences while a and b keep their one attempt, and
/// the run succeeds; `--from b` then re-runs b, c and d of the succeeded run. A run in
/// progress and an unknown step are refused, with nothing changed.
#[test]
fn a_run_failed_at_step_3_of_4_is_retried_and_from_a_step_re_runs_what_follows() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let marker = dir.path().join("ready");
    let yaml = format!(
        "name: chain\nsteps:\n  - name: a\n    run: [sh, -c, 'echo a']\n  - name: b\n    needs: [a]\n    run: [sh, -c, 'echo b']\n  - name: c\n    needs: [b]\n    run: [test, -f, '{}']\n  - name: d\n    needs: [c]\n    run: [sh, -c, 'echo d']\n",
        marker.display()
    );
    let id = server.submit(&yaml);
    let failed = server.wait_terminal(&id, WITHIN);
    assert_eq!(failed["state"], "failed", "{failed:#}");
    assert_eq!(failed["steps"][3]["state"], "skipped");

    std::fs::write(&marker, "").expect("marker");
    let (code, stdout, stderr) = retry(&server, &id, None);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), format!("retrying {id}: c, d"));
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    for step in [0, 1] {
        assert_eq!(
            fences(&run, step),
            fences(&failed, step),
            "step {step} kept"
        );
        assert_eq!(run["steps"][step]["earlier_attempts"], 0);
    }
    assert_eq!(run["steps"][2]["earlier_attempts"], 1);
    assert!(
        fences(&run, 2)[0] > fences(&failed, 2)[0],
        "a new, higher fence"
    );
    assert!(fences(&run, 3)[0] > fences(&run, 2)[0]);
    assert!(
        server.history_kinds(&id).contains(&"retried".to_string()),
        "the history records the retry"
    );

    // Nothing to retry in a succeeded run unless a step is named.
    let (code, _, stderr) = retry(&server, &id, None);
    assert_eq!(code, 2, "refused: {stderr}");
    let (code, _, stderr) = retry(&server, &id, Some("nope"));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("nope"), "{stderr}");
    let unchanged = server.run(&id);
    assert_eq!(unchanged["state"], "succeeded");

    let (code, stdout, stderr) = retry(&server, &id, Some("b"));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), format!("retrying {id}: b, c, d"));
    let again = server.wait_terminal(&id, WITHIN);
    assert_eq!(again["state"], "succeeded", "{again:#}");
    assert_eq!(
        fences(&again, 0),
        fences(&run, 0),
        "a is upstream of b: kept"
    );
    assert_eq!(again["steps"][0]["earlier_attempts"], 0);
    for step in [1, 2, 3] {
        assert!(fences(&again, step)[0] > fences(&run, 3)[0], "step {step}");
        assert_eq!(
            attempts(&again, step).len(),
            1,
            "step {step}: the current try"
        );
    }

    // A run in progress cannot be retried.
    let busy = server.submit("name: busy\nsteps:\n  - name: s\n    run: [sleep, '30']\n");
    server.wait_for(&busy, WITHIN, |run| {
        attempts(run, 0)
            .first()
            .is_some_and(|a| a["state"] == "running")
    });
    let path = format!("/v1/runs/{busy}/retry");
    let (status, body) = server.post_json(&path, &serde_json::json!([null, null]));
    assert_eq!(status, 400, "the array form of the body is refused: {body}");
    assert_eq!(body["field"], "body");
    let (status, body) = server.post_json(&path, &serde_json::json!({}));
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("running")),
        "{body}"
    );
}

/// `scarab version` names the version, the commit and the store formats, in both forms.
#[test]
fn version_names_the_build_and_the_store_formats() {
    let output = Command::new(BIN)
        .args(["version", "-o", "json"])
        .output()
        .expect("scarab version");
    assert!(output.status.success());
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(json["record_format"], scarab::store::codec::FORMAT_VERSION);
    assert_eq!(json["store_schema"], scarab::store::SCHEMA_VERSION);
    assert!(json["commit"].as_str().is_some_and(|c| !c.is_empty()));
    let output = Command::new(BIN)
        .arg("version")
        .output()
        .expect("scarab version");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.starts_with(&format!("scarab {}\n", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
}

/// Runs `scarab ARGS… --url … --token …`: (exit code, stdout, stderr).
fn scarab(server: &Server, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(BIN)
        .args(args)
        .args(["--url", &server.url, "--token", &server.token])
        .output()
        .expect("scarab");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// `submit --wait` follows the run with the live progress and exits with its verdict;
/// `watch` does the same for a run by id, and with `-o json` prints its detail.
#[test]
fn submit_wait_and_watch_exit_with_the_verdict_and_show_progress() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "name: good\nsteps:\n  - name: build\n    run: [sh, -c, 'sleep 1']\n  - name: ship\n    needs: [build]\n    run: [sh, -c, 'true']\n",
    )
    .expect("write");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "name: bad\nsteps:\n  - name: build\n    run: [sh, -c, 'exit 101']\n",
    )
    .expect("write");

    let good_path = good.to_str().expect("utf-8");
    let (code, stdout, stderr) = scarab(&server, &["submit", good_path, "--wait"]);
    assert_eq!(code, 0, "{stderr}");
    let id = stdout.lines().next().expect("the run id first").to_string();
    assert!(id.starts_with('r'), "{stdout}");
    assert!(
        stderr
            .lines()
            .any(|l| l.trim_start().starts_with("build") && l.contains("running")),
        "progress: {stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.trim_start().starts_with("ship") && l.contains("succeeded")),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("run {id} succeeded")), "{stderr}");

    let (code, stdout, stderr) =
        scarab(&server, &["submit", bad.to_str().expect("utf-8"), "--wait"]);
    assert_eq!(code, 1, "a failing run exits 1: {stderr}");
    let failed = stdout.trim().to_string();
    assert!(
        stderr.contains(&format!(
            "run {failed} failed: step build failed: exit code 101"
        )),
        "{stderr}"
    );

    let (code, stdout, _) = scarab(&server, &["watch", &id, "-o", "json"]);
    assert_eq!(code, 0);
    let detail: serde_json::Value = serde_json::from_str(&stdout).expect("the run detail");
    assert_eq!(detail["id"], id.as_str());
    let (code, _, _) = scarab(&server, &["watch", &failed]);
    assert_eq!(code, 1);
}

/// `logs RUN` prints every step's log, each line prefixed with the step's name, and
/// `logs RUN STEP --follow` waits for a step that has not started yet.
#[test]
fn logs_of_every_step_are_prefixed_and_follow_waits_for_a_step_to_start() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let id = server.submit(
        "name: l\nsteps:\n  - name: first\n    run: [sh, -c, 'echo one; echo two; sleep 1']\n  - name: second-step\n    needs: [first]\n    run: [sh, -c, 'echo later']\n",
    );
    let (code, stdout, stderr) = scarab(&server, &["logs", &id, "second-step", "--follow"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "later\n");
    assert!(
        stderr.contains("waiting for step second-step to start"),
        "{stderr}"
    );
    server.wait_terminal(&id, WITHIN);
    let (code, stdout, stderr) = scarab(&server, &["logs", &id]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "first       | one\nfirst       | two\nsecond-step | later\n"
    );
}

/// Parameters through the real binary: `submit --param` and `run --param` substitute the
/// values as text (one argv element, whatever it holds), the run detail records them,
/// and a bad value is a 400 naming the parameter, with nothing created.
#[test]
fn parameters_reach_the_step_as_text_and_bad_values_are_refused_naming_them() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let out = dir.path().join("out");
    let file = dir.path().join("p.yaml");
    std::fs::write(
        &file,
        format!(
            "name: p\nparams:\n  target: {{pattern: 'staging|prod'}}\n  note: {{default: plain}}\nconcurrency: {{group: 'deploy-${{params.target}}'}}\nsteps:\n  - name: s\n    run: [sh, -c, 'printf \"%s|%s\" \"$1\" \"$NOTE\" > {}', x, '${{params.note}}']\n    env: {{NOTE: '${{params.target}}'}}\n",
            out.display()
        ),
    )
    .expect("write");
    let path = file.to_str().expect("utf-8");
    let (code, stdout, stderr) = scarab(
        &server,
        &[
            "submit",
            path,
            "--wait",
            "--param",
            "target=prod",
            "--param",
            "note=a b; $(id)",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let id = stdout.lines().next().expect("id").to_string();
    assert_eq!(
        std::fs::read_to_string(&out).expect("out"),
        "a b; $(id)|prod"
    );
    let run = server.run(&id);
    assert_eq!(run["params"]["target"], "prod");
    assert_eq!(run["params"]["note"], "a b; $(id)");
    assert_eq!(run["admission"]["concurrency"]["group"], "deploy-prod");

    let runs_before = server.get("/v1/runs").1["runs"]
        .as_array()
        .map_or(0, Vec::len);
    for (args, field) in [
        (vec!["--param", "target=qa"], "params.target"),
        (
            vec!["--param", "target=prod", "--param", "other=1"],
            "params.other",
        ),
        (vec![], "params.target"),
    ] {
        let mut all = vec!["submit", path];
        all.extend(args.iter().copied());
        let (code, _, stderr) = scarab(&server, &all);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(field), "{args:?}: {stderr}");
    }
    let runs_after = server.get("/v1/runs").1["runs"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(runs_before, runs_after, "nothing was created");

    // `scarab run` takes the same parameters.
    let output = Command::new(BIN)
        .args(["run", path, "--param", "target=staging", "--state-dir"])
        .arg(dir.path().join("run-state"))
        .output()
        .expect("scarab run");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(std::fs::read_to_string(&out).expect("out"), "plain|staging");
}

//! Schedules through the real binary: fires with the service up, downtime over several
//! fires with `catch_up: one` and `none`, `overlap: skip`, and the operator's commands.
//! (Daylight-saving days are tested on an injected clock in `engine::schedule`.)

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{BIN, Server};
use serde_json::Value;

const EVERY_5S: &str = "*/5 * * * * *";

/// `scarab schedule ARGS…` against `server`: (exit code, stdout, stderr).
fn schedule(server: &Server, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(BIN)
        .arg("schedule")
        .args(args)
        .args(["--url", &server.url, "--token", &server.token])
        .output()
        .expect("scarab schedule");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

fn show(server: &Server, name: &str) -> Value {
    let (status, body) = server.get(&format!("/v1/schedules/{name}"));
    assert_eq!(status, 200, "{body}");
    body
}

/// The runs a schedule started, oldest first: (id, created ms, state).
fn runs_of(server: &Server, name: &str) -> Vec<(String, u64, String)> {
    let (status, body) = server.get("/v1/runs?limit=500");
    assert_eq!(status, 200, "{body}");
    let origin = format!("schedule:{name}");
    let mut runs: Vec<_> = body["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter(|run| run["origin"] == origin.as_str())
        .map(|run| {
            let created = humantime::parse_rfc3339(run["created_at"].as_str().expect("created"))
                .expect("RFC 3339")
                .duration_since(UNIX_EPOCH)
                .expect("after 1970")
                .as_millis() as u64;
            (
                run["id"].as_str().unwrap_or_default().to_string(),
                created,
                run["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    runs.sort_by_key(|(_, created, _)| *created);
    runs
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The service's log lines about one schedule's fires.
fn fire_lines(server: &Server, name: &str) -> Vec<String> {
    let needle = format!("schedule={name} ");
    server
        .log()
        .lines()
        .filter(|line| line.contains(&needle) && line.contains("schedule fire"))
        .map(str::to_string)
        .collect()
}

fn missed(line: &str) -> u64 {
    line.split("missed=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Two schedules every 5 s (`catch_up: one` and `none`) fire with the service up, one
/// run per fire, each at its time. Killed over three fires and started again: the `one`
/// schedule starts exactly one run for all of them, the `none` schedule none (and says
/// so); then both fire on time again.
#[test]
fn fires_on_time_and_after_downtime_catch_up_one_runs_once_and_none_not_at_all() {
    let dir = common::tempdir().expect("tempdir");
    let mut server = Server::start(&dir.path().join("state"));
    let file = dir.path().join("tick.yaml");
    std::fs::write(
        &file,
        "name: tick\nsteps:\n  - name: t\n    run: [\"true\"]\n",
    )
    .expect("file");
    let file = file.to_str().expect("utf-8");
    for (name, catch_up) in [("one", "one"), ("none", "none")] {
        let (code, _, stderr) = schedule(
            &server,
            &[
                "create",
                name,
                "--cron",
                EVERY_5S,
                file,
                "--catch-up",
                catch_up,
            ],
        );
        assert_eq!(code, 0, "{stderr}");
    }
    wait_until("two fires of each", Duration::from_secs(30), || {
        runs_of(&server, "one").len() >= 2 && runs_of(&server, "none").len() >= 2
    });
    for name in ["one", "none"] {
        let runs = runs_of(&server, name);
        // Each run starts within a second of its fire (a multiple of 5 s), one per fire.
        let slots: Vec<u64> = runs.iter().map(|(_, created, _)| created / 5000).collect();
        assert!(
            runs.iter().all(|(_, created, _)| created % 5000 < 1500),
            "{name}: runs start at their fires: {runs:?}"
        );
        assert!(
            slots.windows(2).all(|w| w[0] < w[1]),
            "{name}: one run per fire: {runs:?}"
        );
    }

    server.kill9();
    let stopped = now_ms();
    let before: Vec<usize> = ["one", "none"]
        .iter()
        .map(|name| fire_lines(&server, name).len())
        .collect();
    // Three fires or more pass while nothing runs.
    std::thread::sleep(Duration::from_millis(16_000));
    let restarted = now_ms();
    server.resume();
    wait_until("a fire after the restart", Duration::from_secs(30), || {
        fire_lines(&server, "one").len() > before[0] + 1
            && fire_lines(&server, "none").len() > before[1] + 1
    });

    let one: Vec<String> = fire_lines(&server, "one")[before[0]..].to_vec();
    let caught_up: Vec<&String> = one.iter().filter(|line| missed(line) > 0).collect();
    assert_eq!(caught_up.len(), 1, "exactly one catch-up fire: {one:#?}");
    assert!(caught_up[0].contains("schedule fired"), "{one:#?}");
    assert!(missed(caught_up[0]) >= 3, "{one:#?}");
    let none: Vec<String> = fire_lines(&server, "none")[before[1]..].to_vec();
    assert!(
        none.iter()
            .all(|line| missed(line) == 0 || line.contains("skipped")),
        "no run for missed fires: {none:#?}"
    );
    assert_eq!(
        none.iter().filter(|line| missed(line) >= 3).count(),
        1,
        "{none:#?}"
    );
    let detail = show(&server, "none");
    assert!(detail["fires_skipped"].as_u64() >= Some(1), "{detail:#}");
    assert!(
        detail["last_skip"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("missed while the service was down"),
        "{detail:#}"
    );

    // What the store shows agrees with the log: no run was created while down; after
    // the restart `one` has one run more than its on-time fires, `none` none more.
    for (name, extra) in [("one", 1), ("none", 0)] {
        let runs = runs_of(&server, name);
        assert!(
            runs.iter()
                .all(|(_, created, _)| *created < stopped || *created >= restarted),
            "{name}: {runs:?}"
        );
        let after: Vec<_> = runs.iter().filter(|(_, c, _)| *c >= restarted).collect();
        let on_time = after
            .iter()
            .filter(|(_, created, _)| created % 5000 < 1500)
            .count();
        assert!(
            after.len() <= on_time + extra && after.len() >= extra,
            "{name}: {after:?}"
        );
        let detail = show(&server, name);
        assert_eq!(
            detail["runs_started"].as_u64(),
            Some(runs.len() as u64),
            "{name}: {detail:#}"
        );
        assert_eq!(detail["last_run"], runs.last().expect("runs").0.as_str());
    }
    for name in ["one", "none"] {
        let (code, _, stderr) = schedule(&server, &["delete", name]);
        assert_eq!(code, 0, "{stderr}");
    }
}

/// `overlap: skip` starts nothing while the previous run is unfinished; pause stops
/// fires, resume starts again from the next fire after now, delete removes it; refusals
/// name the field.
#[test]
fn overlap_skip_pause_resume_delete_and_refusals() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let slow = dir.path().join("slow.yaml");
    std::fs::write(
        &slow,
        "name: slow\nparams:\n  wait: {default: \"1\", pattern: \"[0-9]+\"}\nsteps:\n  - name: s\n    run: [sleep, \"${params.wait}\"]\n",
    )
    .expect("file");
    let slow = slow.to_str().expect("utf-8");
    let (code, stdout, stderr) = schedule(
        &server,
        &[
            "create",
            "slow",
            "--cron",
            "* * * * * *",
            slow,
            "--overlap",
            "skip",
            "--param",
            "wait=4",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("wait=4"), "{stdout}");
    wait_until("skipped fires", Duration::from_secs(30), || {
        show(&server, "slow")["fires_skipped"].as_u64() >= Some(3)
    });
    let (code, stdout, _) = schedule(&server, &["pause", "slow"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("paused"), "{stdout}");
    let paused = show(&server, "slow");
    assert_eq!(paused["paused"], true);
    assert_eq!(paused["next_fire"], Value::Null);
    assert!(
        paused["last_skip"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("still in progress"),
        "{paused:#}"
    );
    // While a 4 s run of the schedule ran, every fire was skipped: runs never overlap.
    wait_until("runs to end", Duration::from_secs(30), || {
        runs_of(&server, "slow")
            .iter()
            .all(|(_, _, state)| state == "succeeded")
    });
    let runs = runs_of(&server, "slow");
    assert!(!runs.is_empty());
    for pair in runs.windows(2) {
        assert!(
            pair[1].1 >= pair[0].1 + 4000,
            "a run started while the previous one ran: {runs:?}"
        );
    }
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        runs_of(&server, "slow").len(),
        runs.len(),
        "no fire while paused"
    );
    let (code, _, _) = schedule(&server, &["resume", "slow"]);
    assert_eq!(code, 0);
    wait_until("a fire after resume", Duration::from_secs(30), || {
        runs_of(&server, "slow").len() > runs.len()
    });

    let (code, stdout, _) = schedule(&server, &["list"]);
    assert_eq!(code, 0);
    let header = stdout.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("NAME") && header.contains("NEXT FIRE"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .nth(1)
            .unwrap_or_default()
            .starts_with("slow "),
        "{stdout}"
    );

    // Refusals name what is wrong and change nothing.
    for (args, needle) in [
        (vec!["create", "slow", "--cron", "* * * * *", slow], "name"),
        (vec!["create", "x", "--cron", "61 * * * *", slow], "cron"),
        (
            vec![
                "create",
                "x",
                "--cron",
                "0 2 * * *",
                "--timezone",
                "Mars/Base",
                slow,
            ],
            "timezone",
        ),
        (
            vec![
                "create",
                "x",
                "--cron",
                "0 2 * * *",
                slow,
                "--param",
                "nope=1",
            ],
            "params.nope",
        ),
        (
            vec![
                "create",
                "x",
                "--cron",
                "0 2 * * *",
                slow,
                "--param",
                "wait=x",
            ],
            "params.wait",
        ),
        (
            vec!["create", "bad name", "--cron", "0 2 * * *", slow],
            "name",
        ),
        (vec!["show", "ghost"], "not found"),
        (vec!["pause", "ghost"], "not found"),
    ] {
        let (code, _, stderr) = schedule(&server, &args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let (status, body) =
        server.post_json("/v1/schedules", &serde_json::json!({"cron": "0 2 * * *"}));
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("name")),
        "{body}"
    );
    let (status, body) = server.post_json(
        "/v1/schedules",
        &serde_json::json!({"name": "x", "cron": "0 2 * * *", "pipeline": "name: [", "surprise": 1}),
    );
    assert_eq!(status, 400, "unknown fields are refused: {body}");
    let (status, body) = server.post_json(
        "/v1/schedules",
        &serde_json::json!({"name": "x", "cron": "0 2 * * *", "pipeline": "name: x\nsteps: []\n"}),
    );
    assert_eq!(status, 422, "{body}");
    let (status, body) = server.get("/v1/schedules");
    assert_eq!(status, 200);
    assert_eq!(
        body["schedules"].as_array().map(Vec::len),
        Some(1),
        "{body}"
    );

    let (code, _, stderr) = schedule(&server, &["delete", "slow"]);
    assert_eq!(code, 0, "{stderr}");
    let (status, _) = server.get("/v1/schedules/slow");
    assert_eq!(status, 404);
}

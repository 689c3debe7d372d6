//! The CLI as people read it, through the real binary: tables whose columns stay in
//! line whatever the names, failures as sentences, `-o json` where data is printed, and
//! errors that name what is wrong once.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use common::{BIN, Server};

const WITHIN: Duration = Duration::from_secs(60);

/// `scarab ARGS` with `env`: (exit code, stdout, stderr).
fn scarab(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let output = Command::new(BIN)
        .args(args)
        .env_remove("COLUMNS")
        .envs(env.iter().copied())
        .output()
        .expect("scarab");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

fn client<'a>(server: &'a Server, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = args.to_vec();
    all.extend(["--url", &server.url, "--token", &server.token]);
    all
}

/// The lines of the table that starts with the header `first`, up to a blank line.
fn table<'a>(text: &'a str, first: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| !l.starts_with(first))
        .take_while(|l| !l.is_empty())
        .collect()
}

/// Every cell of every row starts where its column's header does: a character after
/// two spaces (or at the start of the line) sits at a header's offset.
fn assert_in_line(table: &[&str], headers: &[&str]) {
    let header = table[0];
    let starts: Vec<usize> = headers
        .iter()
        .map(|h| {
            header
                .find(h)
                .unwrap_or_else(|| panic!("{h} in {header:?}"))
        })
        .collect();
    for line in table {
        let chars: Vec<char> = line.chars().collect();
        for i in 0..chars.len() {
            let opens = chars[i] != ' '
                && (i == 0 || (i >= 2 && chars[i - 1] == ' ' && chars[i - 2] == ' '));
            if opens {
                assert!(
                    starts.contains(&i),
                    "a cell at column {i} is out of line: {line:?}\n{}",
                    table.join("\n")
                );
            }
        }
    }
}

/// A failed run with long pipeline and step names: `show` and `runs` keep every column
/// in line (whole cells in a pipe; wrapped inside their columns at `COLUMNS=80`), the
/// CLASS column holds only classes, and the failure reads as a sentence.
#[test]
fn long_names_never_misalign_show_or_runs_and_failures_read_as_sentences() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let long_step = "compile-the-firmware-for-every-arm64-edge-box-in-the-fleet";
    let yaml = format!(
        "name: release-the-edge-firmware-to-every-site-in-the-northern-region\nsteps:\n  - name: fetch\n    run: [sh, -c, 'echo fetched']\n  - name: {long_step}\n    needs: [fetch]\n    run: [sh, -c, 'exit 101']\n    retry: {{max: 1, on: [step], backoff: {{initial: 100ms}}}}\n  - name: publish\n    needs: [{long_step}]\n    run: [sh, -c, 'echo published']\n"
    );
    let file = dir.path().join("release.yaml");
    std::fs::write(&file, &yaml).expect("write");
    let path = file.to_str().expect("utf-8");

    let (code, stdout, stderr) = scarab(&client(&server, &["submit", path, "--wait"]), &[]);
    assert_eq!(code, 1, "{stderr}");
    let id = stdout.trim().to_string();
    assert!(
        stderr.contains(&format!(
            "run {id} failed: step {long_step} failed: exit code 101"
        )),
        "{stderr}"
    );
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "failed");

    let headers = [
        "STEP", "STATE", "ATTEMPT", "FENCE", "CLASS", "EXIT", "TOOK", "REASON",
    ];
    for columns in [None, Some("80")] {
        let env: Vec<(&str, &str)> = columns.map(|c| ("COLUMNS", c)).into_iter().collect();
        let (code, show, stderr) = scarab(&client(&server, &["show", &id]), &env);
        assert_eq!(code, 0, "{stderr}");
        assert!(
            show.contains(&format!("step {long_step} failed: exit code 101")),
            "{show}"
        );
        let rows = table(&show, "STEP");
        assert_in_line(&rows, &headers);
        if let Some(columns) = columns {
            let max: usize = columns.parse().expect("number");
            assert!(rows.iter().all(|l| l.chars().count() <= max), "{show}");
            assert!(rows.len() > 5, "the long name wraps in its column: {show}");
        } else {
            // In a pipe, one line per attempt (and per step without one).
            assert_eq!(rows.len(), 1 + 1 + 2 + 1, "{show}");
            // The step's name is on its first row only; CLASS is a class or `-`.
            let class_at = rows[0].find("CLASS").expect("CLASS");
            let classes: Vec<String> = rows[1..4]
                .iter()
                .map(|l| {
                    l[class_at..]
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_string()
                })
                .collect();
            assert_eq!(classes, ["-", "step", "step"], "{show}");
            assert!(rows[2].starts_with(long_step), "{show}");
            assert!(
                rows[3].starts_with(' '),
                "no name on the second attempt: {show}"
            );
            assert!(
                rows[4].starts_with("publish") && rows[4].contains("skipped"),
                "{show}"
            );
        }

        let (code, runs, stderr) = scarab(&client(&server, &["runs"]), &env);
        assert_eq!(code, 0, "{stderr}");
        let rows = table(&runs, "ID");
        assert_in_line(&rows, &["ID", "PIPELINE", "STATE", "AGE", "TOOK", "WHY"]);
        assert!(rows.iter().any(|l| l.starts_with(&id)), "{runs}");
    }

    // Without a terminal or COLUMNS, a pipe gets whole cells: the whole name on one line.
    let (_, runs, _) = scarab(&client(&server, &["runs"]), &[]);
    let row = runs
        .lines()
        .find(|l| l.starts_with(&id))
        .expect("the run's row");
    assert!(
        row.contains("release-the-edge-firmware-to-every-site-in-the-northern-region"),
        "{runs}"
    );
    assert!(row.contains("failed") && row.ends_with("step"), "{runs}");
}

/// Errors say what is wrong, once: a URL without its scheme, a state dir that is a file,
/// a state dir another Scarab holds (with its pid), a YAML syntax error at its line.
#[test]
fn errors_name_the_problem_once() {
    let dir = common::tempdir().expect("tempdir");
    let (code, _, stderr) = scarab(&["runs", "--url", "127.0.0.1:7300", "--token", "t"], &[]);
    assert_eq!(code, 1);
    assert_eq!(
        stderr.trim(),
        "error: --url 127.0.0.1:7300: no scheme; write http://127.0.0.1:7300 (or https://…)"
    );

    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "").expect("write");
    let (code, _, stderr) = scarab(
        &[
            "serve",
            "--state-dir",
            file.to_str().expect("utf-8"),
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(code, 1, "{stderr}");
    let line = stderr.lines().last().unwrap_or_default();
    assert!(line.ends_with("it is a file, not a directory"), "{stderr}");
    assert_eq!(line.matches("not-a-dir").count(), 1, "said once: {line}");

    let state = dir.path().join("state");
    let server = Server::start(&state);
    let pid = server.pid().expect("running");
    let state_arg = state.to_str().expect("utf-8");
    for args in [
        vec!["serve", "--state-dir", state_arg, "--listen", "127.0.0.1:0"],
        vec!["run", "--state-dir", state_arg, "/dev/null"],
    ] {
        let pipeline = dir.path().join("p.yaml");
        std::fs::write(
            &pipeline,
            "name: p\nsteps:\n  - name: a\n    run: [sh, -c, 'echo hi']\n",
        )
        .expect("write");
        let args: Vec<&str> = args
            .iter()
            .map(|a| {
                if *a == "/dev/null" {
                    pipeline.to_str().expect("utf-8")
                } else {
                    a
                }
            })
            .collect();
        let (code, _, stderr) = scarab(&args, &[]);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        let line = stderr.lines().last().unwrap_or_default();
        assert!(
            line.contains(&format!("another Scarab (pid {pid}) is using it")),
            "{args:?}: {stderr}"
        );
        assert_eq!(line.matches("state dir").count(), 1, "said once: {line}");
    }
    let (code, _, stderr) = scarab(
        &["restore", "/nonexistent.redb", "--state-dir", state_arg],
        &[],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    drop(server);

    // YAML syntax errors point at the line that is wrong.
    for (text, line) in [
        (
            "name: x\nsteps:\n  - name: a\n    run: [echo, hi]\n   - name: b\n",
            5,
        ),
        ("name: x\nsteps:\n\t- name: a\n", 3),
        (
            "name: x\nsteps:\n  - name: a\n    run: \"echo\n  - name: b\n",
            4,
        ),
    ] {
        let file = dir.path().join("bad.yaml");
        std::fs::write(&file, text).expect("write");
        let path = file.to_str().expect("utf-8");
        let (code, _, stderr) = scarab(&["validate", path], &[]);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.starts_with(&format!("{path}: line {line}: invalid YAML")),
            "{text:?}: {stderr}"
        );
        let (code, stdout, _) = scarab(&["validate", path, "-o", "json"], &[]);
        assert_eq!(code, 2);
        let json: Value = serde_json::from_str(&stdout).expect("json");
        assert_eq!(json["valid"], false);
        assert_eq!(json["errors"][0]["line"], line, "{json}");
    }
}

/// `-o json` is honoured by validate, run and config check (and never ignored).
#[test]
fn validate_run_and_config_check_print_json() {
    let dir = common::tempdir().expect("tempdir");
    let pipeline = dir.path().join("p.yaml");
    std::fs::write(
        &pipeline,
        "name: p\nsteps:\n  - name: a\n    run: [sh, -c, 'exit 3']\n",
    )
    .expect("write");
    let path = pipeline.to_str().expect("utf-8");

    let (code, stdout, stderr) = scarab(&["validate", path, "-o", "json"], &[]);
    assert_eq!(code, 0, "{stderr}");
    let json: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(
        (
            json["valid"].clone(),
            json["steps"].clone(),
            json["pipeline"].clone()
        ),
        (Value::from(true), Value::from(1), Value::from("p"))
    );

    let state = dir.path().join("run-state");
    let (code, stdout, stderr) = scarab(
        &[
            "run",
            path,
            "--state-dir",
            state.to_str().expect("utf-8"),
            "-o",
            "json",
        ],
        &[],
    );
    assert_eq!(code, 1, "{stderr}");
    let detail: Value = serde_json::from_str(&stdout).expect("the run's detail on stdout");
    assert_eq!(detail["state"], "failed");
    assert_eq!(detail["steps"][0]["attempts"][0]["exit_code"], 3);
    assert!(stderr.contains("step a failed: exit code 3"), "{stderr}");

    let config = dir.path().join("scarab.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:7399\"\n").expect("write");
    let config = config.to_str().expect("utf-8");
    let (code, stdout, stderr) = scarab(&["config", "check", config, "-o", "json"], &[]);
    assert_eq!(code, 0, "{stderr}");
    let json: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(json["valid"], true);
    assert_eq!(json["listen"], "127.0.0.1:7399");
    std::fs::write(Path::new(config), "listen = 7\n").expect("write");
    let (code, stdout, _) = scarab(&["config", "check", config, "-o", "json"], &[]);
    assert_eq!(code, 2);
    let json: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(json["valid"], false);
    assert!(
        json["error"].as_str().is_some_and(|e| e.contains("listen")),
        "{json}"
    );
}

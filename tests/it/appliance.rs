//! The appliance: tokens and permissions, /metrics, SIGHUP reload, SIGTERM under load,
//! `config check`, online backup under load and restore (also from an older backup whose
//! newer lineage still runs). All against the real `scarab` binary.

use crate::common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{BIN, Server, attempts, fences, process_alive, wait_pid_file};
use serde_json::Value;

const WITHIN: Duration = Duration::from_secs(60);
const READER: &str = "reader-token-0123456789abcdef";
const APPROVER: &str = "approver-token-0123456789abcdef";

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn write_config(path: &std::path::Path, text: &str) -> String {
    std::fs::write(path, text).expect("config");
    path.to_str().expect("utf-8").to_string()
}

/// A request with an explicit token (or none).
fn call(
    server: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let agent = common::agent();
    let url = format!("{}{path}", server.url);
    let auth = token.map(|t| format!("Bearer {t}"));
    let response = match method {
        "GET" => {
            let mut request = agent.get(&url);
            if let Some(auth) = &auth {
                request = request.header("Authorization", auth);
            }
            request.call()
        }
        _ => {
            let mut request = agent.post(&url).header("Content-Type", "application/yaml");
            if let Some(auth) = &auth {
                request = request.header("Authorization", auth);
            }
            request.send(body.as_bytes())
        }
    };
    let mut response = response.expect("http");
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

const GATED: &str = "name: g\nsteps:\n  - name: approve\n    gate: {}\n  - name: after\n    needs: [approve]\n    run: [\"true\"]\n";

#[test]
fn tokens_roles_and_reload_by_sighup() {
    let dir = common::tempdir().expect("tempdir");
    let reader_file = dir.path().join("reader.token");
    std::fs::write(&reader_file, format!("{READER}\n")).expect("token file");
    let config_path = dir.path().join("scarab.toml");
    let valid = format!(
        "[[tokens]]\nname = \"dashboard\"\nrole = \"read_only\"\nfile = \"{}\"\n",
        reader_file.display()
    );
    let config = write_config(&config_path, &valid);
    let mut server = Server::start_with(&dir.path().join("state"), &["--config", &config]);
    let id = server.submit(GATED);
    server.wait_for(&id, WITHIN, |r| r["state"] == "waiting");
    let run_path = format!("/v1/runs/{id}");
    let approve = format!("/v1/runs/{id}/gates/approve/approve");

    // No token, a wrong one: 401, on every /v1 route.
    for path in [run_path.as_str(), "/v1/runs", "/v1/dlq"] {
        assert_eq!(call(&server, "GET", path, None, "").0, 401, "{path}");
        assert_eq!(
            call(&server, "GET", path, Some("wrong-token-xxxxxxxx"), "").0,
            401
        );
    }
    // Health and metrics need none.
    assert_eq!(call(&server, "GET", "/healthz", None, "").0, 200);
    // Read-only: reads yes, writes and approvals 403.
    assert_eq!(call(&server, "GET", &run_path, Some(READER), "").0, 200);
    let (status, body) = call(&server, "POST", "/v1/runs", Some(READER), GATED);
    assert_eq!(status, 403, "{body}");
    assert_eq!(call(&server, "POST", &approve, Some(READER), "").0, 403);
    assert_eq!(call(&server, "POST", "/v1/backup", Some(READER), "").0, 403);
    // The approver token does not exist yet.
    assert_eq!(call(&server, "GET", &run_path, Some(APPROVER), "").0, 401);
    // Failed authentications are logged without the token.
    let log = server.log();
    assert!(log.contains("authentication failed"), "{log}");
    assert!(
        !log.contains("wrong-token-xxxxxxxx"),
        "the token must not be logged"
    );

    // SIGHUP with a valid new config: the approver token works at once.
    write_config(
        &config_path,
        &format!(
            "{valid}\n[[tokens]]\nname = \"release-manager\"\nrole = \"approver\"\nsha256 = \"{}\"\n",
            sha256_hex(APPROVER)
        ),
    );
    server.signal(libc::SIGHUP);
    let deadline = Instant::now() + WITHIN;
    while call(&server, "GET", &run_path, Some(APPROVER), "").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "reload not applied: {}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        call(&server, "POST", "/v1/runs", Some(APPROVER), GATED).0,
        403
    );
    let (status, body) = call(&server, "POST", &approve, Some(APPROVER), "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decision"]["caller"], "release-manager");
    assert_eq!(body["decision"]["by"], "release-manager");

    // SIGHUP with an invalid config: rejected with a clear line, the old one stays.
    write_config(
        &config_path,
        "[[tokens]]\nname = \"x\"\nrole = \"superuser\"\nsha256 = \"00\"\n",
    );
    server.signal(libc::SIGHUP);
    let deadline = Instant::now() + WITHIN;
    while !server.log().contains("configuration reload rejected") {
        assert!(
            Instant::now() < deadline,
            "no rejection logged: {}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(server.log().contains("tokens[0].role"), "the key is named");
    assert_eq!(call(&server, "GET", &run_path, Some(APPROVER), "").0, 200);
    assert_eq!(call(&server, "GET", &run_path, Some(READER), "").0, 200);
    assert_eq!(server.terminate(), Some(0));
}

#[test]
fn a_step_token_reaches_only_its_own_steps_outputs() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let token_file = dir.path().join("token");
    let id = server.submit(&format!(
        "name: s\nsteps:\n  - name: a\n    run: [sh, -c, 'echo \"$SCARAB_STEP_TOKEN\" > {}; sleep 30']\n  - name: b\n    run: [sleep, \"30\"]\n",
        token_file.display()
    ));
    let deadline = Instant::now() + WITHIN;
    let token = loop {
        if let Ok(text) = std::fs::read_to_string(&token_file)
            && !text.trim().is_empty()
        {
            break text.trim().to_string();
        }
        assert!(Instant::now() < deadline, "no step token");
        std::thread::sleep(Duration::from_millis(20));
    };
    let put = |step: &str| {
        let response = common::agent()
            .put(format!("{}/v1/runs/{id}/steps/{step}/outputs", server.url))
            .header("Authorization", format!("Bearer {token}"))
            .header("Content-Type", "application/json")
            .send(br#"{"k": "v"}"#.as_slice())
            .expect("http");
        response.status().as_u16()
    };
    assert_eq!(put("a"), 200);
    assert_eq!(put("b"), 401, "another step's outputs");
    assert_eq!(
        call(&server, "GET", &format!("/v1/runs/{id}"), Some(&token), "").0,
        401
    );
    assert_eq!(
        call(&server, "POST", "/v1/runs", Some(&token), GATED).0,
        401
    );
    server.request(
        "POST",
        &format!("/v1/runs/{id}/cancel"),
        "application/json",
        b"{}",
        &[],
    );
}

#[test]
fn metrics_parse_as_prometheus_text() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let ok = server.submit("name: ok\nsteps:\n  - name: a\n    run: [\"true\"]\n");
    let bad = server.submit("name: bad\nsteps:\n  - name: a\n    run: [\"false\"]\n");
    server.wait_terminal(&ok, WITHIN);
    server.wait_terminal(&bad, WITHIN);
    let mut response = common::agent()
        .get(format!("{}/metrics", server.url))
        .call()
        .expect("metrics");
    assert_eq!(response.status().as_u16(), 200);
    let text = response.body_mut().read_to_string().expect("text");
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text format");
    let value = |name: &str, label: Option<(&str, &str)>| -> f64 {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
            .unwrap_or_else(|| panic!("no sample {name} {label:?} in:\n{text}"))
    };
    assert_eq!(value("scarab_runs", Some(("state", "succeeded"))), 1.0);
    assert_eq!(value("scarab_runs", Some(("state", "failed"))), 1.0);
    assert_eq!(value("scarab_runs", Some(("state", "running"))), 0.0);
    assert_eq!(
        value("scarab_attempts_finished_total", Some(("class", "step"))),
        1.0
    );
    assert_eq!(value("scarab_outbox_depth", None), 0.0);
    assert_eq!(value("scarab_ready", None), 1.0);
    assert!(
        value(
            "scarab_run_state_changes_total",
            Some(("state", "succeeded"))
        ) >= 1.0
    );
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric.starts_with("scarab_commit_duration_seconds")),
        "{text}"
    );
    for name in [
        "scarab_auto_retry_passes_total",
        "scarab_outbox_oldest_message_age_seconds",
        "scarab_dead_letter_queue_depth",
    ] {
        value(name, None);
    }
}

#[test]
fn config_check_names_the_bad_key() {
    let dir = common::tempdir().expect("tempdir");
    let check = |text: &str| {
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).expect("write");
        Command::new(BIN)
            .args(["config", "check"])
            .arg(&path)
            .env_remove("SCARAB_AUTO_RETRY_ENABLED")
            .output()
            .expect("config check")
    };
    let good = check(
        "state_dir = \"/var/lib/scarab\"\n[engine]\nkill_grace = \"10s\"\n[auto_retry]\nenabled = true\n",
    );
    assert!(good.status.success(), "{good:?}");
    assert!(String::from_utf8_lossy(&good.stdout).contains("auto-retry on"));
    for (text, key) in [
        ("[engine]\nkill_grace = \"forever\"\n", "kill_grace"),
        ("[engine]\ninfra_retries = 99\n", "engine.infra_retries"),
        ("listen = \"nowhere\"\n", "listen"),
        ("[auto_retry]\nscan_limit = 0\n", "auto_retry.scan_limit"),
        ("[log]\nformat = \"xml\"\n", "log.format"),
        ("colour = 1\n", "colour"),
    ] {
        let out = check(text);
        assert_eq!(out.status.code(), Some(2), "{text}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(key), "{text}: {stderr}");
    }
}

/// Submits runs until told to stop; returns the ids the service acknowledged, each with
/// the instant of its acknowledgement.
fn load(
    server_url: String,
    token: String,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(String, Instant)>> {
    std::thread::spawn(move || {
        let agent = common::agent();
        let mut acked = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::SeqCst) {
            i += 1;
            let yaml = format!("name: load-{i}\nsteps:\n  - name: a\n    run: [\"true\"]\n");
            let response = agent
                .post(format!("{server_url}/v1/runs"))
                .header("Authorization", format!("Bearer {token}"))
                .header("Content-Type", "application/yaml")
                .send(yaml.as_bytes());
            let Ok(mut response) = response else { continue };
            if response.status().as_u16() == 201 {
                let body: Value =
                    serde_json::from_str(&response.body_mut().read_to_string().unwrap_or_default())
                        .unwrap_or_default();
                if let Some(id) = body["id"].as_str() {
                    acked.push((id.to_string(), Instant::now()));
                }
            }
        }
        acked
    })
}

/// `scarab backup --out FILE` against `server`.
fn backup(server: &Server, file: &std::path::Path) -> std::process::Output {
    Command::new(BIN)
        .args(["backup", "--out"])
        .arg(file)
        .args(["--url", &server.url, "--token", &server.token])
        .output()
        .expect("scarab backup")
}

/// `scarab restore FILE --state-dir DIR`.
fn restore(file: &std::path::Path, state_dir: &std::path::Path) -> std::process::Output {
    Command::new(BIN)
        .arg("restore")
        .arg(file)
        .arg("--state-dir")
        .arg(state_dir)
        .output()
        .expect("scarab restore")
}

#[test]
fn sigterm_under_load_exits_zero_loses_nothing_and_readopts() {
    let dir = common::tempdir().expect("tempdir");
    let mut server = Server::start(&dir.path().join("state"));
    let pid_file = dir.path().join("pid");
    let sleeper = server.submit(&format!(
        "name: sleeper\nsteps:\n  - name: s\n    run: [sh, -c, 'echo $$ > {}; sleep 3']\n",
        pid_file.display()
    ));
    let pid = wait_pid_file(&pid_file, WITHIN);
    let fence = fences(
        &server.wait_for(&sleeper, WITHIN, |r| {
            attempts(r, 0)[0]["state"] == "running"
        }),
        0,
    )[0];
    let stop = Arc::new(AtomicBool::new(false));
    let loader = load(server.url.clone(), server.token.clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(700));
    server.signal(libc::SIGTERM);
    let code = server.wait_exit(Duration::from_secs(25));
    stop.store(true, Ordering::SeqCst);
    let acked = loader.join().expect("loader");
    assert_eq!(
        code,
        Some(0),
        "exit 0 within the deadline: {}",
        server.log()
    );
    assert!(!acked.is_empty(), "the load generator got answers");
    assert!(process_alive(pid), "the running step was left running");
    server.resume();
    for (id, _) in &acked {
        let (status, run) = server.get(&format!("/v1/runs/{id}"));
        assert_eq!(status, 200, "acknowledged run {id} lost: {run}");
    }
    let run = server.wait_terminal(&sleeper, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(
        fences(&run, 0),
        vec![fence],
        "re-adopted under the same fence"
    );
}

#[test]
fn online_backup_under_load_restores_every_acknowledged_run() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let stop = Arc::new(AtomicBool::new(false));
    let loader = load(server.url.clone(), server.token.clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(800));
    let backup_started = Instant::now();
    let file = dir.path().join("backup.redb");
    let output = backup(&server, &file);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let acked = loader.join().expect("loader");
    assert!(output.status.success(), "{output:?}");
    let before: Vec<&String> = acked
        .iter()
        .filter(|(_, at)| *at < backup_started)
        .map(|(id, _)| id)
        .collect();
    assert!(
        before.len() >= 5,
        "load before the backup: {}",
        before.len()
    );
    assert!(
        acked.len() > before.len(),
        "writes went on during the backup"
    );
    // A backup never overwrites.
    let again = backup(&server, &file);
    assert!(!again.status.success());

    let fresh = dir.path().join("restored");
    let outcome = restore(&file, &fresh);
    assert!(outcome.status.success(), "{outcome:?}");
    // The live store cannot be replaced while its service runs.
    let busy = restore(&file, &server.state_dir);
    assert!(!busy.status.success());
    assert!(
        String::from_utf8_lossy(&busy.stderr).contains(&format!(
            "another Scarab (pid {}) is using it; stop it first",
            server.pid().expect("running")
        )),
        "{busy:?}"
    );

    let restored = Server::start(&fresh);
    for id in before {
        let (status, original) = server.get(&format!("/v1/runs/{id}"));
        assert_eq!(status, 200);
        let (status, copy) = restored.get(&format!("/v1/runs/{id}"));
        assert_eq!(
            status, 200,
            "run {id} acknowledged before the backup is missing"
        );
        assert_eq!(copy["pipeline"], original["pipeline"]);
        assert_eq!(copy["created_at"], original["created_at"]);
        assert_eq!(copy["steps"][0]["name"], "a");
    }
    let id = restored.submit("name: after\nsteps:\n  - name: a\n    run: [\"true\"]\n");
    assert_eq!(restored.wait_terminal(&id, WITHIN)["state"], "succeeded");
}

#[test]
fn restoring_an_older_backup_mints_no_fence_twice_and_stops_the_newer_lineage() {
    let dir = common::tempdir().expect("tempdir");
    let mut server = Server::start(&dir.path().join("state"));
    let first = server.submit("name: old\nsteps:\n  - name: a\n    run: [\"true\"]\n");
    server.wait_terminal(&first, WITHIN);
    let file = dir.path().join("old.redb");
    let output = backup(&server, &file);
    assert!(output.status.success(), "{output:?}");
    // The newer lineage: a step that runs on after the backup.
    let pid_file = dir.path().join("pid");
    let newer = server.submit(&format!(
        "name: newer\nsteps:\n  - name: s\n    run: [sh, -c, 'echo $$ > {}; sleep 60']\n",
        pid_file.display()
    ));
    let pid = wait_pid_file(&pid_file, WITHIN);
    let newer_fence = fences(
        &server.wait_for(&newer, WITHIN, |r| attempts(r, 0)[0]["state"] == "running"),
        0,
    )[0];
    server.kill9();
    let outcome = restore(&file, &server.state_dir);
    assert!(outcome.status.success(), "{outcome:?}");
    let kept = std::fs::read_dir(&server.state_dir)
        .expect("dir")
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("scarab.redb.before-restore-")
        });
    assert!(kept, "the replaced store is kept aside");
    server.resume();
    let (status, _) = server.get(&format!("/v1/runs/{newer}"));
    assert_eq!(status, 404, "the restored store predates that run");
    let deadline = Instant::now() + WITHIN;
    while process_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the newer lineage's step was not stopped"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let id = server.submit("name: next\nsteps:\n  - name: a\n    run: [\"true\"]\n");
    let run = server.wait_terminal(&id, WITHIN);
    assert!(
        fences(&run, 0)[0] > newer_fence,
        "fence {} minted again (newer lineage had {newer_fence})",
        fences(&run, 0)[0]
    );
}

/// Type=notify for real: READY=1 only once the service answers /readyz, WATCHDOG=1 pings
/// while the engine loop answers, STOPPING=1 on SIGTERM; JSON logs with --log-format json.
#[test]
fn systemd_notify_readiness_watchdog_and_json_logs() {
    use std::os::unix::net::UnixDatagram;
    let dir = common::tempdir().expect("tempdir");
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let state = dir.path().join("state");
    let log_path = dir.path().join("serve.log");
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--log-format",
            "json",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--state-dir")
        .arg(&state)
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000")
        .env("SCARAB_LOG", "info")
        .stderr(std::fs::File::create(&log_path).expect("log"))
        .spawn()
        .expect("spawn");
    let mut buffer = [0u8; 512];
    let mut received = |what: &str| -> String {
        loop {
            let n = socket
                .recv(&mut buffer)
                .unwrap_or_else(|e| panic!("no {what} from the service: {e}"));
            let text = String::from_utf8_lossy(&buffer[..n]).to_string();
            if text.contains(what) {
                return text;
            }
        }
    };
    received("READY=1");
    // Ready means ready: the API answers at once.
    let ready = common::agent()
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .call()
        .expect("readyz");
    assert_eq!(ready.status().as_u16(), 200);
    received("WATCHDOG=1");
    received("WATCHDOG=1");
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    received("STOPPING=1");
    assert_eq!(child.wait().expect("wait").code(), Some(0));
    let log = std::fs::read_to_string(&log_path).expect("log");
    assert!(!log.is_empty());
    for line in log.lines() {
        let parsed: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(parsed["level"].is_string(), "{line}");
    }
}

//! Admission control with real processes and a real store: a sampler counts the live step
//! processes (by a marker in their argv) while hundreds of runs compete for a pool of 4,
//! with and without kill -9 of the service; concurrency groups across a gate, supersede,
//! locks in both orders, a multi-slot step, SIGHUP raising and lowering the limit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{self, BIN, Server, attempts, fences};

const WITHIN: Duration = Duration::from_secs(300);

/// Runs of the two load tests (the acceptance figure; `SCARAB_ADMISSION_RUNS` changes it).
fn load_runs() -> usize {
    std::env::var("SCARAB_ADMISSION_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300)
}

/// How long each step of the load tests sleeps (`SCARAB_ADMISSION_SLEEP`; the acceptance
/// figure is 2 s, CI uses 0.3 s).
fn load_sleep() -> String {
    std::env::var("SCARAB_ADMISSION_SLEEP").unwrap_or_else(|_| "0.3".into())
}

/// Counts live processes whose argv holds `marker`, every 5 ms, keeping the largest count.
struct Sampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicUsize>,
    samples: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The steps (process trees whose root's argv holds `marker`) all alive at one instant.
///
/// /proc is read one process at a time, so a step that ended early in the scan and one
/// that started late in it could both be counted. So the scan only collects candidates
/// (pid, start time, parent); then each is checked again. Every candidate started before
/// the check began, so one still alive (same start time, not a zombie) when checked was
/// alive at the instant the check began: the count is of processes alive together. A
/// candidate whose parent is a candidate is the step's shell forked and not yet exec'd,
/// the same step: only roots count.
fn live_with(marker: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let candidates: Vec<(String, Stat)> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == marker.as_bytes()))
        })
        .filter_map(|pid| stat(&pid).map(|stat| (pid, stat)))
        .collect();
    let alive: Vec<&(String, Stat)> = candidates
        .iter()
        .filter(|(pid, first)| {
            stat(pid).is_some_and(|again| again.start == first.start && again.state != "Z")
        })
        .collect();
    let roots: Vec<_> = alive
        .iter()
        .filter(|(_, stat)| !alive.iter().any(|(pid, _)| *pid == stat.parent))
        .collect();
    if roots.len() > 4 {
        // What the failure will be about: each step and its parent (its supervisor).
        for (pid, stat) in &roots {
            let parent =
                std::fs::read(format!("/proc/{}/cmdline", stat.parent)).unwrap_or_default();
            let parent = String::from_utf8_lossy(&parent).replace('\0', " ");
            eprintln!(
                "live step {pid} ({}), parent {}: {parent}",
                stat.state, stat.parent
            );
        }
    }
    roots.len()
}

struct Stat {
    state: String,
    parent: String,
    start: String,
}

/// A process's state, parent and start time, from /proc/PID/stat.
fn stat(pid: &str) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields follow the last ')'.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    Some(Stat {
        state: fields.first()?.to_string(),
        parent: fields.get(1)?.to_string(),
        start: fields.get(19)?.to_string(),
    })
}

impl Sampler {
    fn start(marker: &str) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicUsize::new(0));
        let samples = Arc::new(AtomicUsize::new(0));
        let marker = marker.to_string();
        let thread = {
            let (stop, max, samples) = (stop.clone(), max.clone(), samples.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    max.fetch_max(live_with(&marker), Ordering::Relaxed);
                    samples.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Sampler {
            stop,
            max,
            samples,
            thread: Some(thread),
        }
    }

    /// Stops, and checks that never more than `limit` steps were alive at once while the
    /// sampler did see the load.
    fn assert_at_most(self, limit: usize) {
        let (max, samples) = self.finish();
        assert!(max <= limit, "{max} step processes were alive at once");
        assert!(
            max >= 2 && samples > 100,
            "the sampler saw the load ({max}, {samples} samples)"
        );
    }

    /// (largest count seen, samples taken).
    fn finish(mut self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        (
            self.max.load(Ordering::Relaxed),
            self.samples.load(Ordering::Relaxed),
        )
    }
}

/// A one-step pipeline whose process carries `marker` in its argv ($0 of `sh -c`) and
/// appends its fence to `out` before sleeping.
fn marked(marker: &str, out: &Path, sleep: &str) -> String {
    format!(
        "name: load\nsteps:\n  - name: work\n    run: [sh, -c, 'echo $SCARAB_FENCE >> \"$1\"; sleep {sleep}; true', {marker}, {}]\n",
        out.display()
    )
}

fn submit_with(server: &Server, yaml: &str, query: &str) -> String {
    let (status, body) = server.request(
        "POST",
        &format!("/v1/runs{query}"),
        "application/yaml",
        yaml.as_bytes(),
        &[],
    );
    assert_eq!(status, 201, "submit answered {body}");
    body["id"].as_str().expect("id").to_string()
}

fn local_pool(server: &Server) -> (u64, u64) {
    let (status, queue) = server.get("/v1/queue");
    assert_eq!(status, 200, "{queue}");
    let pool = queue["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "local")
        .cloned()
        .expect("local pool");
    (
        pool["used"].as_u64().expect("used"),
        pool["limit"].as_u64().expect("limit"),
    )
}

/// One sample of `/metrics`, named with its labels as the text format writes them
/// (`scarab_pool_slots_used{pool="local"}`).
fn metric(server: &Server, sample: &str) -> f64 {
    let text = common::agent()
        .get(format!("{}/metrics", server.url))
        .call()
        .expect("metrics")
        .body_mut()
        .read_to_string()
        .expect("text");
    text.lines()
        .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {sample} in:\n{text}"))
}

/// The fences the steps wrote, each line one run of a step.
fn written_fences(out: &Path) -> Vec<u64> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().parse().expect("a fence"))
        .collect()
}

fn wait_all(server: &Server, ids: &[String]) -> Vec<Value> {
    ids.iter()
        .map(|id| server.wait_terminal(id, WITHIN))
        .collect()
}

#[test]
fn a_pool_of_4_never_runs_more_and_admits_by_priority_then_submit_order() {
    let dir = common::tempdir().expect("tempdir");
    let out = dir.path().join("fences");
    let go = dir.path().join("go");
    let marker = "scarab-admission-order";
    // The admission order is read off the fences, minted at admission. Launches prepared
    // ahead are admitted as they arrive, before later runs of higher priority (their
    // start order is tested below), so none are prepared here.
    let mut server = Server::start_with_env(
        &dir.path().join("state"),
        &[],
        &[
            ("SCARAB_MAX_PARALLEL_LOCAL", "4"),
            ("SCARAB_PREPARED_LOCAL", "0"),
        ],
    );
    // The whole pool is held until every run is queued, so the admission order is the
    // scheduler's alone.
    let blocker = server.submit(&format!(
        "name: blocker\nsteps:\n  - name: hold\n    slots: 4\n    run: [sh, -c, 'while [ ! -e \"$1\" ]; do sleep 0.05; done', blocker, {}]\n",
        go.display()
    ));
    server.wait_for(&blocker, WITHIN, |run| {
        run["steps"][0]["attempts"][0]["state"] == "running"
    });
    let yaml = marked(marker, &out, &load_sleep());
    let mut submitted = Vec::new();
    for i in 0..load_runs() {
        let priority = (i * 7 % 3) as i64;
        let id = submit_with(&server, &yaml, &format!("?priority={priority}"));
        submitted.push((priority, id));
    }
    // A queued step says what it waits for.
    let last = &submitted.last().expect("runs").1;
    let run = server.run(last);
    let wait = &run["steps"][0]["waiting_for"];
    assert_eq!(wait["reason"], "pool", "{run:#}");
    assert_eq!(wait["name"], "local");
    assert!(wait["position"].as_u64().expect("position") >= 1);
    assert_eq!(run["steps"][0]["state"], "queued");
    let output = Command::new(BIN)
        .args([
            "queue",
            "-o",
            "json",
            "--url",
            &server.url,
            "--token",
            &server.token,
        ])
        .output()
        .expect("scarab queue");
    assert!(output.status.success(), "{output:?}");
    let queue: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(
        queue["waiting"]["pool"].as_u64(),
        Some(load_runs() as u64),
        "{queue:#}"
    );
    assert_eq!(queue["pools"][0]["used"], 4);
    assert_eq!(
        metric(&server, "scarab_pool_slots_used{pool=\"local\"}"),
        4.0
    );
    assert_eq!(
        metric(&server, "scarab_pool_slots_limit{pool=\"local\"}"),
        4.0
    );
    assert_eq!(
        metric(&server, "scarab_queued_steps{reason=\"pool\"}"),
        load_runs() as f64
    );

    let sampler = Sampler::start(marker);
    std::fs::write(&go, b"").expect("go");
    let ids: Vec<String> = submitted.iter().map(|(_, id)| id.clone()).collect();
    let runs = wait_all(&server, &ids);
    sampler.assert_at_most(4);

    // Every run succeeded, ran once, and was admitted in (priority, submit order).
    let mut by_fence = BTreeMap::new();
    for ((priority, id), run) in submitted.iter().zip(&runs) {
        assert_eq!(run["state"], "succeeded", "{run:#}");
        assert_eq!(attempts(run, 0).len(), 1);
        by_fence.insert(fences(run, 0)[0], (*priority, id.clone()));
    }
    let admitted: Vec<(i64, String)> = by_fence.into_values().collect();
    let mut expected = submitted.clone();
    expected.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    assert_eq!(admitted, expected, "admission order");
    let mut written = written_fences(&out);
    written.sort_unstable();
    let mut minted: Vec<u64> = runs.iter().map(|r| fences(r, 0)[0]).collect();
    minted.sort_unstable();
    assert_eq!(written, minted, "each step ran exactly once");
    assert_eq!(local_pool(&server), (0, 4), "the pool drained");
    assert_eq!(
        metric(&server, "scarab_pool_slots_used{pool=\"local\"}"),
        0.0
    );
    assert_eq!(metric(&server, "scarab_queued_steps{reason=\"pool\"}"), 0.0);
    // Every load step waited in the queue, and its wait was observed once it was admitted.
    assert!(metric(&server, "scarab_queued_duration_seconds_count") >= load_runs() as f64);
    let kinds = server.history_kinds(last);
    assert!(kinds.iter().any(|k| k == "admitted"), "{kinds:?}");
    server.kill9();
}

#[test]
fn prepared_launches_wait_for_a_slot_start_in_priority_order_and_survive_kill9() {
    let dir = common::tempdir().expect("tempdir");
    let out = dir.path().join("fences");
    let go = dir.path().join("go");
    let marker = "scarab-admission-prepared";
    let mut server = Server::start_with_env(
        &dir.path().join("state"),
        &[],
        &[
            ("SCARAB_MAX_PARALLEL_LOCAL", "1"),
            ("SCARAB_PREPARED_LOCAL", "2"),
        ],
    );
    let blocker = server.submit(&format!(
        "name: blocker\nsteps:\n  - name: hold\n    run: [sh, -c, 'while [ ! -e \"$1\" ]; do sleep 0.05; done', blocker, {}]\n",
        go.display()
    ));
    server.wait_for(&blocker, WITHIN, |run| {
        run["steps"][0]["attempts"][0]["state"] == "running"
    });
    let sampler = Sampler::start(marker);
    let yaml = marked(marker, &out, "0.2");
    // Two launches are prepared beyond the one slot; the rest wait in the queue, the run
    // of higher priority too: it came after the prepared ones were admitted.
    let low: Vec<String> = (0..3).map(|_| server.submit(&yaml)).collect();
    let high = submit_with(&server, &yaml, "?priority=5");
    let check_waiting = |server: &Server| {
        for id in &low[..2] {
            let run = server.wait_for(id, WITHIN, |run| {
                run["steps"][0]["attempts"][0]["state"] == "launching"
            });
            assert_eq!(run["steps"][0]["state"], "active", "{run:#}");
        }
        for id in [&low[2], &high] {
            let run = server.run(id);
            assert_eq!(run["steps"][0]["state"], "queued", "{run:#}");
            assert_eq!(run["steps"][0]["waiting_for"]["reason"], "pool");
        }
        assert_eq!(local_pool(server), (1, 1), "prepared launches use no slot");
        assert!(
            written_fences(&out).is_empty(),
            "nothing started beyond the slot"
        );
    };
    check_waiting(&server);
    // The prepared supervisors wait at the launch handshake; kill -9 of the service
    // cuts it, and the next service prepares them again under the same fences.
    std::thread::sleep(Duration::from_millis(300));
    server.kill9();
    server.resume();
    check_waiting(&server);

    std::fs::write(&go, b"").expect("go");
    let mut ids = vec![high.clone()];
    ids.extend(low.iter().cloned());
    let runs = wait_all(&server, &ids);
    let (max, samples) = sampler.finish();
    assert!(
        max == 1 && samples > 100,
        "{max} step processes alive at once ({samples} samples)"
    );
    assert_eq!(server.wait_terminal(&blocker, WITHIN)["state"], "succeeded");
    let mut expected = Vec::new();
    for run in &runs {
        assert_eq!(run["state"], "succeeded", "{run:#}");
        assert_eq!(attempts(run, 0).len(), 1, "{run:#}");
        expected.push(fences(run, 0)[0]);
    }
    // One slot: the steps ran one after another, the run of higher priority first, then
    // the others in submit order; each once.
    assert_eq!(written_fences(&out), expected, "start order");
    assert_eq!(local_pool(&server), (0, 1), "no slot leaked");
    server.kill9();
}

#[test]
fn kill9_during_the_load_never_exceeds_the_pool_and_runs_each_step_once() {
    let dir = common::tempdir().expect("tempdir");
    let out = dir.path().join("fences");
    let marker = "scarab-admission-kill9";
    let mut server = Server::start_with_env(
        &dir.path().join("state"),
        &[],
        &[("SCARAB_MAX_PARALLEL_LOCAL", "4")],
    );
    let sampler = Sampler::start(marker);
    let yaml = marked(marker, &out, &load_sleep());
    let total = load_runs();
    let mut ids = Vec::new();
    for i in 0..total {
        ids.push(server.submit(&yaml));
        // Three kills spread over the submissions and the load.
        if i > 0 && i % (total / 3).max(1) == 0 && ids.len() < total {
            server.kill9();
            std::thread::sleep(Duration::from_millis(300));
            server.resume();
        }
    }
    server.kill9();
    server.resume();
    let runs = wait_all(&server, &ids);
    sampler.assert_at_most(4);
    let mut minted = Vec::new();
    for run in &runs {
        assert_eq!(run["state"], "succeeded", "{run:#}");
        assert_eq!(attempts(run, 0).len(), 1, "{run:#}");
        minted.push(fences(run, 0)[0]);
    }
    minted.sort_unstable();
    let mut written = written_fences(&out);
    written.sort_unstable();
    assert_eq!(written, minted, "each step ran exactly once");
    assert_eq!(local_pool(&server), (0, 4), "no slot leaked");
    server.kill9();
}

fn config(dir: &Path, local: u32) -> PathBuf {
    let path = dir.join("scarab.toml");
    std::fs::write(
        &path,
        format!(
            "[engine]\nmax_parallel_local = {local}\n\n[[locks]]\nname = \"gpu\"\n\n[[locks]]\nname = \"a\"\n\n[[locks]]\nname = \"b\"\n"
        ),
    )
    .expect("config");
    path
}

/// `(start, end)` nanoseconds of each run of a step that logs them to `file`.
fn intervals(file: &Path) -> Vec<(u128, u128)> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let times: Vec<u128> = text
        .lines()
        .map(|l| l.trim().parse().expect("ns"))
        .collect();
    times.chunks(2).map(|c| (c[0], c[1])).collect()
}

fn timed(name: &str, locks: &str, file: &Path) -> String {
    format!(
        "name: {name}\nsteps:\n  - name: use\n    locks: {locks}\n    run: [sh, -c, 'date +%s%N >> \"$1\"; sleep 0.4; date +%s%N >> \"$1\"', x, {}]\n",
        file.display()
    )
}

#[test]
fn groups_locks_and_slots_hold_with_real_processes() {
    let dir = common::tempdir().expect("tempdir");
    let config = config(dir.path(), 4);
    let mut server = Server::start_with(
        &dir.path().join("state"),
        &["--config", config.to_str().expect("utf-8")],
    );

    // Refused at submit, naming the field.
    let (status, body) =
        server.submit_yaml("name: p\nsteps:\n  - name: s\n    locks: [tpu]\n    run: ['true']\n");
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["errors"][0]["field"], "steps[0].locks[0]", "{body}");
    let (status, body) =
        server.submit_yaml("name: p\nsteps:\n  - name: s\n    slots: 5\n    run: ['true']\n");
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["errors"][0]["field"], "steps[0].slots", "{body}");

    // A group of limit 1 runs one at a time, its gate wait included.
    let deploy = "name: deploy\nconcurrency: {group: prod}\nsteps:\n  - name: approve\n    gate: {}\n  - name: ship\n    needs: [approve]\n    run: [sleep, '0.2']\n";
    let first = server.submit(deploy);
    let second = server.submit(deploy);
    server.wait_for(&first, WITHIN, |run| run["state"] == "waiting");
    let run = server.run(&second);
    assert_eq!(run["steps"][0]["state"], "queued", "{run:#}");
    assert_eq!(run["steps"][0]["waiting_for"]["reason"], "group");
    assert_eq!(run["steps"][0]["waiting_for"]["name"], "prod");
    assert_eq!(run["admission"]["concurrency"]["held"], false);
    assert_eq!(server.run(&first)["admission"]["concurrency"]["held"], true);
    let approve = |id: &str| {
        let (status, body) = server.post_json(
            &format!("/v1/runs/{id}/gates/approve/approve"),
            &serde_json::json!({"by": "test"}),
        );
        assert_eq!(status, 200, "{body}");
    };
    approve(&first);
    let done = server.wait_terminal(&first, WITHIN);
    assert_eq!(done["state"], "succeeded");
    let run = server.wait_for(&second, WITHIN, |run| run["state"] == "waiting");
    let shipped = done["steps"][1]["attempts"][0]["finished_at"]
        .as_str()
        .expect("finished");
    let opened = run["steps"][0]["gate"]["opened_at"]
        .as_str()
        .expect("opened");
    assert!(
        opened >= shipped,
        "the second gate opened ({opened}) before the first run ended ({shipped})"
    );
    approve(&second);
    assert_eq!(server.wait_terminal(&second, WITHIN)["state"], "succeeded");

    // supersede cancels the group's queued older runs, never the one holding the slot.
    let release = "name: release\nconcurrency: {group: rel, supersede: true}\nsteps:\n  - name: approve\n    gate: {}\n";
    let holder = server.submit(release);
    server.wait_for(&holder, WITHIN, |run| run["state"] == "waiting");
    let older = server.submit(release);
    let newer = server.submit(release);
    let cancelled = server.wait_terminal(&older, WITHIN);
    assert_eq!(cancelled["state"], "cancelled");
    assert_eq!(cancelled["cancel_reason"], "superseded");
    assert_eq!(server.run(&holder)["state"], "waiting");
    assert_eq!(server.run(&newer)["steps"][0]["state"], "queued");
    let (status, _) = server.post_json(
        &format!("/v1/runs/{holder}/cancel"),
        &serde_json::json!({"by": "test"}),
    );
    assert_eq!(status, 202);
    server.wait_for(&newer, WITHIN, |run| run["state"] == "waiting");
    let (status, _) = server.post_json(
        &format!("/v1/runs/{newer}/cancel"),
        &serde_json::json!({"by": "test"}),
    );
    assert_eq!(status, 202);

    // Two pipelines sharing gpu (limit 1) never overlap. (The logs are in a directory of
    // their own: the one holding the config is the service's, out of the steps' reach.)
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("logs");
    let gpu_log = logs.join("gpu");
    let gpu: Vec<String> = (0..4)
        .map(|i| server.submit(&timed(&format!("train{}", i % 2), "[gpu]", &gpu_log)))
        .collect();
    // Locks named in both orders: both finish.
    let ab_log = logs.join("ab");
    let ab = server.submit(&timed("ab", "[a, b]", &ab_log));
    let ba = server.submit(&timed("ba", "[b, a]", &ab_log));
    for id in gpu.iter().chain([&ab, &ba]) {
        let run = server.wait_terminal(id, WITHIN);
        assert_eq!(run["state"], "succeeded", "{run:#}");
    }
    for log in [&gpu_log, &ab_log] {
        let mut spans = intervals(log);
        spans.sort_unstable();
        assert!(
            spans.windows(2).all(|w| w[0].1 <= w[1].0),
            "overlap: {spans:?}"
        );
    }
    assert_eq!(intervals(&gpu_log).len(), 4);

    // A step taking 3 of the 4 slots is admitted before one-slot steps submitted after it.
    let long = "name: long\nsteps:\n  - name: s\n    run: [sleep, '1']\n";
    let busy: Vec<String> = (0..2).map(|_| server.submit(long)).collect();
    let big =
        server.submit("name: big\nsteps:\n  - name: s\n    slots: 3\n    run: [sleep, '0.2']\n");
    let small: Vec<String> = (0..6)
        .map(|_| server.submit("name: small\nsteps:\n  - name: s\n    run: [sleep, '0.3']\n"))
        .collect();
    let big_run = server.wait_terminal(&big, WITHIN);
    assert_eq!(big_run["state"], "succeeded");
    let big_fence = fences(&big_run, 0)[0];
    for id in busy.iter().chain(&small) {
        assert_eq!(server.wait_terminal(id, WITHIN)["state"], "succeeded");
    }
    for id in &small {
        assert!(
            fences(&server.run(id), 0)[0] > big_fence,
            "a later one-slot step went first"
        );
    }
    assert_eq!(local_pool(&server), (0, 4));
    server.kill9();
}

#[test]
fn sighup_raising_the_limit_admits_at_once_and_lowering_it_stops_nothing() {
    let dir = common::tempdir().expect("tempdir");
    let config = config(dir.path(), 1);
    let mut server = Server::start_with(
        &dir.path().join("state"),
        &["--config", config.to_str().expect("utf-8")],
    );
    let marker = "scarab-admission-sighup";
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("logs");
    let out = logs.join("fences");
    // Long enough that the first step still runs after both reloads (each waited for up
    // to 2 s) on a loaded machine: the check below counts live processes.
    let yaml = marked(marker, &out, "8");
    let ids: Vec<String> = (0..4).map(|_| server.submit(&yaml)).collect();
    let running = |server: &Server| {
        ids.iter()
            .filter(|id| server.run(id)["steps"][0]["attempts"][0]["state"] == "running")
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(&server) < 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(running(&server), 1);
    assert_eq!(local_pool(&server), (1, 1));
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)
            .expect("read")
            .replace("max_parallel_local = 1", "max_parallel_local = 3"),
    )
    .expect("write");
    server.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(2);
    while local_pool(&server).0 < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(local_pool(&server), (3, 3), "raised: admitted at once");
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)
            .expect("read")
            .replace("max_parallel_local = 3", "max_parallel_local = 1"),
    )
    .expect("write");
    server.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(2);
    while local_pool(&server).1 != 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(local_pool(&server), (3, 1), "lowered: nothing stopped");
    assert_eq!(live_with(marker), 3, "the three steps still run");
    for id in &ids {
        let run = server.wait_terminal(id, WITHIN);
        assert_eq!(run["state"], "succeeded", "{run:#}");
        assert_eq!(attempts(&run, 0).len(), 1);
    }
    assert_eq!(written_fences(&out).len(), 4, "each step ran once");
    server.kill9();
}

#[test]
fn a_submission_beyond_max_active_runs_is_refused_429_and_changes_nothing() {
    let dir = common::tempdir().expect("tempdir");
    let config = dir.path().join("scarab.toml");
    std::fs::write(&config, "[engine]\nmax_active_runs = 2\n").expect("config");
    let server = Server::start_with(
        &dir.path().join("state"),
        &["--config", config.to_str().expect("utf-8")],
    );
    let gate = "name: g\nsteps:\n  - name: approve\n    gate: {}\n";
    let first = server.submit(gate);
    server.submit(gate);
    let (status, body) = server.submit_yaml(gate);
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("engine.max_active_runs")),
        "{body}"
    );
    let (_, runs) = server.get("/v1/runs");
    assert_eq!(
        runs["runs"].as_array().map(Vec::len),
        Some(2),
        "nothing was created"
    );
    let (status, _) = server.post_json(
        &format!("/v1/runs/{first}/cancel"),
        &serde_json::json!({"by": "test"}),
    );
    assert_eq!(status, 202);
    server.wait_terminal(&first, WITHIN);
    // A refused action on the finished run brings it into the driver's cache of runs
    // in progress for a moment; it must leave again, or it would hold a place in the
    // limit that no run uses.
    let (status, body) = server.post_json(
        &format!("/v1/runs/{first}/retry"),
        &serde_json::json!({"from": "no-such-step"}),
    );
    assert_eq!(status, 404, "{body}");
    server.submit(gate);
    let (status, body) = server.submit_yaml(gate);
    assert_eq!(status, 429, "two in progress again: {body}");
}

//! Edge sites: a state dir whose disk fills while runs come and go, on a size-limited
//! tmpfs the test mounts (the test needs root to mount, as CI has).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{self, Server, attempts};

const WITHIN: Duration = Duration::from_secs(120);

/// A tmpfs of `size` mounted at `at` (mode 0700), unmounted when dropped; `None` (and
/// the test says it is skipped) when this process may not mount (not root).
pub(crate) struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    pub(crate) fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting a tmpfs needs root (CI runs as root)");
            return None;
        }
        std::fs::create_dir_all(at).expect("mount point");
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .expect("mount");
        assert!(status.success(), "mount tmpfs at {}", at.display());
        Some(Tmpfs {
            at: at.to_path_buf(),
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Writes zeros to `path` until the filesystem refuses (ENOSPC); the bytes written.
pub(crate) fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).expect("filler");
    let chunk = vec![0u8; 256 * 1024];
    let mut written = 0;
    while file.write_all(&chunk).is_ok() {
        written += chunk.len() as u64;
    }
    // The last partial chunk, byte-wise enough to leave nothing free.
    while file.write_all(&[0u8; 4096]).is_ok() {
        written += 4096;
    }
    written
}

fn ready(server: &Server) -> (u16, Value) {
    let response = common::agent()
        .get(&format!("{}/readyz", server.url))
        .call()
        .expect("readyz");
    let status = response.status().as_u16();
    let mut response = response;
    let text = response.body_mut().read_to_string().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[test]
fn a_full_disk_refuses_submissions_with_507_and_loses_nothing_when_space_returns() {
    let dir = common::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let Some(_mount) = Tmpfs::mount(&state, "48m") else {
        return;
    };
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    let server = Server::start_with_env(&state, &[], &[("SCARAB_MAX_PARALLEL_LOCAL", "4")]);
    let pipeline = |i: usize| {
        format!(
            "name: load\nsteps:\n  - name: work\n    run: [sh, -c, 'echo $SCARAB_FENCE >> \"$1\"; seq 1 2000; sleep 0.5', x, {}]\n",
            out.join(format!("run-{i}")).display()
        )
    };
    let mut acknowledged = Vec::new();
    for i in 0..12 {
        acknowledged.push((i, server.submit(&pipeline(i))));
    }

    // The disk fills while those run: new submissions are refused with 507 and nothing
    // of them is created; the service says so. (The store has free pages of its own:
    // submissions go on until they are used up.)
    let filler = state.join("filler");
    let filled = fill(&filler);
    assert!(filled > 0);
    let mut refused = 0;
    let deadline = Instant::now() + WITHIN;
    for i in 12..20_000 {
        let (status, body) = server.submit_yaml(&pipeline(i));
        match status {
            201 => acknowledged.push((i, body["id"].as_str().expect("id").to_string())),
            507 => {
                refused += 1;
                let error = body["error"].as_str().unwrap_or_default();
                assert!(error.contains("disk is full"), "{body}");
            }
            other => panic!("submission answered {other}: {body}"),
        }
        if refused >= 3 || Instant::now() > deadline {
            break;
        }
    }
    assert!(refused >= 3, "no 507 while the disk was full");
    let (status, body) = ready(&server);
    assert_eq!(status, 503, "{body}");
    assert!(
        body["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("disk is full"),
        "{body}"
    );
    let (_, metrics) = server.request("GET", "/metrics", "", b"", &[]);
    assert!(
        metrics
            .as_str()
            .unwrap_or_default()
            .contains("scarab_disk_full 1"),
        "{metrics}"
    );

    // While the disk is full, what was acknowledged goes on: launches and verdicts are
    // recorded in the space the reserve gave back.
    for (_, id) in &acknowledged {
        let run = server.wait_terminal(id, WITHIN);
        assert_eq!(run["state"], "succeeded", "{run:#}");
    }
    assert_eq!(ready(&server).0, 503, "still full");

    // Space returns: Scarab goes on by itself.
    std::fs::remove_file(&filler).expect("free the disk");
    let deadline = Instant::now() + WITHIN;
    while ready(&server).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready again: {}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = server.submit(&pipeline(99));
    acknowledged.push((99, after));

    // Every acknowledged run finishes, each step ran once, nothing panicked.
    eprintln!(
        "{} runs acknowledged, {refused} refused",
        acknowledged.len()
    );
    for (i, id) in &acknowledged {
        let run = server.wait_terminal(id, WITHIN);
        assert_eq!(run["state"], "succeeded", "{run:#}");
        let ran = std::fs::read_to_string(out.join(format!("run-{i}"))).expect("ran");
        assert_eq!(
            ran.lines().count(),
            attempts(&run, 0).len(),
            "run {i} ran more often than it has attempts"
        );
        assert_eq!(attempts(&run, 0).len(), 1, "{run:#}");
    }
    let log = server.log();
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        log.contains("operator alert: the state dir's disk is full"),
        "{log}"
    );
}

/// What a power cut may leave of a file of an attempt directory (none is fsynced).
#[derive(Clone, Copy, Debug)]
enum Cut {
    Missing,
    Empty,
    /// Half of it.
    Torn,
    /// Of `attempt.jsonl` (its records are appended in order): its first `whole` records,
    /// and half of the next if `torn`.
    Records {
        whole: usize,
        torn: bool,
    },
}

impl Cut {
    /// What a power cut may leave of each file.
    fn of(file: &str) -> Vec<Cut> {
        let mut cuts = vec![Cut::Missing, Cut::Empty];
        if file == "attempt.jsonl" {
            // The spec, the supervisor, the step, the verdict.
            for whole in 0..4 {
                cuts.push(Cut::Records { whole, torn: true });
                if whole > 0 {
                    cuts.push(Cut::Records { whole, torn: false });
                }
            }
        } else {
            cuts.push(Cut::Torn);
        }
        cuts
    }
}

const ATTEMPT_FILES: [&str; 3] = ["attempt.jsonl", "stdout.log", "stderr.log"];

fn cut(dir: &Path, name: &str, how: Cut) {
    let path = dir.join(name);
    let Ok(bytes) = std::fs::read(&path) else {
        return;
    };
    let kept = match how {
        Cut::Missing => {
            std::fs::remove_file(&path).expect("remove");
            return;
        }
        Cut::Empty => 0,
        Cut::Torn => bytes.len() / 2,
        Cut::Records { whole, torn } => {
            let ends: Vec<usize> = bytes
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .map(|(at, _)| at + 1)
                .collect();
            let start = if whole == 0 { 0 } else { ends[whole - 1] };
            match ends.get(whole) {
                Some(end) if torn => start + (end - start) / 2,
                _ => start,
            }
        }
    };
    std::fs::write(&path, &bytes[..kept]).expect("cut");
}

/// A power cut at two points of an attempt's life — while its step runs (service,
/// supervisor and step die) and after its step ended while the service was down — with
/// each file of the attempt directory missing, empty, torn, or (the record file) cut
/// after or in the middle of each of its records. At the next start every attempt is
/// judged: nothing that may have run runs again, and every run ends.
#[test]
fn a_power_cut_leaving_any_attempt_file_missing_empty_or_torn_never_runs_a_step_twice() {
    let dir = common::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    let mut server = Server::start_with_env(
        &dir.path().join("state"),
        &[],
        &[("SCARAB_MAX_PARALLEL_LOCAL", "64")],
    );
    let mut cases: Vec<(bool, &str, Cut)> = Vec::new();
    for mid_run in [true, false] {
        for file in ATTEMPT_FILES {
            for how in Cut::of(file) {
                // A step cut mid-run has no verdict to cut.
                if !(mid_run && matches!(how, Cut::Records { whole: 3, .. })) {
                    cases.push((mid_run, file, how));
                }
            }
        }
    }
    let mut runs = Vec::new();
    // Mid-run steps outlive the cut; the others end while the service is down, once the
    // release file appears (never before the cut, however slow the machine).
    let release = dir.path().join("release");
    for (i, (mid_run, _, _)) in cases.iter().enumerate() {
        let wait = if *mid_run {
            "sleep 60".to_string()
        } else {
            format!("until [ -e {} ]; do sleep 0.05; done", release.display())
        };
        let yaml = format!(
            "name: cut\nsteps:\n  - name: s\n    run: [sh, -c, 'echo $SCARAB_FENCE >> \"$1\"; echo out; echo err >&2; {wait}', x, {}]\n",
            out.join(format!("run-{i}")).display()
        );
        runs.push(server.submit(&yaml));
    }
    let mut dirs = Vec::new();
    for id in &runs {
        let run = server.wait_for(id, WITHIN, |run| {
            run["steps"][0]["attempts"][0]["state"] == "running"
        });
        let fence = attempts(&run, 0)[0]["fence"].as_u64().expect("fence");
        dirs.push(server.state_dir.join("attempts").join(fence.to_string()));
    }
    // The cut: the service dies; so do the mid-run supervisors and steps. The others'
    // steps end and their supervisors write verdicts nobody reads yet.
    server.kill9();
    std::fs::write(&release, b"").expect("release");
    for ((mid_run, _, _), attempt) in cases.iter().zip(&dirs) {
        if *mid_run {
            // The supervisor first, so that it does not live to see its step die; then the
            // step's whole process group.
            let deadline = Instant::now() + WITHIN;
            let recorded = loop {
                let recorded = common::recorded_processes(attempt);
                if recorded.len() == 2 {
                    break recorded;
                }
                assert!(
                    Instant::now() < deadline,
                    "no step recorded in {}",
                    attempt.display()
                );
                std::thread::sleep(Duration::from_millis(20));
            };
            for (pid, _, group) in recorded {
                unsafe {
                    if group {
                        libc::kill(-pid, libc::SIGKILL);
                    }
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        } else {
            let deadline = Instant::now() + WITHIN;
            while records(attempt) < 4 {
                assert!(
                    Instant::now() < deadline,
                    "no verdict in {}",
                    attempt.display()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    for ((_, file, how), attempt) in cases.iter().zip(&dirs) {
        cut(attempt, file, *how);
    }
    server.resume();
    for (i, (id, (mid_run, file, how))) in runs.iter().zip(&cases).enumerate() {
        let run = server.wait_terminal(id, WITHIN);
        let case = format!(
            "{} {file} {how:?}",
            if *mid_run { "mid-run" } else { "ended" }
        );
        assert_eq!(attempts(&run, 0).len(), 1, "{case}: {run:#}");
        let ran = std::fs::read_to_string(out.join(format!("run-{i}"))).unwrap_or_default();
        assert_eq!(
            ran.lines().count(),
            1,
            "{case}: the step ran {} times",
            ran.lines().count()
        );
        let class = attempts(&run, 0)[0]["class"].clone();
        if *mid_run || *file == "attempt.jsonl" {
            // Killed with the service, or the verdict is cut (every record of the file
            // comes before it): no verdict can be had.
            assert_eq!(class, "lost", "{case}: {run:#}");
        } else {
            assert_eq!(run["state"], "succeeded", "{case}: {run:#}");
        }
    }
    let log = server.log();
    assert!(!log.contains("panicked"), "{log}");
}

/// Whole records in an attempt's `attempt.jsonl`.
fn records(attempt: &Path) -> usize {
    std::fs::read(attempt.join("attempt.jsonl"))
        .map(|bytes| bytes.iter().filter(|b| **b == b'\n').count())
        .unwrap_or(0)
}

/// libfaketime (Debian's `faketime`), which `.ci/run` installs.
fn libfaketime() -> Option<PathBuf> {
    let found = std::fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .map(|entry| entry.path().join("faketime/libfaketime.so.1"))
        .find(|path| path.exists());
    if found.is_none() && std::env::var_os("CI").is_some() {
        panic!("libfaketime is missing: .ci/run installs Debian's faketime");
    }
    found
}

/// The service's wall clock steps hours forward and back (libfaketime, driven by a file)
/// while gates wait on their `auto_release`: none fires early, none stalls.
#[test]
fn wall_clock_steps_neither_fire_timers_early_nor_stall_them() {
    let Some(faketime) = libfaketime() else {
        eprintln!("skipped: libfaketime is not installed (apt-get install faketime)");
        return;
    };
    let dir = common::tempdir().expect("tempdir");
    let offset = dir.path().join("offset");
    std::fs::write(&offset, "+0").expect("offset");
    let server = Server::start_with_env(
        &dir.path().join("state"),
        &[],
        &[
            ("LD_PRELOAD", faketime.to_str().expect("utf-8")),
            ("FAKETIME_TIMESTAMP_FILE", offset.to_str().expect("utf-8")),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    let gate = "name: g\nsteps:\n  - name: approve\n    gate: {auto_release: 3s}\n  - name: after\n    needs: [approve]\n    run: ['true']\n";
    for step in ["+2h", "-3h"] {
        let id = server.submit(gate);
        server.wait_for(&id, WITHIN, |run| run["state"] == "waiting");
        let opened = Instant::now();
        std::fs::write(&offset, step).expect("step the clock");
        // Another commit notices the step (a submission is one).
        std::thread::sleep(Duration::from_millis(300));
        server.submit("name: tick\nsteps:\n  - name: t\n    run: ['true']\n");
        std::thread::sleep(Duration::from_millis(700));
        assert_eq!(
            server.run(&id)["state"],
            "waiting",
            "{step}: the gate fired early"
        );
        let run = server.wait_terminal(&id, Duration::from_secs(30));
        let waited = opened.elapsed();
        assert_eq!(run["state"], "succeeded", "{step}: {run:#}");
        assert_eq!(
            run["steps"][0]["gate"]["decision"]["outcome"],
            "auto_released"
        );
        assert!(
            waited >= Duration::from_millis(2500) && waited < Duration::from_secs(15),
            "{step}: released after {waited:?}, not about 3 s"
        );
        let (_, metrics) = server.request("GET", "/metrics", "", b"", &[]);
        let text = metrics.as_str().unwrap_or_default().to_string();
        let skew = text
            .lines()
            .find(|l| l.starts_with("scarab_clock_skew_seconds "))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<i64>().ok())
            .expect("the skew metric");
        let expected = if step == "+2h" { 7200 } else { -3 * 3600 };
        assert!((skew - expected).abs() < 60, "{step}: skew {skew}");
        std::fs::write(&offset, "+0").expect("back");
    }
    assert!(
        server.log().contains("the wall clock stepped"),
        "{}",
        server.log()
    );
}

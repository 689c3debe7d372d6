//! Crash safety: kill -9 of the real service at awkward moments, then a restart on the
//! same state dir. No step may run twice, none may be lost.

use crate::common;

use std::time::Duration;

use common::{Server, attempts, fences, process_alive, wait_pid_file};

const WITHIN: Duration = Duration::from_secs(60);

/// The run succeeded with one attempt, and its step wrote exactly one line.
fn assert_ran_once(server: &Server, id: &str, out: &std::path::Path) -> serde_json::Value {
    let run = server.wait_terminal(id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(attempts(&run, 0).len(), 1, "one attempt");
    let text = std::fs::read_to_string(out).expect("output");
    assert_eq!(
        text.lines().count(),
        1,
        "the step ran exactly once: {text:?}"
    );
    run
}

fn running(run: &serde_json::Value) -> bool {
    attempts(run, 0)
        .first()
        .is_some_and(|a| a["state"] == "running")
}

/// A step that sleeps, then appends one line to `out`.
fn sleeper(out: &std::path::Path, sleep_s: f64) -> String {
    format!(
        "name: crash\nsteps:\n  - name: work\n    run: [sh, -c, 'sleep {sleep_s}; echo \"fence $SCARAB_FENCE\" >> {}']\n",
        out.display()
    )
}

#[test]
fn kill9_mid_step_readopts_and_the_step_runs_once() {
    let dir = common::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let mut server = Server::start(&dir.path().join("state"));
    let id = server.submit(&sleeper(&out, 5.0));
    let before = server.wait_for(&id, WITHIN, running);
    let fence = fences(&before, 0)[0];
    server.restart();
    let run = assert_ran_once(&server, &id, &out);
    assert_eq!(fences(&run, 0), vec![fence], "re-adoption keeps the fence");
    let text = std::fs::read_to_string(&out).expect("output");
    assert_eq!(
        text,
        format!("fence {fence}\n"),
        "the line was written under that fence"
    );
}

#[test]
fn verdict_reached_while_down_is_applied_on_start() {
    let dir = common::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let mut server = Server::start(&dir.path().join("state"));
    let id = server.submit(&sleeper(&out, 1.0));
    server.wait_for(&id, WITHIN, running);
    server.kill9();
    // The step finishes while nobody is listening.
    let deadline = std::time::Instant::now() + WITHIN;
    while !out.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the step never finished"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    server.restart();
    assert_ran_once(&server, &id, &out);
}

#[test]
fn timeout_while_down_kills_the_step_at_its_timeout() {
    let dir = common::tempdir().expect("tempdir");
    let pid_file = dir.path().join("pid");
    let mut server = Server::start(&dir.path().join("state"));
    let yaml = format!(
        "name: p\nsteps:\n  - name: hang\n    run: [sh, -c, 'echo $$ > {}; exec sleep 60']\n    timeout: 2s\n",
        pid_file.display()
    );
    let id = server.submit(&yaml);
    server.wait_for(&id, WITHIN, running);
    let pid = wait_pid_file(&pid_file, WITHIN);
    server.kill9();
    // The supervisor, not the service, enforces the timeout.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while process_alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "step {pid} outlived its timeout with the service down"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    server.restart();
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(attempts(&run, 0).len(), 1);
    assert_eq!(attempts(&run, 0)[0]["class"], "timeout");
    assert_eq!(run["steps"][0]["reason"], "TimedOut");
}

#[test]
fn acknowledged_submission_survives_kill9_right_after_201() {
    let dir = common::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let mut server = Server::start(&dir.path().join("state"));
    let id = server.submit(&sleeper(&out, 0.2));
    let minted = fences(&server.run(&id), 0);
    server.kill9();
    server.restart();
    let run = assert_ran_once(&server, &id, &out);
    // Whether or not the launch was confirmed before the kill, it ran under the fence
    // minted at submission: an unconfirmed launch is relaunched with the same fence.
    assert_eq!(fences(&run, 0), minted);
}

#[test]
fn many_steps_in_flight_survive_kill9_each_exactly_once() {
    let dir = common::tempdir().expect("tempdir");
    let out_dir = dir.path().join("outs");
    std::fs::create_dir_all(&out_dir).expect("dir");
    // All twenty in flight at once: a pool that large.
    let mut server = Server::start_with_env(
        &dir.path().join("state"),
        &[],
        &[("SCARAB_MAX_PARALLEL_LOCAL", "20")],
    );
    let mut steps = String::new();
    for i in 0..20 {
        steps.push_str(&format!(
            "  - name: s{i}\n    run: [sh, -c, 'sleep 2; echo $SCARAB_FENCE >> {}/s{i}']\n",
            out_dir.display()
        ));
    }
    let id = server.submit(&format!("name: wide\nsteps:\n{steps}"));
    server.wait_for(&id, WITHIN, |run| {
        run["steps"]
            .as_array()
            .is_some_and(|s| s.iter().all(|s| s["attempts"][0]["state"] == "running"))
    });
    server.restart();
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    for i in 0..20 {
        assert_eq!(attempts(&run, i).len(), 1);
        let text = std::fs::read_to_string(out_dir.join(format!("s{i}"))).expect("output");
        assert_eq!(text.lines().count(), 1, "step s{i} ran once");
        assert_eq!(text.trim(), fences(&run, i)[0].to_string());
    }
}

#[test]
fn sigterm_exits_cleanly_and_leaves_steps_for_readoption() {
    let dir = common::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let mut server = Server::start(&dir.path().join("state"));
    let id = server.submit(&sleeper(&out, 2.0));
    server.wait_for(&id, WITHIN, running);
    assert_eq!(server.terminate(), Some(0), "SIGTERM exits 0");
    server.restart();
    assert_ran_once(&server, &id, &out);
}

#[test]
fn restore_of_an_older_store_stops_foreign_attempts_and_never_reuses_a_fence() {
    let dir = common::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let mut server = Server::start(&state);
    let first = server.submit("name: p\nsteps:\n  - name: a\n    run: ['true']\n");
    server.wait_terminal(&first, WITHIN);
    assert_eq!(server.terminate(), Some(0));
    let backup = dir.path().join("backup.redb");
    std::fs::copy(state.join("scarab.redb"), &backup).expect("backup");

    server.restart();
    let pid_file = dir.path().join("pid");
    let yaml = format!(
        "name: p\nsteps:\n  - name: zombie\n    run: [sh, -c, 'echo $$ > {}; exec sleep 60']\n",
        pid_file.display()
    );
    let newer = server.submit(&yaml);
    let newer_fence = fences(&server.wait_for(&newer, WITHIN, running), 0)[0];
    let pid = wait_pid_file(&pid_file, WITHIN);
    server.kill9();

    // Restore the older file: the running attempt belongs to a lineage this store never saw.
    std::fs::copy(&backup, state.join("scarab.redb")).expect("restore");
    server.restart();
    let deadline = std::time::Instant::now() + WITHIN;
    while process_alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the foreign step {pid} was not stopped"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, _) = server.get(&format!("/v1/runs/{newer}"));
    assert_eq!(status, 404, "the restored store never had that run");
    let later = server.submit("name: p\nsteps:\n  - name: a\n    run: ['true']\n");
    let run = server.wait_terminal(&later, WITHIN);
    assert!(
        fences(&run, 0)[0] > newer_fence,
        "fences are never reused after a restore"
    );
}

/// A supervisor from the zygote serves the next attempt once its step ended cleanly; one
/// whose step left a process holding its output ends after the attempt instead, and a
/// free one ends after waiting `limits::SUPERVISOR_KEPT_FOR` (5 s) for work.
#[test]
fn a_supervisor_is_kept_for_the_next_attempt_unless_something_of_its_step_may_remain() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let quick = |name: &str, extra: &str| {
        let file = dir.path().join(name);
        let id = server.submit(&format!(
            "name: {name}\nsteps:\n  - name: a\n    run: [sh, -c, 'echo $PPID > {}{extra}']\n",
            file.display()
        ));
        let run = server.wait_terminal(&id, WITHIN);
        assert_eq!(run["state"], "succeeded", "{run:#}");
        wait_pid_file(&file, WITHIN)
    };
    let first = quick("first", "");
    let second = quick("second", "");
    assert_eq!(
        first, second,
        "the second attempt had the first's supervisor"
    );
    let zygote = parent_of(first).expect("the kept supervisor waits for work");
    assert_eq!(
        parent_of(zygote),
        Some(server.pid().expect("running") as i32),
        "its parent is the zygote"
    );

    // A process that left the step's group keeps the output pipe open: the verdict comes
    // after the drain bound, and that supervisor serves no other attempt.
    let escaped = dir.path().join("escaped");
    // The step ends only once the other process has its own session (and so is out of
    // reach of the step's group being killed).
    let third = quick(
        "third",
        &format!(
            "; setsid sh -c \"echo \\$\\$ > {0}; exec sleep 60\" & while [ ! -s {0} ]; do sleep 0.01; done",
            escaped.display()
        ),
    );
    let escaped = wait_pid_file(&escaped, WITHIN);
    assert!(
        process_alive(escaped),
        "the process that left the step's group runs"
    );
    assert_eq!(
        third, first,
        "the third attempt still had the kept supervisor"
    );
    // At once, well within the time a free supervisor is kept.
    let fourth = quick("fourth", "");
    assert_ne!(
        fourth, third,
        "a supervisor with output still draining was given another attempt"
    );
    let deadline = std::time::Instant::now() + WITHIN;
    while process_alive(third) {
        assert!(
            std::time::Instant::now() < deadline,
            "a supervisor with output still draining did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: a plain kill of the process the test's step left behind.
    unsafe { libc::kill(escaped, libc::SIGKILL) };

    // Nothing to do: the free supervisor ends on its own.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while process_alive(fourth) {
        assert!(
            std::time::Instant::now() < deadline,
            "a free supervisor waited for work for ever"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The parent pid of `pid` (field 4 of /proc/PID/stat), while it runs.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Runs one step that records its supervisor's pid (its shell's parent) and stays a
/// moment; returns the run's id and that pid.
fn supervised_step(server: &Server, dir: &std::path::Path, name: &str) -> (String, i32) {
    let file = dir.join(name);
    let id = server.submit(&format!(
        "name: {name}\nsteps:\n  - name: a\n    run: [sh, -c, 'echo $PPID > {}; sleep 1']\n",
        file.display()
    ));
    (id, wait_pid_file(&file, WITHIN))
}

#[test]
fn supervisors_come_from_a_zygote_that_ends_with_the_service_and_a_killed_one_costs_nothing() {
    let dir = common::tempdir().expect("tempdir");
    let mut server = Server::start(&dir.path().join("state"));
    let service = server.pid().expect("running") as i32;

    let (first, supervisor) = supervised_step(&server, dir.path(), "first");
    let zygote = parent_of(supervisor).expect("the supervisor runs");
    assert_ne!(zygote, service, "the supervisor was forked, not executed");
    assert_eq!(
        parent_of(zygote),
        Some(service),
        "the zygote is the service's"
    );
    let cmdline = std::fs::read(format!("/proc/{zygote}/cmdline")).expect("cmdline");
    assert!(
        cmdline.ends_with(b"supervise\0--zygote\0"),
        "{:?}",
        String::from_utf8_lossy(&cmdline)
    );

    // A killed zygote: what it forked goes on, the next launch executes the supervisor
    // instead, and the one after has a new zygote.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(zygote).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill the zygote");
    let run = server.wait_terminal(&first, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let (second, supervisor) = supervised_step(&server, dir.path(), "second");
    assert_eq!(parent_of(supervisor), Some(service), "executed directly");
    let run = server.wait_terminal(&second, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert!(
        server.log().contains("no supervisor from the zygote"),
        "{}",
        server.log()
    );
    let (third, supervisor) = supervised_step(&server, dir.path(), "third");
    let new_zygote = parent_of(supervisor).expect("the supervisor runs");
    assert!(
        ![zygote, service].contains(&new_zygote),
        "a new zygote: {new_zygote}"
    );
    let run = server.wait_terminal(&third, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");

    // kill -9 of the service closes the zygote's socket, and the zygote ends.
    server.kill9();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while process_alive(new_zygote) {
        assert!(
            std::time::Instant::now() < deadline,
            "the zygote outlived the service"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

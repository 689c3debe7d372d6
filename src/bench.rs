//! `scarab bench`: the performance targets of issue #2, measured beside this machine's
//! own limits in the same run, so results read as ratios. Not a test: nothing here
//! asserts a time.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::engine::{
    Attempt, AttemptState, Fence, Outcome, RunAdmission, RunHeader, RunId, RunState, RunStep,
    StepState, Timestamp, Verdict,
};
use crate::executor::fake::FakeExecutor;
use crate::pipeline::{self, Format};
use crate::service::{self, Settings, StateDir};
use crate::store::Store;
use crate::store::records::{PipelineSource, SourceFormat};

pub struct Options {
    pub dir: PathBuf,
    pub quick: bool,
    pub stored_runs: u64,
    pub inflight: u64,
    pub crash_steps: u64,
    pub dead_lettered: u64,
    /// Queued steps of the admission rows.
    pub queued: u64,
    pub only: Option<String>,
}

struct Report {
    rows: Vec<(String, String)>,
}

impl Report {
    fn row(&mut self, name: &str, value: String) {
        println!("| {name} | {value} |");
        let _ = std::io::stdout().flush();
        self.rows.push((name.to_string(), value));
    }
}

pub fn run(options: &Options) -> anyhow::Result<()> {
    std::fs::create_dir_all(&options.dir)?;
    println!("machine: {}", machine());
    println!("| measurement | result |\n|---|---|");
    let mut report = Report { rows: Vec::new() };
    if let Some(only) = &options.only {
        return match only.as_str() {
            "sweep" => sweep_row(options, &mut report),
            "admission" => admission_rows(options, &mut report),
            "dashboard" => dashboard_rows(options, &mut report),
            "throughput" => throughput_rows(options, &mut report),
            _ => anyhow::bail!(
                "--only: unknown measurement {only:?} (one of: throughput, sweep, admission, dashboard)"
            ),
        };
    }
    throughput_rows(options, &mut report)?;

    let exe = std::env::current_exe()?;
    let (idle_ready, idle_rss) = serve_start(&exe, &options.dir.join("idle"))?;
    report.row(
        "idle start-up to ready / RSS",
        format!("{:.0} ms / {:.1} MB", ms(idle_ready), idle_rss),
    );
    let big = options.dir.join("big");
    let generated = Instant::now();
    populate(&big, options.stored_runs, options.inflight)?;
    println!(
        "(generated {} finished runs and {} in-flight attempts in {:.1}s)",
        options.stored_runs,
        options.inflight,
        generated.elapsed().as_secs_f64()
    );
    let (big_ready, big_rss) = serve_start(&exe, &big)?;
    report.row(
        &format!(
            "start-up to ready with {} in-flight, {} finished runs / RSS",
            options.inflight, options.stored_runs
        ),
        format!(
            "{:.0} ms (target <= 1000) / {:.1} MB (target <= 100)",
            ms(big_ready),
            big_rss
        ),
    );
    let crash = crash_recovery(&exe, &options.dir.join("crash"), options.crash_steps)?;
    report.row(
        &format!("kill -9 with {} steps in flight", options.crash_steps),
        crash,
    );
    sweep_row(options, &mut report)?;
    admission_rows(options, &mut report)?;
    dashboard_rows(options, &mut report)
}

/// The machine's limits (a raw fsync, a bare redb commit, spawning `/bin/true`) and, beside
/// them, single and grouped transition commits and trivial steps through the real service.
fn throughput_rows(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let n = if options.quick { 300 } else { 2000 };
    let (fsync, fsync_requests) = fsync_latency(&options.dir, n)?;
    report.row(
        "raw 4 KiB write+fdatasync",
        format!(
            "{:.3} ms median, {:.0}/s; {}",
            ms(fsync),
            1.0 / fsync.as_secs_f64(),
            Requests::each(fsync_requests, n, "fsync")
        ),
    );
    let (commit, commit_requests) = redb_commit_latency(&options.dir, n)?;
    report.row(
        "bare redb commit (Durability::Immediate)",
        format!(
            "{:.3} ms median = {:.2}x fsync; {}",
            ms(commit),
            ratio(commit, fsync),
            Requests::each(commit_requests, n, "commit")
        ),
    );
    let spawn1 = spawn_rate(n, 1)?;
    let spawn2 = spawn_rate(n, 2)?;
    report.row(
        "spawn /bin/true",
        format!("{spawn1:.0}/s on 1 thread, {spawn2:.0}/s on 2"),
    );

    let runtime = tokio::runtime::Runtime::new()?;
    let (single, rate, written) =
        runtime.block_on(transitions(&options.dir.join("transitions"), options.quick))?;
    let lone = written[0].mean_commit();
    report.row(
        "single transition commit latency (submit into an idle service, 1 client)",
        format!(
            "{:.3} ms median = {:.2}x fsync (target <= 2x); the driver's commits in this phase (each run's submission, then its launch and verdict) {:.3} ms mean = {:.2}x fsync",
            ms(single),
            ratio(single, fsync),
            ms(lone),
            ratio(lone, fsync)
        ),
    );
    report.row(
        "durable transitions/s, group commit, 256 clients",
        format!("{rate:.0}/s (target >= 20000)"),
    );
    report.row(
        "store writes (one-step runs, 3 transitions each)",
        {
            let [fresh, batched, later] = written.map(|w| {
                format!(
                    "{:.1} pages per commit x {:.2} commits per run, {}",
                    w.pages_per_commit(),
                    w.commits_per_run(),
                    Requests::each(w.requests, w.commits as usize, "commit")
                )
            });
            format!(
                "one client at a time into a fresh store: {fresh}; 256 clients: {batched}; one at a time after those: {later} (pages of 4 KiB the process wrote; requests the state dir's disk completed, from every process)"
            )
        },
    );
    // Just before the steps: what the disk charges for the attempt directories' inodes now.
    let creates_dir = options.dir.join("creates");
    let creates = create_cost(&creates_dir, if options.quick { 100 } else { 200 })?;
    report.row(
        "create a directory and a file in it, per inode",
        format!(
            "{:.0} µs median (an attempt creates its directory and attempt.jsonl; ext4 without a journal makes this grow for minutes after deletes nearby)",
            creates.as_secs_f64() * 1e6
        ),
    );
    let (steps, latency, commits_per_run, inodes_per_run) = runtime.block_on(trivial_steps(
        &options.dir.join("steps"),
        if options.quick { 200 } else { 1000 },
    ))?;
    report.row(
        "/bin/true steps submit->succeeded, 2 clients",
        format!(
            "{steps:.0} steps/s = {:.2} of the 2-spawn limit {:.0}/s (target >= 700); {:.1} ms median from submission to success; {commits_per_run:.2} commits and {inodes_per_run:.2} inodes per run",
            steps / (spawn2 / 2.0),
            spawn2 / 2.0,
            ms(latency)
        ),
    );
    drop(runtime);
    // Removed only after the steps were measured: deleting makes the next creates dearer.
    let _ = std::fs::remove_dir_all(&creates_dir);
    Ok(())
}

/// The dashboard with 100,000 runs stored (10,000 with `--quick`): a signed-in browser's
/// first page of runs and one run's page, each timed over 30 requests on a real
/// `scarab serve`, beside the API's own first page of runs.
fn dashboard_rows(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let runs = if options.quick { 10_000 } else { 100_000 };
    let dir = options.dir.join("dashboard");
    populate(&dir, runs, 0)?;
    let exe = std::env::current_exe()?;
    let mut server = Server::spawn(&exe, &dir)?;
    server.wait_ready(Duration::from_secs(120))?;
    let token = server.token()?;
    let base = format!("http://127.0.0.1:{}", server.port);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into();
    let login = agent
        .post(format!("{base}/ui/login"))
        .content_type("application/x-www-form-urlencoded")
        .send(format!("token={token}"))?;
    let cookie = login
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .context("the login set no cookie")?
        .to_string();
    let time = |path: &str, auth: (&str, String)| -> anyhow::Result<Duration> {
        let mut samples = Vec::new();
        for _ in 0..30 {
            let started = Instant::now();
            let mut response = agent
                .get(format!("{base}{path}"))
                .header(auth.0, &auth.1)
                .call()?;
            let _ = response.body_mut().read_to_vec()?;
            anyhow::ensure!(
                response.status() == 200,
                "{path} answered {}",
                response.status()
            );
            samples.push(started.elapsed());
        }
        Ok(median(samples))
    };
    let page = time("/ui/runs", ("Cookie", cookie.clone()))?;
    let api = time(
        "/v1/runs?limit=50",
        ("Authorization", format!("Bearer {token}")),
    )?;
    let first: serde_json::Value = agent
        .get(format!("{base}/v1/runs?limit=1"))
        .header("Authorization", &format!("Bearer {token}"))
        .call()?
        .body_mut()
        .read_json()?;
    let id = first["runs"][0]["id"]
        .as_str()
        .context("a run")?
        .to_string();
    let detail = time(&format!("/ui/runs/{id}"), ("Cookie", cookie))?;
    server.kill9();
    report.row(
        &format!("dashboard, {runs} runs stored: first page of runs / one run's page"),
        format!(
            "{:.1} ms / {:.1} ms median (target < 100 ms); the API's first page {:.1} ms",
            ms(page),
            ms(detail),
            ms(api)
        ),
    );
    Ok(())
}

/// Admission control: the decision alone (a slot frees, the next step is chosen) with
/// 1,000 and `queued` steps waiting, so the two read as a ratio; then the real driver and
/// store draining `queued` runs through a pool of 4 (the fake executor answers at once),
/// with the store's size and this process's RSS.
fn admission_rows(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let queued = options.queued;
    let (small, small_p99) = admission_decisions(1_000);
    let (large, large_p99) = admission_decisions(queued);
    report.row(
        &format!("admission decision (slot freed -> next step chosen), 1000 vs {queued} queued"),
        format!(
            "{:.2} us vs {:.2} us median ({:.2}x), p99 {:.2} vs {:.2} us (target < 1 ms, growth <= log n)",
            small.as_secs_f64() * 1e6,
            large.as_secs_f64() * 1e6,
            ratio(large, small),
            small_p99.as_secs_f64() * 1e6,
            large_p99.as_secs_f64() * 1e6,
        ),
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let small = runtime.block_on(admission_drain(&options.dir.join("admission-small"), 1_000))?;
    let large = runtime.block_on(admission_drain(&options.dir.join("admission"), queued))?;
    report.row(
        &format!("runs queued for a pool of 4, 1000 vs {queued} (real driver and store, fake executor)"),
        format!(
            "first 500 admitted at {:.0}/s vs {:.0}/s ({:.2}x; each admission commits with the verdict that freed its slot); {queued} submitted in {:.1}s; store {:.0} MB; RSS +{:.0} MB over the service before submitting",
            small.rate,
            large.rate,
            large.rate / small.rate,
            large.submitted.as_secs_f64(),
            large.store_mb,
            large.rss_grown_mb,
        ),
    );
    Ok(())
}

/// The scheduler alone: `queued` one-step runs waiting for a pool of 4; each sample frees
/// one slot (the run ends) and admits the next step.
fn admission_decisions(queued: u64) -> (Duration, Duration) {
    use crate::engine::admission::{Limits, Scheduler};
    let (_, pipeline) = one_step().expect("the bench pipeline parses");
    let limits = Limits {
        local: 4,
        prepared_local: 0,
        ..Limits::default()
    };
    let mut scheduler = Scheduler::new(limits);
    let mut runs = std::collections::HashMap::new();
    let total = queued + 4;
    for i in 0..total {
        let id = RunId(u128::from(i) + 1);
        let run = crate::engine::Run {
            header: RunHeader {
                id,
                pipeline_name: "bench".into(),
                origin: "local".into(),
                state: RunState::Queued,
                created_at: Timestamp(1_000_000 + i),
                updated_at: Timestamp(1_000_000 + i),
                cancel: None,
                budget: None,
                auto_retry: Default::default(),
                admission: RunAdmission::default(),
            },
            pipeline: pipeline.clone(),
            steps: vec![RunStep::in_state(StepState::Queued {
                since: Timestamp(1_000_000 + i),
            })],
        };
        runs.insert(id, run);
    }
    scheduler.sync_all(runs.values());
    let mut samples = Vec::new();
    let mut active: std::collections::VecDeque<RunId> = std::collections::VecDeque::new();
    let admit = |scheduler: &mut Scheduler,
                 runs: &mut std::collections::HashMap<RunId, crate::engine::Run>,
                 active: &mut std::collections::VecDeque<RunId>| {
        for (id, _) in scheduler.take_decided() {
            if let Some(run) = runs.get_mut(&id) {
                run.steps[0].state = StepState::Active;
                scheduler.sync(run);
                active.push_back(id);
            }
        }
    };
    admit(&mut scheduler, &mut runs, &mut active);
    for _ in 0..2_000.min(queued) {
        let Some(id) = active.pop_front() else { break };
        let Some(mut run) = runs.remove(&id) else {
            break;
        };
        run.steps[0].state = StepState::Succeeded;
        run.header.state = RunState::Succeeded;
        let start = Instant::now();
        scheduler.sync(&run);
        let decided = scheduler.take_decided();
        samples.push(start.elapsed());
        for (id, _) in decided {
            if let Some(run) = runs.get_mut(&id) {
                run.steps[0].state = StepState::Active;
                scheduler.sync(run);
                active.push_back(id);
            }
        }
    }
    samples.sort_unstable();
    let p99 = samples
        .get(samples.len() * 99 / 100)
        .copied()
        .unwrap_or_default();
    (median(samples), p99)
}

/// The real service: `queued` runs submitted while the pool is closed, then it opens to
/// 4 and the time to admit 500 of them is taken (each admission commits with the
/// verdict that freed its slot).
struct Drain {
    submitted: Duration,
    rate: f64,
    store_mb: f64,
    rss_grown_mb: f64,
}

/// `VmRSS` of a process (`self` or a pid), in MB.
fn rss_mb(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn admission_drain(dir: &Path, queued: u64) -> anyhow::Result<Drain> {
    let _ = std::fs::remove_dir_all(dir);
    // The pool starts closed (limit 0, which no configuration can set): every run queues.
    let settings = Settings::default();
    let limits = |local| crate::config::Live {
        admission: crate::engine::admission::Limits {
            local,
            ..Default::default()
        },
        ..Default::default()
    };
    settings.replace_live(limits(0));
    let running = service::start_with(StateDir::new(dir), settings, |reports| {
        Ok(FakeExecutor::succeeding(reports))
    })
    .await?;
    let service = running.service.clone();
    let (source, pipeline) = one_step()?;
    let rss_before = rss_mb("self");
    let started = Instant::now();
    submit_many(&service, &source, &pipeline, 64, queued).await?;
    let submitted = started.elapsed();
    let counts = |service: &service::Service| -> anyhow::Result<u64> {
        let read = service.store.read()?;
        Ok(read.active_run_ids()?.len() as u64)
    };
    let before = counts(&service)?;
    let drain = Instant::now();
    service.settings.replace_live(limits(4));
    // A batch takes the new limits.
    service
        .ping()
        .await
        .map_err(|_| anyhow::anyhow!("the service stopped"))?;
    let target = before.saturating_sub(500.min(queued));
    while counts(&service)? > target {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = (before - target) as f64 / drain.elapsed().as_secs_f64();
    let store_mb = std::fs::metadata(dir.join("scarab.redb"))
        .map(|m| m.len() as f64 / 1e6)
        .unwrap_or(0.0);
    let rss_grown_mb = rss_mb("self") - rss_before;
    running.stop().await;
    Ok(Drain {
        submitted,
        rate,
        store_mb,
        rss_grown_mb,
    })
}

fn sweep_row(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let dir = options.dir.join("sweep");
    let generated = Instant::now();
    populate_dead_lettered(&dir, options.dead_lettered)?;
    println!(
        "(generated {} dead-lettered auto-retryable runs in {:.1}s)",
        options.dead_lettered,
        generated.elapsed().as_secs_f64()
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let (median, max, scanned, resubmitted) = runtime.block_on(sweep_passes(&dir))?;
    report.row(
        &format!(
            "auto-retry pass with {} dead-lettered runs (scan_limit 200, sweep_limit 5)",
            options.dead_lettered
        ),
        format!(
            "{:.2} ms median, {:.2} ms max of 10 passes; {scanned} rows read, {resubmitted} resubmitted per pass (target <= 20 ms)",
            ms(median),
            ms(max)
        ),
    );
    Ok(())
}

/// Dead-lettered never-started runs straight into a store, each in the auto-retry index,
/// as the driver leaves them.
fn populate_dead_lettered(dir: &Path, runs: u64) -> anyhow::Result<()> {
    use crate::engine::{AutoRetryState, FailureClass};
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let store = Store::open(&StateDir::new(dir).database())?;
    let source = PipelineSource {
        format: SourceFormat::Yaml,
        text: ONE_STEP.to_string(),
        params: Some(Vec::new()),
    };
    let now = crate::clock::now();
    let mut written = 0u64;
    while written < runs {
        let mut tx = store.write()?;
        for _ in 0..20_000.min(runs - written) {
            let at = Timestamp(now.0 - runs + written);
            let id = RunId(ulid::Ulid::from_parts(at.0, u128::from(written)).0);
            let header = RunHeader {
                id,
                pipeline_name: "bench".into(),
                origin: "local".into(),
                state: RunState::DeadLettered,
                created_at: at,
                updated_at: at,
                cancel: None,
                budget: None,
                auto_retry: AutoRetryState {
                    eligible_at: Some(at),
                    ..AutoRetryState::default()
                },
                admission: Default::default(),
            };
            tx.put_pipeline(id, &source)?;
            tx.put_run(&header, None)?;
            tx.put_step(
                id,
                0,
                &RunStep::in_state(StepState::DeadLettered {
                    reason: "InfraRetriesExhausted".into(),
                }),
            )?;
            tx.put_attempt(
                id,
                0,
                &Attempt {
                    number: 1,
                    fence: Fence(written + 1),
                    created_at: at,
                    state: AttemptState::Finished(Verdict {
                        outcome: Outcome::Failed(FailureClass::InfraNeverStarted),
                        started: false,
                        reason: "ImagePullBackOff".into(),
                        exit_code: None,
                        started_at: None,
                        finished_at: at,
                    }),
                    kill: None,
                    outputs: Vec::new(),
                },
            )?;
            tx.auto_retry_index_put(at, id)?;
            written += 1;
        }
        tx.set_fence_next(written + 1)?;
        tx.commit()?;
    }
    Ok(())
}

/// Ten sweep passes on the real driver and store (the fake executor answers the launches):
/// median and max duration, rows read and runs resubmitted by the last pass.
async fn sweep_passes(dir: &Path) -> anyhow::Result<(Duration, Duration, usize, usize)> {
    let settings = Settings::default();
    settings.replace_live(crate::config::Live {
        auto_retry: crate::engine::AutoRetrySettings {
            enabled: true,
            interval: Duration::from_secs(3600),
            ..Default::default()
        },
        ..Default::default()
    });
    let running = service::start_with(StateDir::new(dir), settings, |reports| {
        Ok(FakeExecutor::succeeding(reports))
    })
    .await?;
    let mut samples = Vec::new();
    let mut last = Default::default();
    for _ in 0..10 {
        let outcome: service::sweep::PassOutcome = running.service.sweep_pass().await?;
        samples.push(outcome.duration);
        last = outcome;
    }
    running.stop().await;
    let max = samples.iter().copied().max().unwrap_or_default();
    Ok((median(samples), max, last.scanned, last.resubmitted))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines().next().map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<u64>()
                    .unwrap_or(0)
                    / 1024
                    / 1024
            })
        })
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cores} cores, {cpu}, {memory} GiB, Linux {}",
        kernel.trim()
    )
}

fn fsync_latency(dir: &Path, n: usize) -> anyhow::Result<(Duration, Option<Requests>)> {
    let path = dir.join("fsync.probe");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    let block = vec![7u8; 4096];
    // The block is allocated first, so the loop measures overwrites, as a store's are.
    file.write_all_at(&block, 0)?;
    file.sync_all()?;
    let mut samples = Vec::with_capacity(n);
    let before = Requests::now(dir);
    for _ in 0..n {
        let start = Instant::now();
        file.write_all_at(&block, 0)?;
        file.sync_data()?;
        samples.push(start.elapsed());
    }
    let requests = Requests::since(before, dir);
    std::fs::remove_file(&path)?;
    Ok((median(samples), requests))
}

/// The median time to create a directory and an empty file in it, per inode.
fn create_cost(dir: &Path, n: usize) -> anyhow::Result<Duration> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        let entry = dir.join(i.to_string());
        std::fs::create_dir(&entry)?;
        std::fs::File::create(entry.join("f"))?;
        samples.push(start.elapsed() / 2);
    }
    Ok(median(samples))
}

fn redb_commit_latency(dir: &Path, n: usize) -> anyhow::Result<(Duration, Option<Requests>)> {
    const TABLE: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("t");
    let path = dir.join("bare.redb");
    let _ = std::fs::remove_file(&path);
    let db = redb::Database::create(&path)?;
    let mut samples = Vec::with_capacity(n);
    let before = Requests::now(dir);
    for i in 0..n as u64 {
        let start = Instant::now();
        let mut tx = db.begin_write()?;
        tx.set_durability(redb::Durability::Immediate)?;
        tx.open_table(TABLE)?.insert(i, i)?;
        tx.commit()?;
        samples.push(start.elapsed());
    }
    let requests = Requests::since(before, dir);
    drop(db);
    std::fs::remove_file(&path)?;
    Ok((median(samples), requests))
}

fn spawn_rate(n: usize, threads: usize) -> anyhow::Result<f64> {
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                for _ in 0..n / threads {
                    let _ = Command::new("/bin/true").status();
                }
            })
        })
        .collect();
    for handle in handles {
        let _ = handle.join();
    }
    Ok((n / threads * threads) as f64 / start.elapsed().as_secs_f64())
}

const ONE_STEP: &str = "name: bench\nsteps:\n  - name: s\n    run: [/bin/true]\n";

fn one_step() -> anyhow::Result<(PipelineSource, Arc<pipeline::Pipeline>)> {
    let outcome = pipeline::parse(ONE_STEP, Format::Yaml).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let source = PipelineSource {
        format: SourceFormat::Yaml,
        text: ONE_STEP.to_string(),
        params: Some(Vec::new()),
    };
    Ok((source, Arc::new(outcome.pipeline)))
}

/// Drives the real driver, store and outbox with an executor that answers at once:
/// each run is three durable transitions (submit, launch confirmed, verdict).
/// The median latency of a lone submission's commit into an idle service, the durable
/// transitions per second under group commit, and the bytes written per run one client
/// at a time into a fresh store, under group commit, and one at a time again into the store those filled (the
/// process's `wchar`: the store's page writes, since the fake executor writes nothing).
async fn transitions(dir: &Path, quick: bool) -> anyhow::Result<(Duration, f64, [Written; 3])> {
    let _ = std::fs::remove_dir_all(dir);
    // The fake executor runs nothing: a pool as large as the clients, so this measures
    // the durable transitions, not a pool of the machine's CPUs.
    let settings = Settings::default();
    settings.replace_live(crate::config::Live {
        admission: crate::engine::admission::Limits {
            local: 256,
            ..Default::default()
        },
        ..Default::default()
    });
    let running = service::start_with(StateDir::new(dir), settings, |reports| {
        Ok(FakeExecutor::succeeding(reports))
    })
    .await?;
    let service = running.service.clone();
    let (source, pipeline) = one_step()?;
    let mut samples = Vec::new();
    let lone = if quick { 100 } else { 500 };
    let before = Written::now(&service, dir)?;
    for _ in 0..lone {
        // Each into an idle service: the run before it has finished (its launch-confirmed
        // and verdict commits are done), so the sample is one transition's commit and the
        // hand-offs around it, not a wait behind another commit.
        wait_idle(&service).await?;
        let start = Instant::now();
        service
            .submit(
                source.clone(),
                pipeline.clone(),
                "bench".into(),
                RunAdmission::of(&pipeline),
                None,
            )
            .await?;
        samples.push(start.elapsed());
    }
    let single = median(samples);
    wait_idle(&service).await?;
    let lone_written = before.since(&service, dir, lone)?;

    let clients = 256;
    let per_client = if quick { 20 } else { 100 };
    let before = Written::now(&service, dir)?;
    let start = Instant::now();
    submit_many(&service, &source, &pipeline, clients, clients * per_client).await?;
    wait_idle(&service).await?;
    let elapsed = start.elapsed();
    let batched_written = before.since(&service, dir, clients * per_client)?;
    // Lone runs again, now that the store holds thousands: its trees are deeper, so each
    // one a transition touches costs more pages.
    let before = Written::now(&service, dir)?;
    submit_many(&service, &source, &pipeline, 1, lone).await?;
    wait_idle(&service).await?;
    let later_written = before.since(&service, dir, lone)?;
    running.stop().await;
    Ok((
        single,
        (clients * per_client * 3) as f64 / elapsed.as_secs_f64(),
        [lone_written, batched_written, later_written],
    ))
}

/// What the store wrote over a phase: 4 KiB pages per commit, commits per run, and the
/// requests the disk completed for them.
#[derive(Clone, Copy)]
struct Written {
    bytes: u64,
    commits: u64,
    /// The driver's time in its commits (building the batch, redb's commit, the fsync).
    commit_seconds: f64,
    runs: u64,
    requests: Option<Requests>,
}

impl Written {
    fn now(service: &service::Service, dir: &Path) -> anyhow::Result<Written> {
        let (commits, commit_seconds) = commit_metrics(service)?;
        Ok(Written {
            bytes: bytes_written()?,
            commits,
            commit_seconds,
            runs: 0,
            requests: Requests::now(dir),
        })
    }

    fn since(self, service: &service::Service, dir: &Path, runs: u64) -> anyhow::Result<Written> {
        let now = Written::now(service, dir)?;
        Ok(Written {
            bytes: now.bytes - self.bytes,
            commits: now.commits - self.commits,
            commit_seconds: now.commit_seconds - self.commit_seconds,
            runs,
            requests: Requests::since(self.requests, dir),
        })
    }

    fn mean_commit(&self) -> Duration {
        Duration::from_secs_f64(self.commit_seconds / self.commits.max(1) as f64)
    }

    fn pages_per_commit(&self) -> f64 {
        self.bytes as f64 / 4096.0 / self.commits.max(1) as f64
    }

    fn commits_per_run(&self) -> f64 {
        self.commits as f64 / self.runs.max(1) as f64
    }
}

/// The write and flush requests the block device under a directory completed
/// (`/sys/dev/block/MAJOR:MINOR/stat`, fields 5 and 16): what an fsync costs the disk is
/// the requests it waits for, and pages a commit scatters over its file are one request
/// each. Every process's requests are counted, so read it on a quiet machine. `None`
/// where the directory is on no block device (a tmpfs, an overlay).
#[derive(Clone, Copy)]
struct Requests {
    writes: u64,
    flushes: u64,
}

impl Requests {
    fn now(dir: &Path) -> Option<Requests> {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(dir).ok()?.dev();
        let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
        Requests::parse(
            &std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat")).ok()?,
        )
    }

    fn parse(stat: &str) -> Option<Requests> {
        let fields: Vec<u64> = stat
            .split_whitespace()
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        Some(Requests {
            writes: *fields.get(4)?,
            // Kernels before 5.5 count no flushes.
            flushes: fields.get(15).copied().unwrap_or(0),
        })
    }

    fn since(before: Option<Requests>, dir: &Path) -> Option<Requests> {
        let (before, now) = (before?, Requests::now(dir)?);
        Some(Requests {
            writes: now.writes.saturating_sub(before.writes),
            flushes: now.flushes.saturating_sub(before.flushes),
        })
    }

    /// "W writes + F flushes per what" on the disk, over `count` of them.
    fn each(requests: Option<Requests>, count: usize, what: &str) -> String {
        match requests {
            Some(r) => {
                let count = count.max(1) as f64;
                format!(
                    "{:.1} write + {:.1} flush requests per {what}",
                    r.writes as f64 / count,
                    r.flushes as f64 / count
                )
            }
            None => "the disk's requests unknown (no block device)".to_string(),
        }
    }
}

/// Bytes this process handed to write system calls so far (`wchar` of /proc/self/io).
fn bytes_written() -> anyhow::Result<u64> {
    let io = std::fs::read_to_string("/proc/self/io")?;
    io.lines()
        .find_map(|line| line.strip_prefix("wchar: "))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no wchar in /proc/self/io"))
}

/// `total` one-step runs submitted by `clients` concurrent tasks.
async fn submit_many(
    service: &service::Service,
    source: &PipelineSource,
    pipeline: &Arc<pipeline::Pipeline>,
    clients: u64,
    total: u64,
) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for client in 0..clients {
        let service = service.clone();
        let (source, pipeline) = (source.clone(), pipeline.clone());
        let count = total / clients + u64::from(client < total % clients);
        tasks.push(tokio::spawn(async move {
            for _ in 0..count {
                service
                    .submit(
                        source.clone(),
                        pipeline.clone(),
                        "bench".into(),
                        RunAdmission::of(&pipeline),
                        None,
                    )
                    .await?;
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn wait_idle(service: &service::Service) -> anyhow::Result<()> {
    loop {
        let read = service.store.read()?;
        if read.active_run_ids()?.is_empty() && read.outbox_depth()? == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The driver's commits so far (`scarab_commit_duration_seconds_count`).
fn commits(service: &service::Service) -> anyhow::Result<u64> {
    Ok(commit_metrics(service)?.0)
}

/// The driver's commits so far and its time in them (`scarab_commit_duration_seconds`
/// count and sum), from one rendering of the metrics.
fn commit_metrics(service: &service::Service) -> anyhow::Result<(u64, f64)> {
    let text = service.metrics.encode()?;
    let value = |part: &str| {
        let prefix = format!("scarab_commit_duration_seconds_{part} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map(str::trim)
            .ok_or_else(|| anyhow::anyhow!("no commit {part} in the metrics"))
    };
    let count = value("count")?
        .parse()
        .map_err(|e| anyhow::anyhow!("the commit count in the metrics: {e}"))?;
    let sum = value("sum")?
        .parse()
        .map_err(|e| anyhow::anyhow!("the commit sum in the metrics: {e}"))?;
    Ok((count, sum))
}

/// Real supervisors running `/bin/true`, submitted by two clients that each wait for
/// their run to succeed before submitting the next.
/// Steps per second, the median time from a submission to its run's success, and the
/// driver's commits per run (each one fsync).
async fn trivial_steps(dir: &Path, total: usize) -> anyhow::Result<(f64, Duration, f64, f64)> {
    let _ = std::fs::remove_dir_all(dir);
    let exe = std::env::current_exe()?;
    let running = service::start(StateDir::new(dir), Settings::default(), exe).await?;
    let service = running.service.clone();
    let (source, pipeline) = one_step()?;
    let commits_before = commits(&service)?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let service = service.clone();
        let (source, pipeline) = (source.clone(), pipeline.clone());
        tasks.push(tokio::spawn(async move {
            // Woken by each change the service publishes, rather than polling the store
            // (which would take CPU from the service being measured).
            let mut changes = service.events.subscribe();
            let mut latencies = Vec::with_capacity(total / 2);
            for _ in 0..total / 2 {
                let submitted = Instant::now();
                let id = service
                    .submit(
                        source.clone(),
                        pipeline.clone(),
                        "bench".into(),
                        RunAdmission::of(&pipeline),
                        None,
                    )
                    .await?
                    .id;
                loop {
                    let state = service.store.read()?.run_header(id)?.map(|h| h.state);
                    match state {
                        Some(RunState::Succeeded) => break,
                        Some(s) if s.is_terminal() => {
                            anyhow::bail!("run {id} ended {}", s.as_str())
                        }
                        _ => {
                            let _ =
                                tokio::time::timeout(Duration::from_millis(100), changes.changed())
                                    .await;
                        }
                    }
                }
                latencies.push(submitted.elapsed());
            }
            Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let runs = total / 2 * 2;
    let rate = runs as f64 / start.elapsed().as_secs_f64();
    let per_run = (commits(&service)? - commits_before) as f64 / runs as f64;
    running.stop().await;
    let inodes = attempt_inodes(&StateDir::new(dir).attempts())? as f64 / runs as f64;
    Ok((rate, median(latencies), per_run, inodes))
}

/// The inodes the attempts left: every attempt directory and every file in one.
fn attempt_inodes(attempts: &Path) -> anyhow::Result<usize> {
    let mut inodes = 0;
    for attempt in std::fs::read_dir(attempts)? {
        inodes += 1 + std::fs::read_dir(attempt?.path())?.count();
    }
    Ok(inodes)
}

/// Starts `scarab serve` on `dir`; returns the time until /readyz answers 200 and the
/// process's resident memory then.
fn serve_start(exe: &Path, dir: &Path) -> anyhow::Result<(Duration, f64)> {
    let mut server = Server::spawn(exe, dir)?;
    let ready = server.wait_ready(Duration::from_secs(120))?;
    std::thread::sleep(Duration::from_millis(500));
    let rss = server.rss_mb();
    server.kill9();
    Ok((ready, rss))
}

struct Server {
    child: std::process::Child,
    port: u16,
    dir: PathBuf,
    started: Instant,
}

impl Server {
    fn spawn(exe: &Path, dir: &Path) -> anyhow::Result<Server> {
        Server::spawn_with(exe, dir, &[])
    }

    /// With these variables added to the service's environment.
    fn spawn_with(exe: &Path, dir: &Path, env: &[(&str, String)]) -> anyhow::Result<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let started = Instant::now();
        let child = Command::new(exe)
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--state-dir",
            ])
            .arg(dir)
            .env("SCARAB_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning scarab serve")?;
        Ok(Server {
            child,
            port,
            dir: dir.to_path_buf(),
            started,
        })
    }

    fn wait_ready(&mut self, within: Duration) -> anyhow::Result<Duration> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        while self.started.elapsed() < within {
            if let Ok(response) = agent
                .get(format!("http://127.0.0.1:{}/readyz", self.port))
                .call()
                && response.status() == 200
            {
                return Ok(self.started.elapsed());
            }
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("scarab serve exited with {status}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        anyhow::bail!("not ready within {within:?}")
    }

    fn rss_mb(&self) -> f64 {
        rss_mb(&self.child.id().to_string())
    }

    fn token(&self) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(self.dir.join("admin.token"))?
            .trim()
            .to_string())
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `finished` terminal runs and `inflight` runs with one running attempt straight
/// into a store, as the driver would have left them.
fn populate(dir: &Path, finished: u64, inflight: u64) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let store = Store::open(&StateDir::new(dir).database())?;
    let source = PipelineSource {
        format: SourceFormat::Yaml,
        text: ONE_STEP.to_string(),
        params: Some(Vec::new()),
    };
    let now = crate::clock::now();
    let batch = 20_000;
    let mut fence = 1u64;
    let mut written = 0u64;
    while written < finished + inflight {
        let mut tx = store.write()?;
        for _ in 0..batch.min(finished + inflight - written) {
            let active = written >= finished;
            let id =
                RunId(ulid::Ulid::from_parts(now.0 - 1_000_000 + written, u128::from(written)).0);
            let at = Timestamp(now.0 - 1_000_000 + written);
            let state = if active {
                RunState::Running
            } else {
                RunState::Succeeded
            };
            let header = RunHeader {
                id,
                pipeline_name: "bench".into(),
                origin: "local".into(),
                state,
                created_at: at,
                updated_at: at,
                cancel: None,
                budget: None,
                auto_retry: Default::default(),
                admission: Default::default(),
            };
            tx.put_pipeline(id, &source)?;
            tx.put_run(&header, None)?;
            let attempt_state = if active {
                AttemptState::Running {
                    confirmed_at: at,
                    backstop_due: Timestamp(at.0 + 3_600_000),
                }
            } else {
                AttemptState::Finished(Verdict {
                    outcome: Outcome::Succeeded,
                    started: true,
                    reason: "exit code 0".into(),
                    exit_code: Some(0),
                    started_at: Some(at),
                    finished_at: at,
                })
            };
            let progress = RunStep::in_state(if active {
                StepState::Active
            } else {
                StepState::Succeeded
            });
            tx.put_step(id, 0, &progress)?;
            tx.put_attempt(
                id,
                0,
                &Attempt {
                    number: 1,
                    fence: Fence(fence),
                    created_at: at,
                    state: attempt_state,
                    kill: None,
                    outputs: Vec::new(),
                },
            )?;
            fence += 1;
            written += 1;
        }
        tx.set_fence_next(fence)?;
        tx.commit()?;
    }
    Ok(())
}

/// Starts a service, fills it with `steps` sleeping steps, kills it with SIGKILL once
/// all run, restarts it and measures re-adoption; then waits until every run is terminal
/// (or two minutes passed) and counts, from the steps' output files, the steps that ran
/// twice and those that were lost. Neither count aborts the measurement: both are reported.
fn crash_recovery(exe: &Path, dir: &Path, steps: u64) -> anyhow::Result<String> {
    let _ = std::fs::remove_dir_all(dir);
    let outputs = dir.join("outputs");
    std::fs::create_dir_all(&outputs)?;
    let state = dir.join("state");
    // Every step in flight at once: the local pool (the CPUs by default) must hold them.
    let pool = [("SCARAB_MAX_PARALLEL_LOCAL", steps.to_string())];
    let mut server = Server::spawn_with(exe, &state, &pool)?;
    server.wait_ready(Duration::from_secs(60))?;
    let token = server.token()?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let per_run = 100u64;
    let mut ids = Vec::new();
    let mut files = Vec::new();
    for run in 0..steps.div_ceil(per_run) {
        let mut yaml = String::from("name: crash\nsteps:\n");
        for step in 0..per_run.min(steps - run * per_run) {
            let file = outputs.join(format!("{run}-{step}"));
            yaml.push_str(&format!(
                "  - name: s{step}\n    run: [sh, -c, 'sleep 4; echo $SCARAB_FENCE >> {}']\n",
                file.display()
            ));
            files.push(file);
        }
        let mut response = agent
            .post(format!("http://127.0.0.1:{}/v1/runs", server.port))
            .header("Authorization", format!("Bearer {token}"))
            .header("Content-Type", "application/yaml")
            .send(yaml.as_bytes())?;
        let body: serde_json::Value = serde_json::from_str(&response.body_mut().read_to_string()?)?;
        ids.push(body["id"].as_str().context("run id")?.to_string());
    }
    // Wait until every attempt is confirmed running (the set-up, before the crash).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let store_running = count_running_attempts(&token, server.port, &ids)?;
        if store_running >= steps {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {store_running} of {steps} steps started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill9();
    let mut server = Server::spawn_with(exe, &state, &pool)?;
    let readopted = server.wait_ready(Duration::from_secs(60))?;
    // Every run ends (each step writes its line 4 s after it started); a run that does not
    // end within the deadline is reported, and its steps without a line count as lost.
    let deadline = Instant::now() + Duration::from_secs(120);
    let unfinished = loop {
        let unfinished = count_unfinished_runs(&token, server.port, &ids)?;
        if unfinished == 0 || Instant::now() >= deadline {
            break unfinished;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // A step that ran after its run's verdict would still append: give stragglers time.
    std::thread::sleep(Duration::from_millis(500));
    let mut twice = 0u64;
    let mut lost = 0u64;
    for file in &files {
        match std::fs::read_to_string(file) {
            Ok(text) if text.lines().count() > 1 => twice += 1,
            Ok(text) if text.lines().count() == 1 => {}
            Ok(_) => lost += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => lost += 1,
            Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
        }
    }
    server.kill9();
    let unfinished = if unfinished == 0 {
        String::new()
    } else {
        format!(
            "; {unfinished} of {} runs not terminal after 120 s",
            ids.len()
        )
    };
    Ok(format!(
        "re-adopted and ready in {:.0} ms (target <= 1000); {twice} ran twice, {lost} lost{unfinished}",
        ms(readopted)
    ))
}

/// Each run's detail, as the service answers it.
fn run_details(token: &str, port: u16, ids: &[String]) -> anyhow::Result<Vec<serde_json::Value>> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut runs = Vec::with_capacity(ids.len());
    for id in ids {
        let mut response = agent
            .get(format!("http://127.0.0.1:{port}/v1/runs/{id}"))
            .header("Authorization", format!("Bearer {token}"))
            .call()?;
        runs.push(serde_json::from_str(
            &response.body_mut().read_to_string()?,
        )?);
    }
    Ok(runs)
}

/// How many of `ids` are not in a terminal state (or could not be read).
fn count_unfinished_runs(token: &str, port: u16, ids: &[String]) -> anyhow::Result<u64> {
    let unfinished = run_details(token, port, ids)?
        .iter()
        .filter(|run| {
            !RunState::ALL
                .iter()
                .find(|s| run["state"] == s.as_str())
                .is_some_and(|s| s.is_terminal())
        })
        .count();
    Ok(unfinished as u64)
}

/// How many steps of `ids` have their first attempt running.
fn count_running_attempts(token: &str, port: u16, ids: &[String]) -> anyhow::Result<u64> {
    let running = run_details(token, port, ids)?
        .iter()
        .flat_map(|run| run["steps"].as_array().cloned().unwrap_or_default())
        .filter(|step| step["attempts"][0]["state"] == "running")
        .count();
    Ok(running as u64)
}

#[cfg(test)]
mod tests {
    use super::Requests;

    #[test]
    fn a_block_devices_stat_gives_its_write_and_flush_requests() {
        let now = "3179895 100321 272512002 7268058 24801302 1209598 717065920 7167885 0 1467024 14842348 1167147 49 455495216 182652 3260992 223750\n";
        let r = Requests::parse(now).expect("17 fields");
        assert_eq!((r.writes, r.flushes), (24_801_302, 3_260_992));
        // A kernel before 5.5 has no flush fields (and none for discards before 4.18).
        let old = "10 0 80 5 20 3 160 9 0 12 14";
        let r = Requests::parse(old).expect("11 fields");
        assert_eq!((r.writes, r.flushes), (20, 0));
        assert!(Requests::parse("10 0 80").is_none());
        assert!(Requests::parse("10 0 80 5 x 3 160 9 0 12 14").is_none());
        assert_eq!(
            Requests::each(
                Some(Requests {
                    writes: 25,
                    flushes: 10
                }),
                10,
                "commit"
            ),
            "2.5 write + 1.0 flush requests per commit"
        );
    }
}

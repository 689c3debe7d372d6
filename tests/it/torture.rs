//! The kill -9 torture: a client submits runs without pause while the service is killed
//! with SIGKILL and started again, cycle after cycle. Afterwards every acknowledged run
//! is present and succeeded, every step ran exactly once (its output file has one line,
//! the fence of its only attempt), and fences only went up.
//!
//! `SCARAB_TORTURE_CYCLES` sets the number of kills (in the suite 10 under the two-step
//! load and 20 under the throughput load; the long form is
//! `SCARAB_TORTURE_CYCLES=100 cargo test --test it torture -- --nocapture`, see
//! docs/benchmarks.md). The kill times come from a seed printed at the start;
//! `SCARAB_TORTURE_SEED` replays one.

use crate::common;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Server, attempts};

/// What the service is put under while it is killed.
struct Load {
    /// Concurrent clients, each submitting one run after another.
    clients: u64,
    /// The steps of each run, in a chain; each appends its fence to its own file.
    steps: &'static [&'static str],
    /// How long each step sleeps after writing.
    step_sleep: &'static str,
    /// A client's pause between two submissions.
    pause: Duration,
    /// `SCARAB_MAX_PARALLEL_LOCAL`, if the default (the CPUs) is not wanted.
    pool: Option<&'static str>,
    /// Kills when `SCARAB_TORTURE_CYCLES` does not say.
    cycles: u64,
}

/// A small deterministic generator: the seed reproduces the kill times.
struct Lcg(u64);

impl Lcg {
    fn next_ms(&mut self, low: u64, high: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        low + (self.0 >> 33) % (high - low)
    }
}

fn pipeline(load: &Load, out: &Path, index: u64) -> String {
    let mut yaml = format!("name: torture-{index}\nsteps:\n");
    for (i, step) in load.steps.iter().enumerate() {
        let needs = if i == 0 {
            String::new()
        } else {
            format!("\n    needs: [{}]", load.steps[i - 1])
        };
        yaml.push_str(&format!(
            "  - name: {step}{needs}\n    run: [sh, -c, 'echo $SCARAB_FENCE >> {}/{index}-{step}; sleep {}']\n",
            out.display(),
            load.step_sleep
        ));
    }
    yaml
}

#[test]
fn kill_9_under_load_loses_nothing_and_runs_nothing_twice() {
    static LOAD: Load = Load {
        clients: 1,
        steps: &["a", "b"],
        step_sleep: "0.2",
        pause: Duration::from_millis(15),
        // A pool wide enough for the load (the client submits far faster than a pool of
        // the CPUs drains): this is about kill -9, not about admission.
        pool: Some("64"),
        cycles: 10,
    };
    torture(&LOAD);
}

/// The throughput benchmark's load (docs/benchmarks.md): two clients submitting one-step
/// runs of a trivial command without pause, to the default pool, killed 20 times.
#[test]
fn kill_9_under_throughput_load_loses_nothing_and_runs_nothing_twice() {
    static LOAD: Load = Load {
        clients: 2,
        steps: &["a"],
        step_sleep: "0",
        pause: Duration::ZERO,
        pool: None,
        cycles: 20,
    };
    torture(&LOAD);
}

fn torture(load: &'static Load) {
    let cycles: u64 = std::env::var("SCARAB_TORTURE_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(load.cycles);
    let seed: u64 = std::env::var("SCARAB_TORTURE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!(
        "torture: {cycles} cycles, {} clients, SCARAB_TORTURE_SEED={seed}",
        load.clients
    );
    let mut random = Lcg(seed);
    let dir = common::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out dir");
    let env: Vec<(&str, &str)> = load
        .pool
        .map(|pool| ("SCARAB_MAX_PARALLEL_LOCAL", pool))
        .into_iter()
        .collect();
    let server = Arc::new(Mutex::new(Server::start_with_env(
        &dir.path().join("state"),
        &[],
        &env,
    )));
    let (url, token) = {
        let server = server.lock().expect("server");
        (server.url.clone(), server.token.clone())
    };

    // The load: each client submits one run after another, each with a fresh index (an
    // unanswered submission may still have created its run; it must never share an
    // output file). Indices of client c are c, c + clients, c + 2 × clients...
    let acknowledged: Arc<Mutex<BTreeMap<u64, String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let submitters: Vec<_> = (0..load.clients)
        .map(|client| {
            let (acknowledged, stop, out) = (acknowledged.clone(), stop.clone(), out.clone());
            let (url, token) = (url.clone(), token.clone());
            std::thread::spawn(move || {
                let agent = crate::common::agent();
                let mut index = client;
                while !stop.load(Ordering::Relaxed) {
                    index += load.clients;
                    let answer = agent
                        .post(format!("{url}/v1/runs"))
                        .header("Authorization", format!("Bearer {token}"))
                        .header("Content-Type", "application/yaml")
                        .send(pipeline(load, &out, index).as_bytes());
                    match answer {
                        Ok(mut response) if response.status() == 201 => {
                            let body = response.body_mut().read_to_string().unwrap_or_default();
                            let body: serde_json::Value =
                                serde_json::from_str(&body).expect("submit answer");
                            let id = body["id"].as_str().expect("id").to_string();
                            acknowledged.lock().expect("acknowledged").insert(index, id);
                        }
                        _ => std::thread::sleep(Duration::from_millis(20)),
                    }
                    std::thread::sleep(load.pause);
                }
            })
        })
        .collect();

    for _ in 0..cycles {
        std::thread::sleep(Duration::from_millis(random.next_ms(200, 900)));
        let mut server = server.lock().expect("server");
        server.kill9();
        std::thread::sleep(Duration::from_millis(random.next_ms(0, 200)));
        server.resume();
    }
    stop.store(true, Ordering::Relaxed);
    for submitter in submitters {
        submitter.join().expect("submitter");
    }

    let server = server.lock().expect("server");
    let acknowledged = acknowledged.lock().expect("acknowledged").clone();
    assert!(
        acknowledged.len() as u64 >= cycles,
        "the load was too thin: {} runs",
        acknowledged.len()
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut all_fences = Vec::new();
    // Per client, the fence of each run's first step, in submission order: a fence is
    // minted in the commit that acknowledges the run, and a client's submissions commit
    // one after another, restarts or not.
    let mut first_fences: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for (index, id) in &acknowledged {
        let within = deadline.saturating_duration_since(Instant::now());
        let run = server.wait_terminal(id, within);
        assert_eq!(run["state"], "succeeded", "run {index}: {run:#}");
        for (i, step) in load.steps.iter().enumerate() {
            let tries = attempts(&run, i);
            assert_eq!(tries.len(), 1, "run {index} step {step}: {run:#}");
            let fence = tries[0]["fence"].as_u64().expect("fence");
            let lines =
                std::fs::read_to_string(out.join(format!("{index}-{step}"))).unwrap_or_default();
            assert_eq!(
                lines.lines().collect::<Vec<_>>(),
                vec![fence.to_string()],
                "run {index} step {step} ran once, under its attempt's fence"
            );
            all_fences.push(fence);
            if i == 0 {
                first_fences
                    .entry(index % load.clients)
                    .or_default()
                    .push((*index, fence));
            }
        }
    }
    let distinct: std::collections::BTreeSet<u64> = all_fences.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        all_fences.len(),
        "no fence was minted twice"
    );
    for (client, fences) in &first_fences {
        for pair in fences.windows(2) {
            assert!(
                pair[0].1 < pair[1].1,
                "client {client}: run {} has fence {}, the later run {} fence {}",
                pair[0].0,
                pair[0].1,
                pair[1].0,
                pair[1].1
            );
        }
    }
    eprintln!(
        "torture: {cycles} kills, {} acknowledged runs, {} steps, 0 lost, 0 ran twice, fences increasing",
        acknowledged.len(),
        all_fences.len()
    );
}

//! The crash-point simulation: the real driver, dispatcher and store on a real file,
//! with a simulated executor whose world (the attempts that were started, and the
//! verdicts their "processes" reached) outlives every crash, as processes outlive
//! Scarab. Each seed runs a workload and cuts the power at seeded commits — before a
//! commit, or after it and before any of its effects — then starts a new "process" on
//! the same file, many times; after each recovery and at the end the invariants hold:
//! every acknowledged run is there, no fence is minted twice, no attempt is launched
//! while an earlier one of its step may still run, none runs twice, no more run at once
//! than the local pool's slots (launches are prepared beyond them), and everything ends.
//!
//! `SCARAB_CRASH_SEEDS` (default 700 seeds of up to 10 crash points each, at least 5,000), `SCARAB_CRASH_SEED`
//! replays one seed; a failure prints its reproducer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{Settings, StateDir};
use crate::engine::{Fence, KillReason, Outcome, RunAdmission, RunId, Verdict};
use crate::executor::{Adoption, Executor, ExecutorError, Report, Target};
use crate::store::records::{LaunchRecord, PipelineSource, SourceFormat};
use crate::store::{CrashPlan, Store};

/// The local pool's slots: the launches prepared beyond them wait for one to free.
const LOCAL_SLOTS: u32 = 3;

#[derive(Clone, Debug, PartialEq)]
enum Life {
    /// Launched, waiting for its launch to be recorded (the handshake): not started.
    Waiting,
    /// May be running.
    Started,
    Finished(Verdict),
}

#[derive(Debug)]
struct SimAttempt {
    run: RunId,
    step: usize,
    life: Life,
    /// Times its "process" started: more than one is a step run twice.
    starts: u32,
}

struct World {
    attempts: BTreeMap<Fence, SimAttempt>,
    /// The current process's report channel and crash plan.
    reports: Option<mpsc::Sender<Report>>,
    plan: Arc<CrashPlan>,
    violations: Vec<String>,
    rng: u64,
}

impl World {
    fn next(&mut self) -> u64 {
        self.rng = self
            .rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.rng >> 33
    }
}

#[derive(Clone)]
struct SimExecutor {
    world: Arc<Mutex<World>>,
    /// The crash plan of the "process" this executor belongs to: once it crashed, none of
    /// that process's tasks (a re-adoption still running, a late after-commit effect)
    /// touches the world again, as none of a dead process's threads would.
    plan: Arc<CrashPlan>,
}

fn verdict(outcome: Outcome) -> Verdict {
    Verdict {
        started: true,
        exit_code: Some(i32::from(outcome != Outcome::Succeeded)),
        reason: "sim".into(),
        started_at: None,
        finished_at: crate::clock::now(),
        outcome,
    }
}

impl SimExecutor {
    /// The attempt's process starts; it ends a little later, whatever happens to Scarab.
    fn start(&self, world: &mut World, fence: Fence) {
        let Some(attempt) = world.attempts.get_mut(&fence) else {
            return;
        };
        attempt.life = Life::Started;
        attempt.starts += 1;
        if attempt.starts > 1 {
            world
                .violations
                .push(format!("fence {fence} started {} times", attempt.starts));
        }
        let running = world
            .attempts
            .values()
            .filter(|a| a.life == Life::Started)
            .count();
        if running > LOCAL_SLOTS as usize {
            world.violations.push(format!(
                "fence {fence} started while {} steps ran: more than the pool's {LOCAL_SLOTS}",
                running - 1
            ));
        }
        let fails = world.next().is_multiple_of(5);
        let delay = Duration::from_micros(world.next() % 3000);
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let outcome = if fails {
                Outcome::Failed(crate::engine::FailureClass::Step)
            } else {
                Outcome::Succeeded
            };
            me.finish(fence, verdict(outcome)).await;
        });
    }

    async fn finish(&self, fence: Fence, verdict: Verdict) {
        let report = {
            let Ok(mut world) = self.world.lock() else {
                return;
            };
            let Some(attempt) = world.attempts.get_mut(&fence) else {
                return;
            };
            if attempt.life != Life::Started {
                return;
            }
            attempt.life = Life::Finished(verdict.clone());
            let report = Report {
                run: attempt.run,
                step: attempt.step,
                fence,
                verdict,
            };
            (!world.plan.crashed())
                .then(|| world.reports.clone())
                .flatten()
                .map(|to| (to, report))
        };
        if let Some((to, report)) = report {
            let _ = to.send(report).await;
        }
    }

    fn down(&self) -> bool {
        self.plan.crashed()
    }
}

impl Executor for SimExecutor {
    async fn launch(&self, order: &LaunchRecord) -> Result<(), ExecutorError> {
        if self.down() {
            return Err(ExecutorError::Unavailable("crashed".into()));
        }
        let Ok(mut world) = self.world.lock() else {
            return Ok(());
        };
        let step = usize::from(order.step);
        let busy: Vec<Fence> = world
            .attempts
            .iter()
            .filter(|(f, a)| {
                **f != order.fence
                    && a.run == order.run
                    && a.step == step
                    && a.life == Life::Started
            })
            .map(|(f, _)| *f)
            .collect();
        if !busy.is_empty() {
            world.violations.push(format!(
                "fence {} launched while {busy:?} of the same step may still run",
                order.fence
            ));
        }
        match world.attempts.get(&order.fence).map(|a| a.life.clone()) {
            None => {
                world.attempts.insert(
                    order.fence,
                    SimAttempt {
                        run: order.run,
                        step,
                        life: Life::Waiting,
                        starts: 0,
                    },
                );
            }
            // A launch never recorded goes again under its fence: allowed, nothing ran.
            Some(Life::Waiting) => {}
            Some(_) => world.violations.push(format!(
                "fence {} launched again after it started",
                order.fence
            )),
        }
        Ok(())
    }

    fn launch_recorded(&self, fence: Fence) {
        if self.down() {
            return;
        }
        if let Ok(mut world) = self.world.lock()
            && world.attempts.get(&fence).map(|a| &a.life) == Some(&Life::Waiting)
        {
            self.start(&mut world, fence);
        }
    }

    async fn kill(&self, target: Target, _: KillReason) -> Result<(), ExecutorError> {
        if self.down() {
            return Err(ExecutorError::Unavailable("crashed".into()));
        }
        self.finish(target.fence, verdict(Outcome::Stopped)).await;
        Ok(())
    }

    async fn adopt(&self, adoption: &Adoption) -> Result<(), ExecutorError> {
        if self.down() {
            return Err(ExecutorError::Unavailable("crashed".into()));
        }
        let report = {
            let Ok(mut world) = self.world.lock() else {
                return Ok(());
            };
            match world.attempts.get(&adoption.fence).map(|a| a.life.clone()) {
                Some(Life::Finished(verdict)) => Some(verdict),
                // Its process goes on and reports when it ends.
                Some(Life::Started) => None,
                // Recorded as launched, never told to go (the crash came between): it
                // starts now under its fence, as a supervisor at the handshake does.
                Some(Life::Waiting) => {
                    self.start(&mut world, adoption.fence);
                    None
                }
                None => {
                    world.violations.push(format!(
                        "fence {} adopted but never launched",
                        adoption.fence
                    ));
                    None
                }
            }
        };
        if let Some(verdict) = report {
            let to = self.world.lock().ok().and_then(|w| w.reports.clone());
            if let Some(to) = to {
                let _ = to
                    .send(Report {
                        run: adoption.run,
                        step: adoption.step,
                        fence: adoption.fence,
                        verdict,
                    })
                    .await;
            }
        }
        Ok(())
    }

    async fn clean_up(&self, _: Target) -> Result<(), ExecutorError> {
        Ok(())
    }

    async fn recover(
        &self,
        _: &[Adoption],
        _: Fence,
        _: &crate::executor::Retained,
    ) -> Result<Option<Fence>, ExecutorError> {
        Ok(self
            .world
            .lock()
            .ok()
            .and_then(|w| w.attempts.keys().next_back().copied()))
    }
}

const PIPELINES: [&str; 3] = [
    "name: one\nsteps:\n  - name: a\n    run: ['true']\n",
    "name: chain\nsteps:\n  - name: a\n    run: ['true']\n  - name: b\n    needs: [a]\n    run: ['true']\n    retry: {on: step, max: 2, backoff: {initial: 10ms, max: 10ms}}\n",
    "name: fan\nsteps:\n  - name: a\n    run: ['true']\n  - name: b\n    run: ['true']\n    retry: {on: step, max: 1, backoff: {initial: 10ms, max: 10ms}}\n  - name: c\n    needs: [a, b]\n    run: ['true']\n",
];

/// One seed: `crashes` power cuts at seeded commits, then a clean run to the end.
/// Returns the number of crash points that were reached.
async fn seed_run(seed: u64, crashes: u32) -> Result<u32, String> {
    let dir = std::env::temp_dir().join(format!("scarab-crash-sim-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("seed {seed}: {e}"))?;
    let result = seed_in(&dir, seed, crashes).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn seed_in(dir: &std::path::Path, seed: u64, crashes: u32) -> Result<u32, String> {
    let fail = |what: String| format!("seed {seed}: {what} (replay: SCARAB_CRASH_SEED={seed})");
    let world = Arc::new(Mutex::new(World {
        attempts: BTreeMap::new(),
        reports: None,
        plan: Arc::new(CrashPlan::new(0, false)),
        violations: Vec::new(),
        rng: seed.wrapping_add(0x5CA2_AB00),
    }));
    let roll = |n: u64| world.lock().map_or(0, |mut w| w.next() % n);
    let mut acknowledged: BTreeSet<RunId> = BTreeSet::new();
    let mut reached = 0;
    for round in 0..=crashes {
        let last = round == crashes;
        let plan = Arc::new(if last {
            CrashPlan::new(0, false)
        } else {
            // One of the round's first ten commits: a round of one to three runs makes
            // about that many now that commits gather what is ready (group commit).
            CrashPlan::new(1 + roll(10), roll(2) == 0)
        });
        let store = open_when_free(dir, plan.clone())
            .await
            .map_err(|e| fail(format!("round {round}: the store does not open: {e}")))?;
        // Recovery: every acknowledged run is there.
        {
            let read = store.read().map_err(|e| fail(e.to_string()))?;
            for id in &acknowledged {
                if read
                    .run_header(*id)
                    .map_err(|e| fail(e.to_string()))?
                    .is_none()
                {
                    return Err(fail(format!(
                        "round {round}: acknowledged run {id} is gone"
                    )));
                }
            }
            let next = read.fence_next().map_err(|e| fail(e.to_string()))?;
            let highest = world
                .lock()
                .ok()
                .and_then(|w| w.attempts.keys().next_back().copied());
            if let Some(highest) = highest
                && next <= highest.0
            {
                // The executor's recovery raises it at start; the store alone may lag
                // only by fences minted in a batch that never committed, which never
                // launched.
                let launched_above = world
                    .lock()
                    .map(|w| {
                        w.attempts
                            .keys()
                            .any(|f| f.0 >= next && w.attempts[f].starts > 0)
                    })
                    .unwrap_or(false);
                if launched_above {
                    return Err(fail(format!(
                        "round {round}: fence counter {next} is not above started fence {highest}"
                    )));
                }
            }
        }
        let store = Arc::new(store);
        if let Ok(mut w) = world.lock() {
            w.plan = plan.clone();
        }
        let executor_world = world.clone();
        let executor_plan = plan.clone();
        let settings = Settings::default();
        settings.replace_live(crate::config::Live {
            admission: crate::engine::admission::Limits {
                local: LOCAL_SLOTS,
                prepared_local: 2,
                ..Default::default()
            },
            ..Default::default()
        });
        let running = super::start_on(StateDir::new(dir), store, settings, move |reports| {
            if let Ok(mut w) = executor_world.lock() {
                w.reports = Some(reports);
            }
            Ok(SimExecutor {
                world: executor_world,
                plan: executor_plan,
            })
        })
        .await;
        let running = match running {
            Ok(running) => running,
            // The crash may come in the start-up's own commits.
            Err(_) if plan.crashed() => {
                reached += 1;
                continue;
            }
            Err(e) => return Err(fail(format!("round {round}: start failed: {e}"))),
        };
        let service = running.service.clone();
        // A little work each round, while it lasts.
        if !last {
            for _ in 0..1 + roll(3) {
                let text = PIPELINES[roll(PIPELINES.len() as u64) as usize];
                let pipeline = crate::pipeline::parse(text, crate::pipeline::Format::Yaml)
                    .map_err(|e| fail(format!("{e:?}")))?
                    .pipeline;
                let source = PipelineSource {
                    format: SourceFormat::Yaml,
                    text: text.into(),
                    params: Some(Vec::new()),
                };
                let admission = RunAdmission::of(&pipeline);
                if let Ok(submitted) = service
                    .submit(source, Arc::new(pipeline), "local".into(), admission, None)
                    .await
                {
                    acknowledged.insert(submitted.id);
                }
                if plan.crashed() {
                    break;
                }
            }
        }
        // Until the crash (or, in the last round, until every run ended).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if plan.crashed() {
                reached += 1;
                break;
            }
            let active = service
                .store
                .read()
                .and_then(|r| r.active_run_ids())
                .map(|ids| ids.len())
                .unwrap_or(usize::MAX);
            if active == 0 {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(fail(format!("round {round}: {active} runs never ended")));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        running.stop().await;
        let violations = world
            .lock()
            .map(|w| w.violations.clone())
            .unwrap_or_default();
        if !violations.is_empty() {
            return Err(fail(format!("round {round}: {}", violations.join("; "))));
        }
    }
    // The end: every acknowledged run finished; every started attempt got its verdict.
    let store = open_when_free(dir, Arc::new(CrashPlan::new(0, false)))
        .await
        .map_err(|e| fail(e.to_string()))?;
    let read = store.read().map_err(|e| fail(e.to_string()))?;
    for id in &acknowledged {
        match read.run_header(*id).map_err(|e| fail(e.to_string()))? {
            Some(header) if header.state.is_terminal() => {}
            Some(header) => {
                return Err(fail(format!("run {id} ended {}", header.state.as_str())));
            }
            None => return Err(fail(format!("acknowledged run {id} is gone"))),
        }
    }
    Ok(reached)
}

/// Opens the store once the last "process" has let go of the file (its tasks end a
/// moment after it stopped).
async fn open_when_free(
    dir: &std::path::Path,
    plan: Arc<CrashPlan>,
) -> Result<Store, crate::store::StoreError> {
    let path = dir.join("scarab.redb");
    let mut opened = Store::open_crashing(&path, plan.clone());
    for _ in 0..400 {
        match &opened {
            Err(e) if e.to_string().contains("already open") => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                opened = Store::open_crashing(&path, plan.clone());
            }
            _ => break,
        }
    }
    opened
}

/// Seeds of a suite run: enough for at least 5,000 crash points.
const DEFAULT_SEEDS: u64 = 700;

#[test]
fn crash_points_lose_nothing_and_run_nothing_twice() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let seeds: Vec<u64> = match std::env::var("SCARAB_CRASH_SEED") {
        Ok(seed) => vec![seed.parse().expect("a seed")],
        Err(_) => {
            let count: u64 = std::env::var("SCARAB_CRASH_SEEDS")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(DEFAULT_SEEDS);
            (0..count).collect()
        }
    };
    let started = std::time::Instant::now();
    let mut reached = 0;
    // Seeds are independent (each its own file and world): eight at a time.
    for chunk in seeds.chunks(8) {
        let results = runtime.block_on(futures::future::join_all(
            chunk.iter().map(|seed| seed_run(*seed, 10)),
        ));
        for result in results {
            match result {
                Ok(n) => reached += n,
                Err(problem) => panic!("{problem}"),
            }
        }
    }
    eprintln!(
        "crash simulation: {} seeds, {reached} crash points reached, {:.1}s",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    // Each seed reaches most of its ten planned cuts (a round whose runs all end before
    // its cut has none); the suite's own seeds must reach 5,000.
    assert!(
        reached as usize >= seeds.len() * 7,
        "too few crash points were reached: {reached}"
    );
    if seeds.len() as u64 == DEFAULT_SEEDS {
        assert!(
            reached >= 5_000,
            "the suite reached only {reached} crash points"
        );
    }
}

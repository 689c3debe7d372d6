//! Admission control: a seeded simulation of many runs through the engine and one
//! [`Scheduler`], driven as the service's driver drives them, with the invariants checked
//! after every input (nothing over a limit, no queue that could move, the scheduler's
//! counts equal to what the runs' states say), and scenario tests for the orderings
//! docs/admission.md promises.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::admission::{Limits, Pool, Scheduler, WaitingFor};
use super::*;
use crate::pipeline::{
    Concurrency, GateSpec, LocalCommand, Pipeline, PodTemplate, Step, StepAction,
};

fn local() -> StepAction {
    StepAction::Local(LocalCommand {
        argv: vec!["true".into()],
        env: vec![],
        secrets: vec![],
        workdir: None,
    })
}

fn pod() -> StepAction {
    StepAction::Kubernetes(Box::new(PodTemplate {
        image: "busybox".into(),
        command: vec![],
        args: vec![],
        env: vec![],
        secrets: vec![],
        workdir: None,
        resources: Default::default(),
        service_account: None,
        node_selector: vec![],
    }))
}

fn step(name: &str, needs: Vec<usize>, slots: u32, locks: &[&str], action: StepAction) -> Step {
    Step {
        name: name.into(),
        needs,
        timeout: Some(Duration::from_secs(60)),
        retry: None,
        slots: if action.gate().is_some() { 0 } else { slots },
        locks: locks.iter().map(|l| l.to_string()).collect(),
        action,
    }
}

fn pipeline(steps: Vec<Step>) -> Pipeline {
    Pipeline {
        params: Vec::new(),
        name: "p".into(),
        budget: None,
        priority: 0,
        parallelism: None,
        concurrency: None,
        steps,
    }
}

/// Whether the step's attempt is launching: admitted, its launch not started.
fn launching(progress: &RunStep) -> bool {
    progress
        .in_flight()
        .is_some_and(|a| a.state == AttemptState::Launching)
}

fn limits(local: u32, pods: u32, locks: &[(&str, u32)]) -> Limits {
    Limits {
        local,
        pods,
        locks: locks
            .iter()
            .map(|(n, l)| (n.to_string(), *l))
            .collect::<BTreeMap<_, _>>(),
        aging_ms: 60_000,
        active_runs: 1_000_000,
        prepared_local: 0,
    }
}

/// The driver's part: runs, the engine, the scheduler, and the admission loop.
struct World {
    engine: Engine,
    fences: FenceCounter,
    scheduler: Scheduler,
    runs: BTreeMap<RunId, Run>,
    now: Timestamp,
    next_id: u128,
    /// Steps in the order they were admitted (the attempts minted).
    started: Vec<(RunId, usize)>,
    /// Limits the runs were submitted under (a group's limit is the same for all).
    group_limit: u32,
}

impl World {
    fn new(limits: Limits) -> World {
        World {
            engine: Engine::new(EngineSettings::default()),
            fences: FenceCounter::starting_at(1),
            scheduler: Scheduler::new(limits),
            runs: BTreeMap::new(),
            now: Timestamp(1_000_000),
            next_id: 1,
            started: Vec::new(),
            group_limit: 1,
        }
    }

    fn tick(&mut self) {
        self.now = self.now.plus(Duration::from_millis(10));
    }

    fn note(&mut self, id: RunId, effects: &Effects) {
        for intent in &effects.intents {
            if let Intent::Launch(order) = intent {
                self.started.push((id, order.step));
            }
        }
        for event in &effects.events {
            if let Event::GateOpened { step } = event {
                self.started.push((id, *step));
            }
        }
    }

    fn submit(&mut self, pipeline: Pipeline, admission: RunAdmission) -> RunId {
        self.tick();
        let id = RunId(self.next_id);
        self.next_id += 1;
        let (run, effects) = self.engine.submit(
            id,
            Arc::new(pipeline),
            "sim".into(),
            admission,
            &mut self.fences,
            &mut self.scheduler,
            self.now,
        );
        self.note(id, &effects);
        self.scheduler.sync(&run);
        self.runs.insert(id, run);
        self.admit_decided();
        id
    }

    fn input(&mut self, id: RunId, input: Input) {
        self.tick();
        self.apply(id, input);
        self.admit_decided();
    }

    fn apply(&mut self, id: RunId, input: Input) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        if let Ok(effects) =
            self.engine
                .handle(run, &mut self.fences, &mut self.scheduler, input, self.now)
        {
            self.scheduler.sync(run);
            let run_id = run.id();
            self.note(run_id, &effects);
        }
    }

    fn admit_decided(&mut self) {
        loop {
            let decided = self.scheduler.take_decided();
            if decided.is_empty() {
                return;
            }
            for (id, step) in decided {
                self.apply(id, Input::Admit { step });
            }
        }
    }

    /// Every attempt in flight, launched and then finished with `succeeded`.
    fn finish(&mut self, id: RunId, step: usize, success: bool) {
        let Some(attempt) = self.runs.get(&id).and_then(|r| r.steps[step].in_flight()) else {
            return;
        };
        let fence = attempt.fence;
        if attempt.state == AttemptState::Launching {
            // The driver starts a launch only when the scheduler says it may.
            assert!(
                self.scheduler.may_start(id, step),
                "a launch started beyond its pool's limit"
            );
        }
        let verdict = Verdict {
            outcome: if success {
                Outcome::Succeeded
            } else {
                Outcome::Failed(FailureClass::Step)
            },
            started: true,
            reason: "sim".into(),
            exit_code: Some(i32::from(!success)),
            started_at: None,
            finished_at: self.now,
        };
        self.input(id, Input::LaunchConfirmed { step, fence });
        self.input(
            id,
            Input::Verdict {
                step,
                fence,
                verdict,
            },
        );
    }

    fn active(&self) -> Vec<(RunId, usize)> {
        let mut found = Vec::new();
        for (id, run) in &self.runs {
            for (step, progress) in run.steps.iter().enumerate() {
                if progress.state == StepState::Active {
                    found.push((*id, step));
                }
            }
        }
        found
    }

    /// Active steps that started, or whose launch may start now (a launch prepared ahead
    /// waits for a slot).
    fn startable(&self) -> Vec<(RunId, usize)> {
        self.active()
            .into_iter()
            .filter(|(id, step)| {
                !launching(&self.runs[id].steps[*step]) || self.scheduler.may_start(*id, *step)
            })
            .collect()
    }

    /// A restart: the scheduler rebuilt from the runs' committed state.
    fn restart(&mut self) {
        let limits = self.scheduler.limits().clone();
        self.scheduler = Scheduler::new(limits);
        self.scheduler.sync_all(self.runs.values());
        self.admit_decided();
    }

    fn check(&self) {
        if let Err(problem) = self.scheduler.check() {
            panic!("admission invariant: {problem}");
        }
        let limits = self.scheduler.limits();
        // Slots of the steps that started, and of every step admitted (launches not yet
        // started included).
        let mut used = [0u64; 2];
        let mut admitted = [0u64; 2];
        let mut locks: BTreeMap<&str, u32> = BTreeMap::new();
        let mut groups: BTreeMap<&str, u32> = BTreeMap::new();
        for run in self.runs.values() {
            if let Err(stuck) = super::waits(run) {
                panic!("forward progress: {}", stuck.problem);
            }
            let mut active = 0;
            for (step, progress) in run.steps.iter().enumerate() {
                let spec = &run.pipeline.steps[step];
                if progress.state != StepState::Active {
                    continue;
                }
                active += 1;
                let pool = match spec.action {
                    StepAction::Kubernetes(_) => 1,
                    _ => 0,
                };
                admitted[pool] += u64::from(spec.slots);
                // A Pod starts as it is created: only local launches wait.
                if pool == 1 || !launching(progress) {
                    used[pool] += u64::from(spec.slots);
                }
                for lock in &spec.locks {
                    *locks.entry(lock).or_default() += 1;
                }
            }
            if let Some(limit) = run.header.admission.parallelism {
                assert!(
                    active <= limit,
                    "run {} has {active} active steps",
                    run.id()
                );
            }
            if run.header.admission.group_held {
                let group = run.header.admission.group.as_ref().expect("held group");
                *groups.entry(&group.group).or_default() += 1;
            }
            if run.header.state.is_terminal() {
                assert!(
                    !run.header.admission.group_held,
                    "a finished run holds its group"
                );
            }
        }
        for pool in Pool::ALL {
            let index = usize::from(pool == Pool::Kubernetes);
            assert_eq!(
                used[index],
                self.scheduler.started(pool),
                "{} slots of started steps",
                pool.as_str()
            );
            assert_eq!(
                admitted[index],
                self.scheduler.used(pool),
                "{} slots held",
                pool.as_str()
            );
            assert!(
                used[index] <= u64::from(limits.pool(pool)),
                "{} over: {} slots of started steps",
                pool.as_str(),
                used[index]
            );
            let prepared = match pool {
                Pool::Local => limits.prepared_local,
                Pool::Kubernetes => 0,
            };
            assert!(
                admitted[index] <= u64::from(limits.pool(pool) + prepared),
                "{} over: {} slots admitted",
                pool.as_str(),
                admitted[index]
            );
        }
        for (lock, held) in locks {
            assert!(held <= limits.lock(lock), "lock {lock} held {held} times");
            // The scheduler also counts locks taken for steps waiting for their pool.
            assert!(held <= self.scheduler.lock_used(lock), "lock {lock} count");
        }
        for (group, held) in groups {
            assert!(
                held <= self.group_limit,
                "group {group} held by {held} runs"
            );
        }
    }
}

#[derive(Clone, Debug)]
enum Action {
    Submit {
        shape: u8,
        priority: i8,
        group: Option<u8>,
        parallelism: Option<u8>,
    },
    Finish(u8, u8, bool),
    Approve(u8, u8),
    Cancel(u8),
    Raise(u8),
    Restart,
}

fn action_strategy() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (any::<u8>(), -3i8..3, proptest::option::of(0u8..2), proptest::option::of(1u8..3))
            .prop_map(|(shape, priority, group, parallelism)| Action::Submit {
                shape,
                priority,
                group,
                parallelism
            }),
        8 => (any::<u8>(), any::<u8>(), any::<bool>()).prop_map(|(r, s, ok)| Action::Finish(r, s, ok)),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(r, s)| Action::Approve(r, s)),
        1 => any::<u8>().prop_map(Action::Cancel),
        1 => any::<u8>().prop_map(Action::Raise),
        1 => Just(Action::Restart),
    ]
}

/// A small pipeline of one of a few shapes: fan-out, multi-slot, locks in both orders,
/// Pods, a gate first.
fn shape(code: u8) -> Pipeline {
    let a = || local();
    match code % 6 {
        0 => pipeline(vec![step("a", vec![], 1, &[], a())]),
        1 => pipeline(vec![
            step("a", vec![], 1, &[], a()),
            step("b", vec![0], 2, &[], a()),
            step("c", vec![0], 1, &["gpu"], a()),
            step("d", vec![1, 2], 1, &[], a()),
        ]),
        2 => pipeline(vec![
            step("x", vec![], 3, &["a", "b"], a()),
            step("y", vec![], 1, &["b", "a"], a()),
        ]),
        3 => pipeline(vec![
            step("p", vec![], 1, &["gpu"], pod()),
            step("q", vec![], 1, &[], pod()),
        ]),
        4 => pipeline(vec![
            step("g", vec![], 0, &[], StepAction::Gate(GateSpec::default())),
            step("deploy", vec![0], 1, &["a"], a()),
        ]),
        _ => pipeline(vec![
            step("a", vec![], 1, &[], a()),
            step("b", vec![], 1, &[], a()),
            step("c", vec![], 1, &[], a()),
        ]),
    }
}

fn pick<T: Clone>(items: &[T], code: u8) -> Option<T> {
    (!items.is_empty()).then(|| items[usize::from(code) % items.len()].clone())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn admission_holds_its_limits_and_never_idles(
        local in 1u32..5,
        pods in 1u32..3,
        gpu in 1u32..3,
        prepared in 0u32..3,
        actions in proptest::collection::vec(action_strategy(), 1..120),
    ) {
        let mut world = World::new(Limits {
            prepared_local: prepared,
            ..limits(local, pods, &[("gpu", gpu), ("a", 1), ("b", 1)])
        });
        for action in actions {
            match action {
                Action::Submit { shape: code, priority, group, parallelism } => {
                    let pipeline = shape(code);
                    if !world.scheduler.limits().check(&pipeline).is_empty() {
                        // Refused at submit, as the API refuses it.
                        continue;
                    }
                    let admission = RunAdmission {
                        priority: i32::from(priority),
                        parallelism: parallelism.map(u32::from),
                        group: group.map(|g| Concurrency {
                            group: format!("g{g}"),
                            limit: 1,
                            supersede: false,
                        }),
                        group_held: false,
                    };
                    world.submit(pipeline, admission);
                }
                Action::Finish(r, s, ok) => {
                    if let Some((id, step)) = pick(&world.startable(), r.wrapping_add(s)) {
                        world.finish(id, step, ok);
                    }
                }
                Action::Approve(r, s) => {
                    let open: Vec<(RunId, usize)> = world.runs.iter().flat_map(|(id, run)| {
                        run.steps.iter().enumerate()
                            .filter(|(_, p)| p.state == StepState::Waiting)
                            .map(move |(step, _)| (*id, step))
                    }).collect();
                    if let Some((id, step)) = pick(&open, r.wrapping_add(s)) {
                        world.input(id, Input::Decide {
                            step, approve: true, by: "sim".into(), caller: "sim".into(), comment: None,
                        });
                    }
                }
                Action::Cancel(r) => {
                    let live: Vec<RunId> = world.runs.iter()
                        .filter(|(_, run)| !run.header.state.is_terminal())
                        .map(|(id, _)| *id).collect();
                    if let Some(id) = pick(&live, r) {
                        world.input(id, Input::Cancel { by: "sim".into(), reason: None });
                    }
                }
                Action::Raise(n) => {
                    let mut limits = world.scheduler.limits().clone();
                    limits.local += u32::from(n % 2);
                    limits.pods += u32::from(n % 3 == 0);
                    world.scheduler.set_limits(limits);
                    world.tick();
                    world.admit_decided();
                }
                Action::Restart => world.restart(),
            }
            world.check();
        }
        // Everything drains: finish what runs (approving gates) until nothing is left,
        // and then no slot, lock or group is held.
        for _ in 0..10_000 {
            if let Some((id, step)) = world.startable().first().copied() {
                world.finish(id, step, true);
            } else if let Some((id, step)) = world.runs.iter().find_map(|(id, run)| {
                run.steps.iter().position(|p| p.state == StepState::Waiting).map(|s| (*id, s))
            }) {
                world.input(id, Input::Decide {
                    step, approve: true, by: "sim".into(), caller: "sim".into(), comment: None,
                });
            } else {
                break;
            }
            world.check();
        }
        for run in world.runs.values() {
            prop_assert!(run.header.state.is_terminal(), "run {} is {}", run.id(), run.header.state.as_str());
        }
        for pool in Pool::ALL {
            prop_assert_eq!(world.scheduler.used(pool), 0);
        }
        for reason in WaitingFor::ALL {
            prop_assert_eq!(world.scheduler.waiting(reason), 0);
        }
    }
}

fn default_admission() -> RunAdmission {
    RunAdmission::default()
}

/// Confirms the launch of the step (the driver's part once it may start).
fn start(world: &mut World, id: RunId, step: usize) {
    let fence = world.runs[&id].steps[step]
        .in_flight()
        .expect("in flight")
        .fence;
    assert!(
        world.scheduler.may_start(id, step),
        "{id} step {step} may not start"
    );
    world.input(id, Input::LaunchConfirmed { step, fence });
}

#[test]
fn launches_prepared_ahead_start_within_the_limit_and_in_priority_order() {
    // One slot, two launches prepared beyond it.
    let mut world = World::new(Limits {
        prepared_local: 2,
        ..limits(1, 1, &[])
    });
    let busy = world.submit(shape(0), default_admission());
    start(&mut world, busy, 0);
    let low: Vec<RunId> = (0..3)
        .map(|_| world.submit(shape(0), default_admission()))
        .collect();
    // Two are admitted (their launch prepared), the third waits in the queue.
    assert!(launching(&world.runs[&low[0]].steps[0]));
    assert!(launching(&world.runs[&low[1]].steps[0]));
    assert_eq!(
        world.scheduler.wait(low[2], 0).map(|w| w.reason),
        Some(WaitingFor::Pool)
    );
    assert_eq!(world.scheduler.started(Pool::Local), 1);
    assert_eq!(world.scheduler.used(Pool::Local), 3);
    assert!(!world.scheduler.may_start(low[0], 0), "the slot is taken");
    world.check();

    // A run of higher priority arrives: queued, the prepared ones are admitted already.
    let high = world.submit(
        shape(0),
        RunAdmission {
            priority: 5,
            ..RunAdmission::default()
        },
    );
    assert_eq!(
        world.scheduler.wait(high, 0).map(|w| w.reason),
        Some(WaitingFor::Pool)
    );
    // The slot frees: the run of higher priority is admitted into it and starts before
    // the launches prepared earlier, which wait for it.
    world.finish(busy, 0, true);
    assert!(launching(&world.runs[&high].steps[0]));
    assert!(world.scheduler.may_start(high, 0));
    assert!(!world.scheduler.may_start(low[0], 0));
    assert!(!world.scheduler.may_start(low[1], 0));
    start(&mut world, high, 0);
    assert_eq!(world.scheduler.started(Pool::Local), 1);
    assert!(!world.scheduler.may_start(low[0], 0));
    world.check();

    // Then in submit order, one at a time.
    world.finish(high, 0, true);
    assert!(world.scheduler.may_start(low[0], 0));
    assert!(
        !world.scheduler.may_start(low[1], 0),
        "one slot: one at a time"
    );
    for id in &low {
        world.finish(*id, 0, true);
        world.check();
    }
    assert_eq!(world.scheduler.used(Pool::Local), 0);
    assert_eq!(world.scheduler.launching(Pool::Local), 0);
}

#[test]
fn a_step_needing_many_slots_is_not_overtaken_by_launches_prepared_after_it() {
    let mut world = World::new(Limits {
        prepared_local: 4,
        ..limits(4, 1, &[])
    });
    let small = pipeline(vec![step("s", vec![], 1, &[], local())]);
    let busy: Vec<RunId> = (0..4)
        .map(|_| world.submit(small.clone(), default_admission()))
        .collect();
    for id in &busy {
        start(&mut world, *id, 0);
    }
    let big = world.submit(
        pipeline(vec![step("big", vec![], 3, &[], local())]),
        default_admission(),
    );
    let after = world.submit(small.clone(), default_admission());
    assert!(launching(&world.runs[&big].steps[0]));
    assert!(launching(&world.runs[&after].steps[0]));
    // One slot frees: the small one prepared after the big one does not take it.
    world.finish(busy[0], 0, true);
    assert!(!world.scheduler.may_start(big, 0));
    assert!(!world.scheduler.may_start(after, 0));
    world.finish(busy[1], 0, true);
    world.finish(busy[2], 0, true);
    assert!(world.scheduler.may_start(big, 0), "three slots free");
    assert!(!world.scheduler.may_start(after, 0));
    start(&mut world, big, 0);
    world.finish(busy[3], 0, true);
    assert!(world.scheduler.may_start(after, 0));
    world.check();
}

#[test]
fn a_full_pool_queues_in_priority_then_submit_order() {
    let mut world = World::new(limits(1, 1, &[]));
    let busy = world.submit(shape(0), default_admission());
    let mut queued = Vec::new();
    for priority in [0, 5, 0, 5, -1] {
        let admission = RunAdmission {
            priority,
            ..RunAdmission::default()
        };
        queued.push((priority, world.submit(shape(0), admission)));
    }
    let id = queued[0].1;
    let wait = world.scheduler.wait(id, 0).expect("queued");
    assert_eq!(wait.reason, WaitingFor::Pool);
    assert_eq!(wait.name, "local");
    assert_eq!(wait.position, 3, "behind the two of priority 5");
    world.finish(busy, 0, true);
    while let Some((id, step)) = world.active().first().copied() {
        world.finish(id, step, true);
        world.check();
    }
    let order: Vec<RunId> = world.started.iter().map(|(id, _)| *id).collect();
    let expected = vec![
        busy,
        queued[1].1,
        queued[3].1,
        queued[0].1,
        queued[2].1,
        queued[4].1,
    ];
    assert_eq!(order, expected);
}

#[test]
fn a_step_needing_many_slots_is_not_overtaken_forever() {
    let mut world = World::new(limits(4, 1, &[]));
    let small = pipeline(vec![step("s", vec![], 1, &[], local())]);
    let big = pipeline(vec![step("big", vec![], 3, &[], local())]);
    let first: Vec<RunId> = (0..3)
        .map(|_| world.submit(small.clone(), default_admission()))
        .collect();
    let big = world.submit(big, default_admission());
    assert_eq!(
        world.scheduler.wait(big, 0).map(|w| w.reason),
        Some(WaitingFor::Pool)
    );
    // A stream of small steps arrives while the first three finish one by one: the pool
    // is kept for the big one, which starts once three slots are free.
    for id in first {
        world.submit(small.clone(), default_admission());
        world.finish(id, 0, true);
        world.check();
    }
    let big_started = world.started.iter().position(|s| *s == (big, 0));
    assert!(big_started.is_some(), "started: {:?}", world.started);
    assert_eq!(
        world.scheduler.used(Pool::Local),
        4,
        "big (3) and one small"
    );
}

#[test]
fn a_step_waiting_for_a_lock_leaves_the_pool_to_others() {
    let mut world = World::new(limits(2, 1, &[("gpu", 1)]));
    let gpu = pipeline(vec![step("train", vec![], 1, &["gpu"], local())]);
    let first = world.submit(gpu.clone(), default_admission());
    let second = world.submit(gpu, default_admission());
    assert_eq!(
        world.scheduler.wait(second, 0).map(|w| w.reason),
        Some(WaitingFor::Lock)
    );
    let plain = world.submit(shape(0), default_admission());
    assert!(world.started.contains(&(plain, 0)), "the free slot is used");
    world.finish(first, 0, true);
    assert!(world.started.contains(&(second, 0)));
    world.check();
}

#[test]
fn locks_named_in_either_order_never_deadlock() {
    let mut world = World::new(limits(4, 1, &[("a", 1), ("b", 1)]));
    let ab = pipeline(vec![step("ab", vec![], 1, &["a", "b"], local())]);
    let ba = pipeline(vec![step("ba", vec![], 1, &["b", "a"], local())]);
    let runs: Vec<RunId> = (0..6)
        .map(|i| {
            world.submit(
                if i % 2 == 0 { ab.clone() } else { ba.clone() },
                default_admission(),
            )
        })
        .collect();
    assert_eq!(world.active().len(), 1, "one holder of a and b at a time");
    while let Some((id, step)) = world.active().first().copied() {
        assert_eq!(world.active().len(), 1);
        world.finish(id, step, true);
        world.check();
    }
    for id in runs {
        assert_eq!(world.runs[&id].header.state, RunState::Succeeded);
    }
}

#[test]
fn a_group_runs_one_at_a_time_across_its_gate_and_supersede_names_only_the_queued() {
    let mut world = World::new(limits(4, 1, &[]));
    let deploy = pipeline(vec![
        step(
            "approve",
            vec![],
            0,
            &[],
            StepAction::Gate(GateSpec::default()),
        ),
        step("deploy", vec![0], 1, &[], local()),
    ]);
    let group = RunAdmission {
        group: Some(Concurrency {
            group: "prod".into(),
            limit: 1,
            supersede: true,
        }),
        ..RunAdmission::default()
    };
    let first = world.submit(deploy.clone(), group.clone());
    assert_eq!(
        world.runs[&first].header.state,
        RunState::Waiting,
        "its gate is open"
    );
    let second = world.submit(deploy.clone(), group.clone());
    let third = world.submit(deploy.clone(), group.clone());
    let wait = world.scheduler.wait(third, 0).expect("queued");
    assert_eq!(
        (wait.reason, wait.name.as_str(), wait.position),
        (WaitingFor::Group, "prod", 2)
    );
    assert_eq!(world.scheduler.group_waiting("prod"), vec![second, third]);
    // What the driver does for `supersede`: the newest run cancels the older waiting ones.
    world.input(
        second,
        Input::Cancel {
            by: format!("run {third}"),
            reason: Some("superseded".into()),
        },
    );
    assert_eq!(world.runs[&second].header.state, RunState::Cancelled);
    assert!(
        world.scheduler.wait(third, 0).is_some(),
        "still waiting behind the gate"
    );
    world.input(
        first,
        Input::Decide {
            step: 0,
            approve: true,
            by: "me".into(),
            caller: "me".into(),
            comment: None,
        },
    );
    assert!(
        world.scheduler.wait(third, 0).is_some(),
        "the first run still deploys"
    );
    world.finish(first, 1, true);
    assert_eq!(world.runs[&first].header.state, RunState::Succeeded);
    assert_eq!(
        world.runs[&third].header.state,
        RunState::Waiting,
        "now its gate opened"
    );
    world.check();
}

#[test]
fn lowering_a_limit_stops_nothing_and_admits_less() {
    let mut world = World::new(limits(3, 1, &[]));
    let runs: Vec<RunId> = (0..5)
        .map(|_| world.submit(shape(0), default_admission()))
        .collect();
    assert_eq!(world.active().len(), 3);
    world.scheduler.set_limits(limits(1, 1, &[]));
    world.admit_decided();
    assert_eq!(world.active().len(), 3, "nothing stopped");
    world.finish(runs[0], 0, true);
    world.finish(runs[1], 0, true);
    assert_eq!(
        world.active().len(),
        1,
        "none admitted until below the new limit"
    );
    world.finish(runs[2], 0, true);
    assert_eq!(world.active().len(), 1, "one admitted");
    world.scheduler.set_limits(limits(5, 1, &[]));
    world.admit_decided();
    assert_eq!(world.active().len(), 2, "raising it admits at once");
}

#[test]
fn a_restart_counts_active_steps_before_admitting_anything() {
    let mut world = World::new(limits(2, 1, &[]));
    for _ in 0..5 {
        world.submit(shape(0), default_admission());
    }
    assert_eq!(world.active().len(), 2);
    world.restart();
    assert_eq!(world.active().len(), 2);
    assert_eq!(world.scheduler.used(Pool::Local), 2);
    assert_eq!(world.scheduler.waiting(WaitingFor::Pool), 3);
    world.check();
}

#[test]
fn parallelism_caps_a_run_and_not_the_others() {
    let mut world = World::new(limits(8, 1, &[]));
    let capped = RunAdmission {
        parallelism: Some(1),
        ..RunAdmission::default()
    };
    let one = world.submit(shape(5), capped);
    let free = world.submit(shape(5), default_admission());
    let active = world.active();
    assert_eq!(active.iter().filter(|(id, _)| *id == one).count(), 1);
    assert_eq!(active.iter().filter(|(id, _)| *id == free).count(), 3);
    let wait = world.scheduler.wait(one, 2).expect("queued");
    assert_eq!((wait.reason, wait.position), (WaitingFor::Parallelism, 2));
    world.check();
}

#[test]
fn the_limits_refuse_what_they_could_never_admit() {
    let limits = limits(4, 2, &[("gpu", 1)]);
    let mut pipeline = pipeline(vec![
        step("a", vec![], 5, &["gpu", "tpu"], local()),
        step("b", vec![], 4, &[], local()),
    ]);
    let errors = limits.check(&pipeline);
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["steps[0].slots", "steps[0].locks[1]"]);
    assert!(
        errors[1].message.contains("configured: gpu"),
        "{}",
        errors[1].message
    );
    pipeline.steps[0].slots = 4;
    pipeline.steps[0].locks.pop();
    assert!(limits.check(&pipeline).is_empty());
}

/// Each way an attempt ends gives its slot back where docs/admission.md says: a run
/// queued behind it is admitted by the input that records the end (for a budget or a
/// cancel, by the verdict of the stopped attempt, which holds its slot until then), and
/// the scheduler's counts stay equal to the runs' states throughout.
#[test]
fn every_end_of_an_attempt_gives_its_slot_back() {
    fn verdict(outcome: Outcome, now: Timestamp) -> Verdict {
        Verdict {
            outcome,
            started: true,
            reason: "sim".into(),
            exit_code: None,
            started_at: None,
            finished_at: now,
        }
    }
    let retried = || {
        let mut with_retry = step("a", vec![], 1, &[], local());
        with_retry.retry = Some(crate::pipeline::RetryPolicy {
            on: crate::pipeline::RetryOn {
                step: true,
                ..Default::default()
            },
            max: 1,
            backoff: crate::pipeline::Backoff {
                initial: Duration::from_secs(30),
                ..Default::default()
            },
        });
        pipeline(vec![with_retry])
    };
    let budgeted = || {
        let mut p = shape(0);
        p.budget = Some(Duration::from_secs(1));
        p
    };
    // (what ends the attempt, the pipeline, whether a stop precedes the verdict)
    let endings: Vec<(&str, Pipeline)> = vec![
        ("timeout", shape(0)),
        ("lost", shape(0)),
        ("dead letter", shape(0)),
        ("retry backoff", retried()),
        ("budget", budgeted()),
        ("cancel", shape(0)),
    ];
    for (ending, first) in endings {
        let mut world = World::new(limits(1, 1, &[]));
        let a = world.submit(first, default_admission());
        let b = world.submit(shape(0), default_admission());
        assert!(world.scheduler.wait(b, 0).is_some(), "{ending}: b waits");
        let fence = world.runs[&a].steps[0].in_flight().expect("a runs").fence;
        let step = 0;
        let now = world.now;
        match ending {
            "timeout" | "lost" | "retry backoff" => {
                let outcome = match ending {
                    "timeout" => Outcome::Failed(FailureClass::Timeout),
                    "lost" => Outcome::Failed(FailureClass::Lost),
                    _ => Outcome::Failed(FailureClass::Step),
                };
                world.input(a, Input::LaunchConfirmed { step, fence });
                world.check();
                assert!(world.scheduler.wait(b, 0).is_some(), "{ending}: still held");
                world.input(
                    a,
                    Input::Verdict {
                        step,
                        fence,
                        verdict: verdict(outcome, now),
                    },
                );
            }
            "dead letter" => world.input(
                a,
                Input::Undeliverable {
                    step,
                    fence,
                    launch: true,
                    reason: Undelivered::ExecutorUnavailable,
                    detail: "sim".into(),
                },
            ),
            "budget" | "cancel" => {
                world.input(a, Input::LaunchConfirmed { step, fence });
                let stop = if ending == "budget" {
                    Input::TimerFired(Timer::Budget)
                } else {
                    Input::Cancel {
                        by: "sim".into(),
                        reason: None,
                    }
                };
                world.input(a, stop);
                world.check();
                assert!(
                    world.scheduler.wait(b, 0).is_some(),
                    "{ending}: the stopped attempt holds its slot until its verdict"
                );
                world.input(
                    a,
                    Input::Verdict {
                        step,
                        fence,
                        verdict: verdict(Outcome::Failed(FailureClass::Step), now),
                    },
                );
            }
            _ => unreachable!(),
        }
        world.check();
        assert!(
            world.started.contains(&(b, 0)),
            "{ending}: the slot went to b; a is {:?}",
            world.runs[&a].steps[0].state
        );
        assert!(
            world.scheduler.wait(b, 0).is_none(),
            "{ending}: b no longer waits"
        );
    }
}

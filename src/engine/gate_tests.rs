//! Gates, budgets and every timer interaction, on a virtual clock with a model of the
//! durable timer table. After every input the forward-progress check must hold and every
//! timer the run waits on must be scheduled.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::pipeline::{GateSpec, LocalCommand, Pipeline, Step, StepAction};

const T0: Timestamp = Timestamp(5_000_000);

/// A local step running `true` with a 60 s timeout (shared with the auto-retry tests).
pub(super) fn local(name: &str, needs: &[usize]) -> Step {
    Step {
        slots: 1,
        locks: Vec::new(),
        name: name.into(),
        needs: needs.to_vec(),
        timeout: Some(Duration::from_secs(60)),
        retry: None,
        action: StepAction::Local(LocalCommand {
            argv: vec!["true".into()],
            env: vec![],
            secrets: vec![],
            workdir: None,
        }),
    }
}

fn gate(name: &str, needs: &[usize], release: Option<u64>, expires: Option<u64>) -> Step {
    Step {
        slots: 1,
        locks: Vec::new(),
        name: name.into(),
        needs: needs.to_vec(),
        timeout: None,
        retry: None,
        action: StepAction::Gate(GateSpec {
            auto_release: release.map(Duration::from_secs),
            expires: expires.map(Duration::from_secs),
            message: Some("ship it?".into()),
        }),
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The engine plus the durable timer table the driver keeps for it.
struct Sim {
    engine: Engine,
    fences: FenceCounter,
    run: Run,
    now: Timestamp,
    timers: BTreeSet<(Timestamp, TimerKey)>,
    kills: Vec<(usize, Fence, KillReason)>,
}

/// `Timer` with an order, for the set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKey {
    Retry(usize),
    Backstop(usize, u64),
    Release(usize),
    Expiry(usize),
    Budget,
    Retention,
}

impl From<Timer> for TimerKey {
    fn from(timer: Timer) -> Self {
        match timer {
            Timer::RetryDue { step } => TimerKey::Retry(step),
            Timer::Backstop { step, fence } => TimerKey::Backstop(step, fence.0),
            Timer::GateRelease { step } => TimerKey::Release(step),
            Timer::GateExpiry { step } => TimerKey::Expiry(step),
            Timer::Budget => TimerKey::Budget,
            Timer::Retention => TimerKey::Retention,
        }
    }
}

impl From<TimerKey> for Timer {
    fn from(key: TimerKey) -> Self {
        match key {
            TimerKey::Retry(step) => Timer::RetryDue { step },
            TimerKey::Backstop(step, fence) => Timer::Backstop {
                step,
                fence: Fence(fence),
            },
            TimerKey::Release(step) => Timer::GateRelease { step },
            TimerKey::Expiry(step) => Timer::GateExpiry { step },
            TimerKey::Budget => Timer::Budget,
            TimerKey::Retention => Timer::Retention,
        }
    }
}

impl Sim {
    fn new(budget: Option<Duration>, steps: Vec<Step>) -> Sim {
        let engine = Engine::new(EngineSettings::default());
        let mut fences = FenceCounter::starting_at(1);
        let pipeline = Arc::new(Pipeline {
            params: Vec::new(),
            priority: 0,
            parallelism: None,
            concurrency: None,
            name: "p".into(),
            budget,
            steps,
        });
        let (run, effects) = engine.submit(
            RunId(9),
            pipeline,
            "local".into(),
            crate::engine::RunAdmission::default(),
            &mut fences,
            &mut crate::engine::Unlimited,
            T0,
        );
        let mut sim = Sim {
            engine,
            fences,
            run,
            now: T0,
            timers: BTreeSet::new(),
            kills: Vec::new(),
        };
        sim.apply_effects(effects);
        sim
    }

    fn apply_effects(&mut self, effects: Effects) {
        for intent in effects.intents {
            match intent {
                Intent::ScheduleTimer { due, timer } => {
                    self.timers.insert((due, timer.into()));
                }
                Intent::CancelTimer { due, timer } => {
                    self.timers.remove(&(due, timer.into()));
                }
                Intent::Kill {
                    step,
                    fence,
                    reason,
                } => self.kills.push((step, fence, reason)),
                Intent::Launch(_) => {}
            }
        }
        self.check_progress();
    }

    /// The forward-progress invariant, against the modelled timer table.
    fn check_progress(&self) {
        let waits = waits(&self.run).unwrap_or_else(|stuck| panic!("stuck: {}", stuck.problem));
        for wait in waits {
            if let Wait::Timer { due, timer } = wait {
                assert!(
                    self.timers.contains(&(due, timer.into())),
                    "waits on {timer:?} at {due:?}, which is not scheduled: {:?}",
                    self.timers
                );
            }
        }
    }

    fn try_input(&mut self, input: Input) -> Result<(), RejectedInput> {
        let effects = self.engine.handle(
            &mut self.run,
            &mut self.fences,
            &mut crate::engine::Unlimited,
            input,
            self.now,
        )?;
        self.apply_effects(effects);
        Ok(())
    }

    fn input(&mut self, input: Input) {
        self.try_input(input).expect("input accepted");
    }

    /// Moves the clock, firing every timer that comes due on the way, in due order
    /// (as the driver does, exactly once each).
    fn advance(&mut self, by: Duration) {
        let until = self.now.plus(by);
        while let Some(&(due, key)) = self.timers.iter().next() {
            if due > until {
                break;
            }
            self.timers.remove(&(due, key));
            self.now = due.max(self.now);
            self.input(Input::TimerFired(key.into()));
        }
        self.now = until;
    }

    fn fence(&self, step: usize) -> Fence {
        self.run.steps[step].attempts.last().expect("attempt").fence
    }

    fn start(&mut self, step: usize) {
        let fence = self.fence(step);
        self.input(Input::LaunchConfirmed { step, fence });
    }

    fn verdict(&mut self, step: usize, outcome: Outcome) {
        let fence = self.fence(step);
        self.input(Input::Verdict {
            step,
            fence,
            verdict: Verdict {
                outcome,
                started: true,
                reason: "test".into(),
                exit_code: Some(0),
                started_at: None,
                finished_at: self.now,
            },
        });
    }

    /// Starts `step`, lets it run for `took` and finishes it successfully.
    fn run_step(&mut self, step: usize, took: Duration) {
        self.start(step);
        self.advance(took);
        if self.run.steps[step].state == StepState::Active {
            self.verdict(step, Outcome::Succeeded);
        }
    }

    fn decide(&mut self, step: usize, approve: bool) -> Result<(), RejectedInput> {
        self.try_input(Input::Decide {
            step,
            approve,
            by: "alice".into(),
            caller: "admin".into(),
            comment: Some("looks good".into()),
        })
    }

    fn state(&self) -> RunState {
        self.run.header.state
    }

    fn decision(&self, step: usize) -> GateDecision {
        self.run.steps[step]
            .gate
            .as_ref()
            .and_then(|g| g.decision.clone())
            .expect("decided")
    }

    fn gate_timers(&self, step: usize) -> usize {
        self.timers
            .iter()
            .filter(|(_, k)| matches!(k, TimerKey::Release(s) | TimerKey::Expiry(s) if *s == step))
            .count()
    }
}

fn three_steps(release: Option<u64>, expires: Option<u64>) -> Vec<Step> {
    vec![
        local("build", &[]),
        gate("approve", &[0], release, expires),
        local("deploy", &[1]),
    ]
}

#[test]
fn approval_releases_the_run_and_records_who_and_when() {
    let mut sim = Sim::new(None, three_steps(None, None));
    sim.run_step(0, secs(1));
    assert_eq!(sim.state(), RunState::Waiting);
    assert_eq!(sim.run.steps[1].state, StepState::Waiting);
    // Weeks on a gate with no timers: nothing fires, nothing changes.
    sim.advance(secs(21 * 24 * 3600));
    assert_eq!(sim.state(), RunState::Waiting);
    let decided_at = sim.now;
    sim.decide(1, true).expect("approve");
    let decision = sim.decision(1);
    assert_eq!(decision.outcome, GateOutcome::Approved);
    assert_eq!(
        (decision.by.as_str(), decision.caller.as_str()),
        ("alice", "admin")
    );
    assert_eq!(decision.at, decided_at);
    assert_eq!(sim.run.steps[1].state, StepState::Succeeded);
    assert_eq!(sim.state(), RunState::Running);
    assert_eq!(sim.run.steps[2].state, StepState::Active);
    sim.run_step(2, secs(1));
    assert_eq!(sim.state(), RunState::Succeeded);
    assert_eq!(classify_run(&sim.run), None);
}

#[test]
fn rejection_fails_the_gate_and_skips_what_follows() {
    let mut sim = Sim::new(None, three_steps(Some(60), Some(600)));
    sim.run_step(0, secs(1));
    assert_eq!(sim.gate_timers(1), 2);
    sim.decide(1, false).expect("reject");
    assert_eq!(
        sim.gate_timers(1),
        0,
        "a decided gate's timers are cancelled"
    );
    assert_eq!(
        sim.run.steps[1].state,
        StepState::Failed {
            reason: GATE_REJECTED.into()
        }
    );
    assert_eq!(sim.run.steps[2].state, StepState::Skipped);
    assert_eq!(sim.state(), RunState::Failed);
    let class = classify_run(&sim.run).expect("failed");
    assert_eq!(class.category, "gate");
    assert_eq!(class.step.as_deref(), Some("approve"));
    assert!(
        class.reason.contains("rejected by alice"),
        "{}",
        class.reason
    );
    assert!(!class.auto_retryable);
}

#[test]
fn auto_release_approves_as_the_system() {
    let mut sim = Sim::new(None, three_steps(Some(30), Some(3600)));
    sim.run_step(0, secs(1));
    let opened = sim.now;
    sim.advance(secs(29));
    assert_eq!(sim.state(), RunState::Waiting);
    sim.advance(secs(1));
    let decision = sim.decision(1);
    assert_eq!(decision.outcome, GateOutcome::AutoReleased);
    assert_eq!(decision.by, SYSTEM);
    assert_eq!(decision.at, opened.plus(secs(30)));
    assert_eq!(
        sim.gate_timers(1),
        0,
        "the expiry is cancelled by the release"
    );
    assert_eq!(sim.run.steps[2].state, StepState::Active);
}

#[test]
fn expiry_fails_the_gate_with_gate_expired() {
    let mut sim = Sim::new(None, three_steps(None, Some(120)));
    sim.run_step(0, secs(1));
    sim.advance(secs(120));
    assert_eq!(sim.decision(1).outcome, GateOutcome::Expired);
    assert_eq!(
        sim.run.steps[1].state,
        StepState::Failed {
            reason: GATE_EXPIRED.into()
        }
    );
    assert_eq!(sim.state(), RunState::Failed);
    assert_eq!(classify_run(&sim.run).expect("failed").category, "gate");
}

#[test]
fn expiry_and_approval_racing_decide_once() {
    // The approval lands first (same instant as the expiry's due time): the expiry timer
    // was cancelled with it, and a stale firing of it changes nothing.
    let mut sim = Sim::new(None, three_steps(None, Some(60)));
    sim.run_step(0, secs(1));
    let due = sim.run.steps[1]
        .gate
        .as_ref()
        .and_then(|g| g.expires_at)
        .expect("expiry");
    sim.now = due;
    sim.decide(1, true).expect("approve first");
    sim.input(Input::TimerFired(Timer::GateExpiry { step: 1 }));
    assert_eq!(sim.decision(1).outcome, GateOutcome::Approved);
    assert_eq!(sim.run.steps[1].state, StepState::Succeeded);

    // The expiry fires first: the approval is refused, naming what happened.
    let mut sim = Sim::new(None, three_steps(None, Some(60)));
    sim.run_step(0, secs(1));
    sim.advance(secs(60));
    let error = sim.decide(1, true).expect_err("already expired");
    assert!(
        matches!(
            &error,
            RejectedInput::RunTerminal(_) | RejectedInput::GateNotOpen { .. }
        ),
        "{error}"
    );
    assert_eq!(sim.decision(1).outcome, GateOutcome::Expired);
}

#[test]
fn cancel_during_a_gate_cancels_it_and_its_timers() {
    let mut sim = Sim::new(Some(secs(30)), three_steps(Some(600), Some(3600)));
    sim.run_step(0, secs(1));
    assert_eq!(sim.state(), RunState::Waiting);
    sim.input(Input::Cancel {
        by: "bob".into(),
        reason: None,
    });
    assert_eq!(sim.run.steps[1].state, StepState::Cancelled);
    assert_eq!(sim.run.steps[2].state, StepState::Cancelled);
    assert_eq!(sim.state(), RunState::Cancelled);
    // Only the finished run's retention is left: the gate's and the budget's are gone.
    assert!(
        sim.timers.iter().all(|(_, t)| *t == TimerKey::Retention),
        "{:?}",
        sim.timers
    );
    assert_eq!(sim.timers.len(), 1, "{:?}", sim.timers);
    assert_eq!(
        classify_run(&sim.run).expect("cancelled").category,
        "cancelled"
    );
}

#[test]
fn bad_decisions_are_refused_and_change_nothing() {
    let mut sim = Sim::new(None, three_steps(None, None));
    let before = (sim.run.steps.clone(), sim.run.header.clone());
    // A gate not reached yet.
    let error = sim.decide(1, true).expect_err("pending");
    assert!(
        matches!(&error, RejectedInput::GateNotOpen { state, .. } if state == "pending"),
        "{error}"
    );
    // Not a gate.
    let error = sim.decide(0, true).expect_err("not a gate");
    assert_eq!(error, RejectedInput::NotAGate("build".into()));
    assert_eq!((sim.run.steps.clone(), sim.run.header.clone()), before);
    // Already decided.
    sim.run_step(0, secs(1));
    sim.decide(1, true).expect("approve");
    let error = sim.decide(1, false).expect_err("decided");
    assert!(
        error.to_string().contains("already approved by alice"),
        "{error}"
    );
    assert_eq!(sim.decision(1).outcome, GateOutcome::Approved);
}

#[test]
fn a_gate_first_and_parallel_gates_keep_the_run_waiting_until_the_last() {
    let steps = vec![
        gate("g1", &[], None, None),
        gate("g2", &[], None, None),
        local("after", &[0, 1]),
    ];
    let mut sim = Sim::new(None, steps);
    assert_eq!(sim.state(), RunState::Waiting);
    sim.decide(0, true).expect("g1");
    assert_eq!(sim.state(), RunState::Waiting);
    sim.decide(1, true).expect("g2");
    assert_eq!(sim.state(), RunState::Running);
    sim.run_step(2, secs(1));
    assert_eq!(sim.state(), RunState::Succeeded);
}

#[test]
fn a_gate_beside_a_running_step_leaves_the_run_running() {
    let steps = vec![gate("g", &[], None, None), local("side", &[])];
    let mut sim = Sim::new(None, steps);
    assert_eq!(sim.state(), RunState::Queued);
    sim.start(1);
    assert_eq!(sim.state(), RunState::Running);
    sim.verdict(1, Outcome::Succeeded);
    assert_eq!(sim.state(), RunState::Waiting);
    sim.decide(0, true).expect("approve");
    assert_eq!(sim.state(), RunState::Succeeded);
}

#[test]
fn budget_stops_a_step_that_runs_past_it() {
    let mut sim = Sim::new(Some(secs(3)), vec![local("slow", &[]), local("next", &[0])]);
    sim.start(0);
    sim.advance(secs(3));
    assert_eq!(sim.kills, vec![(0, sim.fence(0), KillReason::Budget)]);
    assert_eq!(sim.run.steps[1].state, StepState::Skipped);
    assert_eq!(
        sim.state(),
        RunState::Running,
        "until the executor's verdict"
    );
    sim.verdict(0, Outcome::Stopped);
    assert_eq!(
        sim.run.steps[0].state,
        StepState::Failed {
            reason: BUDGET_EXCEEDED.into()
        }
    );
    assert_eq!(sim.state(), RunState::Failed);
    let class = classify_run(&sim.run).expect("failed");
    assert_eq!(class.category, "budget");
    assert_eq!(class.step.as_deref(), Some("slow"));
}

#[test]
fn gate_time_is_excluded_from_the_budget() {
    // 1 s, a gate approved after 5 s, 1 s: 2 s of active time in a 3 s budget.
    let steps = vec![
        local("a", &[]),
        gate("g", &[0], None, None),
        local("b", &[1]),
    ];
    let mut sim = Sim::new(Some(secs(3)), steps.clone());
    sim.run_step(0, secs(1));
    assert_eq!(sim.state(), RunState::Waiting);
    assert!(
        !sim.timers.iter().any(|(_, k)| *k == TimerKey::Budget),
        "the budget timer is cancelled while waiting"
    );
    sim.advance(secs(5));
    sim.decide(1, true).expect("approve");
    sim.run_step(2, secs(1));
    assert_eq!(sim.state(), RunState::Succeeded);
    assert_eq!(
        sim.run.header.budget.as_ref().map(|b| b.used_ms),
        Some(2000)
    );

    // The same with 2 s steps: the budget runs out 1 s into the second step.
    let mut sim = Sim::new(Some(secs(3)), steps);
    sim.run_step(0, secs(2));
    sim.advance(secs(5));
    sim.decide(1, true).expect("approve");
    sim.start(2);
    sim.advance(secs(1) - Duration::from_millis(1));
    assert!(sim.kills.is_empty());
    sim.advance(Duration::from_millis(1));
    assert_eq!(sim.kills.len(), 1);
    sim.verdict(2, Outcome::Stopped);
    assert_eq!(sim.state(), RunState::Failed);
    assert_eq!(classify_run(&sim.run).expect("failed").category, "budget");
}

#[test]
fn budget_out_during_a_retry_backoff_fails_the_step_without_a_kill() {
    let mut retrying = local("flaky", &[]);
    retrying.retry = Some(crate::pipeline::RetryPolicy {
        on: crate::pipeline::RetryOn::FAILURE,
        max: 5,
        backoff: crate::pipeline::Backoff {
            initial: secs(10),
            factor: 1.0,
            max: secs(10),
        },
    });
    let mut sim = Sim::new(Some(secs(4)), vec![retrying]);
    sim.start(0);
    sim.advance(secs(1));
    sim.verdict(0, Outcome::Failed(FailureClass::Step));
    assert!(matches!(
        sim.run.steps[0].state,
        StepState::RetryWaiting { .. }
    ));
    sim.advance(secs(3));
    assert!(sim.kills.is_empty());
    assert_eq!(
        sim.run.steps[0].state,
        StepState::Failed {
            reason: BUDGET_EXCEEDED.into()
        }
    );
    assert!(
        sim.timers
            .iter()
            .all(|(_, k)| !matches!(k, TimerKey::Retry(_)))
    );
    assert_eq!(sim.state(), RunState::Failed);
    assert_eq!(classify_run(&sim.run).expect("failed").category, "budget");
}

#[test]
fn a_verdict_and_a_timer_arriving_together_settle_once() {
    // The backstop fires at the same instant the verdict arrives, in either order.
    for verdict_first in [true, false] {
        let mut sim = Sim::new(None, vec![local("s", &[])]);
        sim.start(0);
        let fence = sim.fence(0);
        let AttemptState::Running { backstop_due, .. } = sim.run.steps[0].attempts[0].state else {
            panic!("running");
        };
        sim.now = backstop_due;
        let backstop = Input::TimerFired(Timer::Backstop { step: 0, fence });
        if verdict_first {
            sim.verdict(0, Outcome::Succeeded);
            sim.input(backstop);
            assert!(sim.kills.is_empty(), "a stale backstop asks for nothing");
            assert_eq!(sim.state(), RunState::Succeeded);
        } else {
            sim.input(backstop);
            assert_eq!(sim.kills, vec![(0, fence, KillReason::Timeout)]);
            sim.verdict(0, Outcome::Failed(FailureClass::Timeout));
            assert_eq!(sim.state(), RunState::Failed);
        }
    }
    // The budget runs out at the instant the last step succeeds.
    for verdict_first in [true, false] {
        let mut sim = Sim::new(Some(secs(2)), vec![local("s", &[])]);
        sim.start(0);
        sim.now = T0.plus(secs(2));
        if verdict_first {
            sim.verdict(0, Outcome::Succeeded);
            sim.input(Input::TimerFired(Timer::Budget));
            assert_eq!(sim.state(), RunState::Succeeded);
        } else {
            sim.input(Input::TimerFired(Timer::Budget));
            sim.verdict(0, Outcome::Succeeded);
            assert_eq!(sim.run.steps[0].state, StepState::Succeeded);
            assert_eq!(sim.state(), RunState::Failed, "the budget ran out first");
            assert_eq!(classify_run(&sim.run).expect("failed").category, "budget");
        }
    }
}

#[test]
fn a_stale_budget_timer_after_a_pause_changes_nothing() {
    let steps = vec![
        local("a", &[]),
        gate("g", &[0], None, None),
        local("b", &[1]),
    ];
    let mut sim = Sim::new(Some(secs(10)), steps);
    sim.run_step(0, secs(2));
    // The timer scheduled at submit (due T0+10s) was cancelled by the pause; a duplicate
    // firing of it (at-least-once) must not count gate time.
    sim.now = T0.plus(secs(10));
    sim.input(Input::TimerFired(Timer::Budget));
    assert_eq!(sim.state(), RunState::Waiting);
    sim.decide(1, true).expect("approve");
    sim.input(Input::TimerFired(Timer::Budget));
    assert!(sim.kills.is_empty());
    let clock = sim.run.header.budget.clone().expect("budget");
    assert_eq!(clock.used_ms, 2000);
    assert_eq!(clock.due, Some(sim.now.plus(secs(8))));
}

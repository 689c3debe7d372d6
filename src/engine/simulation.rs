//! A seeded simulation of the engine against a simple reference model: random pipelines,
//! random interleavings of launch confirmations, verdicts, timers and cancels, and the
//! invariants of retry and run outcome (docs/failure-classes.md) checked after every input.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::pipeline::{Backoff, LocalCommand, Pipeline, RetryOn, RetryPolicy, Step, StepAction};

#[derive(Clone, Debug)]
enum Action {
    Confirm(usize),
    Finish(usize, u8),
    FireRetry(usize),
    FireBackstop(usize),
    Cancel,
}

fn outcome(code: u8) -> Outcome {
    match code % 8 {
        0 | 1 => Outcome::Succeeded,
        2 => Outcome::Failed(FailureClass::Step),
        3 => Outcome::Failed(FailureClass::Timeout),
        4 => Outcome::Failed(FailureClass::InfraNeverStarted),
        5 => Outcome::Failed(FailureClass::InfraPostStart),
        6 => Outcome::Failed(FailureClass::Lost),
        _ => Outcome::Failed(FailureClass::Config),
    }
}

fn pipeline_strategy() -> impl Strategy<Value = Pipeline> {
    (1usize..6).prop_flat_map(|n| {
        let steps = (0..n)
            .map(|i| {
                let needs = proptest::collection::vec(0..i.max(1), 0..=i.min(2));
                let retry = proptest::option::of((0u8..16, 0u32..4));
                (needs, retry).prop_map(move |(needs, retry)| {
                    let mut needs: Vec<usize> = needs.into_iter().filter(|&d| d < i).collect();
                    needs.sort_unstable();
                    needs.dedup();
                    Step {
                        slots: 1,
                        locks: Vec::new(),
                        name: format!("s{i}"),
                        needs,
                        timeout: Some(Duration::from_secs(5)),
                        retry: retry.map(|(bits, max)| RetryPolicy {
                            on: RetryOn {
                                step: bits & 1 != 0,
                                timeout: bits & 2 != 0,
                                infra: bits & 4 != 0,
                                lost: bits & 8 != 0,
                            },
                            max,
                            backoff: Backoff {
                                initial: Duration::from_millis(100),
                                factor: 2.0,
                                max: Duration::from_secs(1),
                            },
                        }),
                        action: StepAction::Local(LocalCommand {
                            argv: vec!["true".into()],
                            env: vec![],
                            secrets: vec![],
                            workdir: None,
                        }),
                    }
                })
            })
            .collect::<Vec<_>>();
        steps.prop_map(|steps| Pipeline {
            params: Vec::new(),
            priority: 0,
            parallelism: None,
            concurrency: None,
            budget: None,
            name: "sim".into(),
            steps,
        })
    })
}

fn action_strategy() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (0usize..6).prop_map(Action::Confirm),
        6 => (0usize..6, any::<u8>()).prop_map(|(s, o)| Action::Finish(s, o)),
        3 => (0usize..6).prop_map(Action::FireRetry),
        1 => (0usize..6).prop_map(Action::FireBackstop),
        1 => Just(Action::Cancel),
    ]
}

struct Sim {
    engine: Engine,
    fences: FenceCounter,
    run: Run,
    now: Timestamp,
    minted: Vec<Fence>,
}

impl Sim {
    fn apply(&mut self, input: Input) {
        self.now = self.now.plus(Duration::from_millis(10));
        if let Ok(effects) = self.engine.handle(
            &mut self.run,
            &mut self.fences,
            &mut crate::engine::Unlimited,
            input,
            self.now,
        ) {
            self.collect(&effects);
        }
        check_invariants(self);
    }

    fn collect(&mut self, effects: &Effects) {
        for intent in &effects.intents {
            if let Intent::Launch(order) = intent {
                self.minted.push(order.fence);
            }
        }
    }

    fn in_flight(&self, step: usize) -> Option<&Attempt> {
        self.run.steps.get(step)?.in_flight()
    }

    fn act(&mut self, action: &Action) {
        match *action {
            Action::Confirm(step) => {
                if let Some(attempt) = self.in_flight(step) {
                    let fence = attempt.fence;
                    self.apply(Input::LaunchConfirmed { step, fence });
                }
            }
            Action::Finish(step, code) => {
                if let Some(attempt) = self.in_flight(step) {
                    let fence = attempt.fence;
                    let kill = attempt.kill;
                    let outcome = match kill {
                        Some(KillReason::Cancel | KillReason::Budget) => Outcome::Stopped,
                        Some(KillReason::Timeout) => Outcome::Failed(FailureClass::Timeout),
                        None => outcome(code),
                    };
                    let verdict = Verdict {
                        started: true,
                        reason: "sim".into(),
                        exit_code: None,
                        started_at: None,
                        finished_at: self.now,
                        outcome,
                    };
                    self.apply(Input::Verdict {
                        step,
                        fence,
                        verdict,
                    });
                }
            }
            Action::FireRetry(step) => {
                if let Some(StepState::RetryWaiting { due }) =
                    self.run.steps.get(step).map(|s| s.state.clone())
                {
                    self.now = self.now.max(due);
                    self.apply(Input::TimerFired(Timer::RetryDue { step }));
                }
            }
            Action::FireBackstop(step) => {
                if let Some(attempt) = self.in_flight(step) {
                    let fence = attempt.fence;
                    self.apply(Input::TimerFired(Timer::Backstop { step, fence }));
                }
            }
            Action::Cancel => self.apply(Input::Cancel {
                by: "sim".into(),
                reason: None,
            }),
        }
    }
}

fn check_invariants(sim: &Sim) {
    let run = &sim.run;
    let settings = sim.engine.settings();
    // Forward progress: a non-terminal run always waits on a timer, an executor or a gate.
    if let Err(stuck) = super::waits(run) {
        panic!("forward progress: {}", stuck.problem);
    }
    // Fences are minted strictly increasing and never reused.
    assert!(
        sim.minted.windows(2).all(|w| w[0] < w[1]),
        "fences {:?}",
        sim.minted
    );
    for (i, progress) in run.steps.iter().enumerate() {
        let spec = &run.pipeline.steps[i];
        // No overlapping attempts; numbering 1..n; at most the largest budget plus one.
        assert!(
            progress
                .attempts
                .iter()
                .filter(|a| a.is_in_flight())
                .count()
                <= 1
        );
        if let Some(last) = progress.attempts.last() {
            assert!(
                progress.attempts[..progress.attempts.len() - 1]
                    .iter()
                    .all(|a| !a.is_in_flight())
            );
            assert_eq!(last.number as usize, progress.attempts.len());
        }
        let most = spec.retry.map_or(0, |p| p.max).max(settings.infra_retries) + 1;
        assert!(
            progress.attempts.len() as u32 <= most,
            "step {i}: {} attempts",
            progress.attempts.len()
        );
        // An active step has exactly one attempt in flight; others none.
        assert_eq!(
            progress.state == StepState::Active,
            progress.in_flight().is_some(),
            "step {i}: {:?}",
            progress.state
        );
        // A step ran only after everything it needs succeeded.
        if !progress.attempts.is_empty() {
            for &need in &spec.needs {
                assert_eq!(
                    run.steps[need].state,
                    StepState::Succeeded,
                    "step {i} ran before {need}"
                );
            }
        }
        check_retry_decisions(
            spec,
            progress,
            settings.infra_retries,
            run.header.cancel.is_some(),
        );
        if progress.state == StepState::Skipped {
            assert!(
                spec.needs
                    .iter()
                    .any(|&n| !matches!(run.steps[n].state, StepState::Succeeded))
            );
        }
    }
    // §6, checked by a model independent of the engine's code.
    let all_terminal = run.steps.iter().all(|s| s.state.is_terminal());
    assert_eq!(
        run.header.state.is_terminal(),
        all_terminal,
        "run {:?}",
        run.header.state
    );
    if all_terminal {
        let has = |name: &str| run.steps.iter().any(|s| s.state.as_str() == name);
        let expected = if has("dead_lettered") {
            RunState::DeadLettered
        } else if has("failed") {
            RunState::Failed
        } else if run.header.cancel.is_some() && (has("cancelled") || has("skipped")) {
            RunState::Cancelled
        } else {
            RunState::Succeeded
        };
        assert_eq!(run.header.state, expected);
    }
}

/// The retry table (docs/failure-classes.md), written out again independently of `retry.rs`.
fn model_budget(class: FailureClass, policy: Option<&RetryPolicy>, infra_retries: u32) -> u32 {
    let max = policy.map_or(0, |p| p.max);
    let on = policy.map(|p| p.on).unwrap_or_default();
    match class {
        FailureClass::InfraNeverStarted => max.max(infra_retries),
        FailureClass::Config => 0,
        FailureClass::InfraPostStart if on.infra => max,
        FailureClass::Step if on.step => max,
        FailureClass::Timeout if on.timeout => max,
        FailureClass::Lost if on.lost => max,
        _ => 0,
    }
}

/// Every failed attempt followed by another was retryable; a step that stopped on a
/// failure had used up that failure's budget (unless a cancel stopped it).
fn check_retry_decisions(spec: &Step, progress: &RunStep, infra_retries: u32, cancelled: bool) {
    let policy = spec.retry.as_ref();
    for (i, attempt) in progress.attempts.iter().enumerate() {
        let Some(class) = attempt.class() else {
            continue;
        };
        let retries_used = i as u32;
        let budget = model_budget(class, policy, infra_retries);
        if i + 1 < progress.attempts.len() {
            assert!(
                retries_used < budget,
                "attempt {} ({class}) was retried past its budget {budget}",
                i + 1
            );
        } else if progress.state.is_terminal() && !cancelled {
            assert!(
                retries_used >= budget,
                "attempt {} ({class}) gave up with budget {budget} left",
                i + 1
            );
            let dead = matches!(
                class,
                FailureClass::InfraNeverStarted | FailureClass::InfraPostStart | FailureClass::Lost
            );
            assert_eq!(
                progress.state.as_str(),
                if dead { "dead_lettered" } else { "failed" }
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_every_invariant_and_terminate(
        pipeline in pipeline_strategy(),
        actions in proptest::collection::vec(action_strategy(), 0..120),
    ) {
        let engine = Engine::new(EngineSettings::default());
        let mut fences = FenceCounter::starting_at(1);
        let (run, effects) = engine.submit(RunId(1), Arc::new(pipeline), "local".into(), crate::engine::RunAdmission::default(), &mut fences, &mut crate::engine::Unlimited, Timestamp(0));
        let mut sim = Sim { engine, fences, run, now: Timestamp(0), minted: Vec::new() };
        sim.collect(&effects);
        check_invariants(&sim);
        for action in &actions {
            sim.act(action);
        }
        // Liveness: confirming, finishing and firing due timers always ends the run.
        for _ in 0..1000 {
            if sim.run.header.state.is_terminal() {
                break;
            }
            for step in 0..sim.run.steps.len() {
                sim.act(&Action::Confirm(step));
                sim.act(&Action::Finish(step, 0));
                sim.act(&Action::FireRetry(step));
            }
        }
        prop_assert!(sim.run.header.state.is_terminal(), "run never ended: {:?}", sim.run.header.state);
    }
}

//! Table-driven engine tests on a virtual clock.

use std::sync::Arc;
use std::time::Duration;

use super::retry::{self, Decision};
use super::*;
use crate::pipeline::{Backoff, LocalCommand, Pipeline, RetryOn, RetryPolicy, Step, StepAction};

const T0: Timestamp = Timestamp(1_000_000);

fn step(name: &str, needs: &[usize], retry: Option<RetryPolicy>) -> Step {
    Step {
        slots: 1,
        locks: Vec::new(),
        name: name.to_string(),
        needs: needs.to_vec(),
        timeout: Some(Duration::from_secs(60)),
        retry,
        action: StepAction::Local(LocalCommand {
            argv: vec!["true".into()],
            env: vec![],
            secrets: vec![],
            workdir: None,
        }),
    }
}

fn policy(on: RetryOn, max: u32) -> RetryPolicy {
    RetryPolicy {
        on,
        max,
        backoff: Backoff {
            initial: Duration::from_millis(100),
            factor: 2.0,
            max: Duration::from_secs(1),
        },
    }
}

fn verdict(outcome: Outcome) -> Verdict {
    Verdict {
        started: !matches!(
            outcome,
            Outcome::Failed(FailureClass::InfraNeverStarted | FailureClass::Config)
        ),
        reason: format!("{outcome:?}"),
        exit_code: None,
        started_at: None,
        finished_at: T0,
        outcome,
    }
}

struct Sim {
    engine: Engine,
    fences: FenceCounter,
    run: Run,
    now: Timestamp,
    intents: Vec<Intent>,
}

impl Sim {
    fn new(steps: Vec<Step>) -> Sim {
        let engine = Engine::new(EngineSettings::default());
        let mut fences = FenceCounter::starting_at(41);
        let pipeline = Arc::new(Pipeline {
            params: Vec::new(),
            priority: 0,
            parallelism: None,
            concurrency: None,
            budget: None,
            name: "p".into(),
            steps,
        });
        let (run, effects) = engine.submit(
            RunId(7),
            pipeline,
            "local".into(),
            crate::engine::RunAdmission::default(),
            &mut fences,
            &mut crate::engine::Unlimited,
            T0,
        );
        Sim {
            engine,
            fences,
            run,
            now: T0,
            intents: effects.intents,
        }
    }

    fn input(&mut self, input: Input) -> Effects {
        let effects = self.try_input(input).expect("input accepted");
        self.intents.extend(effects.intents.clone());
        effects
    }

    /// The engine's answer to `input`, accepted or not.
    fn try_input(&mut self, input: Input) -> Result<Effects, RejectedInput> {
        self.engine.handle(
            &mut self.run,
            &mut self.fences,
            &mut crate::engine::Unlimited,
            input,
            self.now,
        )
    }

    fn current_fence(&self, step: usize) -> Fence {
        self.run.steps[step]
            .attempts
            .last()
            .expect("an attempt")
            .fence
    }

    /// Confirms the launch of `step`'s current attempt and finishes it with `outcome`.
    fn finish(&mut self, step: usize, outcome: Outcome) -> Effects {
        let fence = self.current_fence(step);
        self.input(Input::LaunchConfirmed { step, fence });
        self.input(Input::Verdict {
            step,
            fence,
            verdict: verdict(outcome),
        })
    }

    /// Fires the retry timer of `step` if one is pending; true if it was.
    fn fire_retry(&mut self, step: usize) -> bool {
        let StepState::RetryWaiting { due } = self.run.steps[step].state else {
            return false;
        };
        self.now = due;
        self.input(Input::TimerFired(Timer::RetryDue { step }));
        true
    }
}

fn on(names: &[&str]) -> RetryOn {
    let mut on = RetryOn::default();
    for name in names {
        match *name {
            "failure" => on = RetryOn::FAILURE,
            "step" => on.step = true,
            "timeout" => on.timeout = true,
            "infra" => on.infra = true,
            "lost" => on.lost = true,
            other => panic!("unknown retry.on {other}"),
        }
    }
    on
}

/// Every class × `retry.on` × budget: the number of attempts made when every attempt
/// fails with that class, and the resulting step and run state.
#[test]
fn retry_table_every_class_on_and_budget() {
    use FailureClass::*;
    // (class, retry.on, retry.max or None, expected attempts, expected terminal state)
    type Case = (
        FailureClass,
        &'static [&'static str],
        Option<u32>,
        u32,
        &'static str,
    );
    let cases: &[Case] = &[
        // Never started: retried up to max(retry.max, infra_retries = 3), whatever `on`.
        (InfraNeverStarted, &[], None, 4, "dead_lettered"),
        (InfraNeverStarted, &["step"], Some(1), 4, "dead_lettered"),
        (InfraNeverStarted, &["step"], Some(5), 6, "dead_lettered"),
        (InfraNeverStarted, &["failure"], Some(0), 4, "dead_lettered"),
        // Config: never retried.
        (Config, &[], None, 1, "failed"),
        (Config, &["failure"], Some(5), 1, "failed"),
        // Post-start infra: only with `infra` (or `failure`).
        (InfraPostStart, &[], None, 1, "dead_lettered"),
        (InfraPostStart, &["step"], Some(2), 1, "dead_lettered"),
        (InfraPostStart, &["infra"], Some(2), 3, "dead_lettered"),
        (InfraPostStart, &["failure"], Some(1), 2, "dead_lettered"),
        (InfraPostStart, &["infra"], Some(0), 1, "dead_lettered"),
        // Step: only with `step`.
        (Step, &[], None, 1, "failed"),
        (Step, &["timeout"], Some(2), 1, "failed"),
        (Step, &["step"], Some(2), 3, "failed"),
        (Step, &["failure"], Some(3), 4, "failed"),
        (Step, &["step", "lost"], Some(0), 1, "failed"),
        // Timeout: only with `timeout`.
        (Timeout, &[], None, 1, "failed"),
        (Timeout, &["step"], Some(2), 1, "failed"),
        (Timeout, &["timeout"], Some(2), 3, "failed"),
        (Timeout, &["failure"], Some(1), 2, "failed"),
        // Lost: only with `lost`.
        (Lost, &[], None, 1, "dead_lettered"),
        (Lost, &["infra"], Some(2), 1, "dead_lettered"),
        (Lost, &["lost"], Some(2), 3, "dead_lettered"),
        (Lost, &["failure"], Some(20), 21, "dead_lettered"),
    ];
    for &(class, on_names, max, expected_attempts, expected_state) in cases {
        let retry = max.map(|m| policy(on(on_names), m));
        let mut sim = Sim::new(vec![step("s", &[], retry)]);
        let mut attempts = 0;
        loop {
            attempts += 1;
            sim.finish(0, Outcome::Failed(class));
            if !sim.fire_retry(0) {
                break;
            }
        }
        let case = format!("{class} on={on_names:?} max={max:?}");
        assert_eq!(attempts, expected_attempts, "{case}: attempts");
        assert_eq!(
            sim.run.steps[0].attempts.len() as u32,
            expected_attempts,
            "{case}"
        );
        assert_eq!(
            sim.run.steps[0].state.as_str(),
            expected_state,
            "{case}: step state"
        );
        assert_eq!(
            sim.run.header.state.as_str(),
            expected_state,
            "{case}: run state"
        );
        let fences: Vec<u64> = sim.run.steps[0]
            .attempts
            .iter()
            .map(|a| a.fence.0)
            .collect();
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "{case}: fences {fences:?}"
        );
        let numbers: Vec<u32> = sim.run.steps[0].attempts.iter().map(|a| a.number).collect();
        assert_eq!(
            numbers,
            (1..=expected_attempts).collect::<Vec<_>>(),
            "{case}"
        );
    }
}

#[test]
fn terminal_reasons_follow_the_table() {
    use FailureClass::*;
    let table = [
        (InfraNeverStarted, "dead", "InfraRetriesExhausted"),
        (Config, "failed", "ConfigError"),
        (InfraPostStart, "dead", "InfraPostStart"),
        (Step, "failed", "StepFailed"),
        (Timeout, "failed", "TimedOut"),
        (Lost, "dead", "Lost"),
    ];
    for (class, kind, reason) in table {
        let expected = if kind == "dead" {
            Decision::DeadLettered { reason }
        } else {
            Decision::Failed { reason }
        };
        assert_eq!(retry::terminal(class), expected, "{class}");
    }
}

#[test]
fn budget_is_shared_across_classes() {
    // A step retried on `step` with max 2 whose failures alternate with never-started
    // ones: every retry consumes the same attempt counter.
    let mut sim = Sim::new(vec![step("s", &[], Some(policy(on(&["step"]), 2)))]);
    sim.finish(0, Outcome::Failed(FailureClass::InfraNeverStarted));
    assert!(sim.fire_retry(0));
    sim.finish(0, Outcome::Failed(FailureClass::Step));
    assert!(sim.fire_retry(0));
    sim.finish(0, Outcome::Failed(FailureClass::Step));
    // Three attempts used: `step` allows 2 retries, so no more.
    assert!(!sim.fire_retry(0));
    assert_eq!(sim.run.header.state, RunState::Failed);
    assert_eq!(sim.run.steps[0].attempts.len(), 3);
}

#[test]
fn success_after_retries_and_dag_order() {
    let mut sim = Sim::new(vec![
        step("a", &[], Some(policy(on(&["step"]), 2))),
        step("b", &[0], None),
        step("c", &[0], None),
        step("d", &[1, 2], None),
    ]);
    assert_eq!(sim.run.header.state, RunState::Queued);
    assert_eq!(launches(&sim.intents), vec![0]);
    sim.finish(0, Outcome::Failed(FailureClass::Step));
    assert!(sim.fire_retry(0));
    sim.finish(0, Outcome::Succeeded);
    assert_eq!(sim.run.header.state, RunState::Running);
    assert_eq!(launches(&sim.intents), vec![0, 0, 1, 2]);
    sim.finish(1, Outcome::Succeeded);
    assert_eq!(launches(&sim.intents).len(), 4, "d waits for c");
    sim.finish(2, Outcome::Succeeded);
    sim.finish(3, Outcome::Succeeded);
    assert_eq!(sim.run.header.state, RunState::Succeeded);
    assert_eq!(classify_run(&sim.run), None);
}

#[test]
fn dependents_of_a_failed_step_are_skipped_and_independent_ones_finish() {
    let mut sim = Sim::new(vec![
        step("a", &[], None),
        step("b", &[0], None),
        step("c", &[], None),
        step("d", &[1], None),
    ]);
    sim.finish(0, Outcome::Failed(FailureClass::Step));
    assert_eq!(sim.run.steps[1].state, StepState::Skipped);
    assert_eq!(sim.run.steps[3].state, StepState::Skipped);
    assert_eq!(sim.run.header.state, RunState::Running, "c still runs");
    sim.finish(2, Outcome::Succeeded);
    assert_eq!(sim.run.header.state, RunState::Failed);
    let classification = classify_run(&sim.run).expect("classified");
    assert_eq!(classification.category, "step");
    assert_eq!(classification.step.as_deref(), Some("a"));
}

#[test]
fn dead_lettered_beats_failed() {
    let mut sim = Sim::new(vec![step("a", &[], None), step("b", &[], None)]);
    sim.finish(0, Outcome::Failed(FailureClass::Step));
    sim.finish(1, Outcome::Failed(FailureClass::InfraPostStart));
    assert_eq!(sim.run.header.state, RunState::DeadLettered);
    let classification = classify_run(&sim.run).expect("classified");
    assert_eq!(classification.category, "infra_post_start");
    assert!(!classification.auto_retryable);
}

#[test]
fn never_started_exhaustion_is_auto_retryable_for_local_origin() {
    let mut sim = Sim::new(vec![step("a", &[], None)]);
    loop {
        sim.finish(0, Outcome::Failed(FailureClass::InfraNeverStarted));
        if !sim.fire_retry(0) {
            break;
        }
    }
    let classification = classify_run(&sim.run).expect("classified");
    assert_eq!(classification.category, "infra_never_started");
    assert!(classification.auto_retryable);
}

#[test]
fn backstop_kills_a_running_attempt_once_and_stale_timers_do_nothing() {
    let mut sim = Sim::new(vec![step("a", &[], None)]);
    let fence = sim.current_fence(0);
    let effects = sim.input(Input::LaunchConfirmed { step: 0, fence });
    let due = match effects.intents.as_slice() {
        [Intent::ScheduleTimer { due, timer }] => {
            assert_eq!(*timer, Timer::Backstop { step: 0, fence });
            *due
        }
        other => panic!("expected one backstop timer, got {other:?}"),
    };
    assert_eq!(
        due,
        T0.plus(Duration::from_secs(60) + crate::limits::BACKSTOP_SLACK)
    );
    sim.now = due;
    let effects = sim.input(Input::TimerFired(Timer::Backstop { step: 0, fence }));
    let second = due.plus(crate::limits::BACKSTOP_SLACK);
    assert_eq!(
        effects.intents,
        vec![
            Intent::Kill {
                step: 0,
                fence,
                reason: KillReason::Timeout
            },
            Intent::ScheduleTimer {
                due: second,
                timer: Timer::Backstop { step: 0, fence }
            }
        ]
    );
    let verdict_effects = sim.input(Input::Verdict {
        step: 0,
        fence,
        verdict: verdict(Outcome::Failed(FailureClass::Timeout)),
    });
    assert!(
        verdict_effects.intents.contains(&Intent::CancelTimer {
            due: second,
            timer: Timer::Backstop { step: 0, fence }
        }),
        "the verdict cancels the second backstop"
    );
    assert_eq!(
        sim.run.steps[0].state,
        StepState::Failed {
            reason: "TimedOut".into()
        }
    );
    let stale = sim.input(Input::TimerFired(Timer::Backstop { step: 0, fence }));
    assert!(stale.intents.is_empty() && stale.events.is_empty());
}

#[test]
fn a_backstop_kill_without_a_verdict_concludes_lost_so_the_run_never_hangs() {
    let mut sim = Sim::new(vec![step("a", &[], None)]);
    let fence = sim.current_fence(0);
    sim.input(Input::LaunchConfirmed { step: 0, fence });
    sim.now = T0.plus(Duration::from_secs(3600));
    let first = sim.input(Input::TimerFired(Timer::Backstop { step: 0, fence }));
    let second_due = first
        .intents
        .iter()
        .find_map(|i| match i {
            Intent::ScheduleTimer {
                due,
                timer: Timer::Backstop { .. },
            } => Some(*due),
            _ => None,
        })
        .expect("a second backstop is scheduled");
    assert_eq!(second_due, sim.now.plus(crate::limits::BACKSTOP_SLACK));
    sim.now = second_due;
    let second = sim.input(Input::TimerFired(Timer::Backstop { step: 0, fence }));
    assert!(
        second
            .intents
            .iter()
            .all(|i| !matches!(i, Intent::Kill { .. }))
    );
    assert_eq!(
        sim.run.steps[0].attempts[0].class(),
        Some(FailureClass::Lost)
    );
    assert_eq!(sim.run.header.state, RunState::DeadLettered);
    // The executor's late verdict changes nothing.
    let late = sim.input(Input::Verdict {
        step: 0,
        fence,
        verdict: verdict(Outcome::Failed(FailureClass::Timeout)),
    });
    assert!(late.events.is_empty());
}

#[test]
fn verdict_cancels_the_backstop_and_duplicates_are_ignored() {
    let mut sim = Sim::new(vec![step("a", &[], None)]);
    let effects = sim.finish(0, Outcome::Succeeded);
    assert!(effects.intents.iter().any(|i| matches!(
        i,
        Intent::CancelTimer {
            timer: Timer::Backstop { .. },
            ..
        }
    )));
    let fence = sim.current_fence(0);
    let duplicate = sim.input(Input::Verdict {
        step: 0,
        fence,
        verdict: verdict(Outcome::Failed(FailureClass::Step)),
    });
    assert!(duplicate.events.is_empty());
    assert_eq!(sim.run.header.state, RunState::Succeeded);
}

#[test]
fn no_overlapping_attempts_retry_waits_for_the_verdict_and_the_timer() {
    let mut sim = Sim::new(vec![step("a", &[], Some(policy(RetryOn::FAILURE, 3)))]);
    let first = sim.current_fence(0);
    sim.input(Input::LaunchConfirmed {
        step: 0,
        fence: first,
    });
    sim.now = T0.plus(Duration::from_secs(3600));
    sim.input(Input::TimerFired(Timer::Backstop {
        step: 0,
        fence: first,
    }));
    // Killed but no verdict yet: no second attempt may exist.
    assert_eq!(sim.run.steps[0].attempts.len(), 1);
    sim.input(Input::Verdict {
        step: 0,
        fence: first,
        verdict: verdict(Outcome::Failed(FailureClass::Timeout)),
    });
    assert_eq!(
        sim.run.steps[0].attempts.len(),
        1,
        "the retry waits for its backoff"
    );
    assert!(sim.fire_retry(0));
    assert_eq!(sim.run.steps[0].attempts.len(), 2);
    assert!(sim.current_fence(0) > first);
}

#[test]
fn cancel_kills_in_flight_cancels_pending_and_ends_cancelled() {
    let mut sim = Sim::new(vec![step("a", &[], None), step("b", &[0], None)]);
    let fence = sim.current_fence(0);
    sim.input(Input::LaunchConfirmed { step: 0, fence });
    let effects = sim.input(Input::Cancel {
        by: "alice".into(),
        reason: None,
    });
    assert!(effects.intents.contains(&Intent::Kill {
        step: 0,
        fence,
        reason: KillReason::Cancel
    }));
    assert_eq!(sim.run.steps[1].state, StepState::Cancelled);
    assert_eq!(
        sim.run.header.state,
        RunState::Running,
        "until the kill is confirmed"
    );
    sim.input(Input::Verdict {
        step: 0,
        fence,
        verdict: verdict(Outcome::Stopped),
    });
    assert_eq!(sim.run.header.state, RunState::Cancelled);
    assert_eq!(
        classify_run(&sim.run).expect("classified").category,
        "cancelled"
    );
    let rejected = sim.engine.handle(
        &mut sim.run,
        &mut sim.fences,
        &mut crate::engine::Unlimited,
        Input::Cancel {
            by: "bob".into(),
            reason: None,
        },
        sim.now,
    );
    assert_eq!(rejected, Err(RejectedInput::RunTerminal("cancelled")));
}

#[test]
fn cancel_during_backoff_stops_the_retry() {
    let mut sim = Sim::new(vec![step("a", &[], Some(policy(on(&["step"]), 3)))]);
    sim.finish(0, Outcome::Failed(FailureClass::Step));
    sim.input(Input::Cancel {
        by: "alice".into(),
        reason: None,
    });
    assert_eq!(sim.run.header.state, RunState::Cancelled);
    sim.input(Input::TimerFired(Timer::RetryDue { step: 0 }));
    assert_eq!(sim.run.steps[0].attempts.len(), 1);
}

#[test]
fn backoff_grows_caps_and_jitters_deterministically() {
    let backoff = Backoff {
        initial: Duration::from_secs(10),
        factor: 2.0,
        max: Duration::from_secs(600),
    };
    for retry_number in 1..=12u32 {
        let delay = retry::backoff_delay(&backoff, retry_number, 1, RunId(9), 0);
        let exponent = i32::try_from(retry_number - 1).expect("small");
        let nominal = (10.0 * 2f64.powi(exponent)).min(600.0);
        let seconds = delay.as_secs_f64();
        assert!(
            seconds >= nominal / 2.0 - 1e-9 && seconds <= nominal + 1e-9,
            "{retry_number}: {seconds}"
        );
        assert_eq!(
            delay,
            retry::backoff_delay(&backoff, retry_number, 1, RunId(9), 0)
        );
    }
    let a = retry::backoff_delay(&backoff, 3, 1, RunId(9), 0);
    let b = retry::backoff_delay(&backoff, 3, 2, RunId(9), 0);
    assert_ne!(a, b, "the seed changes the jitter");
}

#[test]
fn fences_strictly_increase_across_runs_and_raise_above_seen() {
    let mut fences = FenceCounter::starting_at(0);
    assert_eq!(fences.mint(), Ok(Fence(1)));
    assert!(fences.raise_above(Fence(100)));
    assert_eq!(fences.mint(), Ok(Fence(101)));
    assert!(fences.raise_above(Fence(5)));
    assert_eq!(fences.mint(), Ok(Fence(102)));
}

#[test]
fn implausible_fences_never_raise_the_counter() {
    let mut fences = FenceCounter::starting_at(10);
    for implausible in [
        Fence(0),
        Fence(u64::MAX),
        Fence(crate::limits::FENCE_MAX),
        Fence(10 + crate::limits::FENCE_LEAD_MAX),
    ] {
        assert!(!fences.raise_above(implausible), "{implausible}");
        assert_eq!(fences.next_value(), 10);
    }
    // Somewhat ahead (a newer lineage after a restore) is plausible.
    assert!(fences.raise_above(Fence(10 + crate::limits::FENCE_LEAD_MAX - 1)));
}

#[test]
fn minting_past_the_last_fence_is_an_error_not_a_panic() {
    let mut fences = FenceCounter::starting_at(crate::limits::FENCE_MAX - 1);
    assert_eq!(fences.mint(), Ok(Fence(crate::limits::FENCE_MAX - 1)));
    assert!(fences.mint().is_err());
    assert!(fences.mint().is_err());
}

fn launches(intents: &[Intent]) -> Vec<usize> {
    intents
        .iter()
        .filter_map(|i| match i {
            Intent::Launch(order) => Some(order.step),
            _ => None,
        })
        .collect()
}

#[test]
fn an_undeliverable_launch_dead_letters_and_a_requeue_relaunches_the_same_attempt() {
    let mut sim = Sim::new(vec![step("a", &[], None), step("b", &[0], None)]);
    let fence = sim.current_fence(0);
    sim.input(Input::Undeliverable {
        step: 0,
        fence,
        launch: true,
        reason: Undelivered::ExecutorUnavailable,
        detail: "launch dead-lettered".into(),
    });
    assert_eq!(sim.run.header.state, RunState::DeadLettered);
    assert_eq!(sim.run.steps[1].state, StepState::Skipped);
    let classification = classify_run(&sim.run).expect("classified");
    assert_eq!(classification.category, "executor_unavailable");
    assert!(
        !classification.auto_retryable,
        "an unavailable executor is never auto-retried"
    );
    assert_eq!(
        sim.engine.handle(
            &mut sim.run,
            &mut sim.fences,
            &mut crate::engine::Unlimited,
            Input::Requeue {
                step: 0,
                fence: Fence(999)
            },
            sim.now
        ),
        Err(RejectedInput::NotRequeueable),
        "only the dead-lettered attempt's own fence"
    );
    let before = sim.fences.next_value();
    sim.input(Input::Requeue { step: 0, fence });
    assert_eq!(sim.run.header.state, RunState::Queued);
    assert_eq!(sim.run.steps[0].attempts.len(), 1, "the same attempt");
    assert_eq!(sim.run.steps[0].attempts[0].state, AttemptState::Launching);
    assert_eq!(sim.fences.next_value(), before, "no fence minted");
    assert_eq!(
        sim.run.steps[1].state,
        StepState::Pending,
        "its dependents may run again"
    );
    sim.finish(0, Outcome::Succeeded);
    sim.finish(1, Outcome::Succeeded);
    assert_eq!(sim.run.header.state, RunState::Succeeded);
}

#[test]
fn a_failed_step_cannot_be_requeued() {
    let mut sim = Sim::new(vec![step("a", &[], None)]);
    let fence = sim.current_fence(0);
    sim.finish(0, Outcome::Failed(FailureClass::Step));
    let rejected = sim.engine.handle(
        &mut sim.run,
        &mut sim.fences,
        &mut crate::engine::Unlimited,
        Input::Requeue { step: 0, fence },
        sim.now,
    );
    assert_eq!(rejected, Err(RejectedInput::NotRequeueable));
    assert_eq!(sim.run.header.state, RunState::Failed);
}

#[test]
fn a_run_known_only_by_its_header_is_quarantined_and_discarded_by_the_engine() {
    let engine = Engine::new(EngineSettings::default());
    let retention = engine.settings().log_retention;
    let mut header = RunHeader {
        id: RunId(1),
        pipeline_name: "p".into(),
        origin: "local".into(),
        state: RunState::DeadLettered,
        created_at: T0,
        updated_at: T0,
        cancel: None,
        budget: None,
        auto_retry: AutoRetryState::default(),
        admission: Default::default(),
    };
    let now = T0.plus(Duration::from_secs(5));
    let quarantine = || Input::Quarantine {
        reason: "gone".into(),
    };
    let effects = engine
        .handle_header(&mut header, quarantine(), now)
        .expect("quarantined");
    assert_eq!(header.state, RunState::Quarantined);
    assert_eq!(header.updated_at, now);
    assert_eq!(header.auto_retry.quarantined.as_deref(), Some("gone"));
    assert!(effects.events.contains(&Event::RunState {
        from: RunState::DeadLettered,
        to: RunState::Quarantined
    }));
    assert_eq!(
        effects.intents,
        vec![Intent::ScheduleTimer {
            due: now.plus(retention),
            timer: Timer::Retention
        }],
        "every arrival in a terminal state starts the retention clock"
    );

    let before = header.clone();
    assert!(
        engine
            .handle_header(&mut header, quarantine(), now)
            .is_err()
    );
    assert!(matches!(
        engine.handle_header(
            &mut header,
            Input::Cancel {
                by: "x".into(),
                reason: None
            },
            now
        ),
        Err(RejectedInput::NeedsPipeline)
    ));
    assert_eq!(header, before, "refusals change nothing");

    let later = now.plus(Duration::from_secs(5));
    let discard = Input::Discard {
        by: "ops".into(),
        reason: "obsolete".into(),
    };
    engine
        .handle_header(&mut header, discard, later)
        .expect("discarded");
    assert_eq!(header.state, RunState::DeadLettered);
    assert!(header.auto_retry.discarded.is_some());
    assert_eq!(header.auto_retry.eligible_at, None);
}

#[test]
fn a_run_id_has_one_spelling() {
    let id: RunId = "r01m8y57tfmvwmvb565r30rzdve".parse().expect("canonical");
    assert_eq!(id.to_string(), "r01m8y57tfmvwmvb565r30rzdve");
    for other in [
        "r01M8Y57TFMVWMVB565R30RZDVE",
        "R01m8y57tfmvwmvb565r30rzdve",
        "01m8y57tfmvwmvb565r30rzdve",
        "r01m8y57tfmvwmvb565r30rzdv",
        "r01m8y57tfmvwmvb565r30rzdvex",
    ] {
        assert!(other.parse::<RunId>().is_err(), "{other}");
    }
}

/// A four-step chain a → b → c → d failed at c: a retry starts c and d over with new,
/// higher fences, a and b keep their one attempt; `from: b` also re-runs b; a run in
/// progress, and a succeeded run without `from`, are refused with nothing changed.
#[test]
fn a_retry_starts_over_what_did_not_succeed_and_from_a_step_what_follows_it() {
    let chain = || {
        vec![
            step("a", &[], None),
            step("b", &[0], None),
            step("c", &[1], None),
            step("d", &[2], None),
        ]
    };
    let mut sim = Sim::new(chain());
    let refused = sim.try_input(Input::Retry {
        by: "op".into(),
        from: None,
    });
    assert!(
        matches!(refused, Err(RejectedInput::NothingToRetry(ref m)) if m.contains("queued")),
        "{refused:?}"
    );
    sim.finish(0, Outcome::Succeeded);
    sim.finish(1, Outcome::Succeeded);
    let failed_fence = sim.current_fence(2);
    sim.finish(2, Outcome::Failed(FailureClass::Step));
    assert_eq!(sim.run.header.state, RunState::Failed);
    assert_eq!(sim.run.steps[3].state, StepState::Skipped);
    assert_eq!(retry_plan(&sim.run, None), vec![2, 3]);
    assert_eq!(retry_plan(&sim.run, Some(1)), vec![1, 2, 3]);

    let effects = sim.input(Input::Retry {
        by: "op".into(),
        from: None,
    });
    assert!(effects.events.iter().any(|e| matches!(
        e,
        Event::Retried { from: None, steps, .. } if *steps == vec![2, 3]
    )));
    assert_eq!(sim.run.header.state, RunState::Queued);
    assert_eq!(sim.run.steps[0].attempts.len(), 1);
    assert_eq!(sim.run.steps[1].attempts.len(), 1);
    assert_eq!(
        sim.run.steps[2].try_start, 1,
        "the failed attempt is an earlier one"
    );
    assert!(sim.current_fence(2) > failed_fence, "a new, higher fence");
    assert!(sim.run.steps[3].current_try().is_empty(), "d waits for c");
    sim.finish(2, Outcome::Succeeded);
    sim.finish(3, Outcome::Succeeded);
    assert_eq!(sim.run.header.state, RunState::Succeeded);
    assert_eq!(sim.run.steps[2].attempts.len(), 2);

    // A succeeded run: nothing to retry unless a step is named.
    let refused = sim.try_input(Input::Retry {
        by: "op".into(),
        from: None,
    });
    assert!(
        matches!(refused, Err(RejectedInput::NothingToRetry(_))),
        "{refused:?}"
    );
    assert_eq!(sim.run.header.state, RunState::Succeeded, "nothing changed");
    let before = sim.current_fence(3);
    sim.input(Input::Retry {
        by: "op".into(),
        from: Some(1),
    });
    assert_eq!(sim.run.steps[0].attempts.len(), 1, "a is upstream: kept");
    assert_eq!(sim.run.steps[1].try_start, 1);
    assert!(sim.current_fence(1) > before);
    for step in 1..4 {
        sim.finish(step, Outcome::Succeeded);
    }
    assert_eq!(sim.run.header.state, RunState::Succeeded);
    assert_eq!(
        sim.run
            .steps
            .iter()
            .map(|s| s.attempts.len())
            .collect::<Vec<_>>(),
        vec![1, 2, 3, 2]
    );
}

/// A cancelled run retried: the cancel request is cleared, so the new try runs.
#[test]
fn a_retried_cancelled_run_runs_again() {
    let mut sim = Sim::new(vec![step("a", &[], None), step("b", &[0], None)]);
    sim.finish(0, Outcome::Succeeded);
    sim.input(Input::Cancel {
        by: "op".into(),
        reason: None,
    });
    let fence = sim.current_fence(1);
    sim.input(Input::Verdict {
        step: 1,
        fence,
        verdict: verdict(Outcome::Stopped),
    });
    assert_eq!(
        sim.run.header.state,
        RunState::Cancelled,
        "{:?}",
        sim.run.steps
    );
    sim.input(Input::Retry {
        by: "op".into(),
        from: None,
    });
    assert!(sim.run.header.cancel.is_none());
    assert_eq!(sim.run.steps[0].attempts.len(), 1);
    sim.finish(1, Outcome::Succeeded);
    assert_eq!(sim.run.header.state, RunState::Succeeded);
}

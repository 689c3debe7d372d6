//! The auto-retry sweep's decisions (docs/auto-retry.md): which dead-lettered runs may be
//! resubmitted, when, and when a run is set aside (quarantined) instead. Pure: the
//! service's sweep reads candidates through an index and applies these decisions inside
//! one write transaction each.

use std::time::Duration;

use super::ids::Timestamp;
use super::run_failure::classify_run;
use super::state::{Run, RunState};

/// The sweep's settings. Defaults are docs/auto-retry.md's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AutoRetrySettings {
    /// Off by default: a pass then returns at once and nothing changes.
    pub enabled: bool,
    pub interval: Duration,
    /// Index rows one pass reads at most.
    pub scan_limit: usize,
    /// Runs one pass resubmits at most.
    pub sweep_limit: usize,
    /// Only runs dead-lettered within this window are considered.
    pub window: Duration,
    /// Resubmissions per run before it is quarantined.
    pub max: u32,
    /// Backoff before a run is eligible again after its first resubmit; doubles after each.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl Default for AutoRetrySettings {
    fn default() -> Self {
        AutoRetrySettings {
            enabled: false,
            interval: Duration::from_secs(180),
            scan_limit: 200,
            sweep_limit: 5,
            window: Duration::from_secs(24 * 3600),
            max: 2,
            backoff_initial: Duration::from_secs(120),
            backoff_max: Duration::from_secs(1800),
        }
    }
}

impl AutoRetrySettings {
    /// The wait after the `attempt`-th resubmit (1-based): `initial × 2^(attempt−1)`,
    /// capped at `backoff_max`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        self.backoff_initial
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.backoff_max)
    }
}

/// What the sweep does with one candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Eligibility {
    Resubmit,
    /// Its budget of resubmits is spent: set it aside for an operator.
    Quarantine(String),
    /// Nothing now; the reason is counted in the sweep's metrics.
    Skip(SkipReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// No longer dead-lettered (requeued, resubmitted or discarded meanwhile).
    NotDeadLettered,
    /// Its failure is not never-started infra of a local run.
    NotRetryable,
    /// Dead-lettered longer ago than the window.
    OutsideWindow,
    /// Its backoff has not elapsed.
    Backoff,
    /// An operator discarded it.
    Discarded,
    /// The pass already resubmitted `sweep_limit` runs.
    SweepLimit,
}

impl SkipReason {
    pub const ALL: [SkipReason; 6] = [
        SkipReason::NotDeadLettered,
        SkipReason::NotRetryable,
        SkipReason::OutsideWindow,
        SkipReason::Backoff,
        SkipReason::Discarded,
        SkipReason::SweepLimit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::NotDeadLettered => "not_dead_lettered",
            SkipReason::NotRetryable => "not_retryable",
            SkipReason::OutsideWindow => "outside_window",
            SkipReason::Backoff => "backoff",
            SkipReason::Discarded => "discarded",
            SkipReason::SweepLimit => "sweep_limit",
        }
    }
}

/// The one rule for a dead-lettered run, given `now`.
pub fn eligibility(run: &Run, settings: &AutoRetrySettings, now: Timestamp) -> Eligibility {
    let header = &run.header;
    if header.state != RunState::DeadLettered {
        return Eligibility::Skip(SkipReason::NotDeadLettered);
    }
    if header.auto_retry.discarded.is_some() {
        return Eligibility::Skip(SkipReason::Discarded);
    }
    if !classify_run(run).is_some_and(|c| c.auto_retryable) {
        return Eligibility::Skip(SkipReason::NotRetryable);
    }
    if header.updated_at.0.saturating_add(millis(settings.window)) < now.0 {
        return Eligibility::Skip(SkipReason::OutsideWindow);
    }
    if header.auto_retry.attempts >= settings.max {
        return Eligibility::Quarantine(format!(
            "auto-retry budget spent: dead-lettered again after {} resubmit(s) (max {})",
            header.auto_retry.attempts, settings.max
        ));
    }
    if header.auto_retry.next_at.is_some_and(|at| at > now) {
        return Eligibility::Skip(SkipReason::Backoff);
    }
    Eligibility::Resubmit
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::gate_tests::local;
    use crate::engine::{
        Effects, Engine, EngineSettings, FailureClass, Fence, FenceCounter, Input, Intent, Outcome,
        RunId, StepState, Undelivered, Verdict,
    };
    use crate::pipeline::{GateSpec, Pipeline, Step, StepAction};

    const T0: Timestamp = Timestamp(10_000_000);

    struct Sim {
        engine: Engine,
        fences: FenceCounter,
        run: Run,
        now: Timestamp,
        launches: Vec<(usize, u32, Fence)>,
    }

    impl Sim {
        fn new(steps: Vec<Step>, origin: &str, budget: Option<Duration>) -> Sim {
            let engine = Engine::new(EngineSettings {
                infra_retries: 1,
                ..EngineSettings::default()
            });
            let mut fences = FenceCounter::starting_at(100);
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
                RunId(3),
                pipeline,
                origin.into(),
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
                launches: Vec::new(),
            };
            sim.collect(&effects);
            sim
        }

        fn collect(&mut self, effects: &Effects) {
            for intent in &effects.intents {
                if let Intent::Launch(order) = intent {
                    self.launches.push((order.step, order.attempt, order.fence));
                }
            }
        }

        fn input(&mut self, input: Input) -> Result<(), crate::engine::RejectedInput> {
            let effects = self.engine.handle(
                &mut self.run,
                &mut self.fences,
                &mut crate::engine::Unlimited,
                input,
                self.now,
            )?;
            self.collect(&effects);
            Ok(())
        }

        fn fence(&self, step: usize) -> Fence {
            self.run.steps[step].attempts.last().expect("attempt").fence
        }

        /// Finishes the step's current attempt with `class` (never-started classes
        /// without a launch confirmation), firing retry timers until it is terminal.
        fn fail_until_terminal(&mut self, step: usize, class: FailureClass) {
            loop {
                let fence = self.fence(step);
                let started = !matches!(
                    class,
                    FailureClass::InfraNeverStarted | FailureClass::Config
                );
                if started {
                    self.input(Input::LaunchConfirmed { step, fence })
                        .expect("confirm");
                }
                let verdict = Verdict {
                    outcome: Outcome::Failed(class),
                    started,
                    reason: format!("{class:?}"),
                    exit_code: None,
                    started_at: None,
                    finished_at: self.now,
                };
                self.input(Input::Verdict {
                    step,
                    fence,
                    verdict,
                })
                .expect("verdict");
                match self.run.steps[step].state {
                    StepState::RetryWaiting { due } => {
                        self.now = due;
                        self.input(Input::TimerFired(crate::engine::Timer::RetryDue { step }))
                            .expect("timer");
                    }
                    _ => return,
                }
            }
        }
    }

    fn settings() -> AutoRetrySettings {
        AutoRetrySettings {
            enabled: true,
            ..AutoRetrySettings::default()
        }
    }

    /// A run of two steps (`b` needs `a`) whose `a` dead-lettered never-started.
    fn never_started(origin: &str) -> Sim {
        let mut sim = Sim::new(vec![local("a", &[]), local("b", &[0])], origin, None);
        sim.fail_until_terminal(0, FailureClass::InfraNeverStarted);
        assert_eq!(sim.run.header.state, RunState::DeadLettered);
        sim
    }

    #[test]
    fn only_never_started_infra_of_a_local_run_is_resubmitted() {
        use FailureClass::*;
        for class in [
            InfraNeverStarted,
            Config,
            InfraPostStart,
            Step,
            Timeout,
            Lost,
        ] {
            let mut sim = Sim::new(vec![local("a", &[])], "local", None);
            sim.fail_until_terminal(0, class);
            let expected = if class == InfraNeverStarted {
                Eligibility::Resubmit
            } else if sim.run.header.state == RunState::DeadLettered {
                Eligibility::Skip(SkipReason::NotRetryable)
            } else {
                Eligibility::Skip(SkipReason::NotDeadLettered)
            };
            assert_eq!(
                eligibility(&sim.run, &settings(), sim.now),
                expected,
                "{class:?}"
            );
        }
        // An external origin is owned by its producer.
        let sim = never_started("ci.example.org");
        assert_eq!(
            eligibility(&sim.run, &settings(), sim.now),
            Eligibility::Skip(SkipReason::NotRetryable)
        );
    }

    #[test]
    fn undelivered_gate_budget_cancelled_and_mixed_runs_are_never_resubmitted() {
        // Executor unavailable and outbox poison.
        for reason in [Undelivered::ExecutorUnavailable, Undelivered::OutboxPoison] {
            let mut sim = Sim::new(vec![local("a", &[])], "local", None);
            let fence = sim.fence(0);
            sim.input(Input::Undeliverable {
                step: 0,
                fence,
                launch: true,
                reason,
                detail: "gave up".into(),
            })
            .expect("undeliverable");
            assert_eq!(sim.run.header.state, RunState::DeadLettered);
            assert_eq!(
                eligibility(&sim.run, &settings(), sim.now),
                Eligibility::Skip(SkipReason::NotRetryable),
                "{reason:?}"
            );
        }
        // A rejected gate and a budget are `failed`, not dead-lettered.
        let gate = Step {
            slots: 1,
            locks: Vec::new(),
            action: StepAction::Gate(GateSpec::default()),
            timeout: None,
            ..local("g", &[])
        };
        let mut sim = Sim::new(vec![gate], "local", None);
        sim.input(Input::Decide {
            step: 0,
            approve: false,
            by: "x".into(),
            caller: "admin".into(),
            comment: None,
        })
        .expect("reject");
        assert_eq!(
            eligibility(&sim.run, &settings(), sim.now),
            Eligibility::Skip(SkipReason::NotDeadLettered)
        );
        let mut sim = Sim::new(vec![local("a", &[])], "local", Some(Duration::from_secs(1)));
        sim.now = T0.plus(Duration::from_secs(1));
        sim.input(Input::TimerFired(crate::engine::Timer::Budget))
            .expect("budget");
        let fence = sim.fence(0);
        sim.input(Input::Verdict {
            step: 0,
            fence,
            verdict: Verdict {
                outcome: Outcome::Stopped,
                started: false,
                reason: "stopped".into(),
                exit_code: None,
                started_at: None,
                finished_at: sim.now,
            },
        })
        .expect("verdict");
        assert_eq!(sim.run.header.state, RunState::Failed);
        assert_eq!(
            eligibility(&sim.run, &settings(), sim.now),
            Eligibility::Skip(SkipReason::NotDeadLettered)
        );
        // Dead-lettered never-started beside a failed step: a fresh try cannot succeed.
        let mut sim = Sim::new(vec![local("a", &[]), local("b", &[])], "local", None);
        sim.fail_until_terminal(0, FailureClass::InfraNeverStarted);
        sim.fail_until_terminal(1, FailureClass::Step);
        assert_eq!(sim.run.header.state, RunState::DeadLettered);
        assert_eq!(
            eligibility(&sim.run, &settings(), sim.now),
            Eligibility::Skip(SkipReason::NotRetryable)
        );
        // A cancel that dead-lettered (a kill that could not be delivered).
        let mut sim = never_started("local");
        sim.run.header.cancel = Some(crate::engine::CancelRequest {
            reason: None,
            by: "x".into(),
            at: T0,
        });
        assert_eq!(
            eligibility(&sim.run, &settings(), sim.now),
            Eligibility::Skip(SkipReason::NotRetryable)
        );
    }

    #[test]
    fn the_window_edge_is_inclusive() {
        let sim = never_started("local");
        let window = settings().window;
        let edge = sim.run.header.updated_at.plus(window);
        assert_eq!(
            eligibility(&sim.run, &settings(), edge),
            Eligibility::Resubmit
        );
        assert_eq!(
            eligibility(&sim.run, &settings(), Timestamp(edge.0 + 1)),
            Eligibility::Skip(SkipReason::OutsideWindow)
        );
    }

    #[test]
    fn backoff_doubles_from_initial_and_caps() {
        let s = AutoRetrySettings::default();
        let minutes: Vec<u64> = (1..=7).map(|n| s.backoff(n).as_secs() / 60).collect();
        assert_eq!(minutes, vec![2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(s.backoff(u32::MAX), Duration::from_secs(1800));
    }

    #[test]
    fn resubmit_starts_a_fresh_try_with_new_fences_then_max_quarantines() {
        let settings = settings();
        let mut sim = never_started("local");
        let old_fences: Vec<Fence> = sim.run.steps[0].attempts.iter().map(|a| a.fence).collect();
        assert_eq!(old_fences.len(), 2, "1 + infra_retries attempts");
        let launches_before = sim.launches.len();
        let next_at = sim.now.plus(settings.backoff(1));
        sim.input(Input::Resubmit {
            by: "auto-retry".into(),
            next_at,
        })
        .expect("resubmit");
        assert_eq!(sim.run.header.state, RunState::Queued);
        assert_eq!(sim.run.header.auto_retry.attempts, 1);
        assert_eq!(sim.run.header.auto_retry.next_at, Some(next_at));
        assert_eq!(sim.run.steps[0].try_start, 2);
        assert_eq!(sim.run.steps[0].current_try().len(), 1);
        assert_eq!(
            sim.run.steps[1].state,
            StepState::Pending,
            "the skipped step is back"
        );
        let (step, number, fence) = *sim.launches.last().expect("launch");
        assert_eq!(sim.launches.len(), launches_before + 1);
        assert_eq!((step, number), (0, 3), "attempt numbers continue");
        assert!(fence > *old_fences.last().expect("fence"), "a new fence");
        // A second resubmit is refused while the run is in progress (the double-submit
        // guard inside the engine).
        assert!(
            sim.input(Input::Resubmit {
                by: "x".into(),
                next_at
            })
            .is_err()
        );
        // The fresh try has its own never-started retries, then dead-letters again, and
        // is not eligible before its backoff.
        sim.fail_until_terminal(0, FailureClass::InfraNeverStarted);
        assert_eq!(sim.run.steps[0].current_try().len(), 2);
        assert_eq!(sim.run.header.state, RunState::DeadLettered);
        assert_eq!(
            sim.run.header.auto_retry.eligible_at,
            Some(next_at.max(sim.now))
        );
        let early = Timestamp(next_at.0 - 1);
        if early > sim.now {
            assert_eq!(
                eligibility(&sim.run, &settings, early),
                Eligibility::Skip(SkipReason::Backoff)
            );
        }
        sim.now = next_at;
        sim.input(Input::Resubmit {
            by: "auto-retry".into(),
            next_at: sim.now.plus(settings.backoff(2)),
        })
        .expect("second resubmit");
        sim.fail_until_terminal(0, FailureClass::InfraNeverStarted);
        assert_eq!(sim.run.header.auto_retry.attempts, 2);
        let Eligibility::Quarantine(reason) =
            eligibility(&sim.run, &settings, sim.now.plus(settings.backoff(2)))
        else {
            panic!("max reached: quarantine");
        };
        sim.input(Input::Quarantine { reason }).expect("quarantine");
        assert_eq!(sim.run.header.state, RunState::Quarantined);
        assert!(sim.run.header.auto_retry.quarantined.is_some());
        // The operator discards it: dead-lettered for good, never eligible again.
        sim.input(Input::Discard {
            by: "ops".into(),
            reason: "registry gone".into(),
        })
        .expect("discard");
        assert_eq!(sim.run.header.state, RunState::DeadLettered);
        assert_eq!(
            eligibility(&sim.run, &settings, sim.now),
            Eligibility::Skip(SkipReason::Discarded)
        );
    }

    #[test]
    fn max_zero_quarantines_at_once() {
        let sim = never_started("local");
        let settings = AutoRetrySettings {
            max: 0,
            ..settings()
        };
        assert!(matches!(
            eligibility(&sim.run, &settings, sim.now),
            Eligibility::Quarantine(_)
        ));
    }
}

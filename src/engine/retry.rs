//! The retry table (docs/failure-classes.md) and retry backoff: the one place that decides whether
//! a failed attempt is retried and what a step's terminal state is when it is not.

use std::time::Duration;

use super::ids::{RunId, Timestamp};
use super::verdict::FailureClass;
use crate::pipeline::{Backoff, RetryPolicy};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Retry,
    Failed { reason: &'static str },
    DeadLettered { reason: &'static str },
}

/// How many retries a failure of `class` may use under `policy`.
pub fn retry_budget(class: FailureClass, policy: Option<&RetryPolicy>, infra_retries: u32) -> u32 {
    let authored = |covered: bool| match policy {
        Some(p) if covered => p.max,
        _ => 0,
    };
    let on = policy.map(|p| p.on).unwrap_or_default();
    match class {
        // Never started: no side effect was possible, so it heals itself, bounded.
        FailureClass::InfraNeverStarted => infra_retries.max(policy.map_or(0, |p| p.max)),
        FailureClass::Config => 0,
        FailureClass::InfraPostStart => authored(on.infra),
        FailureClass::Step => authored(on.step),
        FailureClass::Timeout => authored(on.timeout),
        FailureClass::Lost => authored(on.lost),
    }
}

/// Decides after attempt number `attempts_used` (1-based) failed with `class`. Every
/// retry of every class consumes the same attempt budget.
pub fn decide(
    class: FailureClass,
    policy: Option<&RetryPolicy>,
    infra_retries: u32,
    attempts_used: u32,
) -> Decision {
    let retries_used = attempts_used.saturating_sub(1);
    if retries_used < retry_budget(class, policy, infra_retries) {
        return Decision::Retry;
    }
    terminal(class)
}

/// The terminal step state for a class that is not (or no longer) retried.
pub fn terminal(class: FailureClass) -> Decision {
    match class {
        FailureClass::InfraNeverStarted => Decision::DeadLettered {
            reason: "InfraRetriesExhausted",
        },
        FailureClass::InfraPostStart => Decision::DeadLettered {
            reason: "InfraPostStart",
        },
        FailureClass::Lost => Decision::DeadLettered { reason: "Lost" },
        FailureClass::Config => Decision::Failed {
            reason: "ConfigError",
        },
        FailureClass::Step => Decision::Failed {
            reason: "StepFailed",
        },
        FailureClass::Timeout => Decision::Failed { reason: "TimedOut" },
    }
}

/// The wait before retry number `retry` (1-based): `initial * factor^(retry-1)`, capped
/// at `max`, then jittered into `[delay/2, delay]` by a hash of the seed and the attempt,
/// so a simulation with the same seed waits the same times and retries never spin.
pub fn backoff_delay(
    backoff: &Backoff,
    retry: u32,
    jitter_seed: u64,
    run: RunId,
    step: usize,
) -> Duration {
    let exponent = i32::try_from(retry.saturating_sub(1)).unwrap_or(i32::MAX);
    let raw_s = backoff.initial.as_secs_f64() * backoff.factor.powi(exponent);
    let capped_s = raw_s.min(backoff.max.as_secs_f64()).max(0.0);
    let unit = unit_interval(
        jitter_seed ^ (run.0 as u64) ^ ((run.0 >> 64) as u64),
        step,
        retry,
    );
    Duration::from_secs_f64(capped_s * (0.5 + 0.5 * unit))
}

pub fn retry_due(now: Timestamp, delay: Duration) -> Timestamp {
    now.plus(delay)
}

/// A deterministic value in [0, 1) from the inputs (splitmix64).
fn unit_interval(seed: u64, step: usize, retry: u32) -> f64 {
    let mut x = seed
        .wrapping_add((step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(u64::from(retry).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

//! The executor's verdict and its failure class: the stable contract of docs/failure-classes.md.
//!
//! Class names are public (API, history, metrics) and versioned: never rename one.

use std::fmt;

use super::ids::Timestamp;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// The main process provably never ran; transient.
    InfraNeverStarted,
    /// It can never start as written.
    Config,
    /// The system killed it after it may have run.
    InfraPostStart,
    /// The code gave a failing verdict.
    Step,
    /// It ran past its timeout.
    Timeout,
    /// No verdict can be obtained.
    Lost,
}

impl FailureClass {
    pub const ALL: [FailureClass; 6] = [
        FailureClass::InfraNeverStarted,
        FailureClass::Config,
        FailureClass::InfraPostStart,
        FailureClass::Step,
        FailureClass::Timeout,
        FailureClass::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::InfraNeverStarted => "infra_never_started",
            FailureClass::Config => "config",
            FailureClass::InfraPostStart => "infra_post_start",
            FailureClass::Step => "step",
            FailureClass::Timeout => "timeout",
            FailureClass::Lost => "lost",
        }
    }

    pub fn parse(name: &str) -> Option<FailureClass> {
        FailureClass::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an attempt ended, as its executor observed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed(FailureClass),
    /// Stopped because Scarab asked (a cancel); not a failure of the step.
    Stopped,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub outcome: Outcome,
    /// Did the main process ever run?
    pub started: bool,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
}

impl Verdict {
    pub fn class(&self) -> Option<FailureClass> {
        match self.outcome {
            Outcome::Failed(class) => Some(class),
            Outcome::Succeeded | Outcome::Stopped => None,
        }
    }
}

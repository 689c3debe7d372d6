//! The pipeline file (docs/pipeline.md): parsing, validation and the validated, plain types
//! the engine consumes.
//!
//! `doc` holds the serde/schemars document types (the wire format, the JSON Schema's
//! source); `parse` turns YAML or JSON text into a [`Pipeline`] or into *every* error at
//! once, each naming its field path and, for YAML, its line. The types below carry no
//! serde: they are what a valid document means.

pub mod doc;
mod parse;

use std::time::Duration;

pub use parse::{Binding, FieldError, Format, ParseOutcome, parse, parse_with, retry_warning};

/// A validated pipeline. Step `needs` are indices into `steps`, and the graph is acyclic.
#[derive(Clone, Debug, PartialEq)]
pub struct Pipeline {
    pub name: String,
    /// Opt-in active-time budget of a run: time with only gates left does not count.
    pub budget: Option<Duration>,
    /// Admission order: higher first, ties in submit order (docs/admission.md).
    pub priority: i32,
    /// At most this many of a run's steps active at once.
    pub parallelism: Option<u32>,
    /// The run's concurrency group, if any.
    pub concurrency: Option<Concurrency>,
    /// The run's parameter values (given at submit, else defaults), by name; already
    /// substituted wherever `${params.NAME}` stood.
    pub params: Vec<(String, String)>,
    pub steps: Vec<Step>,
}

/// Runs that share `group` share `limit` run slots, each held from the run's admission
/// to the group until the run ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Concurrency {
    pub group: String,
    pub limit: u32,
    /// A newer run cancels the group's runs that are still waiting for a slot.
    pub supersede: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub name: String,
    /// Indices of the steps this one needs, each smaller or greater than its own index
    /// (any order is allowed in the file), never itself.
    pub needs: Vec<usize>,
    /// `None` means the global default step timeout applies.
    pub timeout: Option<Duration>,
    pub retry: Option<RetryPolicy>,
    /// Slots of the step's pool it takes while active: 1 for a Pod, `slots:` (default 1)
    /// for a local step, 0 for a gate (which takes none).
    pub slots: u32,
    /// Named locks of the configuration, taken all at once while the step is active.
    pub locks: Vec<String>,
    pub action: StepAction,
}

#[derive(Clone, Debug, PartialEq)]
pub enum StepAction {
    Local(LocalCommand),
    Kubernetes(Box<PodTemplate>),
    /// No executor: the step waits for a person (or its timers) to decide.
    Gate(GateSpec),
}

impl StepAction {
    pub fn executor_name(&self) -> &'static str {
        match self {
            StepAction::Local(_) => "local",
            StepAction::Kubernetes(_) => "kubernetes",
            StepAction::Gate(_) => "gate",
        }
    }

    pub fn gate(&self) -> Option<&GateSpec> {
        match self {
            StepAction::Gate(gate) => Some(gate),
            StepAction::Local(_) | StepAction::Kubernetes(_) => None,
        }
    }
}

/// An approval gate. Both waits are optional; without them the gate waits forever.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GateSpec {
    /// Approve (as the system) once the gate has waited this long.
    pub auto_release: Option<Duration>,
    /// Fail the gate (`GateExpired`) if nobody approved it by then. When both are set,
    /// `auto_release` is shorter (validation refuses the other order).
    pub expires: Option<Duration>,
    /// Shown to whoever decides.
    pub message: Option<String>,
}

/// A step run as a Pod: what its one container runs and where.
#[derive(Clone, Debug, PartialEq)]
pub struct PodTemplate {
    pub image: String,
    /// The container's entrypoint; empty keeps the image's own.
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Variables whose value is a Kubernetes Secret of the executor's namespace:
    /// (variable, Secret name); the container reads key `value` of it.
    pub secrets: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub resources: Resources,
    pub service_account: Option<String>,
    pub node_selector: Vec<(String, String)>,
}

/// Container resource requests and limits, as Kubernetes quantities (`500m`, `1Gi`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resources {
    pub requests: Vec<(String, String)>,
    pub limits: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LocalCommand {
    /// `argv[0]` is the program; never interpreted by a shell.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Variables whose value is a named secret: (variable, secret name). The value is
    /// looked up only when the step starts, and never stored.
    pub secrets: Vec<(String, String)>,
    pub workdir: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    pub on: RetryOn,
    /// Number of retries: at most `max + 1` attempts.
    pub max: u32,
    pub backoff: Backoff,
}

/// Which post-start classes a step's author declared safe to re-run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetryOn {
    pub step: bool,
    pub timeout: bool,
    /// `infra_post_start`. Never-started infra is retried whatever `on` says.
    pub infra: bool,
    pub lost: bool,
}

impl RetryOn {
    /// `on: failure`: every post-start class.
    pub const FAILURE: RetryOn = RetryOn {
        step: true,
        timeout: true,
        infra: true,
        lost: true,
    };
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub factor: f64,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(10),
            factor: 2.0,
            max: Duration::from_secs(600),
        }
    }
}

impl Pipeline {
    pub fn step_index(&self, name: &str) -> Option<usize> {
        self.steps.iter().position(|s| s.name == name)
    }
}

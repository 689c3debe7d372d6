//! The pipeline file's wire format (docs/pipeline.md) as serde + schemars types.
//!
//! These types are the source of the published JSON Schema and describe exactly what
//! `parse` accepts. `parse` does not deserialize into them: it walks a located tree so
//! that it can report every error at once with a line number. Tests in `parse` keep the
//! two in step (field names, retry classes, and valid documents deserializing here).
//!
//! Limits quoted in the doc comments are those of `crate::limits`; the schema's
//! `maxLength`/`maxItems`/`minimum`/`maximum` keywords are generated from the constants
//! themselves.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::limits;

/// A Scarab pipeline: named steps forming a dependency graph (a DAG).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Scarab pipeline")]
pub struct PipelineDoc {
    /// The pipeline's name: 1 to 100 characters, no control characters.
    #[schemars(length(min = 1, max = limits::PIPELINE_NAME_MAX_CHARS))]
    pub name: String,
    /// Opt-in budget of a run's active time, a human duration (`90s`, `10m`, `2h`) between
    /// 1s and 30 days. Time while the run is `waiting` with only gates left does not count.
    /// When the budget is spent, running attempts are killed and the run fails (failure
    /// category `budget`). Absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub budget: Option<String>,
    /// Admission order of the pipeline's runs, -1000 to 1000 (default 0): when steps wait
    /// for a slot, higher priority goes first, ties in submit order. Waiting ages a run:
    /// one point of priority is worth `engine.priority_aging` of waiting, so nothing waits
    /// forever behind later arrivals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "i32", range(min = limits::PRIORITY_MIN, max = limits::PRIORITY_MAX))]
    pub priority: Option<i32>,
    /// At most this many steps of one run active at once, 1 to 100. Absent: no per-run
    /// cap (the pools still apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u32", range(min = 1, max = limits::STEPS_MAX))]
    pub parallelism: Option<u32>,
    /// The runs' concurrency group: runs that share `group` share `limit` run slots, each
    /// held from the run's admission until it ends (gate waits included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "ConcurrencyDoc")]
    pub concurrency: Option<ConcurrencyDoc>,
    /// Defaults for every step with `executor: kubernetes`; a step's own field wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "KubernetesDoc")]
    pub kubernetes: Option<KubernetesDoc>,
    /// The steps, 1 to 100 of them. A step runs once every step it `needs` has succeeded.
    #[schemars(length(min = 1, max = limits::STEPS_MAX))]
    pub steps: Vec<StepDoc>,
    /// Parameters a run is submitted with (`--param NAME=VALUE`), at most 32, by name (a
    /// letter or `_`, then letters, digits and `_`, at most 64 bytes). `${params.NAME}`
    /// is replaced by the value, as text, in steps' `run`, `command` and `args` items,
    /// `env` values and `image`, and in `kubernetes.image` and `concurrency.group`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "BTreeMap<String, ParamDoc>")]
    pub params: Option<BTreeMap<String, ParamDoc>>,
}

/// One step: a local command run without a shell, (with `executor: kubernetes`) a Pod, or
/// (with `gate`) an approval gate that runs nothing.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StepDoc {
    /// The step's name, unique in the pipeline: 1 to 63 characters of `[A-Za-z0-9_-]`.
    #[schemars(
        length(min = 1, max = limits::STEP_NAME_MAX_CHARS),
        regex(pattern = r"^[A-Za-z0-9_-]+$")
    )]
    pub name: String,
    /// Where the step runs: `local` (the default, a process under a supervisor) or
    /// `kubernetes` (a Pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "ExecutorDoc")]
    pub executor: Option<ExecutorDoc>,
    /// Local steps (required for them): the command as an argv list; `run[0]` is the
    /// program and must not be empty. Never interpreted by a shell. At most 256 items, each
    /// at most 4096 bytes, 64 KiB in total; no NUL bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>", length(min = 1, max = limits::ARGV_MAX_ITEMS))]
    pub run: Option<Vec<String>>,
    /// Kubernetes steps: the container image (required unless `kubernetes.image` sets a
    /// default), at most 512 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String", length(min = 1, max = limits::IMAGE_MAX_BYTES))]
    pub image: Option<String>,
    /// Kubernetes steps: the container's entrypoint (default: the image's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>", length(min = 1, max = limits::ARGV_MAX_ITEMS))]
    pub command: Option<Vec<String>>,
    /// Kubernetes steps: the entrypoint's arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<String>", length(max = limits::ARGV_MAX_ITEMS))]
    pub args: Option<Vec<String>>,
    /// Kubernetes steps: container resource requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "ResourcesDoc")]
    pub resources: Option<ResourcesDoc>,
    /// Kubernetes steps: the Pod's service account (a DNS-1123 subdomain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub service_account: Option<String>,
    /// Kubernetes steps: the Pod's node selector (label key → value), at most 32 entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "BTreeMap<String, String>")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Names of the steps that must succeed before this one starts. Each must name another
    /// step of this pipeline, at most once; the graph must have no cycles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::STEPS_MAX))]
    pub needs: Vec<String>,
    /// The step's timeout as a human duration (`90s`, `10m`, `1h30m`, `500ms`), between 1s
    /// and 7 days. Absent: the global default step timeout applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub timeout: Option<String>,
    /// Environment variables added to the command's environment, applied in file order.
    /// Names match `[A-Za-z_][A-Za-z0-9_]*` (at most 128 bytes) and must not start with the
    /// reserved prefix `SCARAB_`; values are strings (quote numbers and booleans) of at most
    /// 4096 bytes with no NUL, or `{secret: NAME}` for a named secret. At most 100
    /// variables and 64 KiB of names and values in total.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = limits::ENV_MAX_VARS))]
    pub env: BTreeMap<String, EnvValue>,
    /// The working directory of the command: a non-empty path of at most 4096 bytes, no NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String", length(min = 1, max = limits::WORKDIR_MAX_BYTES))]
    pub workdir: Option<String>,
    /// Opt-in retry policy. Retry re-runs the whole step at-least-once: enable it only if
    /// the step is idempotent or fenced against a cooperating sink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "RetryDoc")]
    pub retry: Option<RetryDoc>,
    /// Local steps: how many slots of `engine.max_parallel_local` the step takes while it
    /// is active, 1 (the default) to the pool's limit, checked at submit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u32", range(min = 1, max = limits::SLOTS_MAX))]
    pub slots: Option<u32>,
    /// Named locks (`[[locks]]` of the configuration) the step holds while it is active,
    /// taken all at once or not at all: at most 8 distinct names of `[A-Za-z0-9_.-]`.
    /// A name the configuration does not have is refused at submit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::LOCKS_PER_STEP_MAX))]
    pub locks: Vec<LockName>,
    /// Makes the step an approval gate: it runs nothing and waits until someone approves or
    /// rejects it (CLI, API or web), or one of its timers fires. A gate step has only
    /// `name`, `needs` and `gate`; `gate: {}` waits forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "GateDoc")]
    pub gate: Option<GateDoc>,
}

/// An approval gate's timers and message; every field is optional.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GateDoc {
    /// Approve the gate (as the system) once it has waited this long: a human duration
    /// between 1s and 365 days, shorter than `expires` when both are set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub auto_release: Option<String>,
    /// Fail the gate (reason `GateExpired`) if nobody approved it within this long: a human
    /// duration between 1s and 365 days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub expires: Option<String>,
    /// Shown to whoever decides: at most 1024 bytes, no control characters but newline and
    /// tab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String", length(max = limits::GATE_MESSAGE_MAX_BYTES))]
    pub message: Option<String>,
}

/// A declared parameter. Without a default a value must be given at submit.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParamDoc {
    /// The value when none is given: one line, at most 1024 bytes, matching `pattern`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// A regular expression (Rust `regex` syntax, at most 1024 bytes) every value must
    /// match as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// For people, at most 1024 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A concurrency group.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyDoc {
    /// The group's name: 1 to 128 bytes of `[A-Za-z0-9_.-]` once its `${params.NAME}`
    /// references are replaced.
    #[schemars(
        length(min = 1),
        regex(pattern = r"^([A-Za-z0-9_.-]|\$\{params\.[A-Za-z_][A-Za-z0-9_]*\})+$")
    )]
    pub group: String,
    /// Runs of the group in progress at once, 1 to 10000 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u32", range(min = 1, max = limits::GROUP_LIMIT_MAX))]
    pub limit: Option<u32>,
    /// A newer run cancels the group's older runs that are still waiting for a slot
    /// (reason `superseded`). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersede: Option<bool>,
}

/// A named lock of the configuration.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct LockName(
    #[schemars(
        length(min = 1, max = limits::LOCK_NAME_MAX_BYTES),
        regex(pattern = r"^[A-Za-z0-9_.-]+$")
    )]
    pub String,
);

/// When and how often a step is re-run after it started and failed.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryDoc {
    /// The failure classes that trigger a retry: one class or a non-empty list of them.
    pub on: RetryOnDoc,
    /// The number of retries, 0 to 20: at most `max + 1` attempts.
    #[schemars(range(min = 0, max = limits::RETRY_MAX))]
    pub max: u32,
    /// Delay between attempts; each field is optional (defaults: 10s, 2, 10m). Jitter is
    /// added by Scarab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "BackoffDoc")]
    pub backoff: Option<BackoffDoc>,
}

/// One failure class, or a list of them.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum RetryOnDoc {
    One(RetryClassDoc),
    Many(#[schemars(length(min = 1))] Vec<RetryClassDoc>),
}

/// A post-start failure class a step's author declares safe to re-run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RetryClassDoc {
    /// Every post-start class below.
    Failure,
    /// The code gave a failing verdict (non-zero exit).
    Step,
    /// The step ran past its timeout.
    Timeout,
    /// `infra_post_start`: the system killed the step after it may have run.
    Infra,
    /// No verdict can be obtained: the process and its status are gone.
    Lost,
}

/// Exponential backoff between attempts.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackoffDoc {
    /// Delay before the first retry, a human duration of at least 10ms. Default 10s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub initial: Option<String>,
    /// Multiplier applied to the delay after each retry, 1 to 10. Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "f64", range(min = limits::BACKOFF_FACTOR_MIN, max = limits::BACKOFF_FACTOR_MAX))]
    pub factor: Option<f64>,
    /// Upper bound on the delay, a human duration of at least `initial` and at most 24h.
    /// Default 10m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub max: Option<String>,
}

/// The executor of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorDoc {
    /// A local process under a detached supervisor.
    Local,
    /// A Pod per attempt.
    Kubernetes,
}

/// Defaults for Kubernetes steps.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KubernetesDoc {
    /// Default container image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String", length(min = 1, max = limits::IMAGE_MAX_BYTES))]
    pub image: Option<String>,
    /// Default resource requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "ResourcesDoc")]
    pub resources: Option<ResourcesDoc>,
    /// Default service account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub service_account: Option<String>,
    /// Default node selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "BTreeMap<String, String>")]
    pub node_selector: Option<BTreeMap<String, String>>,
}

/// Container resources as Kubernetes quantities (`cpu: 500m`, `memory: 1Gi`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcesDoc {
    /// What the scheduler reserves.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
    /// What the container may use at most.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
}

/// The JSON Schema (draft 2020-12) of the pipeline file, generated from [`PipelineDoc`].
pub fn json_schema() -> serde_json::Value {
    schemars::schema_for!(PipelineDoc).to_value()
}

/// An `env` value: text, or a named secret (docs/security.md).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum EnvValue {
    Text(#[schemars(length(max = limits::ENV_VALUE_MAX_BYTES))] String),
    Secret(SecretRef),
}

/// `{secret: NAME}`: the value of the named secret, given to the step when it starts and
/// never stored. For a local step, a file of the service's secrets dir; for a Kubernetes
/// step, key `value` of the Kubernetes Secret of that name in the executor's namespace.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    #[schemars(
        length(min = 1, max = limits::SECRET_NAME_MAX_BYTES),
        regex(pattern = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
    )]
    pub secret: String,
}

//! Judging a Pod: the one pure function that turns a Pod object into a verdict and a
//! failure class (docs/failure-classes.md, Kubernetes column). The Kubernetes executor and
//! `scarab explain-pod` both call [`judge`]; nothing else interprets Pods.
//!
//! # Evidence of a start
//!
//! A container *ran* when its `state` or `lastState` is `running` or `terminated` with a
//! container ID and a real `startedAt` (present and after the Unix epoch). Look-alikes that
//! are not starts:
//! - `terminated`, reason `ContainerStatusUnknown`, exit 137, no timestamps: written by the
//!   kubelet's status manager when a Pod ends (`TerminatePod`,
//!   pkg/kubelet/status/status_manager.go) over every container that was not terminated.
//! - containerd's `StartError` (startedAt 1970-01-01) and Docker's `ContainerCannotRun`
//!   (startedAt = finishedAt, exit 127/126): the runtime failed to exec the process.
//!
//! Decision (safe direction): the same `TerminatePod` rewrite also covers a container that
//! was *running* (the current kubelet rewrites every non-terminated state, not only waiting
//! ones), and pkg/kubelet/kubelet_pods.go writes a `lastState` "…The container used to be
//! Running". So a `ContainerStatusUnknown` whose container status still carries a container
//! ID, or a `lastState` saying "used to be Running", counts as *may have run*: reporting
//! `infra_never_started` there would let the engine re-run a step that may have had side
//! effects. A never-created waiting container has no container ID, so the classic
//! look-alike stays "never started".
//!
//! # Which container is "the step"
//!
//! `started` in the [`Judgement`] is about the main container only (the §3 contract: did
//! the main process run). Whether a failure is *never started* or *post start* is judged
//! on every container of the Pod, init containers included: they are the user's code too,
//! and an init container that ran may have had side effects.
//!
//! Decision on init containers: Scarab writes none, so an init container in the Pod was
//! injected (an admission webhook's mesh set-up or secret agent). One that terminated
//! non-zero or was OOMKilled means the step's own code never ran: the class is
//! `infra_never_started` with `started: false` (rules `init-container-failed`,
//! `init-oom-killed`), and the reason names the container. One that failed to exec
//! (StartError / ContainerCannotRun) is judged like the main container. An init container
//! waiting on an image pull or a config error follows the waiting rules below.
//!
//! # Waiting states
//!
//! States the kubelet retries forever are not terminal: before their grace period the
//! verdict is `pending`; after it the class is `infra_never_started` (or `infra_post_start`
//! when an init container already ran) with `delete: true`, so the executor deletes the Pod.
//! Grace is measured from the Pod's own timestamps, never from when Scarab first looked:
//! - image pulls and container-config errors: from the latest of `creationTimestamp`,
//!   `PodScheduled=True` and, for regular containers, `Initialized=True` transition times
//!   (the kubelet only starts pulling once the Pod is bound and initialised);
//! - `Unschedulable`: from that condition's `lastTransitionTime`, else `creationTimestamp`;
//! - everything else pending (e.g. `ContainerCreating` on a missing Secret *volume*, which
//!   never produces `CreateContainerConfigError`): from `creationTimestamp`. This overall
//!   `pending` deadline also backs up the specific ones.
//!
//! A Pod with no usable timestamp never expires here; the engine's timeout backstop still
//! ends the attempt.
//!
//! # Where the strings come from (kubernetes/kubernetes)
//!
//! - `DisruptionTarget`, `Unschedulable`, `PreemptionByScheduler`, `TerminationByKubelet`:
//!   staging/src/k8s.io/api/core/v1/types.go; `EvictionByEvictionAPI`:
//!   pkg/registry/core/pod/storage/eviction.go; `DeletionByTaintManager`:
//!   pkg/controller/tainteviction/taint_eviction.go; `DeletionByPodGC`:
//!   pkg/controller/podgc/gc_controller.go.
//! - `Evicted`: pkg/kubelet/eviction/types.go (`Reason`), also used by its admission check.
//! - "Pod was rejected: " + admission reason: `rejectPod` in pkg/kubelet/kubelet.go; reasons
//!   `UnexpectedAdmissionError`, `UnknownReason`, `UnexpectedPredicateFailureType`,
//!   `OutOfcpu`/`OutOfmemory`/`OutOf<resource>`, `InvalidNodeInfo`, `PodOSNotSupported`, …
//!   in pkg/kubelet/lifecycle/predicate.go; `NodeShutdown` and the shutdown reason
//!   `Terminated` in pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go.
//! - `DeadlineExceeded`: pkg/kubelet/active_deadline.go (which needs `status.startTime`).
//! - `ErrImagePull`, `ImagePullBackOff`, `RegistryUnavailable`, `InvalidImageName`,
//!   `ErrImageNeverPull`: pkg/kubelet/images/types.go (newer trees:
//!   pkg/kubelet/container/sync_result.go); `CreateContainerConfigError`,
//!   `CreateContainerError`: pkg/kubelet/kuberuntime/kuberuntime_container.go.
//! - `ContainerStatusUnknown`: pkg/kubelet/container/runtime.go
//!   (`ContainerReasonStatusUnknown`), written in pkg/kubelet/status/status_manager.go and
//!   pkg/kubelet/kubelet_pods.go.
//! - `StartError` comes from containerd's CRI plugin, `ContainerCannotRun` from Docker; the
//!   kubelet copies them verbatim.

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::engine::{FailureClass, Timestamp};

/// How long a waiting state the kubelet keeps retrying may last before it is a verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GracePeriods {
    /// ErrImagePull, ImagePullBackOff, RegistryUnavailable.
    pub image_pull: Duration,
    /// CreateContainerConfigError, CreateContainerError.
    pub config: Duration,
    /// PodScheduled=False, reason Unschedulable.
    pub unschedulable: Duration,
    /// Any other pending state, measured from the Pod's creation.
    pub pending: Duration,
}

impl Default for GracePeriods {
    fn default() -> Self {
        GracePeriods {
            image_pull: Duration::from_secs(5 * 60),
            config: Duration::from_secs(2 * 60),
            unschedulable: Duration::from_secs(10 * 60),
            pending: Duration::from_secs(30 * 60),
        }
    }
}

/// Where the Pod's step stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodVerdict {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl PodVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            PodVerdict::Pending => "pending",
            PodVerdict::Running => "running",
            PodVerdict::Succeeded => "succeeded",
            PodVerdict::Failed => "failed",
        }
    }

    /// Succeeded or failed: the attempt has its verdict.
    pub fn is_final(self) -> bool {
        matches!(self, PodVerdict::Succeeded | PodVerdict::Failed)
    }
}

impl fmt::Display for PodVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The judgement on one Pod. `class` is `Some` exactly when `verdict` is `Failed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgement {
    pub verdict: PodVerdict,
    pub class: Option<FailureClass>,
    /// Did the main container's process ever run (or may it have)?
    pub started: bool,
    pub reason: String,
    /// Stable id of the rule that decided, for logs, tests and `explain-pod`.
    pub rule: &'static str,
    /// The executor should delete the Pod: a waiting state's grace expired (or can never
    /// pass), and the kubelet would otherwise keep retrying forever.
    pub delete: bool,
    /// The exit code behind the verdict (the main container's, or a failed init
    /// container's), when there is one.
    pub exit_code: Option<i32>,
}

/// Reasons are shown to people and stored: keep them bounded.
const REASON_MAX_CHARS: usize = 512;

impl Judgement {
    fn new(verdict: PodVerdict, class: Option<FailureClass>, rule: &'static str) -> Self {
        Judgement {
            verdict,
            class,
            started: false,
            reason: String::new(),
            rule,
            delete: false,
            exit_code: None,
        }
    }

    fn pending(rule: &'static str) -> Self {
        Judgement::new(PodVerdict::Pending, None, rule)
    }

    fn running(rule: &'static str) -> Self {
        Judgement::new(PodVerdict::Running, None, rule)
    }

    fn succeeded(rule: &'static str) -> Self {
        Judgement::new(PodVerdict::Succeeded, None, rule)
    }

    fn failed(class: FailureClass, rule: &'static str) -> Self {
        Judgement::new(PodVerdict::Failed, Some(class), rule)
    }

    fn started(mut self, started: bool) -> Self {
        self.started = started;
        self
    }

    fn reason(mut self, reason: impl Into<String>) -> Self {
        let mut reason: String = reason.into();
        if let Some((cut, _)) = reason.char_indices().nth(REASON_MAX_CHARS) {
            reason.truncate(cut);
            reason.push('…');
        }
        self.reason = reason;
        self
    }

    fn delete(mut self) -> Self {
        self.delete = true;
        self
    }

    fn exit_code(mut self, code: i32) -> Self {
        self.exit_code = Some(code);
        self
    }
}

/// Judges `pod` as of `now`. `main_container` names the container whose process is the
/// step; when the Pod has exactly one container, that one is the step whatever its name.
pub fn judge(pod: &Pod, main_container: &str, now: Timestamp, grace: &GracePeriods) -> Judgement {
    let facts = Facts::gather(pod, main_container, now);
    // The kubelet's own reason decides before "failed while running": kubelets write a
    // Pod's end in either order (the terminal phase with its reason while the container
    // still says running, or the container's end first), and the verdict must not
    // depend on which came first.
    unknown_phase_rule(&facts)
        .or_else(|| pod_reason_rules(&facts))
        .or_else(|| failed_while_running_rule(&facts))
        .or_else(|| node_loss_disruption_rule(&facts))
        .or_else(|| init_failure_rules(&facts))
        .or_else(|| main_terminated_rules(&facts))
        .or_else(|| terminal_fallback(&facts))
        .unwrap_or_else(|| live_rules(&facts, grace))
}

// ---------------------------------------------------------------------------------------
// Facts: everything the rules read, gathered once.

struct Facts<'a> {
    pod: &'a Pod,
    status: Option<&'a PodStatus>,
    phase: &'a str,
    reason: &'a str,
    message: &'a str,
    main: Option<&'a ContainerStatus>,
    /// The main container's process ran, or may have.
    started: bool,
    /// Some container of the Pod (init or regular) ran, or may have.
    anything_started: bool,
    now: Timestamp,
}

impl<'a> Facts<'a> {
    fn gather(pod: &'a Pod, main_container: &str, now: Timestamp) -> Self {
        let status = pod.status.as_ref();
        let main = main_status(pod, main_container);
        let started = main.is_some_and(container_started);
        let anything_started = started || all_statuses(status).any(container_started);
        Facts {
            pod,
            status,
            phase: status.and_then(|s| s.phase.as_deref()).unwrap_or(""),
            reason: status.and_then(|s| s.reason.as_deref()).unwrap_or(""),
            message: status.and_then(|s| s.message.as_deref()).unwrap_or(""),
            main,
            started,
            anything_started,
            now,
        }
    }

    fn failed_phase(&self) -> bool {
        self.phase == "Failed"
    }

    fn main_state(&self) -> Option<&'a ContainerState> {
        self.main.and_then(|m| m.state.as_ref())
    }

    fn main_terminated(&self) -> Option<&'a ContainerStateTerminated> {
        self.main_state().and_then(|s| s.terminated.as_ref())
    }

    fn inits(&self) -> &'a [ContainerStatus] {
        self.status
            .and_then(|s| s.init_container_statuses.as_deref())
            .unwrap_or(&[])
    }

    fn regular(&self) -> &'a [ContainerStatus] {
        self.status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or(&[])
    }

    fn condition(&self, kind: &str) -> Option<&'a PodCondition> {
        self.status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or(&[])
            .iter()
            .find(|c| c.type_ == kind)
    }

    fn condition_since(&self, kind: &str) -> Option<Timestamp> {
        self.condition(kind)
            .filter(|c| c.status == "True")
            .and_then(|c| real_time(c.last_transition_time.as_ref()))
    }

    fn created(&self) -> Option<Timestamp> {
        real_time(self.pod.metadata.creation_timestamp.as_ref())
    }

    /// A terminated state is the last word only once the Pod's phase is terminal: until
    /// then the kubelet may still write why it ended the Pod (a deadline, an eviction, a
    /// node shutdown), which decides the class, or restart the container.
    fn is_final(&self, _exit_code: i32) -> bool {
        matches!(self.phase, "Failed" | "Succeeded")
    }

    /// Init containers with `restartPolicy: Always` are sidecars: they are killed when
    /// the Pod ends, which is no failure of the step.
    fn is_sidecar(&self, name: &str) -> bool {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or(&[])
            .iter()
            .any(|c| c.name == name && c.restart_policy.as_deref() == Some("Always"))
    }

    fn class_after_start(&self) -> FailureClass {
        if self.anything_started {
            FailureClass::InfraPostStart
        } else {
            FailureClass::InfraNeverStarted
        }
    }
}

fn all_statuses(status: Option<&PodStatus>) -> impl Iterator<Item = &ContainerStatus> {
    let inits = status.and_then(|s| s.init_container_statuses.as_deref());
    let regular = status.and_then(|s| s.container_statuses.as_deref());
    inits
        .unwrap_or(&[])
        .iter()
        .chain(regular.unwrap_or(&[]).iter())
}

/// The main container's status: by name, or the only container when there is one.
fn main_status<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    let statuses = pod.status.as_ref()?.container_statuses.as_deref()?;
    if let Some(found) = statuses.iter().find(|s| s.name == name) {
        return Some(found);
    }
    let spec_count = pod
        .spec
        .as_ref()
        .map_or(statuses.len(), |s| s.containers.len());
    match statuses {
        [only] if spec_count <= 1 => Some(only),
        _ => None,
    }
}

/// Milliseconds since the epoch, or `None` for a missing time or one at or before the
/// epoch (containerd reports a process that never started as started at 1970-01-01).
fn real_time(time: Option<&Time>) -> Option<Timestamp> {
    let ms = time?.0.as_millisecond();
    u64::try_from(ms).ok().filter(|ms| *ms > 0).map(Timestamp)
}

fn non_empty(text: Option<&str>) -> bool {
    text.is_some_and(|t| !t.is_empty())
}

// ---------------------------------------------------------------------------------------
// Evidence of a start.

const STATUS_UNKNOWN: &str = "ContainerStatusUnknown";

fn container_started(status: &ContainerStatus) -> bool {
    let id = status.container_id.as_deref();
    let ran = |state: Option<&ContainerState>| state.is_some_and(|s| state_ran(s, id));
    ran(status.state.as_ref()) || ran(status.last_state.as_ref()) || may_have_run(status)
}

fn state_ran(state: &ContainerState, status_id: Option<&str>) -> bool {
    if let Some(running) = &state.running {
        return non_empty(status_id) && real_time(running.started_at.as_ref()).is_some();
    }
    let Some(terminated) = &state.terminated else {
        return false;
    };
    if start_failure(terminated).is_some() {
        return false;
    }
    let id = terminated.container_id.as_deref().or(status_id);
    non_empty(id) && real_time(terminated.started_at.as_ref()).is_some()
}

/// A `ContainerStatusUnknown` rewrite that hides a container which existed, or one the
/// kubelet says "used to be Running": no timestamps, but no proof it never ran either.
fn may_have_run(status: &ContainerStatus) -> bool {
    let unknown_now = status
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| t.reason.as_deref() == Some(STATUS_UNKNOWN));
    let used_to_run = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| {
            t.reason.as_deref() == Some(STATUS_UNKNOWN)
                && t.message
                    .as_deref()
                    .is_some_and(|m| m.contains("used to be Running"))
        });
    (unknown_now && non_empty(status.container_id.as_deref())) || used_to_run
}

/// What a start failure means: the executable cannot run as written (`config`), or the
/// runtime failed for another reason (`infra_never_started`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StartFailure {
    Config,
    Infra,
}

/// containerd's `StartError`, Docker's `ContainerCannotRun`: the runtime created the
/// container but could not exec its process.
fn start_failure(terminated: &ContainerStateTerminated) -> Option<StartFailure> {
    let reason = terminated.reason.as_deref()?;
    if reason != "StartError" && reason != "ContainerCannotRun" {
        return None;
    }
    let message = terminated.message.as_deref().unwrap_or("").to_lowercase();
    // Docker's convention when it cannot exec: 127 not found, 126 not executable.
    let docker_exec_code =
        reason == "ContainerCannotRun" && matches!(terminated.exit_code, 126 | 127);
    if docker_exec_code || EXEC_ERRORS.iter().any(|e| message.contains(e)) {
        Some(StartFailure::Config)
    } else {
        Some(StartFailure::Infra)
    }
}

/// Runtime messages that mean "can never start as written": missing or non-executable
/// binary, wrong architecture, missing working directory.
const EXEC_ERRORS: [&str; 5] = [
    "executable file not found",
    "no such file or directory",
    "permission denied",
    "exec format error",
    "not a directory",
];

// ---------------------------------------------------------------------------------------
// Rules, in order. Each returns `None` when it does not apply.

fn unknown_phase_rule(facts: &Facts) -> Option<Judgement> {
    // The node stopped reporting: the process may still run there, or not.
    (facts.phase == "Unknown").then(|| {
        Judgement::failed(FailureClass::Lost, "phase-unknown")
            .started(facts.started)
            .reason(describe("Pod phase Unknown", facts.message))
    })
}

/// Only when no kubelet reason explains the end (`pod_reason_rules` came first).
fn failed_while_running_rule(facts: &Facts) -> Option<Judgement> {
    let still_running = facts.main_state().is_some_and(|s| s.running.is_some());
    if facts.failed_phase() && still_running {
        // Failed while the container says running: the node vanished (PodGC, taint
        // manager) and nobody saw the process end; it may still be running there.
        return Some(
            Judgement::failed(FailureClass::Lost, "failed-while-running")
                .started(facts.started)
                .reason(describe(
                    "Pod failed while its container still reported running",
                    facts.message,
                )),
        );
    }
    None
}

/// Pod-level causes, judged before any exit code: when the system ended the Pod, the
/// container's exit code (137, 143, even 0) is the system's doing, not the code's.
fn pod_reason_rules(facts: &Facts) -> Option<Judgement> {
    if !facts.failed_phase() {
        return None;
    }
    deadline_rule(facts)
        .or_else(|| node_shutdown_rule(facts))
        .or_else(|| admission_rule(facts))
        .or_else(|| eviction_rule(facts))
        .or_else(|| disruption_rule(facts).filter(|_| !node_lost(facts)))
}

/// `DisruptionTarget` reasons that mean the node is gone (nobody saw the process end),
/// unlike preemption, API eviction and the kubelet's own termination, which end it.
const NODE_LOSS: [&str; 2] = ["DeletionByPodGC", "DeletionByTaintManager"];

fn node_lost(facts: &Facts) -> bool {
    facts
        .condition("DisruptionTarget")
        .filter(|c| c.status == "True")
        .and_then(|c| c.reason.as_deref())
        .is_some_and(|reason| NODE_LOSS.contains(&reason))
}

/// A node-loss disruption whose containers no longer say running: judged by their
/// evidence (after `failed_while_running_rule`, which takes the case where they do).
fn node_loss_disruption_rule(facts: &Facts) -> Option<Judgement> {
    if !facts.failed_phase() || !node_lost(facts) {
        return None;
    }
    disruption_rule(facts)
}

fn deadline_rule(facts: &Facts) -> Option<Judgement> {
    // Only the kubelet's activeDeadlineSeconds handler writes this, and only for a Pod
    // with a startTime: an unscheduled Pod never gets here (it stays Pending).
    (facts.reason == "DeadlineExceeded").then(|| {
        let judgement = Judgement::failed(FailureClass::Timeout, "active-deadline-exceeded")
            .started(facts.started)
            .reason(describe("DeadlineExceeded", facts.message));
        with_main_exit_code(judgement, facts)
    })
}

/// Reasons the kubelet's admission handlers give (pkg/kubelet/lifecycle/predicate.go and
/// the admit handlers registered in pkg/kubelet/kubelet.go). `Evicted` is not here: the
/// eviction manager uses it both to reject at admission and to evict a running Pod.
const ADMISSION_REASONS: [&str; 11] = [
    "NodeAffinity",
    "UnexpectedAdmissionError",
    "UnknownReason",
    "UnexpectedPredicateFailureType",
    "InvalidNodeInfo",
    "PodOSSelectorNodeLabelDoesNotMatch",
    "PodOSNotSupported",
    "InitContainerRestartPolicyForbidden",
    "SupplementalGroupsPolicyNotSupported",
    "TopologyAffinityError",
    "SysctlForbidden",
];

fn is_admission_rejection(facts: &Facts) -> bool {
    facts.message.starts_with("Pod was rejected:")
        || facts.reason.starts_with("OutOf")
        || ADMISSION_REASONS.contains(&facts.reason)
}

fn admission_rule(facts: &Facts) -> Option<Judgement> {
    // A rejected Pod never got a container. Should a status nevertheless show a start
    // (a kubelet restart re-admitting a running Pod), the kubelet killed a running step.
    is_admission_rejection(facts).then(|| {
        let rule = if facts.anything_started {
            "kubelet-admission-rejected-after-start"
        } else {
            "kubelet-admission-rejected"
        };
        Judgement::failed(facts.class_after_start(), rule)
            .started(facts.started)
            .reason(describe(facts.reason, facts.message))
    })
}

fn eviction_rule(facts: &Facts) -> Option<Judgement> {
    (facts.reason == "Evicted").then(|| {
        let rule = if facts.anything_started {
            "evicted-after-start"
        } else {
            "evicted-before-start"
        };
        Judgement::failed(facts.class_after_start(), rule)
            .started(facts.started)
            .reason(describe("Evicted", facts.message))
    })
}

fn node_shutdown_rule(facts: &Facts) -> Option<Judgement> {
    // Every wording kubelets have used: "Shutdown" ("Node is shutting, evicting pods",
    // older kubelets), "NodeShutdown" (also at admission, while the node shuts down) and
    // "Terminated" with a message about the node shutting down. Started or not, the
    // containers' evidence decides the class.
    let message = facts.message.to_lowercase();
    let shutdown = matches!(facts.reason, "Shutdown" | "NodeShutdown")
        || (facts.reason == "Terminated" && message.contains("shut"));
    shutdown.then(|| {
        let rule = if facts.anything_started {
            "node-shutdown-after-start"
        } else {
            "node-shutdown-before-start"
        };
        Judgement::failed(facts.class_after_start(), rule)
            .started(facts.started)
            .reason(describe(facts.reason, facts.message))
    })
}

fn disruption_rule(facts: &Facts) -> Option<Judgement> {
    // The condition may be written late, together with the terminal phase: the
    // containers' evidence, not the condition, says whether anything ran.
    let condition = facts
        .condition("DisruptionTarget")
        .filter(|c| c.status == "True")?;
    let rule = if facts.anything_started {
        "disrupted-after-start"
    } else {
        "disrupted-before-start"
    };
    let cause = format!(
        "DisruptionTarget {}",
        condition.reason.as_deref().unwrap_or("(no reason)")
    );
    Some(
        Judgement::failed(facts.class_after_start(), rule)
            .started(facts.started)
            .reason(describe(&cause, condition.message.as_deref().unwrap_or(""))),
    )
}

/// A failed init container: the main process never ran.
fn init_failure_rules(facts: &Facts) -> Option<Judgement> {
    if facts.started {
        return None;
    }
    facts
        .inits()
        .iter()
        .find_map(|init| init_failure(facts, init))
}

fn init_failure(facts: &Facts, init: &ContainerStatus) -> Option<Judgement> {
    let terminated = init.state.as_ref()?.terminated.as_ref()?;
    let unknown = terminated.reason.as_deref() == Some(STATUS_UNKNOWN);
    if terminated.exit_code == 0 || unknown || facts.is_sidecar(&init.name) {
        return None;
    }
    if !facts.is_final(terminated.exit_code) {
        return None;
    }
    // Scarab writes no init container: one in the Pod was injected (an admission
    // webhook's mesh set-up or secret agent), and when it fails the step never ran,
    // whatever its exit code or reason.
    let how = match terminated.reason.as_deref() {
        Some(reason) if !reason.is_empty() => {
            format!("{reason}, exit code {}", terminated.exit_code)
        }
        _ => format!("exit code {}", terminated.exit_code),
    };
    // Rule ids are stable: an OOMKilled init container keeps its own.
    let rule = if terminated.reason.as_deref() == Some("OOMKilled") {
        "init-oom-killed"
    } else {
        "init-container-failed"
    };
    let judgement = Judgement::failed(FailureClass::InfraNeverStarted, rule)
        .started(false)
        .reason(describe(
            &format!(
                "init container {} (not Scarab's: injected into the Pod) failed: {how}; the step never ran",
                init.name
            ),
            terminated.message.as_deref().unwrap_or(""),
        ));
    Some(judgement.exit_code(terminated.exit_code))
}

fn main_terminated_rules(facts: &Facts) -> Option<Judgement> {
    let terminated = facts.main_terminated()?;
    if !facts.is_final(terminated.exit_code) {
        return None;
    }
    if terminated.reason.as_deref() == Some(STATUS_UNKNOWN) {
        return Some(status_unknown(facts));
    }
    if let Some(failure) = start_failure(terminated) {
        let judgement = start_failure_judgement(facts, failure, terminated, "main container");
        return Some(judgement.exit_code(terminated.exit_code));
    }
    if deleted_before_finish(facts, terminated) {
        return Some(deleted_while_running(facts, terminated));
    }
    Some(exit_judgement(facts, terminated))
}

/// `ContainerStatusUnknown` on the main container: the kubelet lost track of it.
fn status_unknown(facts: &Facts) -> Judgement {
    if facts.started {
        Judgement::failed(FailureClass::Lost, "status-unknown-after-start")
            .started(true)
            .reason("ContainerStatusUnknown: the container may have run and its end is unknown")
    } else {
        Judgement::failed(
            FailureClass::InfraNeverStarted,
            "status-unknown-never-started",
        )
        .reason(describe(
            "ContainerStatusUnknown: the Pod ended before the container started",
            facts.message,
        ))
    }
}

fn start_failure_judgement(
    facts: &Facts,
    failure: StartFailure,
    terminated: &ContainerStateTerminated,
    what: &str,
) -> Judgement {
    let reason = terminated.reason.as_deref().unwrap_or("StartError");
    let text = describe(
        &format!("{reason} ({what})"),
        terminated.message.as_deref().unwrap_or(""),
    );
    match failure {
        StartFailure::Config => Judgement::failed(FailureClass::Config, "start-error-config"),
        // An earlier init container may have run; then it is not "never started".
        StartFailure::Infra => Judgement::failed(facts.class_after_start(), "start-error"),
    }
    .reason(text)
}

/// Someone deleted the Pod while the process ran: the deletion request (deletionTimestamp
/// minus the grace period) precedes the container's end, so the exit (even 0, a trapped
/// SIGTERM) answers the deletion, not the step.
fn deleted_before_finish(facts: &Facts, terminated: &ContainerStateTerminated) -> bool {
    let metadata = &facts.pod.metadata;
    let Some(deleted_at) = real_time(metadata.deletion_timestamp.as_ref()) else {
        return false;
    };
    let grace_ms = metadata
        .deletion_grace_period_seconds
        .and_then(|s| u64::try_from(s).ok())
        .unwrap_or(0)
        .saturating_mul(1000);
    let requested_at = deleted_at.0.saturating_sub(grace_ms);
    // No finishedAt: nothing shows the process ended before the request.
    real_time(terminated.finished_at.as_ref()).is_none_or(|finished| requested_at < finished.0)
}

fn deleted_while_running(facts: &Facts, terminated: &ContainerStateTerminated) -> Judgement {
    Judgement::failed(FailureClass::Lost, "deleted-while-running")
        .started(facts.started)
        .exit_code(terminated.exit_code)
        .reason(format!(
            "the Pod was deleted while its container ran (exit code {} answered the deletion)",
            terminated.exit_code
        ))
}

fn exit_judgement(facts: &Facts, terminated: &ContainerStateTerminated) -> Judgement {
    let code = terminated.exit_code;
    let judgement = if terminated.reason.as_deref() == Some("OOMKilled") {
        Judgement::failed(FailureClass::InfraPostStart, "oom-killed").reason("OOMKilled")
    } else if code != 0 {
        Judgement::failed(FailureClass::Step, "main-terminated-nonzero")
            .reason(format!("exit code {code}"))
    } else if let Some(sibling) = failed_sibling(facts) {
        sibling
    } else {
        Judgement::succeeded("succeeded").reason("exit code 0")
    };
    judgement.started(facts.started).exit_code(code)
}

/// Main exited 0 but the Pod failed: another regular container of the step failed.
fn failed_sibling(facts: &Facts) -> Option<Judgement> {
    if !facts.failed_phase() {
        return None;
    }
    let main_name = facts.main.map(|m| m.name.as_str());
    facts.regular().iter().find_map(|sibling| {
        let terminated = sibling.state.as_ref()?.terminated.as_ref()?;
        if Some(sibling.name.as_str()) == main_name || terminated.exit_code == 0 {
            return None;
        }
        let what = describe(
            &format!("container {}", sibling.name),
            terminated.reason.as_deref().unwrap_or(""),
        );
        Some(
            Judgement::failed(FailureClass::Step, "other-container-failed")
                .reason(format!("{what} (exit code {})", terminated.exit_code)),
        )
    })
}

/// A terminal phase that no rule above explained.
fn terminal_fallback(facts: &Facts) -> Option<Judgement> {
    match facts.phase {
        // Succeeded means every container exited 0, even if the main one is not listed.
        "Succeeded" => Some(
            Judgement::succeeded("pod-succeeded")
                .started(facts.started)
                .reason("the Pod succeeded"),
        ),
        "Failed" if facts.anything_started => Some(
            Judgement::failed(FailureClass::Lost, "failed-without-verdict")
                .started(facts.started)
                .reason(describe(
                    "the Pod failed and no container verdict is left",
                    facts.message,
                )),
        ),
        "Failed" => Some(
            Judgement::failed(FailureClass::InfraNeverStarted, "failed-before-start").reason(
                describe(
                    &describe("the Pod failed before any container started", facts.reason),
                    facts.message,
                ),
            ),
        ),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// Live Pods: running, or waiting for something.

fn live_rules(facts: &Facts, grace: &GracePeriods) -> Judgement {
    if let Some(running) = facts.main_state().and_then(|s| s.running.as_ref()) {
        let reason = match &running.started_at {
            Some(since) => format!("running since {}", since.0),
            None => "running".to_string(),
        };
        return Judgement::running("running").started(true).reason(reason);
    }
    if facts.inits().iter().any(is_running) && !facts.started {
        // User code runs in an init container: not pending, and no pending deadline.
        return Judgement::running("initializing").reason("an init container is running");
    }
    if let Some(judgement) = waiting_rules(facts, grace) {
        return judgement;
    }
    if restarting(facts) {
        // Restarting (restartPolicy Always/OnFailure): it ran and will run again.
        return Judgement::running("restarting")
            .started(true)
            .reason("the container ran and is restarting");
    }
    unschedulable_rule(facts, grace).unwrap_or_else(|| pending_rule(facts, grace))
}

/// The main container ran, or some container ran and now backs off before its restart.
fn restarting(facts: &Facts) -> bool {
    let backing_off = |s: &ContainerStatus| {
        let waiting = s.state.as_ref().and_then(|s| s.waiting.as_ref());
        waiting.is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
            && container_started(s)
    };
    facts.started || all_statuses(facts.status).any(backing_off)
}

fn is_running(status: &ContainerStatus) -> bool {
    status.state.as_ref().is_some_and(|s| s.running.is_some())
}

/// Which waiting reasons this module judges, and how.
#[derive(Clone, Copy)]
enum Waiting {
    /// Deterministic: can never start as written.
    Config,
    ImagePull,
    CreateConfig,
}

fn waiting_kind(reason: &str) -> Option<Waiting> {
    match reason {
        "InvalidImageName" | "ErrImageNeverPull" => Some(Waiting::Config),
        "ErrImagePull" | "ImagePullBackOff" | "RegistryUnavailable" => Some(Waiting::ImagePull),
        "CreateContainerConfigError" | "CreateContainerError" => Some(Waiting::CreateConfig),
        _ => None,
    }
}

/// The first container blocked on a waiting reason we judge: init containers in order
/// (they block everything after them), then the main container, then its siblings.
fn waiting_rules(facts: &Facts, grace: &GracePeriods) -> Option<Judgement> {
    let main_name = facts.main.map(|m| m.name.as_str());
    let inits = facts.inits().iter().map(|s| (s, true));
    let main = facts.main.into_iter().map(|s| (s, false));
    let siblings = facts
        .regular()
        .iter()
        .filter(move |s| Some(s.name.as_str()) != main_name)
        .map(|s| (s, false));
    inits
        .chain(main)
        .chain(siblings)
        .find_map(|(status, init)| waiting_judgement(facts, grace, status, init))
}

fn waiting_judgement(
    facts: &Facts,
    grace: &GracePeriods,
    status: &ContainerStatus,
    init: bool,
) -> Option<Judgement> {
    let waiting = status.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    let kind = waiting_kind(reason)?;
    let text = describe(
        &format!("{reason} (container {})", status.name),
        waiting.message.as_deref().unwrap_or(""),
    );
    let (period, rules) = match kind {
        Waiting::Config => {
            return Some(
                Judgement::failed(FailureClass::Config, "image-unusable")
                    .started(facts.started)
                    .reason(text)
                    .delete(),
            );
        }
        Waiting::ImagePull => (
            grace.image_pull,
            ("image-pull-waiting", "image-pull-expired"),
        ),
        Waiting::CreateConfig => (
            grace.config,
            ("create-config-waiting", "create-config-expired"),
        ),
    };
    let since = container_wait_since(facts, init);
    Some(graced(facts, grace, since, period, rules, text))
}

/// When the kubelet could first have tried: it pulls and creates only once the Pod is
/// bound, and a regular container only once the init containers are done.
fn container_wait_since(facts: &Facts, init: bool) -> Option<Timestamp> {
    let initialized = if init {
        None
    } else {
        facts.condition_since("Initialized")
    };
    [
        facts.created(),
        facts.condition_since("PodScheduled"),
        initialized,
    ]
    .into_iter()
    .flatten()
    .max()
}

fn unschedulable_rule(facts: &Facts, grace: &GracePeriods) -> Option<Judgement> {
    let condition = facts
        .condition("PodScheduled")
        .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))?;
    let since = real_time(condition.last_transition_time.as_ref()).or_else(|| facts.created());
    let text = describe("Unschedulable", condition.message.as_deref().unwrap_or(""));
    let rules = ("unschedulable-waiting", "unschedulable-expired");
    Some(graced(
        facts,
        grace,
        since,
        grace.unschedulable,
        rules,
        text,
    ))
}

fn pending_rule(facts: &Facts, grace: &GracePeriods) -> Judgement {
    let what = facts
        .main_state()
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
        .unwrap_or("Pending");
    let text = format!("{what}: no container has started");
    let rules = ("pending", "pending-expired");
    graced(facts, grace, facts.created(), grace.pending, rules, text)
}

/// Pending until `period` has passed since `since`; then a never-started failure the
/// executor ends by deleting the Pod. The overall `pending` deadline from the Pod's
/// creation backs up every specific one.
fn graced(
    facts: &Facts,
    grace: &GracePeriods,
    since: Option<Timestamp>,
    period: Duration,
    (waiting_rule, expired_rule): (&'static str, &'static str),
    text: String,
) -> Judgement {
    let waited = |from: Option<Timestamp>| from.map(|t| facts.now.since(t));
    if let Some(waited) = waited(since).filter(|w| *w >= period) {
        return expired(facts, expired_rule, text, waited, period);
    }
    if let Some(waited) = waited(facts.created()).filter(|w| *w >= grace.pending) {
        return expired(facts, "pending-deadline", text, waited, grace.pending);
    }
    let so_far = waited(since).map_or_else(|| "unknown".to_string(), human);
    Judgement::pending(waiting_rule)
        .started(facts.started)
        .reason(format!("{text} (waiting {so_far} of {})", human(period)))
}

fn expired(
    facts: &Facts,
    rule: &'static str,
    text: String,
    waited: Duration,
    period: Duration,
) -> Judgement {
    Judgement::failed(facts.class_after_start(), rule)
        .started(facts.started)
        .reason(format!(
            "{text} (waited {}, grace {})",
            human(waited),
            human(period)
        ))
        .delete()
}

fn human(duration: Duration) -> String {
    humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string()
}

/// "what: message", or "what" alone when there is no message.
fn describe(what: &str, message: &str) -> String {
    let message = message.trim();
    match (what.is_empty(), message.is_empty()) {
        (_, true) => what.to_string(),
        (true, false) => message.to_string(),
        (false, false) => format!("{what}: {message}"),
    }
}

fn with_main_exit_code(judgement: Judgement, facts: &Facts) -> Judgement {
    match facts.main_terminated() {
        Some(t) if t.reason.as_deref() != Some(STATUS_UNKNOWN) => judgement.exit_code(t.exit_code),
        _ => judgement,
    }
}

#[cfg(test)]
mod tests {
    //! One row per Kubernetes fact of docs/failure-classes.md, with Pods shaped like what the
    //! kubelet, scheduler and controllers really write.

    use super::*;
    use serde_json::{Value, json};

    const CREATED: &str = "2025-03-01T10:00:00Z";
    const CID: &str =
        "containerd://4f1c2b9e8a7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928170615243";
    const IMAGE: &str = "registry.example.com/team/build:1.4";

    fn at(text: &str) -> Timestamp {
        let time: k8s_openapi::jiff::Timestamp = text.parse().expect("test time");
        Timestamp(u64::try_from(time.as_millisecond()).expect("after the epoch"))
    }

    /// Recursive JSON merge: objects merge, everything else replaces.
    fn merge(base: &mut Value, patch: Value) {
        match (base, patch) {
            (Value::Object(base), Value::Object(patch)) => {
                for (key, value) in patch {
                    merge(base.entry(key).or_insert(Value::Null), value);
                }
            }
            (base, patch) => *base = patch,
        }
    }

    /// A Pod as `kubectl get pod -o json` prints it, with `status` merged in.
    fn pod(status: Value) -> Value {
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "r01jq-build-a1-f41",
                "namespace": "scarab",
                "uid": "5c1c6f0e-2b0a-4f7e-9d43-8f1f0c7b2a11",
                "resourceVersion": "88213",
                "creationTimestamp": CREATED,
                "labels": {"scarab.dev/fence": "41"}
            },
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "step", "image": IMAGE, "command": ["make", "image"]}]
            },
            "status": {"qosClass": "BestEffort"}
        });
        merge(&mut pod, json!({ "status": status }));
        pod
    }

    fn with(mut pod: Value, patch: Value) -> Value {
        merge(&mut pod, patch);
        pod
    }

    fn status(name: &str, container_id: Option<&str>, state: Value, last: Value) -> Value {
        let mut s = json!({
            "name": name, "image": IMAGE, "imageID": "", "ready": false,
            "restartCount": 0, "started": false, "state": state, "lastState": last
        });
        if let Some(id) = container_id {
            merge(
                &mut s,
                json!({"containerID": id, "imageID": format!("{IMAGE}@sha256:9a1b")}),
            );
        }
        s
    }

    fn running(since: &str) -> Value {
        status(
            "step",
            Some(CID),
            json!({"running": {"startedAt": since}}),
            json!({}),
        )
    }

    fn exited(name: &str, code: i32, reason: &str, started: &str, finished: &str) -> Value {
        let state = json!({"terminated": {
            "containerID": CID, "exitCode": code, "reason": reason,
            "startedAt": started, "finishedAt": finished
        }});
        status(name, Some(CID), state, json!({}))
    }

    fn waiting(name: &str, reason: &str, message: &str) -> Value {
        let state = json!({"waiting": {"reason": reason, "message": message}});
        status(name, None, state, json!({}))
    }

    /// The kubelet's `TerminatePod` rewrite of a container that had not terminated.
    fn status_unknown(container_id: Option<&str>) -> Value {
        let state = json!({"terminated": {
            "exitCode": 137, "reason": "ContainerStatusUnknown",
            "message": "The container could not be located when the pod was terminated"
        }});
        status("step", container_id, state, json!({}))
    }

    fn condition(kind: &str, status: &str, since: &str) -> Value {
        json!({"type": kind, "status": status, "lastProbeTime": null, "lastTransitionTime": since})
    }

    fn scheduled(since: &str) -> Value {
        condition("PodScheduled", "True", since)
    }

    fn disruption(reason: &str, message: &str, since: &str) -> Value {
        let mut c = condition("DisruptionTarget", "True", since);
        merge(&mut c, json!({"reason": reason, "message": message}));
        c
    }

    fn pending_with(container: Value, since_scheduled: &str) -> Value {
        pod(json!({
            "phase": "Pending",
            "conditions": [
                condition("PodReadyToStartContainers", "True", since_scheduled),
                condition("Initialized", "True", since_scheduled),
                scheduled(since_scheduled)
            ],
            "hostIP": "10.0.3.17", "startTime": since_scheduled,
            "containerStatuses": [container]
        }))
    }

    fn unschedulable(since: &str) -> Value {
        pod(json!({
            "phase": "Pending",
            "conditions": [{
                "type": "PodScheduled", "status": "False", "lastProbeTime": null,
                "lastTransitionTime": since, "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
            }]
        }))
    }

    fn failed_with(reason: &str, message: &str, conditions: Value, containers: Value) -> Value {
        pod(json!({
            "phase": "Failed", "reason": reason, "message": message,
            "conditions": conditions, "hostIP": "10.0.3.17", "startTime": "2025-03-01T10:00:05Z",
            "containerStatuses": containers
        }))
    }

    struct Row {
        name: &'static str,
        pod: Value,
        now: &'static str,
        verdict: PodVerdict,
        class: Option<FailureClass>,
        started: bool,
        rule: &'static str,
        delete: bool,
    }

    fn row(
        name: &'static str,
        pod: Value,
        now: &'static str,
        (verdict, class): (PodVerdict, Option<FailureClass>),
        started: bool,
        rule: &'static str,
    ) -> Row {
        let delete =
            rule.ends_with("-expired") || rule == "pending-deadline" || rule == "image-unusable";
        Row {
            name,
            pod,
            now,
            verdict,
            class,
            started,
            rule,
            delete,
        }
    }

    const PENDING: (PodVerdict, Option<FailureClass>) = (PodVerdict::Pending, None);
    const RUNNING: (PodVerdict, Option<FailureClass>) = (PodVerdict::Running, None);
    const SUCCEEDED: (PodVerdict, Option<FailureClass>) = (PodVerdict::Succeeded, None);

    fn failed(class: FailureClass) -> (PodVerdict, Option<FailureClass>) {
        (PodVerdict::Failed, Some(class))
    }

    use FailureClass::{Config, InfraNeverStarted, InfraPostStart, Lost, Step, Timeout};

    const T0: &str = "2025-03-01T10:00:12Z";
    const T1: &str = "2025-03-01T10:03:40Z";

    fn lifecycle_rows() -> Vec<Row> {
        vec![
            row(
                "running",
                pod(
                    json!({"phase": "Running", "conditions": [scheduled(CREATED)],
                    "startTime": CREATED, "containerStatuses": [running(T0)]}),
                ),
                T1,
                RUNNING,
                true,
                "running",
            ),
            row(
                "succeeded",
                pod(json!({"phase": "Succeeded",
                    "containerStatuses": [exited("step", 0, "Completed", T0, T1)]})),
                T1,
                SUCCEEDED,
                true,
                "succeeded",
            ),
            row(
                "main exits non-zero",
                failed_with(
                    "",
                    "",
                    json!([]),
                    json!([exited("step", 2, "Error", T0, T1)]),
                ),
                T1,
                failed(Step),
                true,
                "main-terminated-nonzero",
            ),
            row(
                "OOMKilled keeps its reason",
                failed_with(
                    "",
                    "",
                    json!([]),
                    json!([exited("step", 137, "OOMKilled", T0, T1)]),
                ),
                T1,
                failed(InfraPostStart),
                true,
                "oom-killed",
            ),
            row(
                "an injected init container fails: the step never ran",
                pod(json!({
                    "phase": "Failed",
                    "initContainerStatuses": [exited("migrate", 3, "Error", T0, T1)],
                    "containerStatuses": [waiting("step", "PodInitializing", "")]})),
                T1,
                failed(InfraNeverStarted),
                false,
                "init-container-failed",
            ),
            row(
                "an injected init container is OOMKilled: the step never ran",
                pod(json!({
                    "phase": "Failed",
                    "initContainerStatuses": [exited("istio-init", 137, "OOMKilled", T0, T1)],
                    "containerStatuses": [waiting("step", "PodInitializing", "")]})),
                T1,
                failed(InfraNeverStarted),
                false,
                "init-oom-killed",
            ),
            row(
                "init container running",
                pod(json!({"phase": "Pending",
                    "initContainerStatuses": [status("migrate", Some(CID),
                        json!({"running": {"startedAt": T0}}), json!({}))],
                    "containerStatuses": [waiting("step", "PodInitializing", "")]})),
                "2025-03-01T11:00:00Z",
                RUNNING,
                false,
                "initializing",
            ),
            row(
                "crash-looping container restarts",
                with(
                    pod(json!({"phase": "Running",
                    "containerStatuses": [status("step", Some(CID),
                        json!({"waiting": {"reason": "CrashLoopBackOff",
                               "message": "back-off 40s restarting failed container"}}),
                        json!({"terminated": {"containerID": CID, "exitCode": 1, "reason": "Error",
                               "startedAt": T0, "finishedAt": T1}}))]})),
                    json!({"spec": {"restartPolicy": "Always"}}),
                ),
                "2025-03-01T11:00:00Z",
                RUNNING,
                true,
                "restarting",
            ),
            row(
                "Failed while the container still says running: node gone",
                failed_with(
                    "",
                    "",
                    json!([disruption(
                        "DeletionByPodGC",
                        "PodGC: node no longer exists",
                        T1
                    )]),
                    json!([running(T0)]),
                ),
                T1,
                failed(Lost),
                true,
                "failed-while-running",
            ),
            row(
                "phase Unknown",
                pod(json!({"phase": "Unknown", "containerStatuses": [running(T0)]})),
                T1,
                failed(Lost),
                true,
                "phase-unknown",
            ),
        ]
    }

    fn deletion_rows() -> Vec<Row> {
        let deleted = |deleted_at: &str| {
            json!({"metadata": {
            "deletionTimestamp": deleted_at, "deletionGracePeriodSeconds": 30}})
        };
        vec![
            // Request at 10:03:00 (10:03:30 minus 30s grace), exit 0 at 10:03:40: SIGTERM trapped.
            row(
                "deleted while running, exits 0: lost",
                with(
                    pod(json!({"phase": "Succeeded",
                    "containerStatuses": [exited("step", 0, "Completed", T0, T1)]})),
                    deleted("2025-03-01T10:03:30Z"),
                ),
                T1,
                failed(Lost),
                true,
                "deleted-while-running",
            ),
            row(
                "deleted while running, dies of SIGTERM: lost",
                with(
                    failed_with(
                        "Error",
                        "",
                        json!([]),
                        json!([exited("step", 143, "Error", T0, T1)]),
                    ),
                    deleted("2025-03-01T10:03:30Z"),
                ),
                T1,
                failed(Lost),
                true,
                "deleted-while-running",
            ),
            // Request at 10:05:00, after the 10:03:40 exit: a real success.
            row(
                "deleted after it finished: success",
                with(
                    pod(json!({"phase": "Succeeded",
                    "containerStatuses": [exited("step", 0, "Completed", T0, T1)]})),
                    deleted("2025-03-01T10:05:30Z"),
                ),
                T1,
                SUCCEEDED,
                true,
                "succeeded",
            ),
        ]
    }

    fn deadline_rows() -> Vec<Row> {
        let deadline = json!({"spec": {"activeDeadlineSeconds": 60}});
        vec![
            row(
                "DeadlineExceeded of a scheduled Pod",
                with(
                    failed_with(
                        "DeadlineExceeded",
                        "Pod was active on the node longer than the specified deadline",
                        json!([]),
                        json!([exited("step", 137, "Error", T0, T1)]),
                    ),
                    deadline.clone(),
                ),
                T1,
                failed(Timeout),
                true,
                "active-deadline-exceeded",
            ),
            // Never bound, so no startTime: the deadline never fires; Unschedulable decides.
            row(
                "unscheduled Pod with a deadline, before grace",
                with(unschedulable(CREATED), deadline.clone()),
                "2025-03-01T10:05:00Z",
                PENDING,
                false,
                "unschedulable-waiting",
            ),
            row(
                "unscheduled Pod with a deadline, after grace",
                with(unschedulable(CREATED), deadline),
                "2025-03-01T10:10:00Z",
                failed(InfraNeverStarted),
                false,
                "unschedulable-expired",
            ),
        ]
    }

    fn eviction_rows() -> Vec<Row> {
        let memory = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 91Mi. Container step was using 1510Mi, request is 0, has larger consumption of memory.";
        vec![
            row(
                "evicted while pending",
                failed_with(
                    "Evicted",
                    memory,
                    json!([disruption("TerminationByKubelet", memory, T1)]),
                    json!([status_unknown(None)]),
                ),
                T1,
                failed(InfraNeverStarted),
                false,
                "evicted-before-start",
            ),
            row(
                "evicted while running",
                failed_with(
                    "Evicted",
                    memory,
                    json!([disruption("TerminationByKubelet", memory, T1)]),
                    json!([exited("step", 137, "Error", T0, T1)]),
                ),
                T1,
                failed(InfraPostStart),
                true,
                "evicted-after-start",
            ),
            row(
                "Evicted at admission: rejected",
                failed_with(
                    "Evicted",
                    "Pod was rejected: The node had condition: [DiskPressure]. ",
                    json!([]),
                    json!(null),
                ),
                T1,
                failed(InfraNeverStarted),
                false,
                "kubelet-admission-rejected",
            ),
        ]
    }

    fn admission_rows() -> Vec<Row> {
        let rejected = |reason: &str, message: &str| {
            failed_with(
                reason,
                &format!("Pod was rejected: {message}"),
                json!([]),
                json!(null),
            )
        };
        vec![
            row(
                "OutOfcpu",
                rejected(
                    "OutOfcpu",
                    "Node didn't have enough resource: cpu, requested: 4000, used: 1500, capacity: 4000",
                ),
                T1,
                failed(InfraNeverStarted),
                false,
                "kubelet-admission-rejected",
            ),
            row(
                "NodeAffinity",
                rejected(
                    "NodeAffinity",
                    "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
                ),
                T1,
                failed(InfraNeverStarted),
                false,
                "kubelet-admission-rejected",
            ),
            row(
                "UnexpectedAdmissionError",
                rejected(
                    "UnexpectedAdmissionError",
                    "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices nvidia.com/gpu, which is unexpected",
                ),
                T1,
                failed(InfraNeverStarted),
                false,
                "kubelet-admission-rejected",
            ),
            row(
                "NodeShutdown at admission",
                rejected(
                    "NodeShutdown",
                    "Pod was rejected as the node is shutting down.",
                ),
                T1,
                failed(InfraNeverStarted),
                false,
                "node-shutdown-before-start",
            ),
        ]
    }

    fn disruption_rows() -> Vec<Row> {
        let shutdown = "Pod was terminated in response to imminent node shutdown.";
        let preempt = "default-scheduler: preempting to accommodate a higher priority pod";
        let shutting = "Node is shutting, evicting pods";
        vec![
            row(
                "node shutdown of a running Pod, older wording (Shutdown)",
                failed_with(
                    "Shutdown",
                    shutting,
                    json!([]),
                    json!([exited("step", 137, "Error", T0, T1)]),
                ),
                T1,
                failed(InfraPostStart),
                true,
                "node-shutdown-after-start",
            ),
            row(
                "node shutdown of a running Pod, NodeShutdown",
                failed_with(
                    "NodeShutdown",
                    shutting,
                    json!([]),
                    json!([exited("step", 143, "Error", T0, T1)]),
                ),
                T1,
                failed(InfraPostStart),
                true,
                "node-shutdown-after-start",
            ),
            row(
                "node shutdown before the container started, older wording",
                failed_with(
                    "Shutdown",
                    shutting,
                    json!([]),
                    json!([status_unknown(None)]),
                ),
                T1,
                failed(InfraNeverStarted),
                false,
                "node-shutdown-before-start",
            ),
            row(
                "node shutdown of a running Pod",
                failed_with(
                    "Terminated",
                    shutdown,
                    json!([disruption("TerminationByKubelet", shutdown, T1)]),
                    json!([exited("step", 143, "Error", T0, T1)]),
                ),
                T1,
                failed(InfraPostStart),
                true,
                "node-shutdown-after-start",
            ),
            row(
                "preemption of a running Pod",
                failed_with(
                    "",
                    "",
                    json!([disruption("PreemptionByScheduler", preempt, T1)]),
                    json!([exited("step", 137, "Error", T0, T1)]),
                ),
                T1,
                failed(InfraPostStart),
                true,
                "disrupted-after-start",
            ),
            row(
                "preemption before the container started",
                failed_with(
                    "",
                    "",
                    json!([disruption("PreemptionByScheduler", preempt, T1)]),
                    json!([status_unknown(None)]),
                ),
                T1,
                failed(InfraNeverStarted),
                false,
                "disrupted-before-start",
            ),
            // The condition lands with the terminal phase; evidence, not the condition, decides.
            row(
                "DisruptionTarget late, container had run",
                failed_with(
                    "",
                    "",
                    json!([disruption(
                        "DeletionByTaintManager",
                        "Taint manager: deleting due to NoExecute taint",
                        T1
                    )]),
                    json!([exited("step", 1, "Error", T0, T1)]),
                ),
                T1,
                failed(InfraPostStart),
                true,
                "disrupted-after-start",
            ),
            row(
                "DisruptionTarget late, nothing had run",
                failed_with(
                    "",
                    "",
                    json!([disruption(
                        "EvictionByEvictionAPI",
                        "Eviction API: evicting",
                        T1
                    )]),
                    json!([status_unknown(None)]),
                ),
                T1,
                failed(InfraNeverStarted),
                false,
                "disrupted-before-start",
            ),
        ]
    }

    fn look_alike_rows() -> Vec<Row> {
        let start_error = |message: &str| {
            let state = json!({"terminated": {"containerID": CID, "exitCode": 128, "reason": "StartError",
                "message": message, "startedAt": "1970-01-01T00:00:00Z", "finishedAt": T1}});
            failed_with(
                "",
                "",
                json!([]),
                json!([status("step", Some(CID), state, json!({}))]),
            )
        };
        let cannot_run = {
            let state = json!({"terminated": {"containerID": "docker://7a1e", "exitCode": 127,
                "reason": "ContainerCannotRun", "startedAt": T0, "finishedAt": T0,
                "message": "OCI runtime create failed: runc create failed: unable to start container process: exec: \"mkae\": executable file not found in $PATH: unknown"}});
            failed_with(
                "",
                "",
                json!([]),
                json!([status("step", Some("docker://7a1e"), state, json!({}))]),
            )
        };
        vec![
            row(
                "ContainerStatusUnknown without evidence: never started",
                failed_with("", "", json!([]), json!([status_unknown(None)])),
                T1,
                failed(InfraNeverStarted),
                false,
                "status-unknown-never-started",
            ),
            row(
                "ContainerStatusUnknown over a container that existed: lost",
                failed_with("", "", json!([]), json!([status_unknown(Some(CID))])),
                T1,
                failed(Lost),
                true,
                "status-unknown-after-start",
            ),
            row(
                "StartError 1970, executable missing: config",
                start_error(
                    "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: \"/app/run\": stat /app/run: no such file or directory: unknown",
                ),
                T1,
                failed(Config),
                false,
                "start-error-config",
            ),
            row(
                "StartError 1970, other cause: never started",
                start_error(
                    "failed to create containerd task: failed to create shim task: context deadline exceeded: unknown",
                ),
                T1,
                failed(InfraNeverStarted),
                false,
                "start-error",
            ),
            row(
                "ContainerCannotRun 127: config",
                cannot_run,
                T1,
                failed(Config),
                false,
                "start-error-config",
            ),
        ]
    }

    /// Each waiting reason before and after its grace (defaults: pull 5m, config 2m).
    fn waiting_rows() -> Vec<Row> {
        let pull = |reason: &str| {
            pending_with(
                waiting(
                    "step",
                    reason,
                    "failed to pull and unpack image \"registry.example.com/team/build:1.4\": 401 Unauthorized",
                ),
                CREATED,
            )
        };
        let config = |reason: &str| {
            pending_with(
                waiting("step", reason, "secret \"deploy-token\" not found"),
                CREATED,
            )
        };
        let before = "2025-03-01T10:01:00Z";
        let after_pull = "2025-03-01T10:05:00Z";
        let after_config = "2025-03-01T10:02:00Z";
        let never = failed(InfraNeverStarted);
        vec![
            row(
                "ErrImagePull before grace",
                pull("ErrImagePull"),
                before,
                PENDING,
                false,
                "image-pull-waiting",
            ),
            row(
                "ErrImagePull after grace",
                pull("ErrImagePull"),
                after_pull,
                never,
                false,
                "image-pull-expired",
            ),
            row(
                "ImagePullBackOff before grace",
                pull("ImagePullBackOff"),
                before,
                PENDING,
                false,
                "image-pull-waiting",
            ),
            row(
                "ImagePullBackOff after grace",
                pull("ImagePullBackOff"),
                after_pull,
                never,
                false,
                "image-pull-expired",
            ),
            row(
                "RegistryUnavailable before grace",
                pull("RegistryUnavailable"),
                before,
                PENDING,
                false,
                "image-pull-waiting",
            ),
            row(
                "RegistryUnavailable after grace",
                pull("RegistryUnavailable"),
                after_pull,
                never,
                false,
                "image-pull-expired",
            ),
            row(
                "CreateContainerConfigError before grace",
                config("CreateContainerConfigError"),
                before,
                PENDING,
                false,
                "create-config-waiting",
            ),
            row(
                "CreateContainerConfigError after grace",
                config("CreateContainerConfigError"),
                after_config,
                never,
                false,
                "create-config-expired",
            ),
            row(
                "CreateContainerError before grace",
                config("CreateContainerError"),
                before,
                PENDING,
                false,
                "create-config-waiting",
            ),
            row(
                "CreateContainerError after grace",
                config("CreateContainerError"),
                after_config,
                never,
                false,
                "create-config-expired",
            ),
            row(
                "InvalidImageName at once",
                pending_with(
                    waiting(
                        "step",
                        "InvalidImageName",
                        "Failed to apply default image tag \"Registry/Build:\": couldn't parse image name",
                    ),
                    CREATED,
                ),
                CREATED,
                failed(Config),
                false,
                "image-unusable",
            ),
            row(
                "ErrImageNeverPull at once",
                pending_with(
                    waiting(
                        "step",
                        "ErrImageNeverPull",
                        "Container image \"build:dev\" is not present with pull policy of Never",
                    ),
                    CREATED,
                ),
                CREATED,
                failed(Config),
                false,
                "image-unusable",
            ),
            // Grace counts from when the Pod was unschedulable, not from its creation.
            row(
                "Unschedulable before grace",
                unschedulable("2025-03-01T10:05:00Z"),
                "2025-03-01T10:14:00Z",
                PENDING,
                false,
                "unschedulable-waiting",
            ),
            row(
                "Unschedulable after grace",
                unschedulable("2025-03-01T10:05:00Z"),
                "2025-03-01T10:15:00Z",
                never,
                false,
                "unschedulable-expired",
            ),
            row(
                "ContainerCreating (missing Secret volume) before deadline",
                pending_with(waiting("step", "ContainerCreating", ""), CREATED),
                "2025-03-01T10:29:00Z",
                PENDING,
                false,
                "pending",
            ),
            row(
                "ContainerCreating (missing Secret volume) after deadline",
                pending_with(waiting("step", "ContainerCreating", ""), CREATED),
                "2025-03-01T10:30:00Z",
                never,
                false,
                "pending-expired",
            ),
        ]
    }

    fn grace_source_rows() -> Vec<Row> {
        let late_bound = |bound: &str| {
            pending_with(
                waiting("step", "ImagePullBackOff", "Back-off pulling image"),
                bound,
            )
        };
        let init_pull = pod(json!({"phase": "Pending",
            "conditions": [scheduled(CREATED), condition("Initialized", "False", CREATED)],
            "initContainerStatuses": [waiting("fetch", "ImagePullBackOff", "Back-off pulling image \"fetch:2\"")],
            "containerStatuses": [waiting("step", "PodInitializing", "")]}));
        let init_ran = pod(json!({"phase": "Pending",
            "conditions": [scheduled(CREATED), condition("Initialized", "True", T1)],
            "initContainerStatuses": [exited("fetch", 0, "Completed", T0, T1)],
            "containerStatuses": [waiting("step", "ErrImagePull", "manifest unknown")]}));
        vec![
            // Bound at 10:08: the pull has waited 4 minutes, the Pod 12.
            row(
                "pull grace counts from scheduling",
                late_bound("2025-03-01T10:08:00Z"),
                "2025-03-01T10:12:00Z",
                PENDING,
                false,
                "image-pull-waiting",
            ),
            // The overall pending deadline backs up the specific one.
            row(
                "pending deadline backs up the pull grace",
                late_bound("2025-03-01T10:28:00Z"),
                "2025-03-01T10:31:00Z",
                failed(InfraNeverStarted),
                false,
                "pending-deadline",
            ),
            row(
                "init container image pull before grace",
                init_pull.clone(),
                "2025-03-01T10:04:00Z",
                PENDING,
                false,
                "image-pull-waiting",
            ),
            row(
                "init container image pull after grace",
                init_pull,
                "2025-03-01T10:05:00Z",
                failed(InfraNeverStarted),
                false,
                "image-pull-expired",
            ),
            // An init container ran: not "never started" even though main never ran.
            row(
                "main pull expires after an init container ran",
                init_ran,
                "2025-03-01T10:09:00Z",
                failed(InfraPostStart),
                false,
                "image-pull-expired",
            ),
        ]
    }

    fn all_rows() -> Vec<Row> {
        [
            lifecycle_rows(),
            deletion_rows(),
            deadline_rows(),
            eviction_rows(),
            admission_rows(),
            disruption_rows(),
            look_alike_rows(),
            waiting_rows(),
            grace_source_rows(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    #[test]
    fn every_fact_is_judged_as_product_md_says() {
        let mut failures = Vec::new();
        for row in all_rows() {
            let pod: Pod = serde_json::from_value(row.pod).expect(row.name);
            let got = judge(&pod, "step", at(row.now), &GracePeriods::default());
            let want = (row.verdict, row.class, row.started, row.rule, row.delete);
            let seen = (got.verdict, got.class, got.started, got.rule, got.delete);
            if want != seen {
                failures.push(format!(
                    "{}:\n  want {want:?}\n  got  {seen:?} ({})",
                    row.name, got.reason
                ));
            }
            assert_eq!(
                got.class.is_some(),
                got.verdict == PodVerdict::Failed,
                "{}",
                row.name
            );
            assert!(!got.reason.is_empty(), "{}: empty reason", row.name);
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// The two halves of a Pod's end as some kubelets write them apart: the terminal
    /// phase with its reason while the containers still show how they were before (phase
    /// first), or the containers' end while the phase is still `Running` (containers first).
    /// Only an end the kubelet gives a reason of its own (a deadline, an eviction, a node
    /// shutdown, an admission rejection) can come phase first: a plain exit's phase is
    /// computed from the containers' states, in the same status.
    fn halves(pod: &Value) -> Vec<(&'static str, Value)> {
        let kubelet_reason = pod["status"]["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty());
        let mut phase_first = pod.clone();
        let mut containers_first = pod.clone();
        if let Some(statuses) = phase_first["status"]["containerStatuses"].as_array_mut() {
            for status in statuses {
                let terminated = status["state"]["terminated"].clone();
                if terminated.is_null() {
                    continue;
                }
                // A container that had started still says running; one that never did
                // still waits.
                let started = terminated["startedAt"]
                    .as_str()
                    .is_some_and(|at| !at.starts_with("1970"))
                    && status["containerID"].is_string();
                status["state"] = if started {
                    json!({"running": {"startedAt": terminated["startedAt"]}})
                } else {
                    json!({"waiting": {"reason": "ContainerCreating"}})
                };
            }
        }
        let status = &mut containers_first["status"];
        let started = status["containerStatuses"]
            .as_array()
            .is_some_and(|s| s.iter().any(|c| c["containerID"].is_string()));
        status["phase"] = json!(if started { "Running" } else { "Pending" });
        for key in ["reason", "message"] {
            if let Some(object) = status.as_object_mut() {
                object.remove(key);
            }
        }
        if let Some(conditions) = status["conditions"].as_array_mut() {
            conditions.retain(|c| c["type"] != "DisruptionTarget");
        }
        let mut halves = vec![("containers first", containers_first)];
        if kubelet_reason {
            halves.push(("phase first", phase_first));
        }
        halves
    }

    /// Every row that ends the Pod, delivered in either order: each intermediate document
    /// is judged either not over yet, or exactly as the whole end is (class and
    /// `started`). `explain-pod` judges the same documents the same way.
    #[test]
    fn every_end_comes_out_the_same_in_either_order() {
        let mut failures = Vec::new();
        for row in all_rows() {
            if row.verdict != PodVerdict::Failed || row.delete {
                continue;
            }
            let phase = row.pod["status"]["phase"].as_str().unwrap_or("");
            if phase != "Failed" {
                continue;
            }
            for (order, document) in halves(&row.pod) {
                let got = judge_json(document.clone(), row.now);
                let explained = crate::cli::explain::explain_text(
                    &document.to_string(),
                    at(row.now),
                    Some("step"),
                );
                if let Ok(explained) = explained
                    && (explained.verdict, explained.class) != (got.verdict, got.class)
                {
                    failures.push(format!("{} ({order}): explain-pod disagrees", row.name));
                }
                let terminal = matches!(got.verdict, PodVerdict::Failed | PodVerdict::Succeeded);
                if terminal && (got.class, got.started) != (row.class, row.started) {
                    failures.push(format!(
                        "{} ({order}): {:?} started {} by {} ({}), the whole end is {:?} started {}",
                        row.name, got.class, got.started, got.rule, got.reason, row.class, row.started
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    fn judge_json(pod: Value, now: &str) -> Judgement {
        let pod: Pod = serde_json::from_value(pod).expect("test pod");
        judge(&pod, "step", at(now), &GracePeriods::default())
    }

    #[test]
    fn reasons_and_exit_codes() {
        let step = judge_json(
            failed_with(
                "",
                "",
                json!([]),
                json!([exited("step", 2, "Error", T0, T1)]),
            ),
            T1,
        );
        assert_eq!(
            (step.reason.as_str(), step.exit_code),
            ("exit code 2", Some(2))
        );
        let oom = judge_json(
            failed_with(
                "",
                "",
                json!([]),
                json!([exited("step", 137, "OOMKilled", T0, T1)]),
            ),
            T1,
        );
        assert_eq!(
            (oom.reason.as_str(), oom.exit_code),
            ("OOMKilled", Some(137))
        );
        let init = judge_json(
            pod(json!({"phase": "Failed",
                "initContainerStatuses": [exited("migrate", 3, "Error", T0, T1)],
                "containerStatuses": [waiting("step", "PodInitializing", "")]})),
            T1,
        );
        assert_eq!(init.exit_code, Some(3));
        assert!(
            init.reason.contains("init container migrate"),
            "{}",
            init.reason
        );
        let preempted = judge_json(
            failed_with(
                "",
                "",
                json!([disruption("PreemptionByScheduler", "preempting", T1)]),
                json!([exited("step", 137, "Error", T0, T1)]),
            ),
            T1,
        );
        assert!(
            preempted.reason.contains("PreemptionByScheduler"),
            "{}",
            preempted.reason
        );
    }

    #[test]
    fn the_only_container_is_the_step_whatever_its_name() {
        let pod: Pod = serde_json::from_value(failed_with(
            "",
            "",
            json!([]),
            json!([exited("step", 4, "Error", T0, T1)]),
        ))
        .expect("test pod");
        let got = judge(&pod, "not-the-name", at(T1), &GracePeriods::default());
        assert_eq!((got.class, got.started), (Some(Step), true));
    }

    #[test]
    fn a_sibling_container_is_not_the_step() {
        let two = with(
            failed_with(
                "",
                "",
                json!([]),
                json!([
                    exited("step", 0, "Completed", T0, T1),
                    exited("uploader", 1, "Error", T0, T1)
                ]),
            ),
            json!({"spec": {"containers": [
                {"name": "step", "image": IMAGE}, {"name": "uploader", "image": IMAGE}
            ]}}),
        );
        let got = judge_json(two, T1);
        assert_eq!(
            (got.class, got.rule),
            (Some(Step), "other-container-failed")
        );
    }

    #[test]
    fn empty_and_odd_pods_do_not_panic() {
        for value in [
            json!({}),
            json!({"status": {}}),
            json!({"status": {"phase": "Weird"}}),
            json!({"status": {"phase": "Failed"}}),
            json!({"status": {"phase": "Succeeded"}}),
        ] {
            let pod: Pod = serde_json::from_value(value).expect("pod");
            let got = judge(&pod, "step", Timestamp(0), &GracePeriods::default());
            assert!(!got.rule.is_empty());
        }
    }

    #[test]
    fn long_messages_are_bounded() {
        let message = "x".repeat(10_000);
        let got = judge_json(failed_with("Evicted", &message, json!([]), json!(null)), T1);
        assert!(got.reason.chars().count() <= REASON_MAX_CHARS + 1);
    }

    #[test]
    fn sidecar_killed_at_the_end_is_not_a_failure() {
        let with_sidecar = with(
            pod(json!({"phase": "Succeeded",
                "initContainerStatuses": [exited("proxy", 137, "Error", T0, T1)],
                "containerStatuses": [exited("step", 0, "Completed", T0, T1)]})),
            json!({"spec": {"initContainers": [{"name": "proxy", "image": IMAGE, "restartPolicy": "Always"}]}}),
        );
        assert_eq!(judge_json(with_sidecar, T1).verdict, PodVerdict::Succeeded);
    }
}

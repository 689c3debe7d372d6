//! The scripted kubelet (plus the scheduler's and controllers' status writes).
//!
//! Each transition writes the fields, reasons and messages the real components
//! write; the sources are cited next to each one (paths in kubernetes/kubernetes).
//! Every write goes through the store: resourceVersion bump + MODIFIED event.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::admission::{self, now};
use super::store::{Key, Shared, State, Termination};

// --- messages, verbatim from the Kubernetes source ---------------------------

/// pkg/kubelet/status/status_manager.go TerminatePod and
/// pkg/kubelet/kubelet_pods.go convertToAPIContainerStatuses.
pub const STATUS_UNKNOWN_MESSAGE: &str =
    "The container could not be located when the pod was terminated";
/// pkg/kubelet/eviction/helpers.go: Reason, nodeLowMessageFmt, thresholdMetMessageFmt,
/// containerMessageFmt (trailing spaces included).
pub const EVICTED_REASON: &str = "Evicted";
/// pkg/kubelet/nodeshutdown/nodeshutdown_manager.go: nodeShutdownReason/Message.
pub const NODE_SHUTDOWN_REASON: &str = "Terminated";
pub const NODE_SHUTDOWN_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// pkg/kubelet/nodeshutdown: nodeShutdownNotAdmittedMessage.
pub const NODE_SHUTDOWN_NOT_ADMITTED_MESSAGE: &str =
    "Pod was rejected as the node is shutting down.";
/// pkg/kubelet/active_deadline.go: reason and message.
pub const DEADLINE_REASON: &str = "DeadlineExceeded";
pub const DEADLINE_MESSAGE: &str = "Pod was active on the node longer than the specified deadline";
/// pkg/controller/podgc/gc_controller.go gcOrphaned.
pub const PODGC_MESSAGE: &str = "PodGC: node no longer exists";

/// The order in which the kubelet lists Pod conditions (kubelet_pods.go generateAPIPodStatus).
const CONDITION_ORDER: &[&str] = &[
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
    "DisruptionTarget",
];

/// Handle on the scripted kubelet of a `FakeCluster`.
#[derive(Clone)]
pub struct Kubelet {
    pub(super) shared: Arc<Shared>,
}

/// Ids minted for one write.
struct Gen {
    hex: Vec<String>,
    n: u64,
}

impl Gen {
    fn container_id(&mut self) -> String {
        format!("containerd://{}", self.hex.pop().unwrap_or_default())
    }
    fn digest(&mut self) -> String {
        self.hex.pop().unwrap_or_default()
    }
}

fn mint(st: &mut State) -> Gen {
    Gen {
        hex: (0..6).map(|_| admission::hex(st, 64)).collect(),
        n: st.next_seq(),
    }
}

// --- Pod status helpers --------------------------------------------------------

fn status(pod: &mut Pod) -> &mut PodStatus {
    pod.status.get_or_insert_with(PodStatus::default)
}

fn containers(pod: &Pod) -> Vec<(String, String)> {
    pod.spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

/// `busybox` → `docker.io/library/busybox:latest`, as containerd reports images.
pub fn normalize_image(image: &str) -> String {
    let (repo, rest) = match image.find('@') {
        Some(i) => (&image[..i], &image[i..]),
        None => (image, ""),
    };
    let last = repo.rsplit('/').next().unwrap_or(repo);
    let mut full = if repo.contains('/') {
        let first = repo.split('/').next().unwrap_or("");
        if first.contains('.') || first.contains(':') || first == "localhost" {
            repo.to_string()
        } else {
            format!("docker.io/{repo}")
        }
    } else {
        format!("docker.io/library/{repo}")
    };
    if rest.is_empty() && !last.contains(':') {
        full.push_str(":latest");
    }
    full.push_str(rest);
    full
}

fn unready_message(pod: &Pod) -> String {
    let names: Vec<String> = containers(pod).into_iter().map(|(n, _)| n).collect();
    format!("containers with unready status: [{}]", names.join(" "))
}

/// podutil.UpdatePodCondition: lastTransitionTime moves only when status changes.
fn set_condition(
    pod: &mut Pod,
    type_: &str,
    cond_status: &str,
    reason: Option<&str>,
    message: Option<&str>,
) {
    let st = status(pod);
    let conds = st.conditions.get_or_insert_with(Vec::new);
    let fresh = PodCondition {
        type_: type_.to_string(),
        status: cond_status.to_string(),
        reason: reason.map(str::to_string),
        message: message.map(str::to_string),
        last_transition_time: Some(now()),
        last_probe_time: None,
        ..PodCondition::default()
    };
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let keep_time = c.status == cond_status;
            let old_time = c.last_transition_time.clone();
            *c = fresh;
            if keep_time {
                c.last_transition_time = old_time;
            }
        }
        None => conds.push(fresh),
    }
    conds.sort_by_key(|c| {
        CONDITION_ORDER
            .iter()
            .position(|t| *t == c.type_)
            .unwrap_or(CONDITION_ORDER.len())
    });
}

fn waiting_state(reason: &str, message: Option<&str>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message: message.map(str::to_string),
        }),
        ..ContainerState::default()
    }
}

/// Ensures one status per spec container; new ones wait in ContainerCreating.
fn container_statuses(pod: &mut Pod) -> &mut Vec<ContainerStatus> {
    let specs = containers(pod);
    let list = status(pod).container_statuses.get_or_insert_with(Vec::new);
    for (name, image) in specs {
        if !list.iter().any(|c| c.name == name) {
            list.push(ContainerStatus {
                name,
                image: normalize_image(&image),
                image_id: String::new(),
                ready: false,
                restart_count: 0,
                started: Some(false),
                state: Some(waiting_state("ContainerCreating", None)),
                ..ContainerStatus::default()
            });
        }
    }
    list
}

fn is_scheduled(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

fn is_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|l| {
            l.iter()
                .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod).as_str(), "Succeeded" | "Failed")
}

/// The scheduler's binding (pkg/registry/core/pod/storage BindingREST: sets
/// spec.nodeName and PodScheduled=True).
fn bind(pod: &mut Pod, node: &str) {
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node.to_string());
    }
    set_condition(pod, "PodScheduled", "True", None, None);
}

/// The kubelet's first status after admitting a Pod (kubelet_pods.go
/// generateAPIPodStatus; startTime set by status_manager updateStatusInternal).
fn admitted(pod: &mut Pod, g: &Gen) {
    let msg = unready_message(pod);
    let st = status(pod);
    st.phase = Some("Pending".into());
    st.host_ip = Some("10.0.0.11".into());
    st.host_ips = Some(vec![HostIP {
        ip: "10.0.0.11".into(),
    }]);
    if st.start_time.is_none() {
        st.start_time = Some(now());
    }
    let _ = g;
    set_condition(pod, "PodReadyToStartContainers", "False", None, None);
    set_condition(pod, "Initialized", "True", None, None);
    set_condition(
        pod,
        "Ready",
        "False",
        Some("ContainersNotReady"),
        Some(&msg),
    );
    set_condition(
        pod,
        "ContainersReady",
        "False",
        Some("ContainersNotReady"),
        Some(&msg),
    );
    container_statuses(pod);
}

fn run_containers(pod: &mut Pod, g: &mut Gen) {
    let ip = format!("10.244.1.{}", 2 + g.n % 250);
    {
        let st = status(pod);
        st.phase = Some("Running".into());
        st.pod_ip = Some(ip.clone());
        st.pod_ips = Some(vec![PodIP { ip }]);
    }
    for cs in container_statuses(pod).iter_mut() {
        if cs.state.as_ref().is_some_and(|s| s.running.is_some()) {
            continue;
        }
        cs.container_id = Some(g.container_id());
        let repo = cs.image.split(':').next().unwrap_or(&cs.image).to_string();
        cs.image_id = format!("{repo}@sha256:{}", g.digest());
        cs.state = Some(ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(now()),
            }),
            ..ContainerState::default()
        });
        cs.ready = true;
        cs.started = Some(true);
    }
    set_condition(pod, "PodReadyToStartContainers", "True", None, None);
    set_condition(pod, "Ready", "True", None, None);
    set_condition(pod, "ContainersReady", "True", None, None);
}

/// Ends every container: running ones terminate with `code` (reason from the
/// runtime: "Completed" for 0, else `reason`); ones that never started get the
/// kubelet's ContainerStatusUnknown rewrite (exit 137, no timestamps).
fn terminate_containers(pod: &mut Pod, code: i32, reason: &str, message: Option<&str>) {
    for cs in container_statuses(pod).iter_mut() {
        let state = cs.state.clone().unwrap_or_default();
        if state.terminated.is_some() {
            continue;
        }
        let terminated = match state.running {
            Some(running) => ContainerStateTerminated {
                exit_code: code,
                reason: Some(if code == 0 {
                    "Completed".into()
                } else {
                    reason.to_string()
                }),
                message: message.map(str::to_string),
                started_at: running.started_at,
                finished_at: Some(now()),
                container_id: cs.container_id.clone(),
                ..ContainerStateTerminated::default()
            },
            None => ContainerStateTerminated {
                exit_code: 137,
                reason: Some("ContainerStatusUnknown".into()),
                message: Some(STATUS_UNKNOWN_MESSAGE.into()),
                ..ContainerStateTerminated::default()
            },
        };
        cs.state = Some(ContainerState {
            terminated: Some(terminated),
            ..ContainerState::default()
        });
        cs.ready = false;
        cs.started = Some(false);
    }
}

/// getPhase for restartPolicy Never: all exited 0 → Succeeded, else Failed.
fn terminal_phase(pod: &Pod) -> &'static str {
    let ok = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|l| {
            l.iter().all(|c| {
                c.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0)
            })
        });
    if ok { "Succeeded" } else { "Failed" }
}

/// Conditions of a finished Pod (status.GeneratePodReadyCondition: PodCompleted
/// for Succeeded).
fn terminal_conditions(pod: &mut Pod) {
    let msg = unready_message(pod);
    let (reason, message) = if phase(pod) == "Succeeded" {
        ("PodCompleted", None)
    } else {
        ("ContainersNotReady", Some(msg.as_str()))
    };
    set_condition(pod, "PodReadyToStartContainers", "False", None, None);
    set_condition(pod, "Ready", "False", Some(reason), message);
    set_condition(pod, "ContainersReady", "False", Some(reason), message);
}

fn finish(pod: &mut Pod, phase_override: Option<&str>) {
    let p = phase_override
        .unwrap_or_else(|| terminal_phase(pod))
        .to_string();
    status(pod).phase = Some(p);
    terminal_conditions(pod);
}

fn disruption(pod: &mut Pod, reason: &str, message: &str) {
    set_condition(pod, "DisruptionTarget", "True", Some(reason), Some(message));
}

fn first_image(pod: &Pod) -> String {
    containers(pod)
        .first()
        .map(|(_, i)| i.clone())
        .unwrap_or_default()
}

// --- the handle -----------------------------------------------------------------

impl Kubelet {
    fn apply_key(&self, key: &Key, f: impl FnOnce(&mut Pod, &mut Gen)) -> Option<Pod> {
        self.shared.write(|st| {
            let mut g = mint(st);
            st.modify(key, |p| f(p, &mut g))
        })
    }

    fn key(&self, name: &str) -> Option<Key> {
        self.shared.lock().resolve(name)
    }

    fn apply(&self, name: &str, f: impl FnOnce(&mut Pod, &mut Gen)) -> Option<Pod> {
        let key = self.key(name)?;
        self.apply_key(&key, f)
    }

    fn get(&self, name: &str) -> Option<Pod> {
        let st = self.shared.lock();
        let key = st.resolve(name)?;
        st.pods.get(&key).cloned()
    }

    fn node(&self) -> String {
        self.shared.lock().kubelet.node.clone()
    }

    fn ensure_scheduled(&self, name: &str) {
        if self.get(name).is_some_and(|p| !is_scheduled(&p)) {
            let node = self.node();
            self.schedule(name, &node);
        }
    }

    fn ensure_running(&self, name: &str) {
        self.ensure_scheduled(name);
        if self
            .get(name)
            .is_some_and(|p| !is_running(&p) && !is_terminal(&p))
        {
            self.start(name);
        }
    }

    /// Auto mode: created Pods are scheduled, started and, when their command is
    /// a recognised `sh -c` script or env SCARAB_TEST_EXIT is set, finish.
    pub fn auto(&self, on: bool) {
        self.shared.lock().kubelet.auto = on;
    }

    /// The node auto mode and implicit scheduling bind to (default "node-1").
    pub fn set_node(&self, node: &str) {
        self.shared.lock().kubelet.node = node.to_string();
    }

    /// Auto mode pacing: delay between schedule/start steps and before exit.
    pub fn set_delays(&self, step: Duration, exit: Duration) {
        let mut st = self.shared.lock();
        st.kubelet.step_delay = step;
        st.kubelet.exit_delay = exit;
    }

    /// Auto mode: whether the registry serves `image` (Pods of an unpullable image stay
    /// in ImagePullBackOff).
    pub fn set_pullable(&self, image: &str, pullable: bool) {
        let mut st = self.shared.lock();
        if pullable {
            st.kubelet.unpullable.remove(image);
        } else {
            st.kubelet.unpullable.insert(image.to_string());
        }
    }

    /// In what order the kubelet writes the ends it decides (`EndOrder`).
    pub fn set_end_order(&self, order: super::store::EndOrder) {
        self.shared.lock().kubelet.end_order = order;
    }

    /// A Pod's end the kubelet decides: the containers' half and the Pod's half, written
    /// as the configured `EndOrder` says (two watch events when split).
    fn end(
        &self,
        name: &str,
        containers: impl Fn(&mut Pod),
        pod_level: impl Fn(&mut Pod),
    ) -> Option<Pod> {
        use super::store::EndOrder;
        let order = self.shared.lock().kubelet.end_order;
        match order {
            EndOrder::Together => self.apply(name, |p, _| {
                containers(p);
                pod_level(p);
            }),
            EndOrder::PhaseFirst => {
                self.apply(name, |p, _| pod_level(p))?;
                std::thread::sleep(Duration::from_millis(300));
                self.apply(name, |p, _| containers(p))
            }
            EndOrder::ContainersFirst => {
                self.apply(name, |p, _| containers(p))?;
                std::thread::sleep(Duration::from_millis(300));
                self.apply(name, |p, _| pod_level(p))
            }
        }
    }

    /// How a gracefully deleted Pod's process reacts to SIGTERM.
    pub fn set_termination(&self, t: Termination) {
        self.shared.lock().kubelet.termination = t;
    }

    /// Scheduler binding, then the kubelet's first status: two MODIFIED events.
    pub fn schedule(&self, name: &str, node: &str) -> Option<Pod> {
        let key = self.key(name)?;
        self.apply_key(&key, |p, _| bind(p, node))?;
        self.apply_key(&key, |p, g| admitted(p, g))
    }

    /// Containers running (containerd id, startedAt, ready), phase Running.
    pub fn start(&self, name: &str) -> Option<Pod> {
        self.ensure_scheduled(name);
        self.apply(name, run_containers)
    }

    /// Containers exit with `code` (reason Completed/Error); phase Succeeded/Failed.
    pub fn exit(&self, name: &str, code: i32) -> Option<Pod> {
        self.ensure_running(name);
        self.apply(name, |p, _| {
            terminate_containers(p, code, "Error", None);
            finish(p, None);
        })
    }

    /// The runtime's OOM kill: terminated reason OOMKilled, exit 137.
    pub fn oom_kill(&self, name: &str) -> Option<Pod> {
        self.ensure_running(name);
        self.apply(name, |p, _| {
            terminate_containers(p, 137, "OOMKilled", None);
            finish(p, None);
        })
    }

    /// Any waiting reason/message on every container (phase stays Pending).
    pub fn waiting(&self, name: &str, reason: &str, message: &str) -> Option<Pod> {
        self.ensure_scheduled(name);
        self.apply(name, |p, _| {
            for cs in container_statuses(p).iter_mut() {
                cs.state = Some(waiting_state(reason, Some(message)));
                cs.ready = false;
                cs.started = Some(false);
            }
        })
    }

    /// ErrImagePull (the CRI's error text), then ImagePullBackOff with
    /// pkg/kubelet/images/image_manager.go's "Back-off pulling image %q".
    pub fn image_pull_backoff(&self, name: &str) -> Option<Pod> {
        let image = self.get(name).map(|p| first_image(&p))?;
        let full = normalize_image(&image);
        let pull = format!(
            "rpc error: code = NotFound desc = failed to pull and unpack image {full:?}: failed to resolve reference {full:?}: {full}: not found"
        );
        self.waiting(name, "ErrImagePull", &pull)?;
        self.waiting(
            name,
            "ImagePullBackOff",
            &format!("Back-off pulling image {image:?}"),
        )
    }

    /// image_manager.go: ErrInvalidImageName "InvalidImageName",
    /// "Failed to apply default image tag %q: %v" (applyDefaultImageTag's error).
    pub fn invalid_image(&self, name: &str) -> Option<Pod> {
        let image = self.get(name).map(|p| first_image(&p))?;
        self.waiting(
            name,
            "InvalidImageName",
            &format!(
                "Failed to apply default image tag {image:?}: couldn't parse image reference {image:?}: invalid reference format"
            ),
        )
    }

    /// kuberuntime: CreateContainerConfigError for a missing Secret key/env source.
    pub fn create_container_config_error(&self, name: &str) -> Option<Pod> {
        self.waiting(
            name,
            "CreateContainerConfigError",
            "secret \"scarab-missing\" not found",
        )
    }

    /// The scheduler's failure (pkg/scheduler/schedule_one.go handleSchedulingFailure:
    /// PodScheduled=False, reason Unschedulable, FitError message).
    pub fn unschedulable(&self, name: &str) -> Option<Pod> {
        self.apply(name, |p, _| {
            status(p).phase = Some("Pending".into());
            set_condition(
                p,
                "PodScheduled",
                "False",
                Some("Unschedulable"),
                Some("0/3 nodes are available: 3 Insufficient memory. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."),
            );
        })
    }

    /// Node-pressure eviction (pkg/kubelet/eviction/eviction_manager.go synchronize →
    /// evictPod, helpers.go evictionMessage): phase Failed, reason Evicted, the
    /// message, and DisruptionTarget reason TerminationByKubelet in the same write.
    /// `running == false`: the containers never started and get the
    /// ContainerStatusUnknown rewrite; otherwise they are killed (exit 137).
    pub fn evict(&self, name: &str, running: bool) -> Option<Pod> {
        if running {
            self.ensure_running(name);
        } else {
            self.ensure_scheduled(name);
        }
        let cname = self
            .get(name)
            .and_then(|p| containers(&p).first().map(|c| c.0.clone()))
            .unwrap_or_default();
        let mut message =
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. "
                .to_string();
        if running {
            message.push_str(&format!(
                "Container {cname} was using 1953124Ki, request is 0, has larger consumption of memory. "
            ));
        }
        self.end(
            name,
            |p| terminate_containers(p, 137, "Error", None),
            |p| {
                let st = status(p);
                st.phase = Some("Failed".into());
                st.reason = Some(EVICTED_REASON.into());
                st.message = Some(message.clone());
                terminal_conditions(p);
                disruption(p, "TerminationByKubelet", &message);
            },
        )
    }

    /// Scheduler preemption (pkg/scheduler/framework/preemption/preemption.go
    /// prepareCandidate): DisruptionTarget PreemptionByScheduler, then a graceful
    /// delete with the Pod's terminationGracePeriodSeconds.
    pub fn preempt(&self, name: &str) -> Option<Pod> {
        let key = self.key(name)?;
        let pod = self.apply_key(&key, |p, _| {
            let scheduler = p
                .spec
                .as_ref()
                .and_then(|s| s.scheduler_name.clone())
                .unwrap_or_else(|| "default-scheduler".into());
            disruption(
                p,
                "PreemptionByScheduler",
                &format!("{scheduler}: preempting to accommodate a higher priority pod"),
            );
        })?;
        let grace = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        graceful_delete(&self.shared, &key, grace)
    }

    /// Graceful node shutdown (nodeshutdown_manager.go killPods): phase Failed
    /// unless already Succeeded, reason Terminated, DisruptionTarget
    /// TerminationByKubelet; running containers die of SIGTERM (143).
    pub fn node_shutdown(&self, name: &str) -> Option<Pod> {
        self.ensure_scheduled(name);
        self.end(
            name,
            |p| terminate_containers(p, 143, "Error", None),
            |p| {
                let ph = if phase(p) == "Succeeded" {
                    "Succeeded"
                } else {
                    "Failed"
                };
                finish(p, Some(ph));
                let st = status(p);
                st.reason = Some(NODE_SHUTDOWN_REASON.into());
                st.message = Some(NODE_SHUTDOWN_MESSAGE.into());
                disruption(p, "TerminationByKubelet", NODE_SHUTDOWN_MESSAGE);
            },
        )
    }

    /// Kubelet admission rejection (pkg/kubelet/kubelet.go rejectPod:
    /// phase Failed, reason, message "Pod was rejected: " + message). Known reasons
    /// get the admit handler's message; containers never get a status.
    pub fn admission_reject(&self, name: &str, reason: &str) -> Option<Pod> {
        let message = match reason {
            // pkg/kubelet/lifecycle/predicate.go: "Predicate %s failed: %s"
            "NodeAffinity" => "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector".to_string(),
            "UnexpectedAdmissionError" => "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected".to_string(),
            "NodeShutdown" => NODE_SHUTDOWN_NOT_ADMITTED_MESSAGE.to_string(),
            "OutOfcpu" => "Node didn't have enough resource: cpu, requested: 4000, used: 0, capacity: 2000".to_string(),
            "OutOfmemory" => "Node didn't have enough resource: memory, requested: 8589934592, used: 0, capacity: 4294967296".to_string(),
            other => format!("Predicate {other} failed"),
        };
        self.admission_reject_with(name, reason, &message)
    }

    /// As `admission_reject` with an explicit admit-handler message.
    pub fn admission_reject_with(&self, name: &str, reason: &str, message: &str) -> Option<Pod> {
        let key = self.key(name)?;
        if self.get(name).is_some_and(|p| !is_scheduled(&p)) {
            let node = self.node();
            self.apply_key(&key, |p, _| bind(p, &node))?;
        }
        self.apply_key(&key, |p, _| {
            let st = status(p);
            st.phase = Some("Failed".into());
            st.reason = Some(reason.to_string());
            st.message = Some(format!("Pod was rejected: {message}"));
            if st.start_time.is_none() {
                st.start_time = Some(now());
            }
        })
    }

    /// activeDeadlineSeconds (pkg/kubelet/active_deadline.go): phase Failed, reason
    /// DeadlineExceeded; the kubelet kills the containers (SIGTERM: 143) or, never
    /// started, rewrites them as ContainerStatusUnknown.
    pub fn deadline_exceeded(&self, name: &str) -> Option<Pod> {
        self.ensure_scheduled(name);
        self.end(
            name,
            |p| terminate_containers(p, 143, "Error", None),
            |p| {
                finish(p, Some("Failed"));
                let st = status(p);
                st.reason = Some(DEADLINE_REASON.into());
                st.message = Some(DEADLINE_MESSAGE.into());
            },
        )
    }

    /// containerd's StartError: exit 128, startedAt 1970-01-01T00:00:00Z, the
    /// runc message naming the missing executable; phase Failed.
    pub fn start_error(&self, name: &str) -> Option<Pod> {
        self.ensure_scheduled(name);
        let exe = self
            .get(name)
            .and_then(|p| {
                let c = p.spec?.containers.into_iter().next()?;
                c.command
                    .and_then(|v| v.into_iter().next())
                    .or_else(|| c.args.and_then(|v| v.into_iter().next()))
            })
            .unwrap_or_else(|| "/entrypoint".into());
        self.apply(name, |p, g| {
            for cs in container_statuses(p).iter_mut() {
                let cid = g.container_id();
                let repo = cs.image.split(':').next().unwrap_or(&cs.image).to_string();
                cs.image_id = format!("{repo}@sha256:{}", g.digest());
                cs.container_id = Some(cid.clone());
                cs.state = Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 128,
                        reason: Some("StartError".into()),
                        message: Some(format!(
                            "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: exec: {exe:?}: executable file not found in $PATH: unknown"
                        )),
                        started_at: Some(Time(Timestamp::UNIX_EPOCH)),
                        finished_at: Some(now()),
                        container_id: Some(cid),
                        ..ContainerStateTerminated::default()
                    }),
                    ..ContainerState::default()
                });
                cs.ready = false;
                cs.started = Some(false);
            }
            finish(p, Some("Failed"));
        })
    }

    /// The node vanished: PodGC marks the Pod Failed with DisruptionTarget
    /// DeletionByPodGC (pkg/controller/podgc/gc_controller.go
    /// markFailedAndDeletePodWithCondition); the container status still says running
    /// because no kubelet is left to update it. The Pod is not removed (call `remove`).
    pub fn node_lost(&self, name: &str) -> Option<Pod> {
        self.ensure_running(name);
        self.apply(name, |p, _| {
            status(p).phase = Some("Failed".into());
            set_condition(p, "Ready", "False", None, None);
            disruption(p, "DeletionByPodGC", PODGC_MESSAGE);
        })
    }

    /// The pre-1.x node controller's NodeLost marking: phase Unknown, container
    /// still running.
    pub fn node_lost_unknown(&self, name: &str) -> Option<Pod> {
        self.ensure_running(name);
        let (pod_name, node) = self.get(name).map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.spec.and_then(|s| s.node_name).unwrap_or_default(),
            )
        })?;
        self.apply(name, |p, _| {
            let st = status(p);
            st.phase = Some("Unknown".into());
            st.reason = Some("NodeLost".into());
            st.message = Some(format!(
                "Node {node} which was running pod {pod_name} is unresponsive"
            ));
            set_condition(p, "Ready", "False", Some("NodeLost"), None);
        })
    }

    /// Appends to the Pod's log (what `GET .../log` returns).
    pub fn append_log(&self, name: &str, text: &str) {
        self.shared.write(|st| {
            if let Some(key) = st.resolve(name)
                && let Some(uid) = st.pods.get(&key).and_then(|p| p.metadata.uid.clone())
            {
                st.append_log(&uid, text.as_bytes());
            }
        });
    }

    /// Removes the Pod at once (a force delete): DELETED event.
    pub fn remove(&self, name: &str) -> Option<Pod> {
        self.shared.write(|st| {
            let key = st.resolve(name)?;
            st.remove(&key)
        })
    }

    /// Completes a deletion held by `Termination::Hold`: SIGTERM exit (143), terminal
    /// status, then removal.
    pub fn finish_deletion(&self, name: &str) -> Option<Pod> {
        let key = self.key(name)?;
        terminate_and_remove(&self.shared, &key, None, 143)
    }
}

// --- server-side hooks: graceful deletion and auto mode -----------------------

fn alive(shared: &Shared, key: &Key, uid: &str) -> Option<Pod> {
    let st = shared.lock();
    st.pods
        .get(key)
        .filter(|p| p.metadata.uid.as_deref() == Some(uid))
        .filter(|p| p.metadata.deletion_timestamp.is_none() && !is_terminal(p))
        .cloned()
}

/// The kubelet's side of a graceful delete: terminal status (since 1.27 the
/// kubelet moves a deleted Pod to a terminal phase before the final delete), then
/// removal. `uid` guards against a re-created Pod of the same name.
fn terminate_and_remove(shared: &Shared, key: &Key, uid: Option<&str>, code: i32) -> Option<Pod> {
    shared.write(|st| {
        let pod = st.pods.get(key)?;
        if uid.is_some_and(|u| pod.metadata.uid.as_deref() != Some(u)) {
            return None;
        }
        if !is_terminal(pod) {
            st.modify(key, |p| {
                terminate_containers(p, code, "Error", None);
                finish(p, None);
            });
        }
        st.remove(key)
    })
}

/// Starts a graceful delete from inside the cluster (preemption) the way the
/// DELETE route does.
fn graceful_delete(shared: &Arc<Shared>, key: &Key, grace: i64) -> Option<Pod> {
    let pod = shared.write(|st| {
        let pod = st.pods.get(key)?;
        if !is_scheduled(pod) || is_terminal(pod) || grace == 0 {
            return st.remove(key);
        }
        if pod.metadata.deletion_timestamp.is_some() {
            return Some(pod.clone());
        }
        st.modify(key, |p| {
            let ts = Timestamp::now();
            let at = ts
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(grace))
                .unwrap_or(ts);
            p.metadata.deletion_timestamp = Some(Time(at));
            p.metadata.deletion_grace_period_seconds = Some(grace);
            p.metadata.generation = Some(p.metadata.generation.unwrap_or(0) + 1);
        })
    })?;
    if shared.lock().pods.contains_key(key) {
        on_graceful_delete(shared, key);
    }
    Some(pod)
}

/// Called by the DELETE route after it set deletionTimestamp on a scheduled Pod.
pub fn on_graceful_delete(shared: &Arc<Shared>, key: &Key) {
    let (uid, grace, termination) = {
        let st = shared.lock();
        let Some(pod) = st.pods.get(key) else { return };
        (
            pod.metadata.uid.clone().unwrap_or_default(),
            pod.metadata.deletion_grace_period_seconds.unwrap_or(30),
            st.kubelet.termination,
        )
    };
    let Termination::Graceful { after, exit_code } = termination else {
        return;
    };
    let grace = Duration::from_secs(grace.max(0) as u64);
    let (wait, code) = if after <= grace {
        (after, exit_code)
    } else {
        (grace, 137)
    };
    let shared = shared.clone();
    let key = key.clone();
    shared.runtime.clone().spawn(async move {
        tokio::time::sleep(wait).await;
        terminate_and_remove(&shared, &key, Some(&uid), code);
    });
}

/// What an auto-mode Pod's script does.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub logs: Vec<String>,
    pub sleep: Duration,
    /// None: runs until deleted or its deadline.
    pub exit: Option<i32>,
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    for q in ['\'', '"'] {
        if let Some(inner) = s.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return inner.to_string();
        }
    }
    s.to_string()
}

/// Interprets `sh -c "echo x; sleep 1; exit 3"` (echo, sleep, exit, true, false)
/// and the env overrides SCARAB_TEST_EXIT / SCARAB_TEST_LOG / SCARAB_TEST_SLEEP_MS.
pub fn plan_for(pod: &Pod) -> Plan {
    let mut plan = Plan::default();
    let Some(c) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
        return plan;
    };
    let mut argv: Vec<String> = c.command.clone().unwrap_or_default();
    argv.extend(c.args.clone().unwrap_or_default());
    let shell = argv
        .first()
        .is_some_and(|a| matches!(a.as_str(), "sh" | "/bin/sh" | "bash" | "/bin/bash"));
    if shell && argv.get(1).map(String::as_str) == Some("-c") {
        let script = argv.get(2).cloned().unwrap_or_default();
        let mut known = true;
        let mut code = None;
        for seg in script.split(['\n', ';']).flat_map(|s| s.split("&&")) {
            let seg = seg.trim();
            let (cmd, rest) = seg.split_once(char::is_whitespace).unwrap_or((seg, ""));
            match cmd {
                "" | "true" | ":" => {}
                "false" => {
                    code = Some(1);
                    break;
                }
                "exit" => {
                    code = Some(rest.trim().parse().unwrap_or(0));
                    break;
                }
                "echo" => plan.logs.push(format!("{}\n", unquote(rest))),
                "sleep" => {
                    plan.sleep += Duration::from_secs_f64(rest.trim().parse().unwrap_or(0.0));
                }
                _ => known = false,
            }
        }
        if known {
            plan.exit = Some(code.unwrap_or(0));
        }
    }
    for e in c.env.clone().unwrap_or_default() {
        let v = e.value.unwrap_or_default();
        match e.name.as_str() {
            "SCARAB_TEST_EXIT" => plan.exit = v.trim().parse().ok().or(plan.exit),
            "SCARAB_TEST_LOG" => plan.logs.push(v),
            "SCARAB_TEST_SLEEP_MS" => {
                plan.sleep += Duration::from_millis(v.trim().parse().unwrap_or(0));
            }
            _ => {}
        }
    }
    plan
}

/// Called by the create route; drives the Pod when auto mode is on.
pub fn on_created(shared: &Arc<Shared>, key: &Key) {
    let (auto, uid) = {
        let st = shared.lock();
        let uid = st
            .pods
            .get(key)
            .and_then(|p| p.metadata.uid.clone())
            .unwrap_or_default();
        (st.kubelet.auto, uid)
    };
    if !auto {
        return;
    }
    let shared = shared.clone();
    let key = key.clone();
    shared.runtime.clone().spawn(async move {
        auto_run(shared, key, uid).await;
    });
}

async fn auto_run(shared: Arc<Shared>, key: Key, uid: String) {
    let cfg = shared.lock().kubelet.clone();
    let kubelet = Kubelet {
        shared: shared.clone(),
    };
    let name = format!("{}/{}", key.0, key.1);
    tokio::time::sleep(cfg.step_delay).await;
    if alive(&shared, &key, &uid).is_none() {
        return;
    }
    kubelet.schedule(&name, &cfg.node);
    tokio::time::sleep(cfg.step_delay).await;
    let Some(pod) = alive(&shared, &key, &uid) else {
        return;
    };
    if cfg.unpullable.contains(&first_image(&pod)) {
        kubelet.image_pull_backoff(&name);
        return;
    }
    kubelet.start(&name);
    let plan = plan_for(&pod);
    for line in &plan.logs {
        kubelet.append_log(&name, line);
    }
    // activeDeadlineSeconds counts from status.startTime (set at schedule).
    let deadline = pod
        .spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds)
        .map(|d| Duration::from_secs(d.max(0) as u64));
    let exit_after = plan.exit.map(|_| cfg.exit_delay + plan.sleep);
    let (wait, by_deadline) = match (exit_after, deadline) {
        (Some(e), Some(d)) if d < e => (d, true),
        (Some(e), _) => (e, false),
        (None, Some(d)) => (d, true),
        (None, None) => return,
    };
    tokio::time::sleep(wait).await;
    if alive(&shared, &key, &uid).is_none() {
        return;
    }
    if by_deadline {
        kubelet.deadline_exceeded(&name);
    } else {
        kubelet.exit(&name, plan.exit.unwrap_or(0));
    }
}

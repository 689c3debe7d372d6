//! The Kubernetes executor end to end: the real `scarab serve`, the real kube client, and
//! the faithful API test server with its scripted kubelet.

use crate::common;
use crate::k8s_api;

use std::time::Duration;

use common::{Server, attempts, fences};
use k8s_api::{FakeCluster, Fault, Method};

const WITHIN: Duration = Duration::from_secs(60);

/// The fake cluster on its own runtime, so the test body can block.
struct Cluster {
    cluster: FakeCluster,
    _runtime: tokio::runtime::Runtime,
}

impl Cluster {
    fn start() -> Cluster {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let cluster = runtime.block_on(FakeCluster::start());
        Cluster {
            cluster,
            _runtime: runtime,
        }
    }

    fn serve(&self, dir: &std::path::Path) -> Server {
        let kubeconfig = self.cluster.kubeconfig(dir);
        let kubeconfig = kubeconfig.to_str().expect("utf-8 path").to_string();
        Server::start_with(
            &dir.join("state"),
            &["--kubeconfig", &kubeconfig, "--kube-namespace", "default"],
        )
    }

    /// `serve` with extra arguments after the cluster's.
    fn serve_with(&self, dir: &std::path::Path, extra: &[&str]) -> Server {
        let kubeconfig = self.cluster.kubeconfig(dir);
        let kubeconfig = kubeconfig.to_str().expect("utf-8 path").to_string();
        let mut args = vec!["--kubeconfig", &kubeconfig, "--kube-namespace", "default"];
        args.extend_from_slice(extra);
        Server::start_with(&dir.join("state"), &args)
    }

    fn pod_creations(&self) -> usize {
        self.cluster
            .count_requests(&Method::POST, |path| path.ends_with("/pods"))
    }
}

/// A LIST of the Pods collection (a request target as logged), not a watch on it.
fn is_pod_list(target: &str) -> bool {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    path.ends_with("/pods")
        && !query
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1")
}

/// A LIST request that carries a continue token: a page after the first.
fn is_continued_pod_list(target: &str) -> bool {
    is_pod_list(target)
        && target.split_once('?').is_some_and(|(_, q)| {
            q.split('&')
                .any(|p| p.starts_with("continue=") && p.len() > 9)
        })
}

fn pod_name(run: &serde_json::Value, step: usize) -> String {
    let fence = fences(run, step)[0];
    format!("{}-s{step}-f{fence}", run["id"].as_str().expect("id"))
}

/// Polls until the auto kubelet has started the Pod (phase Running). A test that scripts
/// an auto-mode Pod's end must wait for this: the auto kubelet checks that the Pod has not
/// ended and then schedules and starts it, in separate steps, so an end scripted before
/// the start can be overwritten by it, and the Pod then runs its whole command.
fn wait_pod_running(cluster: &Cluster, name: &str) {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let phase = cluster
            .cluster
            .pod(name)
            .and_then(|p| p.status)
            .and_then(|s| s.phase);
        if phase.as_deref() == Some("Running") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pod {name} never ran: phase {phase:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kube_step(name: &str, script: &str) -> String {
    format!(
        "  - name: {name}\n    executor: kubernetes\n    image: alpine:3\n    command: [sh, -c, '{script}']\n"
    )
}

#[test]
fn pods_run_to_their_verdict_and_failures_are_classified() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    let server = cluster.serve(dir.path());
    let yaml = format!(
        "name: k\nsteps:\n{}{}",
        kube_step("ok", "exit 0"),
        kube_step("bad", "exit 3")
    );
    let id = server.submit(&yaml);
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(run["steps"][0]["state"], "succeeded");
    assert_eq!(run["steps"][0]["executor"], "kubernetes");
    let bad = &attempts(&run, 1)[0];
    assert_eq!(bad["class"], "step");
    assert_eq!(bad["exit_code"], 3);
    assert_eq!(bad["started"], true);
    let pod = cluster
        .cluster
        .pod(&pod_name(&run, 1))
        .expect("the failed Pod is kept for debugging");
    let spec = pod.spec.expect("spec");
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert!(
        spec.active_deadline_seconds.is_some(),
        "the kubelet enforces the timeout"
    );
    assert_eq!(cluster.pod_creations(), 2, "one Pod per attempt");
}

#[test]
fn oom_killed_pod_is_infra_post_start_and_dead_letters() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    let server = cluster.serve(dir.path());
    let id = server.submit(&format!(
        "name: k\nsteps:\n{}",
        kube_step("hog", "sleep 600")
    ));
    let run = server.wait_for(&id, WITHIN, |run| {
        attempts(run, 0)
            .first()
            .is_some_and(|a| a["state"] == "running")
    });
    let name = pod_name(&run, 0);
    wait_pod_running(&cluster, &name);
    assert!(cluster.cluster.kubelet().oom_kill(&name).is_some());
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "dead_lettered", "{run:#}");
    assert_eq!(attempts(&run, 0)[0]["class"], "infra_post_start");
    assert!(
        attempts(&run, 0)[0]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("OOMKilled")
    );
}

#[test]
fn kill9_with_a_pod_running_readopts_it_and_never_creates_it_twice() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    let mut server = cluster.serve(dir.path());
    let id = server.submit(&format!(
        "name: k\nsteps:\n{}",
        kube_step("long", "sleep 600")
    ));
    let run = server.wait_for(&id, WITHIN, |run| {
        attempts(run, 0)
            .first()
            .is_some_and(|a| a["state"] == "running")
    });
    let fence = fences(&run, 0);
    let name = pod_name(&run, 0);
    wait_pod_running(&cluster, &name);
    server.kill9();
    // The step finishes while Scarab is down.
    assert!(cluster.cluster.kubelet().exit(&name, 0).is_some());
    assert_eq!(cluster.pod_creations(), 1, "one Pod before the crash");
    // From here on the request log holds only what the restarted service sends.
    cluster.cluster.clear_request_log();
    server.restart();
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(attempts(&run, 0).len(), 1);
    assert_eq!(fences(&run, 0), fence, "re-adoption keeps the fence");
    assert_eq!(
        cluster.pod_creations(),
        0,
        "the restarted service creates no Pod: it re-adopts the one it has"
    );
    let log = cluster.cluster.request_log();
    let lists = log
        .iter()
        .filter(|(m, t)| *m == Method::GET && is_pod_list(t))
        .count();
    assert!(
        lists >= 2,
        "the restarted service lists the managed Pods at start and in its watch: {log:?}"
    );
    let gets = cluster.cluster.count_requests(&Method::GET, |p| {
        p.contains("/pods/") && !p.ends_with("/log")
    });
    assert_eq!(gets, 0, "no per-Pod GETs");
}

#[test]
fn zombie_pods_are_deleted_at_start_and_fences_are_never_reused() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    // A Pod of an attempt this store never had (a newer lineage, or a stale fence).
    let zombie_fence = 777u64;
    let zombie_run = "r01m8xaz6t4hpa5m3jsn0p2xd4n";
    let zombie = format!("{zombie_run}-s0-f{zombie_fence}");
    let manifest: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": zombie, "labels": {
            "app.kubernetes.io/managed-by": "scarab", "scarab.dev/run": zombie_run,
            "scarab.dev/step": "0", "scarab.dev/attempt": "1", "scarab.dev/fence": zombie_fence.to_string()}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "step", "image": "alpine", "command": ["sh", "-c", "sleep 600"]}]}
    }))
    .expect("pod");
    cluster
        ._runtime
        .block_on(async {
            let client = cluster.cluster.client();
            kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, "default")
                .create(&kube::api::PostParams::default(), &manifest)
                .await
        })
        .expect("create zombie");
    let server = cluster.serve(dir.path());
    let deadline = std::time::Instant::now() + WITHIN;
    while cluster.cluster.pod(&zombie).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the zombie Pod was not deleted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let id = server.submit(&format!("name: k\nsteps:\n{}", kube_step("a", "exit 0")));
    let run = server.wait_terminal(&id, WITHIN);
    assert!(
        fences(&run, 0)[0] > zombie_fence,
        "the counter was raised above the zombie's fence"
    );
}

/// A Pod labelled as Scarab's, with these run, step and fence label values, as a Pod of
/// an attempt this store never had (or one with labels Scarab could not have written).
fn managed_pod(name: &str, run: &str, step: &str, fence: &str) -> k8s_api::Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {
            "app.kubernetes.io/managed-by": "scarab", "scarab.dev/run": run,
            "scarab.dev/step": step, "scarab.dev/attempt": "1", "scarab.dev/fence": fence}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "step", "image": "alpine", "command": ["sh", "-c", "sleep 600"]}]}
    }))
    .expect("pod")
}

/// Creates `pods` through the API (eight at a time), as an earlier Scarab would have.
fn create_pods(cluster: &Cluster, pods: &[k8s_api::Pod]) {
    use futures::StreamExt;
    cluster._runtime.block_on(async {
        let api = kube::Api::<k8s_api::Pod>::namespaced(cluster.cluster.client(), "default");
        let created: Vec<_> = futures::stream::iter(pods)
            .map(|pod| {
                let api = api.clone();
                async move { api.create(&kube::api::PostParams::default(), pod).await }
            })
            .buffer_unordered(8)
            .collect()
            .await;
        for result in created {
            result.expect("create a managed Pod");
        }
    });
}

/// Polls until none of `names` is left in the cluster.
fn wait_deleted(cluster: &Cluster, names: &[String], what: &str) {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let left: Vec<&String> = names
            .iter()
            .filter(|n| cluster.cluster.pod(n).is_some())
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {} Pods not deleted, among them {:?}",
            left.len(),
            left.first()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The start-up LIST in pages: more stale managed Pods than one page (500) holds are in
/// the namespace before `scarab serve` starts. Every one is deleted, the LIST followed
/// continue tokens between the deletions of one page and the next, and the fence counter
/// is raised above the highest stale fence, which is on the last page.
#[test]
fn a_start_up_list_of_several_pages_deletes_every_stale_pod_and_counts_every_fence() {
    const STALE: u64 = 2_000;
    const PAGE: usize = 500;
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    // Run ids rise with i, so the names sort (as the API server pages them) in the order
    // of i, and the highest fence is on the last page.
    let now = scarab::clock::now().0;
    let stale: Vec<(String, u64)> = (0..STALE)
        .map(|i| {
            let run = scarab::engine::RunId(ulid::Ulid::from_parts(now - STALE + i, 7).0);
            let fence = 1_000 + i;
            (run.to_string(), fence)
        })
        .collect();
    let names: Vec<String> = stale
        .iter()
        .map(|(run, fence)| format!("{run}-s0-f{fence}"))
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, names, "the names sort in the order of their fences");
    let highest = stale.iter().map(|(_, f)| *f).max().expect("stale Pods");
    let pods: Vec<k8s_api::Pod> = stale
        .iter()
        .zip(&names)
        .map(|((run, fence), name)| managed_pod(name, run, "0", &fence.to_string()))
        .collect();
    create_pods(&cluster, &pods);
    assert_eq!(cluster.cluster.pods().len(), STALE as usize);
    cluster.cluster.clear_request_log();

    let started = std::time::Instant::now();
    let server = cluster.serve(dir.path());
    let ready = started.elapsed();
    wait_deleted(&cluster, &names, "stale Pods");
    eprintln!(
        "{STALE} stale Pods: ready after {} ms, all deleted after {} ms",
        ready.as_millis(),
        started.elapsed().as_millis()
    );

    let log = cluster.cluster.request_log();
    let mut deleted_at = std::collections::HashMap::new();
    let mut deletes = 0;
    for (i, (method, target)) in log.iter().enumerate() {
        if *method != Method::DELETE {
            continue;
        }
        deletes += 1;
        let path = target.split('?').next().unwrap_or(target);
        if let Some((_, name)) = path.rsplit_once("/pods/") {
            assert!(
                deleted_at.insert(name.to_string(), i).is_none(),
                "{name} deleted twice"
            );
        }
    }
    assert_eq!(deletes, STALE as usize, "one DELETE per stale Pod");
    let continued: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, (m, t))| *m == Method::GET && is_continued_pod_list(t))
        .map(|(i, _)| i)
        .collect();
    // Readiness waits for the one LIST (four pages), not for the deletions: they all
    // come after its last page, in the background, sixteen at a time.
    // (The watch's own listing pages too, later.)
    let pages_after_first = (STALE as usize).div_ceil(PAGE) - 1;
    assert!(
        continued.len() >= pages_after_first,
        "pages after the first: {continued:?}"
    );
    let first_delete = deleted_at.values().min().copied().expect("deletions");
    assert!(
        continued[pages_after_first - 1] < first_delete,
        "a deletion before the start-up LIST was done (continued LISTs at {continued:?}, first deletion at {first_delete}; {PAGE} Pods a page)"
    );

    cluster.cluster.kubelet().auto(true);
    let id = server.submit(&format!("name: k\nsteps:\n{}", kube_step("a", "exit 0")));
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert!(
        fences(&run, 0)[0] > highest,
        "the new attempt's fence {} is above the highest stale fence {highest}, found on the last page",
        fences(&run, 0)[0]
    );
}

/// Managed Pods whose labels no store of this lineage could have written: a fence of
/// u64::MAX and a fence label that is not a number. The service starts, deletes both,
/// does not raise its counter for them, and mints normal fences.
#[test]
fn pods_with_an_implausible_or_unreadable_fence_are_deleted_and_do_not_raise_the_counter() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    let run = "r01m8xaz6t4hpa5m3jsn0p2xd4n";
    let max = format!("{run}-s0-f{}", u64::MAX);
    let garbage = format!("{run}-s1-fgarbage");
    // A plausible stale Pod beside them: its fence (40) is counted, so the counter moves.
    let plausible = format!("{run}-s2-f40");
    create_pods(
        &cluster,
        &[
            managed_pod(&max, run, "0", &u64::MAX.to_string()),
            managed_pod(&garbage, run, "1", "garbage"),
            managed_pod(&plausible, run, "2", "40"),
        ],
    );
    assert_eq!(cluster.cluster.pods().len(), 3);
    let server = cluster.serve(dir.path());
    wait_deleted(
        &cluster,
        &[max.clone(), garbage.clone(), plausible.clone()],
        "managed Pods of no in-flight attempt",
    );
    cluster.cluster.kubelet().auto(true);
    let id = server.submit(&format!("name: k\nsteps:\n{}", kube_step("a", "exit 0")));
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let fence = fences(&run, 0)[0];
    assert!(
        fence > 40,
        "the counter must be raised above the plausible stale fence 40; minted {fence}"
    );
    assert!(
        fence < 1_000,
        "the implausible fences must not raise the counter; minted {fence}"
    );
    let id = server.submit(&format!("name: k2\nsteps:\n{}", kube_step("a", "exit 0")));
    let next = server.wait_terminal(&id, WITHIN);
    assert_eq!(next["state"], "succeeded", "{next:#}");
    assert_eq!(fences(&next, 0)[0], fence + 1, "minting goes on one by one");
}

#[test]
fn an_unreachable_api_server_delays_launches_without_losing_or_duplicating_them() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    let server = cluster.serve(dir.path());
    cluster.cluster.set_fault(Fault::Unreachable);
    let id = server.submit(&format!("name: k\nsteps:\n{}", kube_step("a", "exit 0")));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        server.run(&id)["state"],
        "queued",
        "the launch waits in the outbox"
    );
    cluster.cluster.set_fault(Fault::None);
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(
        attempts(&run, 0).len(),
        1,
        "nothing lost, nothing duplicated"
    );
    // Requests sent while the server was unreachable were dropped unread, so the log holds
    // exactly the creates the server received: one, or Scarab created the Pod twice.
    assert_eq!(cluster.pod_creations(), 1, "the Pod was created once");
}

type Script = fn(&k8s_api::Kubelet, &str) -> Option<k8s_openapi::api::core::v1::Pod>;

/// Every row of the Kubernetes column of docs/failure-classes.md, end to end through the executor:
/// the kubelet writes what Kubernetes writes; the run must end with the right class,
/// `started`, and terminal run state.
#[test]
fn every_kubernetes_row_ends_with_the_right_class_and_run_state() {
    let rows: &[(&str, Script, &str, bool, &str)] = &[
        (
            "exit-code",
            |k, n| k.start(n).and(k.exit(n, 2)),
            "step",
            true,
            "failed",
        ),
        (
            "oom",
            |k, n| k.start(n).and(k.oom_kill(n)),
            "infra_post_start",
            true,
            "dead_lettered",
        ),
        (
            "pull",
            |k, n| k.schedule(n, "node-1").and(k.image_pull_backoff(n)),
            "infra_never_started",
            false,
            "dead_lettered",
        ),
        (
            "invalid-image",
            |k, n| k.schedule(n, "node-1").and(k.invalid_image(n)),
            "config",
            false,
            "failed",
        ),
        (
            "config-error",
            |k, n| {
                k.schedule(n, "node-1")
                    .and(k.create_container_config_error(n))
            },
            "infra_never_started",
            false,
            "dead_lettered",
        ),
        (
            "unschedulable",
            |k, n| k.unschedulable(n),
            "infra_never_started",
            false,
            "dead_lettered",
        ),
        (
            "evicted-pending",
            |k, n| k.schedule(n, "node-1").and(k.evict(n, false)),
            "infra_never_started",
            false,
            "dead_lettered",
        ),
        (
            "evicted-running",
            |k, n| k.start(n).and(k.evict(n, true)),
            "infra_post_start",
            true,
            "dead_lettered",
        ),
        (
            "preempted",
            |k, n| k.start(n).and(k.preempt(n)),
            "infra_post_start",
            true,
            "dead_lettered",
        ),
        (
            "node-shutdown",
            |k, n| k.start(n).and(k.node_shutdown(n)),
            "infra_post_start",
            true,
            "dead_lettered",
        ),
        (
            "admission",
            |k, n| {
                k.schedule(n, "node-1")
                    .and(k.admission_reject(n, "NodeAffinity"))
            },
            "infra_never_started",
            false,
            "dead_lettered",
        ),
        (
            "deadline",
            |k, n| k.start(n).and(k.deadline_exceeded(n)),
            "timeout",
            true,
            "failed",
        ),
        (
            "start-error",
            |k, n| k.schedule(n, "node-1").and(k.start_error(n)),
            "config",
            false,
            "failed",
        ),
        (
            "node-lost",
            |k, n| k.start(n).and(k.node_lost(n)),
            "lost",
            true,
            "dead_lettered",
        ),
        (
            "deleted",
            |k, n| k.start(n).and(k.remove(n)),
            "lost",
            true,
            "dead_lettered",
        ),
    ];
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    let kubeconfig = cluster.cluster.kubeconfig(dir.path());
    let kubeconfig = kubeconfig.to_str().expect("utf-8").to_string();
    let grace = [
        "--kube-grace-image-pull",
        "1s",
        "--kube-grace-config",
        "1s",
        "--kube-grace-unschedulable",
        "1s",
    ];
    let mut args = vec![
        "--kubeconfig",
        &kubeconfig,
        "--kube-namespace",
        "default",
        "--infra-retries",
        "0",
    ];
    args.extend(grace);
    let server = Server::start_with(&dir.path().join("state"), &args);
    let kubelet = cluster.cluster.kubelet();
    let mut started = Vec::new();
    for (label, script, ..) in rows {
        let id = server.submit(&format!(
            "name: {label}\nsteps:\n{}",
            kube_step("s", "sleep 600")
        ));
        let run = server.wait_for(&id, WITHIN, |run| {
            attempts(run, 0)
                .first()
                .is_some_and(|a| a["state"] == "running")
        });
        let name = pod_name(&run, 0);
        assert!(
            script(&kubelet, &name).is_some(),
            "{label}: the kubelet script applies to {name}"
        );
        started.push((id, *label));
    }
    for ((id, label), (_, _, class, started_flag, state)) in started.iter().zip(rows) {
        let run = server.wait_terminal(id, WITHIN);
        let attempt = &attempts(&run, 0)[0];
        assert_eq!(attempt["class"], *class, "{label}: {run:#}");
        assert_eq!(attempt["started"], *started_flag, "{label}: {run:#}");
        assert_eq!(run["state"], *state, "{label}: {run:#}");
    }
}

/// Benchmark, not a test (run it with `cargo test --release --test it -- --ignored
/// --nocapture readopt_10k`): 10,000 in-flight Pods re-adopted at start. Prints the time
/// to ready and the requests it took; asserts only the request counts (no timing).
#[test]
#[ignore]
fn readopt_10k_pods_benchmark() {
    use scarab::engine::{
        Attempt, AttemptState, Fence, RunHeader, RunId, RunState, StepState, Timestamp,
    };
    use scarab::store::records::{LaunchAction, LaunchRecord, PipelineSource, SourceFormat};
    const PODS: u64 = 10_000;
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    let yaml = format!("name: bench\nsteps:\n{}", kube_step("s", "sleep 600"));
    let pipeline = scarab::pipeline::parse(&yaml, scarab::pipeline::Format::Yaml)
        .expect("valid")
        .pipeline;
    let action = LaunchAction::of(&pipeline.steps[0].action).expect("a launchable step");
    let LaunchAction::Kubernetes(template) = &action else {
        panic!("a kubernetes step")
    };
    let store = scarab::store::Store::open(&state.join("scarab.redb")).expect("store");
    let now = scarab::clock::now();
    let mut manifests = Vec::new();
    let mut tx = store.write().expect("write");
    for i in 0..PODS {
        let run = RunId(ulid::Ulid::from_parts(now.0 - PODS + i, u128::from(i)).0);
        let fence = Fence(i + 1);
        let header = RunHeader {
            id: run,
            pipeline_name: "bench".into(),
            origin: "local".into(),
            state: RunState::Running,
            created_at: now,
            updated_at: now,
            cancel: None,
            budget: None,
            auto_retry: Default::default(),
            admission: Default::default(),
        };
        tx.put_pipeline(
            run,
            &PipelineSource {
                format: SourceFormat::Yaml,
                text: yaml.clone(),
                params: Some(Vec::new()),
            },
        )
        .expect("pipeline");
        tx.put_run(&header, None).expect("run");
        tx.put_step(
            run,
            0,
            &scarab::engine::RunStep::in_state(StepState::Active),
        )
        .expect("step");
        let attempt = Attempt {
            number: 1,
            fence,
            created_at: now,
            state: AttemptState::Running {
                confirmed_at: now,
                backstop_due: Timestamp(now.0 + 3_600_000),
            },
            kill: None,
            outputs: Vec::new(),
        };
        tx.put_attempt(run, 0, &attempt).expect("attempt");
        let order = LaunchRecord {
            run,
            step: 0,
            step_name: "s".into(),
            attempt: 1,
            fence,
            timeout_ms: 3_600_000,
            action: action.clone(),
        };
        manifests.push(scarab::executor::kubernetes::pod::build(&order, template));
    }
    tx.set_fence_next(PODS + 1).expect("fence");
    tx.commit().expect("commit");
    drop(store);
    cluster._runtime.block_on(async {
        let api = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
            cluster.cluster.client(),
            "default",
        );
        for manifest in &manifests {
            api.create(&kube::api::PostParams::default(), manifest)
                .await
                .expect("create");
        }
    });
    cluster.cluster.clear_request_log();
    let started = std::time::Instant::now();
    let server = cluster.serve(dir.path());
    let ready = started.elapsed();
    let pages = cluster
        .cluster
        .count_requests(&Method::GET, |p| p.ends_with("/pods"));
    let gets = cluster
        .cluster
        .count_requests(&Method::GET, |p| p.contains("/pods/"));
    let deletes = cluster.cluster.count_requests(&Method::DELETE, |_| true);
    println!(
        "re-adopted {PODS} in-flight Pods: ready {} ms after start; {pages} LIST/watch requests, {gets} per-Pod GETs, {deletes} deletes",
        ready.as_millis()
    );
    assert_eq!(gets, 0, "no per-Pod GETs");
    assert_eq!(deletes, 0, "every Pod belongs to an in-flight attempt");
    // The start-up LIST and the watch's own listing, each one page per 500 Pods, plus the watch.
    assert!(
        pages as u64 <= 2 * PODS.div_ceil(500) + 4,
        "{pages} list requests"
    );
    drop(server);
}

#[test]
fn logs_are_live_while_the_pod_runs_and_archived_after_it() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    let server = cluster.serve(dir.path());
    let kubelet = cluster.cluster.kubelet();
    let id = server.submit(&format!(
        "name: k\nsteps:\n{}",
        kube_step("talk", "sleep 600")
    ));
    let run = server.wait_for(&id, WITHIN, |run| {
        attempts(run, 0)
            .first()
            .is_some_and(|a| a["state"] == "running")
    });
    let name = pod_name(&run, 0);
    assert!(kubelet.start(&name).is_some());
    kubelet.append_log(&name, "first\n");
    let (status, log) = server.get(&format!("/v1/runs/{id}/steps/talk/logs"));
    assert_eq!(status, 200);
    assert_eq!(
        log,
        serde_json::Value::String("first\n".into()),
        "live from the API"
    );
    kubelet.append_log(&name, "second\n");
    assert!(kubelet.exit(&name, 0).is_some());
    server.wait_terminal(&id, WITHIN);
    let (status, log) = server.get(&format!("/v1/runs/{id}/steps/talk/logs"));
    assert_eq!(status, 200);
    assert_eq!(
        log,
        serde_json::Value::String("first\nsecond\n".into()),
        "archived at the verdict"
    );
}

#[test]
fn kill9_while_pods_succeed_fail_vanish_and_keep_running_judges_each_once() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    let mut server = cluster.serve(dir.path());
    let kubelet = cluster.cluster.kubelet();
    let steps: String = ["ok", "fail", "gone", "still"]
        .iter()
        .map(|s| kube_step(s, "sleep 600"))
        .collect();
    let id = server.submit(&format!("name: k\nsteps:\n{steps}"));
    let run = server.wait_for(&id, WITHIN, |run| {
        (0..4).all(|i| {
            attempts(run, i)
                .first()
                .is_some_and(|a| a["state"] == "running")
        })
    });
    let names: Vec<String> = (0..4).map(|i| pod_name(&run, i)).collect();
    let before: Vec<u64> = (0..4).map(|i| fences(&run, i)[0]).collect();
    for name in &names {
        assert!(kubelet.start(name).is_some());
    }
    server.kill9();
    assert!(kubelet.exit(&names[0], 0).is_some());
    assert!(kubelet.exit(&names[1], 4).is_some());
    assert!(kubelet.remove(&names[2]).is_some());
    server.restart();
    let run = server.wait_for(&id, WITHIN, |run| {
        (0..3).all(|i| attempts(run, i)[0]["state"] == "finished")
    });
    assert_eq!(
        attempts(&run, 3)[0]["state"],
        "running",
        "the running Pod is adopted, not judged"
    );
    assert!(kubelet.exit(&names[3], 0).is_some());
    let run = server.wait_terminal(&id, WITHIN);
    let classes: Vec<serde_json::Value> = (0..4)
        .map(|i| attempts(&run, i)[0]["class"].clone())
        .collect();
    assert_eq!(
        classes,
        vec![
            serde_json::Value::Null,
            "step".into(),
            "lost".into(),
            serde_json::Value::Null
        ],
        "{run:#}"
    );
    for (i, fence) in before.iter().enumerate() {
        assert_eq!(attempts(&run, i).len(), 1, "judged exactly once, no retry");
        assert_eq!(fences(&run, i)[0], *fence, "fences unchanged");
    }
    assert_eq!(cluster.pod_creations(), 4, "no Pod created twice");
    assert_eq!(run["state"], "dead_lettered");
}

#[test]
fn a_cancel_before_the_pod_exists_means_it_is_never_created() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    let server = cluster.serve(dir.path());
    cluster.cluster.set_fault(Fault::Unreachable);
    let id = server.submit(&format!("name: k\nsteps:\n{}", kube_step("a", "sleep 600")));
    std::thread::sleep(Duration::from_millis(500));
    let (status, body) = server.request(
        "POST",
        &format!("/v1/runs/{id}/cancel"),
        "application/json",
        b"",
        &[],
    );
    assert_eq!(status, 202, "{body}");
    std::thread::sleep(Duration::from_millis(500));
    cluster.cluster.set_fault(Fault::None);
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "cancelled", "{run:#}");
    assert_eq!(attempts(&run, 0)[0]["started"], false);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(cluster.pod_creations(), 0, "the Pod was never created");
}

#[test]
fn an_exhausted_launch_dead_letters_the_run_and_a_requeue_completes_it() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    let kubeconfig = cluster.cluster.kubeconfig(dir.path());
    let kubeconfig = kubeconfig.to_str().expect("utf-8").to_string();
    let args = [
        "--kubeconfig",
        &kubeconfig,
        "--kube-namespace",
        "default",
        "--max-deliveries",
        "2",
    ];
    let server = Server::start_with(&dir.path().join("state"), &args);
    cluster.cluster.set_fault(Fault::Forbidden);
    let id = server.submit(&format!(
        "name: k\nsteps:\n{}{}",
        kube_step("a", "exit 0"),
        "  - name: b\n    needs: [a]\n    run: ['true']\n"
    ));
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "dead_lettered", "{run:#}");
    assert_eq!(
        run["failure_classification"]["category"], "executor_unavailable",
        "{run:#}"
    );
    assert_eq!(run["failure_classification"]["auto_retryable"], false);
    assert_eq!(run["steps"][0]["reason"], "ExecutorUnavailable");
    assert_eq!(run["steps"][1]["state"], "skipped");
    let fence = fences(&run, 0);
    let (status, dlq) = server.get("/v1/dlq");
    assert_eq!(status, 200, "{dlq}");
    let letters = dlq["dead_letters"].as_array().expect("list").clone();
    assert_eq!(letters.len(), 1, "{dlq}");
    assert_eq!(letters[0]["kind"], "launch");
    assert_eq!(letters[0]["category"], "executor_unavailable");
    assert_eq!(letters[0]["deliveries"], 2);
    assert!(
        letters[0]["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("403")
            || letters[0]["last_error"]
                .as_str()
                .unwrap_or("")
                .to_lowercase()
                .contains("forbidden"),
        "{dlq}"
    );
    let letter = letters[0]["id"].as_u64().expect("id");
    let (status, body) = server.request(
        "POST",
        &format!("/v1/dlq/{letter}/discard"),
        "application/json",
        b"{}",
        &[],
    );
    assert_eq!(status, 400, "discard needs a reason: {body}");
    assert_eq!(body["field"], "reason");

    cluster.cluster.set_fault(Fault::None);
    let (status, body) = server.request(
        "POST",
        &format!("/v1/dlq/{letter}/requeue"),
        "application/json",
        br#"{"by":"ops"}"#,
        &[],
    );
    assert_eq!(status, 202, "{body}");
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(
        fences(&run, 0),
        fence,
        "the same attempt was launched again"
    );
    let (_, dlq) = server.get("/v1/dlq");
    assert_eq!(dlq["dead_letters"].as_array().map(Vec::len), Some(0));
    let (status, _) = server.request(
        "POST",
        &format!("/v1/dlq/{letter}/requeue"),
        "application/json",
        b"",
        &[],
    );
    assert_eq!(status, 404, "already requeued");
    let (_, history) = server.get(&format!("/v1/runs/{id}/history"));
    let kinds: Vec<&str> = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"message_dead_lettered") && kinds.contains(&"dlq_requeued"),
        "{kinds:?}"
    );
}

// --- The auto-retry sweep (docs/auto-retry.md) ----------------------------------------------

/// A config file turning the sweep on (or leaving it off) with short intervals.
fn auto_retry_config(dir: &std::path::Path, enabled: bool, backoff: &str) -> String {
    let path = dir.join("scarab.toml");
    std::fs::write(
        &path,
        format!(
            "[auto_retry]\nenabled = {enabled}\ninterval = \"1s\"\nbackoff_initial = \"{backoff}\"\nbackoff_max = \"{backoff}\"\nmax = 2\n"
        ),
    )
    .expect("config");
    path.to_str().expect("utf-8").to_string()
}

fn pull_pipeline(name: &str, image: &str) -> String {
    format!(
        "name: {name}\nsteps:\n  - name: pull\n    executor: kubernetes\n    image: {image}\n    command: [sh, -c, 'true']\n"
    )
}

/// Fast never-started verdicts: a failing pull is judged after 1 s, with no in-flight
/// infra retries, so each try is one attempt.
const PULL_ARGS: [&str; 4] = ["--kube-grace-image-pull", "1s", "--infra-retries", "0"];

fn count_events(server: &Server, id: &str, kind: &str) -> usize {
    let (_, history) = server.get(&format!("/v1/runs/{id}/history?limit=1000"));
    history["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == kind)
        .count()
}

#[test]
fn an_unpullable_image_is_auto_retried_twice_then_quarantined_or_heals() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    let kubelet = cluster.cluster.kubelet();
    kubelet.auto(true);
    kubelet.set_pullable("registry.example/never:1", false);
    kubelet.set_pullable("registry.example/later:1", false);
    let config = auto_retry_config(dir.path(), true, "8s");
    let mut extra = vec!["--config", config.as_str()];
    extra.extend(PULL_ARGS);
    let server = cluster.serve_with(dir.path(), &extra);
    let never = server.submit(&pull_pipeline("never", "registry.example/never:1"));
    let later = server.submit(&pull_pipeline("later", "registry.example/later:1"));

    // First dead-letter: never-started, auto-retryable.
    let first = server.wait_for(&never, WITHIN, |r| r["state"] == "dead_lettered");
    let class = &first["failure_classification"];
    assert_eq!(class["category"], "infra_never_started", "{first:#}");
    assert_eq!(class["auto_retryable"], true, "{first:#}");

    // `later` becomes pullable after its first resubmit failed, before the second.
    server.wait_for(&later, WITHIN, |r| {
        r["auto_retry"]["attempts"] == 1 && r["state"] == "dead_lettered"
    });
    kubelet.set_pullable("registry.example/later:1", true);
    let healed = server.wait_for(&later, WITHIN, |r| r["state"] == "succeeded");
    assert_eq!(healed["auto_retry"]["attempts"], 2, "{healed:#}");
    assert_eq!(healed["steps"][0]["earlier_attempts"], 2, "{healed:#}");
    assert_eq!(
        attempts(&healed, 0).len(),
        1,
        "the detail shows the fresh try"
    );

    let run = server.wait_for(&never, WITHIN, |r| r["state"] == "quarantined");
    assert_eq!(run["auto_retry"]["attempts"], 2, "{run:#}");
    assert_eq!(run["auto_retry"]["quarantined"], true);
    assert!(
        run["auto_retry"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("max 2")),
        "{run:#}"
    );
    assert_eq!(
        run["failure_classification"]["category"],
        "infra_never_started"
    );
    assert_eq!(count_events(&server, &never, "auto_retry_scheduled"), 2);
    assert_eq!(count_events(&server, &never, "auto_retry_quarantined"), 1);
    // Three tries, three distinct fences, in increasing order.
    let created: Vec<u64> = {
        let (_, history) = server.get(&format!("/v1/runs/{never}/history?limit=1000"));
        history["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["kind"] == "attempt_created")
            .filter_map(|e| e["detail"]["fence"].as_u64())
            .collect()
    };
    assert_eq!(created.len(), 3, "{created:?}");
    assert!(created.windows(2).all(|w| w[0] < w[1]), "{created:?}");
    // Quarantined runs stay put.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(server.run(&never)["state"], "quarantined");
}

#[test]
fn with_the_sweep_off_nothing_is_resubmitted() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    let kubelet = cluster.cluster.kubelet();
    kubelet.auto(true);
    kubelet.set_pullable("registry.example/never:1", false);
    let config = auto_retry_config(dir.path(), false, "1s");
    let mut extra = vec!["--config", config.as_str()];
    extra.extend(PULL_ARGS);
    let server = cluster.serve_with(dir.path(), &extra);
    let id = server.submit(&pull_pipeline("off", "registry.example/never:1"));
    let run = server.wait_for(&id, WITHIN, |r| r["state"] == "dead_lettered");
    assert_eq!(run["failure_classification"]["auto_retryable"], true);
    std::thread::sleep(Duration::from_secs(3));
    let run = server.run(&id);
    assert_eq!(run["state"], "dead_lettered");
    assert_eq!(run["auto_retry"]["attempts"], 0);
    assert_eq!(count_events(&server, &id, "auto_retry_scheduled"), 0);
    assert_eq!(cluster.pod_creations(), 1);
}

#[test]
fn kill9_during_sweeps_leaves_every_run_resubmitted_completely_or_untouched() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    let kubelet = cluster.cluster.kubelet();
    kubelet.auto(true);
    kubelet.set_pullable("registry.example/never:1", false);
    let path = dir.path().join("scarab.toml");
    std::fs::write(
        &path,
        "[auto_retry]\nenabled = true\ninterval = \"1s\"\nbackoff_initial = \"1s\"\nbackoff_max = \"1s\"\nmax = 20\nsweep_limit = 50\n",
    )
    .expect("config");
    let config = path.to_str().expect("utf-8").to_string();
    let mut extra = vec!["--config", config.as_str()];
    extra.extend(PULL_ARGS);
    let mut server = cluster.serve_with(dir.path(), &extra);
    let ids: Vec<String> = (0..20)
        .map(|i| server.submit(&pull_pipeline(&format!("k{i}"), "registry.example/never:1")))
        .collect();
    for round in 0..4 {
        std::thread::sleep(Duration::from_millis(1300 + 170 * round));
        server.kill9();
        server.resume();
    }
    std::thread::sleep(Duration::from_secs(2));
    let mut total = 0;
    for id in &ids {
        let run = server.run(id);
        let resubmits = run["auto_retry"]["attempts"].as_u64().expect("attempts") as usize;
        let step = &run["steps"][0];
        let tries = step["earlier_attempts"].as_u64().expect("earlier") as usize
            + step["attempts"].as_array().map_or(0, Vec::len);
        // Each resubmit minted exactly one new attempt in its own transaction.
        assert_eq!(tries, resubmits + 1, "{run:#}");
        assert_eq!(
            count_events(&server, id, "auto_retry_scheduled"),
            resubmits,
            "{run:#}"
        );
        total += resubmits;
    }
    assert!(
        total >= ids.len(),
        "the sweeps ran between the kills: {total} resubmits"
    );
    let (_, ready) = server.get("/readyz");
    assert_eq!(ready["progress"]["stuck"], serde_json::json!([]), "{ready}");
}

#[test]
fn max_pods_bounds_the_pods_alive_at_once() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    let kubeconfig = cluster.cluster.kubeconfig(dir.path());
    let server = Server::start_with_env(
        &dir.path().join("state"),
        &[
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8 path"),
            "--kube-namespace",
            "default",
        ],
        &[("SCARAB_MAX_PODS", "2")],
    );
    let yaml = format!("name: k\nsteps:\n{}", kube_step("s", "sleep 0.3; exit 0"));
    let ids: Vec<String> = (0..6).map(|_| server.submit(&yaml)).collect();
    // Pods that have not ended, sampled while the runs go through.
    let mut most = 0;
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let alive = cluster
            .cluster
            .pods()
            .into_iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                !matches!(phase.as_deref(), Some("Succeeded" | "Failed"))
            })
            .count();
        most = most.max(alive);
        let done = ids.iter().all(|id| {
            let state = server.run(id)["state"].clone();
            state == "succeeded" || state == "failed"
        });
        if done {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "runs did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(most <= 2, "{most} Pods were alive at once");
    assert_eq!(most, 2, "the pool was used to its limit");
    for id in &ids {
        assert_eq!(server.run(id)["state"], "succeeded");
    }
    assert_eq!(cluster.pod_creations(), 6, "one Pod per run");
    let (_, queue) = server.get("/v1/queue");
    let pods = &queue["pools"][1];
    assert_eq!(
        (&pods["name"], &pods["used"], &pods["limit"]),
        (&"kubernetes".into(), &0.into(), &2.into()),
        "{queue}"
    );
}

/// A deadline and an eviction the kubelet writes in either order (the phase with its
/// reason first, or the containers' end first, or both at once) give the same verdict:
/// `timeout`, retried by `retry: {on: timeout}`, and `infra_post_start`.
#[test]
fn a_deadline_and_an_eviction_give_the_same_verdict_in_either_write_order() {
    use crate::k8s_api::EndOrder;
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    let server = cluster.serve(dir.path());
    let name_of = |run: &serde_json::Value, attempt: usize| {
        let fence = attempts(run, 0)[attempt]["fence"].as_u64().expect("fence");
        format!("{}-s0-f{fence}", run["id"].as_str().expect("id"))
    };
    for order in [
        EndOrder::PhaseFirst,
        EndOrder::ContainersFirst,
        EndOrder::Together,
    ] {
        cluster.cluster.kubelet().set_end_order(order);
        // A deadline: timeout, and retried.
        let yaml = format!(
            "name: deadline\nsteps:\n{}    retry: {{on: timeout, max: 1, backoff: {{initial: 100ms, max: 100ms}}}}\n",
            kube_step("s", "sleep 30")
        );
        let id = server.submit(&yaml);
        let run = server.wait_for(&id, WITHIN, |run| {
            attempts(run, 0)
                .first()
                .is_some_and(|a| a["state"] == "running")
        });
        let first = name_of(&run, 0);
        wait_pod_running(&cluster, &first);
        cluster.cluster.kubelet().deadline_exceeded(&first);
        let run = server.wait_for(&id, WITHIN, |run| attempts(run, 0).len() == 2);
        let judged = &attempts(&run, 0)[0];
        assert_eq!(judged["class"], "timeout", "{order:?}: {run:#}");
        assert_eq!(judged["started"], true, "{order:?}");
        let second = name_of(&run, 1);
        wait_pod_running(&cluster, &second);
        cluster.cluster.kubelet().exit(&second, 0);
        let run = server.wait_terminal(&id, WITHIN);
        assert_eq!(run["state"], "succeeded", "{order:?}: {run:#}");

        // An eviction of a running Pod: infra_post_start.
        let id = server.submit(&format!(
            "name: evicted\nsteps:\n{}",
            kube_step("s", "sleep 30")
        ));
        let run = server.wait_for(&id, WITHIN, |run| {
            attempts(run, 0)
                .first()
                .is_some_and(|a| a["state"] == "running")
        });
        let pod = name_of(&run, 0);
        wait_pod_running(&cluster, &pod);
        cluster.cluster.kubelet().evict(&pod, true);
        let run = server.wait_terminal(&id, WITHIN);
        let judged = &attempts(&run, 0)[0];
        assert_eq!(judged["class"], "infra_post_start", "{order:?}: {run:#}");
        assert_eq!(judged["started"], true, "{order:?}");
    }
}

#[test]
fn a_kubernetes_step_on_a_service_without_a_cluster_is_refused_at_submit() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let (status, body) = server.submit_yaml(&format!(
        "name: k\nsteps:\n  - name: local\n    run: ['true']\n{}",
        kube_step("pod", "exit 0")
    ));
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["errors"][0]["field"], "steps[1].executor", "{body}");
    let (_, runs) = server.get("/v1/runs");
    assert_eq!(
        runs["runs"].as_array().map(Vec::len),
        Some(0),
        "nothing was created"
    );
}

/// Admission rejections: Pod Security refuses the Pod as written (`config`, at once); a
/// used-up ResourceQuota is waited out until the pending grace, then `infra_never_started`.
/// Both name their cause in the attempt's reason.
#[test]
fn pod_security_is_config_and_an_exceeded_quota_waits_then_never_started() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    let server = cluster.serve_with(
        dir.path(),
        &["--kube-grace-pending", "2s", "--infra-retries", "0"],
    );
    let yaml = format!("name: k\nsteps:\n{}", kube_step("s", "exit 0"));

    cluster.cluster.set_fault(Fault::PodSecurity);
    let id = server.submit(&yaml);
    let run = server.wait_terminal(&id, WITHIN);
    let judged = &attempts(&run, 0)[0];
    assert_eq!(judged["class"], "config", "{run:#}");
    assert_eq!(judged["started"], false);
    assert!(
        judged["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("PodSecurity"),
        "{run:#}"
    );

    cluster.cluster.set_fault(Fault::QuotaExceeded);
    let started = std::time::Instant::now();
    let id = server.submit(&yaml);
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        attempts(&server.run(&id), 0)[0]["state"],
        "launching",
        "waits for room"
    );
    let run = server.wait_terminal(&id, WITHIN);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "gave up before the grace"
    );
    let judged = &attempts(&run, 0)[0];
    assert_eq!(judged["class"], "infra_never_started", "{run:#}");
    assert_eq!(judged["started"], false);
    assert!(
        judged["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("exceeded quota"),
        "{run:#}"
    );
    cluster.cluster.set_fault(Fault::None);
    assert!(
        cluster.cluster.pods().is_empty(),
        "no Pod was ever admitted"
    );
    assert!(
        cluster.pod_creations() >= 3,
        "the quota was asked again, with backoff"
    );
}

/// The API is unreachable when Scarab starts: it starts anyway, retries the start-up
/// reconciliation in the background, creates no Pod meanwhile, and once the API is back
/// deletes the stale Pods and raises its fence counter above theirs, without a restart.
#[test]
fn a_start_without_the_api_reconciles_in_the_background_once_it_returns() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    let run = scarab::engine::RunId(ulid::Ulid::from_parts(1_796_000_000_000, 9).0).to_string();
    let stale: Vec<String> = (0..3).map(|i| format!("{run}-s{i}-f{}", 500 + i)).collect();
    let pods: Vec<k8s_api::Pod> = stale
        .iter()
        .enumerate()
        .map(|(i, name)| managed_pod(name, &run, &i.to_string(), &(500 + i).to_string()))
        .collect();
    create_pods(&cluster, &pods);
    cluster.cluster.set_fault(Fault::Unreachable);
    let server = cluster.serve(dir.path());
    cluster.cluster.kubelet().auto(true);
    let id = server.submit(&format!("name: k\nsteps:\n{}", kube_step("a", "exit 0")));
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(
        cluster.cluster.pods().len(),
        3,
        "nothing deleted or created while unreachable"
    );
    cluster.cluster.set_fault(Fault::None);
    wait_deleted(&cluster, &stale, "stale Pods after the API returned");
    // The run submitted meanwhile had its fence already; it starts now.
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    // What is minted from now on is above every stale fence.
    let id = server.submit(&format!("name: k2\nsteps:\n{}", kube_step("a", "exit 0")));
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let fence = fences(&run, 0)[0];
    assert!(
        fence > 502,
        "the counter was not raised above the stale fences: minted {fence}"
    );
}

/// A never-started attempt whose Pod is being deleted (its image pull gave up) is retried
/// only once that Pod is gone: the old Pod's DELETED precedes the new Pod's ADDED in the
/// server's event history, though the retry's backoff is only 100 ms and the deletion
/// takes a second.
#[test]
fn a_retry_waits_until_the_previous_attempts_pod_is_gone() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    let kubelet = cluster.cluster.kubelet();
    kubelet.auto(true);
    kubelet.set_pullable("example.invalid/missing:1", false);
    kubelet.set_termination(k8s_api::Termination::Graceful {
        after: Duration::from_secs(1),
        exit_code: 143,
    });
    cluster.cluster.set_history_limit(100_000);
    let server = cluster.serve_with(dir.path(), &["--kube-grace-image-pull", "1s"]);
    let id = server.submit(
        "name: k\nsteps:\n  - name: a\n    executor: kubernetes\n    image: example.invalid/missing:1\n    command: [sh, -c, 'exit 0']\n    retry: {on: step, max: 0, backoff: {initial: 100ms, max: 100ms}}\n",
    );
    let run = server.wait_for(&id, WITHIN, |run| attempts(run, 0).len() >= 2);
    let first = format!("{}-s0-f{}", id, attempts(&run, 0)[0]["fence"]);
    let second = format!("{}-s0-f{}", id, attempts(&run, 0)[1]["fence"]);
    assert_eq!(
        attempts(&run, 0)[0]["class"],
        "infra_never_started",
        "{run:#}"
    );
    let deadline = std::time::Instant::now() + WITHIN;
    let (deleted, added) = loop {
        let events = cluster.cluster.events();
        let at = |kind: &str, name: &str| events.iter().position(|(k, n)| *k == kind && n == name);
        if let (Some(deleted), Some(added)) = (at("DELETED", &first), at("ADDED", &second)) {
            break (deleted, added);
        }
        assert!(std::time::Instant::now() < deadline, "events: {events:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        deleted < added,
        "the retry's Pod was created before the old one was gone"
    );
}

/// Pods of finished attempts are kept across a restart while their run's log retention
/// lasts; a start deletes the ones whose retention has ended, and a Pod that still runs
/// for an attempt that has ended.
#[test]
fn kept_pods_of_finished_attempts_survive_a_restart_until_their_retention_ends() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    let mut server = cluster.serve_with(dir.path(), &["--log-retention", "1h"]);
    let ids = [
        server.submit(&format!("name: ok\nsteps:\n{}", kube_step("a", "exit 0"))),
        server.submit(&format!("name: bad\nsteps:\n{}", kube_step("a", "exit 3"))),
        server.submit(&format!(
            "name: again\nsteps:\n{}",
            kube_step("a", "exit 0")
        )),
    ];
    let runs: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| server.wait_terminal(id, WITHIN))
        .collect();
    let names: Vec<String> = runs.iter().map(|run| pod_name(run, 0)).collect();
    // The third attempt's Pod is replaced by a running one with its identity.
    cluster.cluster.kubelet().remove(&names[2]);
    let fence = fences(&runs[2], 0)[0].to_string();
    create_pods(&cluster, &[managed_pod(&names[2], &ids[2], "0", &fence)]);
    wait_pod_running(&cluster, &names[2]);

    server.kill9();
    server.resume();
    wait_deleted(&cluster, &names[2..], "the running Pod of an ended attempt");
    let deletes_of = |name: &str| {
        let path = format!("/pods/{name}");
        cluster.cluster.count_requests(&Method::DELETE, |p| {
            p.split('?').next() == Some(&path[..]) || p.ends_with(&path)
        })
    };
    for name in &names[..2] {
        assert!(
            cluster.cluster.pod(name).is_some(),
            "{name}: a finished attempt's Pod within its retention was deleted at start"
        );
        assert_eq!(deletes_of(name), 0, "{name}");
    }

    // The same store, started with a retention the runs have outlived: their Pods go.
    server.kill9();
    // (Their runs ended more than the new retention ago.)
    std::thread::sleep(Duration::from_millis(1500));
    let server = cluster.serve_with(dir.path(), &["--log-retention", "1s"]);
    wait_deleted(&cluster, &names[..2], "Pods past their retention");
    drop(server);
}

/// With `kubernetes.callback_url`, a Pod step gets SCARAB_URL and its attempt's token:
/// its outputs reach a later step, a superseded attempt's token gets 409 stale_fence, and
/// a token stops working once its attempt has ended. Without it a Pod gets neither.
#[test]
fn a_pod_step_reports_outputs_through_the_callback_url_and_a_zombie_gets_409() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    cluster.cluster.kubelet().auto(true);
    let callback = "http://scarab.scarab-system.svc:7300";
    let server = cluster.serve_with(dir.path(), &["--kube-callback-url", callback]);
    let env_of = |name: &str| -> std::collections::HashMap<String, String> {
        let pod = cluster.cluster.pod(name).expect("pod");
        pod.spec.expect("spec").containers[0]
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|v| (v.name, v.value.unwrap_or_default()))
            .collect()
    };
    let put = |id: &str, step: &str, token: &str, body: &str| {
        common::agent()
            .put(format!("{}/v1/runs/{id}/steps/{step}/outputs", server.url))
            .header("Authorization", format!("Bearer {token}"))
            .header("Content-Type", "application/json")
            .send(body.as_bytes())
            .map(|mut r| {
                let status = r.status().as_u16();
                let text = r.body_mut().read_to_string().unwrap_or_default();
                (
                    status,
                    serde_json::from_str::<serde_json::Value>(&text).unwrap_or_default(),
                )
            })
            .expect("http")
    };
    let yaml = format!(
        "name: o\nsteps:\n{}    retry: {{on: step, max: 1, backoff: {{initial: 10ms}}}}\n{}    needs: [build]\n    env: {{DIGEST: '${{steps.build.outputs.digest}}'}}\n",
        kube_step("build", "sleep 30"),
        kube_step("deploy", "sleep 30")
    );
    let id = server.submit(&yaml);
    let name_of = |run: &serde_json::Value, step: usize, attempt: usize| {
        let fence = attempts(run, step)[attempt]["fence"]
            .as_u64()
            .expect("fence");
        format!("{id}-s{step}-f{fence}")
    };
    let run = server.wait_for(&id, WITHIN, |run| {
        attempts(run, 0)
            .first()
            .is_some_and(|a| a["state"] == "running")
    });
    let first = name_of(&run, 0, 0);
    wait_pod_running(&cluster, &first);
    let env = env_of(&first);
    assert_eq!(env.get("SCARAB_URL").map(String::as_str), Some(callback));
    let stale = env.get("SCARAB_STEP_TOKEN").expect("a step token").clone();
    // The first attempt fails; the retry's Pod reports the output.
    cluster.cluster.kubelet().exit(&first, 1);
    let run = server.wait_for(&id, WITHIN, |run| {
        attempts(run, 0).len() == 2 && attempts(run, 0)[1]["state"] == "running"
    });
    let second = name_of(&run, 0, 1);
    wait_pod_running(&cluster, &second);
    let (status, body) = put(&id, "build", &stale, r#"{"digest": "from-a-zombie"}"#);
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "stale_fence");
    assert_eq!(body["current"], attempts(&run, 0)[1]["fence"]);
    let token = env_of(&second)["SCARAB_STEP_TOKEN"].clone();
    assert_ne!(token, stale, "a token names one attempt");
    let (status, body) = put(&id, "build", &token, r#"{"digest": "sha256:abc"}"#);
    assert_eq!(status, 200, "{body}");
    cluster.cluster.kubelet().exit(&second, 0);
    let run = server.wait_for(&id, WITHIN, |run| {
        attempts(run, 1)
            .first()
            .is_some_and(|a| a["state"] == "running")
    });
    let deploy = name_of(&run, 1, 0);
    assert_eq!(
        env_of(&deploy)["DIGEST"],
        "sha256:abc",
        "the output reached the later step"
    );
    // The build attempt has ended: its own token no longer writes.
    let (status, body) = put(&id, "build", &token, r#"{"digest": "late"}"#);
    assert_eq!(status, 409, "{body}");
    wait_pod_running(&cluster, &deploy);
    cluster.cluster.kubelet().exit(&deploy, 0);
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(attempts(&run, 0)[1]["outputs"]["digest"], "sha256:abc");
    assert!(
        attempts(&run, 0)[0]["outputs"]
            .as_object()
            .is_none_or(|o| o.is_empty()),
        "{run:#}"
    );

    // Without a callback URL a Pod gets neither the URL nor a token.
    let other = common::tempdir().expect("tempdir");
    let plain = cluster.serve(other.path());
    let id = plain.submit(&format!("name: p\nsteps:\n{}", kube_step("a", "exit 0")));
    let run = plain.wait_terminal(&id, WITHIN);
    let env = env_of(&pod_name(&run, 0));
    assert!(
        !env.contains_key("SCARAB_URL") && !env.contains_key("SCARAB_STEP_TOKEN"),
        "{env:?}"
    );
}

/// A restart finds an ended attempt's Pod still running (something recreated it): the
/// start deletes it, and the step's retry, due meanwhile, is created only once that Pod
/// is gone.
#[test]
fn a_retry_after_a_restart_waits_for_a_stale_pod_of_its_step_to_be_gone() {
    let dir = common::tempdir().expect("tempdir");
    let cluster = Cluster::start();
    let kubelet = cluster.cluster.kubelet();
    kubelet.auto(true);
    cluster.cluster.set_history_limit(100_000);
    let mut server = cluster.serve(dir.path());
    let id = server.submit(&format!(
        "name: k\nsteps:\n{}    retry: {{on: step, max: 1, backoff: {{initial: 1s, max: 1s}}}}\n",
        kube_step("a", "sleep 30")
    ));
    let run = server.wait_for(&id, WITHIN, |run| {
        attempts(run, 0)
            .first()
            .is_some_and(|a| a["state"] == "running")
    });
    let first = pod_name(&run, 0);
    wait_pod_running(&cluster, &first);
    kubelet.exit(&first, 1);
    server.wait_for(&id, WITHIN, |run| {
        attempts(run, 0)
            .first()
            .is_some_and(|a| a["class"] == "step")
    });
    // Scarab dies during the retry's back-off; the first Pod comes back, running; Scarab
    // starts after the back-off, so the retry is due at once; deleting the stale Pod
    // takes the kubelet 3 s.
    server.kill9();
    kubelet.remove(&first);
    let fence = fences(&run, 0)[0].to_string();
    create_pods(&cluster, &[managed_pod(&first, &id, "0", &fence)]);
    wait_pod_running(&cluster, &first);
    kubelet.set_termination(k8s_api::Termination::Graceful {
        after: Duration::from_secs(3),
        exit_code: 143,
    });
    std::thread::sleep(Duration::from_millis(1200));
    server.resume();
    let run = server.wait_for(&id, WITHIN, |run| attempts(run, 0).len() == 2);
    let second = format!("{id}-s0-f{}", attempts(&run, 0)[1]["fence"]);
    // The recreated Pod's deletion: the first DELETED after its (last) ADDED.
    let deadline = std::time::Instant::now() + WITHIN;
    let (deleted, added, events) = loop {
        let events = cluster.cluster.events();
        let recreated = events
            .iter()
            .rposition(|(k, n)| *k == "ADDED" && *n == first)
            .expect("the recreated Pod");
        let deleted = events
            .iter()
            .skip(recreated)
            .position(|(k, n)| *k == "DELETED" && *n == first)
            .map(|i| i + recreated);
        let added = events
            .iter()
            .position(|(k, n)| *k == "ADDED" && *n == second);
        if let (Some(deleted), Some(added)) = (deleted, added) {
            break (deleted, added, events);
        }
        assert!(std::time::Instant::now() < deadline, "events: {events:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        deleted < added,
        "the retry's Pod was created while the stale one still ran: {events:?}"
    );
}

//! Self-test of the fake Kubernetes API server in tests/k8s_api, driven through the
//! real `kube` client.

use crate::common;
use crate::k8s_api;

use std::collections::BTreeMap;
use std::future::poll_fn;
use std::pin::Pin;
use std::time::Duration;

use k8s_api::{FakeCluster, Fault, Method, Termination};
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec};
use kube::api::{
    Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---- helpers --------------------------------------------------------------------

/// `StreamExt::next` without the futures crate: the `Stream` trait is reachable
/// through its subtrait `WatchStreamExt` as a bound.
async fn next<S: WatchStreamExt + Unpin>(s: &mut S) -> Option<S::Item> {
    poll_fn(|cx| Pin::new(&mut *s).poll_next(cx)).await
}

async fn next_within<S: WatchStreamExt + Unpin>(s: &mut S, secs: u64) -> Option<S::Item> {
    tokio::time::timeout(Duration::from_secs(secs), next(s))
        .await
        .expect("stream item within timeout")
}

fn pod(name: &str, labels: &[(&str, &str)], command: &[&str]) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.to_string());
    if !labels.is_empty() {
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        );
    }
    p.spec = Some(PodSpec {
        restart_policy: Some("Never".into()),
        containers: vec![Container {
            name: "main".into(),
            image: Some("busybox:1.36".into()),
            command: (!command.is_empty()).then(|| command.iter().map(|s| s.to_string()).collect()),
            ..Container::default()
        }],
        ..PodSpec::default()
    });
    p
}

fn api_err(err: kube::Error) -> Box<kube::core::Status> {
    match err {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

fn json_of(p: &Pod) -> Value {
    serde_json::to_value(p).unwrap()
}

async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..200 {
        if let Some(v) = f() {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

// ---- CRUD -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_conflict_invalid_not_found() {
    let cluster = FakeCluster::start().await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");

    let created = pods
        .create(
            &PostParams::default(),
            &pod("alpha", &[("app", "scarab")], &["sh", "-c", "exit 0"]),
        )
        .await
        .unwrap();
    let meta = &created.metadata;
    assert_eq!(meta.namespace.as_deref(), Some("default"));
    assert_eq!(meta.uid.as_ref().map(String::len), Some(36));
    assert!(meta.creation_timestamp.is_some());
    let rv: u64 = meta.resource_version.as_deref().unwrap().parse().unwrap();
    assert_eq!(phase(&created), "Pending");
    let spec = created.spec.as_ref().unwrap();
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
    assert_eq!(
        created.status.as_ref().unwrap().qos_class.as_deref(),
        Some("BestEffort")
    );

    let got = pods.get("alpha").await.unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);

    // 409 AlreadyExists, exact apiserver wording.
    let dup = api_err(
        pods.create(&PostParams::default(), &pod("alpha", &[], &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!(dup.code, 409);
    assert_eq!(dup.reason, "AlreadyExists");
    assert_eq!(dup.message, "pods \"alpha\" already exists");
    let details = dup.details.as_ref().unwrap();
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        ("alpha", "pods")
    );

    // 422 Invalid with a metadata.name cause.
    let bad = api_err(
        pods.create(&PostParams::default(), &pod("Bad_Name", &[], &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!(bad.code, 422);
    assert_eq!(bad.reason, "Invalid");
    assert!(
        bad.message.starts_with("Pod \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"),
        "{}",
        bad.message
    );
    let cause = &bad.details.as_ref().unwrap().causes[0];
    assert_eq!(cause.field, "metadata.name");
    assert_eq!(cause.reason, "FieldValueInvalid");
    let long = "a".repeat(254);
    let too_long = api_err(
        pods.create(&PostParams::default(), &pod(&long, &[], &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!(too_long.code, 422);

    // 404 NotFound.
    let missing = api_err(pods.get("nope").await.unwrap_err());
    assert_eq!(missing.code, 404);
    assert_eq!(missing.reason, "NotFound");
    assert_eq!(missing.message, "pods \"nope\" not found");

    // resourceVersion is one global counter.
    let beta = pods
        .create(&PostParams::default(), &pod("beta", &[], &[]))
        .await
        .unwrap();
    let rv2: u64 = beta
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv);

    // Status over HTTP (merge patch) bumps the resourceVersion.
    let patched = pods
        .patch_status(
            "beta",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "reason": "Patched"}})),
        )
        .await
        .unwrap();
    assert_eq!(phase(&patched), "Running");
    let rv3: u64 = patched
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv3 > rv2);
    // Main-resource patch keeps status.
    let labelled = pods
        .patch(
            "beta",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(phase(&labelled), "Running");
    assert_eq!(labelled.metadata.labels.unwrap()["x"], "y");
}

// ---- list ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_selectors_and_paging() {
    let cluster = FakeCluster::start().await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    for i in 0..5 {
        let tier = if i % 2 == 0 { "a" } else { "b" };
        pods.create(
            &PostParams::default(),
            &pod(
                &format!("run-{i}"),
                &[("app", "scarab"), ("tier", tier)],
                &[],
            ),
        )
        .await
        .unwrap();
    }
    for i in 0..2 {
        pods.create(
            &PostParams::default(),
            &pod(&format!("other-{i}"), &[("app", "other")], &[]),
        )
        .await
        .unwrap();
    }
    let other_ns: Api<Pod> = Api::namespaced(cluster.client(), "elsewhere");
    other_ns
        .create(
            &PostParams::default(),
            &pod("run-x", &[("app", "scarab")], &[]),
        )
        .await
        .unwrap();

    let names = |l: &kube::core::ObjectList<Pod>| -> Vec<String> {
        l.items
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect()
    };
    let count = |sel: &'static str| {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default().labels(sel))
                .await
                .unwrap()
                .items
                .len()
        }
    };
    assert_eq!(count("app=scarab").await, 5);
    assert_eq!(count("app==scarab,tier=a").await, 3);
    assert_eq!(count("app!=scarab").await, 2);
    assert_eq!(count("tier in (a,b)").await, 5);
    assert_eq!(count("tier notin (a)").await, 4);
    assert_eq!(count("tier").await, 5);
    assert_eq!(count("!tier").await, 2);
    let by_name = pods
        .list(&ListParams::default().fields("metadata.name=run-3"))
        .await
        .unwrap();
    assert_eq!(names(&by_name), vec!["run-3"]);
    let all: Api<Pod> = Api::all(cluster.client());
    assert_eq!(
        all.list(&ListParams::default().labels("app=scarab"))
            .await
            .unwrap()
            .items
            .len(),
        6
    );
    let bad = api_err(
        pods.list(&ListParams::default().labels("app ~ x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(bad.code, 400);

    // Paging: limit 2 over 5 Pods → 3 pages, same snapshot resourceVersion.
    cluster.clear_request_log();
    let mut lp = ListParams::default().labels("app=scarab").limit(2);
    let mut pages = Vec::new();
    let mut rvs = Vec::new();
    loop {
        let page = pods.list(&lp).await.unwrap();
        pages.push(names(&page));
        rvs.push(page.metadata.resource_version.clone().unwrap());
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => break,
        }
    }
    assert_eq!(
        pages,
        vec![
            vec!["run-0", "run-1"],
            vec!["run-2", "run-3"],
            vec!["run-4"]
        ]
    );
    assert!(rvs.windows(2).all(|w| w[0] == w[1]));
    let log = cluster.request_log();
    assert_eq!(log.len(), 3);
    assert!(
        log.iter()
            .all(|(m, t)| *m == Method::GET && t.starts_with("/api/v1/namespaces/default/pods?"))
    );
    assert!(log[1].1.contains("continue="));
    assert_eq!(
        cluster.count_requests(&Method::GET, |p| p
            .starts_with("/api/v1/namespaces/default/pods/")),
        0
    );
}

// ---- delete ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_is_graceful_then_gone() {
    let cluster = FakeCluster::start().await;
    let kubelet = cluster.kubelet();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    pods.create(
        &PostParams::default(),
        &pod("victim", &[], &["sleep", "1000"]),
    )
    .await
    .unwrap();
    kubelet.start("victim").unwrap();
    kubelet.set_termination(Termination::Hold);

    let deleted = pods
        .delete("victim", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = deleted
        .left()
        .expect("the Pod comes back while terminating");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    // Still there, terminating, container still running.
    let still = pods.get("victim").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    assert_eq!(phase(&still), "Running");

    let last = kubelet.finish_deletion("victim").unwrap();
    let term = json_of(&last)["status"]["containerStatuses"][0]["state"]["terminated"].clone();
    assert_eq!(term["exitCode"], 143);
    assert_eq!(phase(&last), "Failed");
    assert_eq!(api_err(pods.get("victim").await.unwrap_err()).code, 404);

    // Default termination: SIGTERM death shortly after the request.
    kubelet.set_termination(Termination::Graceful {
        after: Duration::from_millis(50),
        exit_code: 143,
    });
    pods.create(
        &PostParams::default(),
        &pod("victim2", &[], &["sleep", "1000"]),
    )
    .await
    .unwrap();
    kubelet.start("victim2").unwrap();
    pods.delete("victim2", &DeleteParams::default().grace_period(5))
        .await
        .unwrap();
    eventually("victim2 gone", || {
        cluster.pod("victim2").is_none().then_some(())
    })
    .await;

    // Unscheduled Pods go at once; missing Pods are 404.
    pods.create(&PostParams::default(), &pod("pending", &[], &[]))
        .await
        .unwrap();
    pods.delete("pending", &DeleteParams::default())
        .await
        .unwrap();
    assert!(cluster.pod("pending").is_none());
    let missing = api_err(
        pods.delete("pending", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (missing.code, missing.message.as_str()),
        (404, "pods \"pending\" not found")
    );

    // UID precondition.
    let p = pods
        .create(&PostParams::default(), &pod("fenced", &[], &[]))
        .await
        .unwrap();
    let wrong = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let conflict = api_err(pods.delete("fenced", &wrong).await.unwrap_err());
    assert_eq!(conflict.code, 409);
    assert!(
        conflict
            .message
            .contains("Precondition failed: UID in precondition: not-the-uid")
    );
    let right = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: p.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    pods.delete("fenced", &right).await.unwrap();
}

// ---- watch -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_watch_events_bookmarks_timeout_and_gone() {
    let cluster = FakeCluster::start().await;
    cluster.set_bookmark_interval(Duration::from_millis(100));
    let kubelet = cluster.kubelet();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let start_rv = cluster.resource_version().to_string();

    let mut stream = Box::pin(
        pods.watch(
            &WatchParams::default().labels("app=scarab").timeout(3),
            &start_rv,
        )
        .await
        .unwrap(),
    );
    pods.create(
        &PostParams::default(),
        &pod("ignored", &[("app", "other")], &[]),
    )
    .await
    .unwrap();
    pods.create(&PostParams::default(), &pod("w", &[("app", "scarab")], &[]))
        .await
        .unwrap();
    kubelet.start("w").unwrap();
    pods.delete("w", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();

    let mut kinds = Vec::new();
    let mut bookmarks = 0;
    while let Some(ev) = next_within(&mut stream, 5).await {
        match ev.unwrap() {
            WatchEvent::Added(p) => kinds.push(format!("ADDED {}", p.metadata.name.unwrap())),
            WatchEvent::Modified(p) => kinds.push(format!("MODIFIED {}", phase(&p))),
            WatchEvent::Deleted(p) => kinds.push(format!("DELETED {}", p.metadata.name.unwrap())),
            WatchEvent::Bookmark(b) => {
                assert!(!b.metadata.resource_version.is_empty());
                bookmarks += 1;
            }
            WatchEvent::Error(e) => panic!("unexpected error event {e:?}"),
        }
    }
    // schedule = binding + kubelet status, start = Running, delete(grace 0) = DELETED alone.
    assert_eq!(
        kinds,
        vec![
            "ADDED w",
            "MODIFIED Pending",
            "MODIFIED Pending",
            "MODIFIED Running",
            "DELETED w"
        ]
    );
    assert!(bookmarks >= 1, "bookmarks sent every 100ms");

    // A resourceVersion older than the history: one ERROR event (410 Expired), then the end.
    cluster.compact();
    let mut stale = Box::pin(
        pods.watch(&WatchParams::default(), &start_rv)
            .await
            .unwrap(),
    );
    match next_within(&mut stale, 5).await.unwrap().unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
            assert_eq!(
                e.message,
                format!(
                    "too old resource version: {start_rv} ({})",
                    cluster.resource_version()
                )
            );
        }
        other => panic!("expected ERROR, got {other:?}"),
    }
    assert!(next_within(&mut stale, 5).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_watcher_survives_outage_and_compaction() {
    let cluster = FakeCluster::start().await;
    cluster.set_bookmark_interval(Duration::from_millis(200));
    let kubelet = cluster.kubelet();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    pods.create(
        &PostParams::default(),
        &pod("p1", &[("app", "scarab")], &[]),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams::default(),
        &pod("p3", &[("app", "scarab")], &[]),
    )
    .await
    .unwrap();

    let mut w = Box::pin(watcher::watcher(
        pods.clone(),
        watcher::Config::default().labels("app=scarab"),
    ));
    let mut init = Vec::new();
    loop {
        match next_within(&mut w, 5).await.unwrap().unwrap() {
            Event::Init => {}
            Event::InitApply(p) => init.push(p.metadata.name.unwrap()),
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(init, vec!["p1", "p3"]);

    pods.create(
        &PostParams::default(),
        &pod("p2", &[("app", "scarab")], &[]),
    )
    .await
    .unwrap();
    kubelet.start("p2").unwrap();
    pods.delete("p1", &DeleteParams::default()).await.unwrap(); // unscheduled: immediate
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("delete p1") {
        match next_within(&mut w, 5).await.unwrap().unwrap() {
            Event::Apply(p) => seen.push(format!(
                "apply {} {}",
                p.metadata.name.as_deref().unwrap(),
                phase(&p)
            )),
            Event::Delete(p) => seen.push(format!("delete {}", p.metadata.name.unwrap())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen.first().map(String::as_str), Some("apply p2 Pending"));
    assert!(seen.contains(&"apply p2 Running".to_string()));

    // Outage: the stream is cut; meanwhile p2 fails, p3 is force-deleted and the
    // history is compacted. The watcher re-watches from its old resourceVersion,
    // gets 410 and relists: the final state must still arrive.
    cluster.set_fault(Fault::Unreachable);
    tokio::time::sleep(Duration::from_millis(100)).await;
    kubelet.exit("p2", 3).unwrap();
    kubelet.remove("p3").unwrap();
    cluster.compact();
    cluster.set_fault(Fault::None);

    let mut saw_gone = false;
    let mut relisted = BTreeMap::new();
    loop {
        match next_within(&mut w, 10).await.unwrap() {
            Err(watcher::Error::WatchError(e)) if e.code == 410 => saw_gone = true,
            Err(_) => {} // the cut stream
            Ok(Event::Init) => relisted.clear(),
            Ok(Event::InitApply(p)) => {
                relisted.insert(p.metadata.name.clone().unwrap(), p);
            }
            Ok(Event::InitDone) => break,
            Ok(other) => panic!("unexpected {other:?}"),
        }
    }
    assert!(saw_gone, "the re-watch got 410 Expired");
    assert_eq!(relisted.keys().collect::<Vec<_>>(), vec!["p2"]);
    let p2 = &relisted["p2"];
    assert_eq!(phase(p2), "Failed");
    assert_eq!(
        json_of(p2)["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        3
    );

    // And it keeps watching.
    pods.create(
        &PostParams::default(),
        &pod("p4", &[("app", "scarab")], &[]),
    )
    .await
    .unwrap();
    match next_within(&mut w, 5).await.unwrap().unwrap() {
        Event::Apply(p) => assert_eq!(p.metadata.name.as_deref(), Some("p4")),
        other => panic!("unexpected {other:?}"),
    }
}

// ---- logs ------------------------------------------------------------------------

#[tokio::test]
async fn logs_plain_and_follow() {
    let cluster = FakeCluster::start().await;
    let kubelet = cluster.kubelet();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    pods.create(&PostParams::default(), &pod("talker", &[], &[]))
        .await
        .unwrap();

    kubelet.schedule("talker", "node-1").unwrap();
    let waiting = api_err(
        pods.logs("talker", &LogParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(waiting.code, 400);
    assert_eq!(
        waiting.message,
        "container \"main\" in pod \"talker\" is waiting to start: ContainerCreating"
    );

    kubelet.start("talker").unwrap();
    kubelet.append_log("talker", "one\ntwo\n");
    assert_eq!(
        pods.logs("talker", &LogParams::default()).await.unwrap(),
        "one\ntwo\n"
    );
    let tail = LogParams {
        tail_lines: Some(1),
        ..LogParams::default()
    };
    assert_eq!(pods.logs("talker", &tail).await.unwrap(), "two\n");

    // follow=true over a raw socket: streams until the container terminates.
    let mut sock = tokio::net::TcpStream::connect(("127.0.0.1", cluster.port()))
        .await
        .unwrap();
    sock.write_all(
        b"GET /api/v1/namespaces/default/pods/talker/log?follow=true HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    kubelet.append_log("talker", "three\n");
    tokio::time::sleep(Duration::from_millis(50)).await;
    kubelet.exit("talker", 0).unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("Transfer-Encoding: chunked"));
    let body = dechunk(text.split_once("\r\n\r\n").unwrap().1);
    assert_eq!(body, "one\ntwo\nthree\n");
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(size, 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

// ---- faults ----------------------------------------------------------------------

#[tokio::test]
async fn faults() {
    let cluster = FakeCluster::start().await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    pods.create(&PostParams::default(), &pod("here", &[], &[]))
        .await
        .unwrap();

    cluster.set_fault(Fault::Forbidden);
    let e = api_err(pods.get("here").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert!(
        e.message.starts_with("pods \"here\" is forbidden: User \""),
        "{}",
        e.message
    );
    let e = api_err(
        pods.create(&PostParams::default(), &pod("new", &[], &[]))
            .await
            .unwrap_err(),
    );
    assert!(e.message.contains(
        "cannot create resource \"pods\" in API group \"\" in the namespace \"default\""
    ));
    assert_eq!(
        api_err(pods.list(&ListParams::default()).await.unwrap_err()).code,
        403
    );

    cluster.set_fault(Fault::NamespaceMissing);
    let e = api_err(
        pods.create(&PostParams::default(), &pod("new", &[], &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, "namespaces \"default\" not found");
    assert_eq!(e.details.as_ref().unwrap().kind, "namespaces");
    assert_eq!(
        api_err(pods.get("here").await.unwrap_err()).message,
        "pods \"here\" not found"
    );
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    cluster.set_fault(Fault::Unreachable);
    let err = pods.get("here").await.unwrap_err();
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "transport error expected, got {err:?}"
    );

    cluster.set_fault(Fault::None);
    assert_eq!(
        pods.get("here").await.unwrap().metadata.name.as_deref(),
        Some("here")
    );
}

// ---- kubelet shapes --------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_before_start_has_container_status_unknown() {
    let cluster = FakeCluster::start().await;
    let kubelet = cluster.kubelet();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    pods.create(&PostParams::default(), &pod("ev", &[], &[]))
        .await
        .unwrap();
    kubelet.evict("ev", false).unwrap();

    let v = json_of(&pods.get("ev").await.unwrap());
    let st = &v["status"];
    assert_eq!(st["phase"], "Failed");
    assert_eq!(st["reason"], "Evicted");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .starts_with("The node was low on resource: memory. ")
    );
    let cs = &st["containerStatuses"][0];
    assert!(cs.get("containerID").is_none(), "never created: {cs}");
    assert_eq!(cs["ready"], false);
    let term = &cs["state"]["terminated"];
    assert_eq!(term["exitCode"], 137);
    assert_eq!(term["reason"], "ContainerStatusUnknown");
    assert_eq!(
        term["message"],
        "The container could not be located when the pod was terminated"
    );
    assert!(
        term.get("startedAt").is_none() && term.get("finishedAt").is_none(),
        "{term}"
    );
    let dt = st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .unwrap();
    assert_eq!(
        (dt["status"].as_str(), dt["reason"].as_str()),
        (Some("True"), Some("TerminationByKubelet"))
    );

    // Evicted while running: real timestamps and a containerID.
    pods.create(&PostParams::default(), &pod("ev2", &[], &[]))
        .await
        .unwrap();
    let v = json_of(&kubelet.evict("ev2", true).unwrap());
    let term = &v["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(term["exitCode"], 137);
    assert!(
        term["startedAt"].is_string()
            && term["containerID"]
                .as_str()
                .unwrap()
                .starts_with("containerd://")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_transitions() {
    let cluster = FakeCluster::start().await;
    let k = cluster.kubelet();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    for name in [
        "s", "r", "x", "oom", "img", "inv", "cfg", "uns", "pre", "shut", "adm", "dl", "se", "lost",
    ] {
        pods.create(&PostParams::default(), &pod(name, &[], &["/app/run"]))
            .await
            .unwrap();
    }
    let status = |p: Pod| json_of(&p)["status"].clone();

    let s = status(k.schedule("s", "node-7").unwrap());
    assert_eq!(
        cluster.pod("s").unwrap().spec.unwrap().node_name.as_deref(),
        Some("node-7")
    );
    assert!(s["startTime"].is_string());
    assert_eq!(
        s["containerStatuses"][0]["state"]["waiting"]["reason"],
        "ContainerCreating"
    );

    let r = status(k.start("r").unwrap());
    assert_eq!(r["phase"], "Running");
    let cs = &r["containerStatuses"][0];
    assert_eq!(cs["ready"], true);
    assert_eq!(
        cs["containerID"].as_str().unwrap().len(),
        "containerd://".len() + 64
    );
    assert!(cs["state"]["running"]["startedAt"].is_string());
    assert_eq!(cs["image"], "docker.io/library/busybox:1.36");

    let x = status(k.exit("x", 2).unwrap());
    assert_eq!(x["phase"], "Failed");
    let t = &x["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (t["exitCode"].as_i64(), t["reason"].as_str()),
        (Some(2), Some("Error"))
    );
    assert!(
        t["startedAt"].is_string() && t["finishedAt"].is_string() && t["containerID"].is_string()
    );

    let o = status(k.oom_kill("oom").unwrap());
    assert_eq!(
        o["containerStatuses"][0]["state"]["terminated"]["reason"],
        "OOMKilled"
    );
    assert_eq!(
        o["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        137
    );

    let img = status(k.image_pull_backoff("img").unwrap());
    assert_eq!(img["phase"], "Pending");
    assert_eq!(
        img["containerStatuses"][0]["state"]["waiting"]["reason"],
        "ImagePullBackOff"
    );
    assert_eq!(
        img["containerStatuses"][0]["state"]["waiting"]["message"],
        "Back-off pulling image \"busybox:1.36\""
    );
    assert_eq!(
        status(k.invalid_image("inv").unwrap())["containerStatuses"][0]["state"]["waiting"]["reason"],
        "InvalidImageName"
    );
    assert_eq!(
        status(k.create_container_config_error("cfg").unwrap())["containerStatuses"][0]["state"]["waiting"]
            ["reason"],
        "CreateContainerConfigError"
    );

    let u = status(k.unschedulable("uns").unwrap());
    let c = &u["conditions"][0];
    assert_eq!(
        (
            c["type"].as_str(),
            c["status"].as_str(),
            c["reason"].as_str()
        ),
        (Some("PodScheduled"), Some("False"), Some("Unschedulable"))
    );
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .starts_with("0/3 nodes are available")
    );

    k.start("pre").unwrap();
    k.set_termination(Termination::Hold);
    let pre = k.preempt("pre").unwrap();
    assert!(pre.metadata.deletion_timestamp.is_some());
    let dt = json_of(&pre)["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .cloned()
        .unwrap();
    assert_eq!(dt["reason"], "PreemptionByScheduler");
    assert_eq!(
        dt["message"],
        "default-scheduler: preempting to accommodate a higher priority pod"
    );
    k.finish_deletion("pre").unwrap();
    assert!(cluster.pod("pre").is_none());

    k.start("shut").unwrap();
    let sh = status(k.node_shutdown("shut").unwrap());
    assert_eq!(
        (sh["phase"].as_str(), sh["reason"].as_str()),
        (Some("Failed"), Some("Terminated"))
    );
    assert_eq!(
        sh["message"],
        "Pod was terminated in response to imminent node shutdown."
    );

    let adm = status(k.admission_reject("adm", "NodeAffinity").unwrap());
    assert_eq!(
        (adm["phase"].as_str(), adm["reason"].as_str()),
        (Some("Failed"), Some("NodeAffinity"))
    );
    assert!(
        adm["message"]
            .as_str()
            .unwrap()
            .starts_with("Pod was rejected: ")
    );
    assert!(adm.get("containerStatuses").is_none());

    k.start("dl").unwrap();
    let dl = status(k.deadline_exceeded("dl").unwrap());
    assert_eq!(
        (dl["phase"].as_str(), dl["reason"].as_str()),
        (Some("Failed"), Some("DeadlineExceeded"))
    );
    assert_eq!(
        dl["message"],
        "Pod was active on the node longer than the specified deadline"
    );

    let se = status(k.start_error("se").unwrap());
    let t = &se["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (t["exitCode"].as_i64(), t["reason"].as_str()),
        (Some(128), Some("StartError"))
    );
    assert_eq!(t["startedAt"], "1970-01-01T00:00:00Z");
    assert!(
        t["message"]
            .as_str()
            .unwrap()
            .contains("exec: \"/app/run\": executable file not found in $PATH")
    );

    let lost = status(k.node_lost("lost").unwrap());
    assert_eq!(lost["phase"], "Failed");
    assert!(lost["containerStatuses"][0]["state"]["running"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_mode_runs_scripts_deadlines_and_deletions() {
    let cluster = FakeCluster::start().await;
    let k = cluster.kubelet();
    k.auto(true);
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");

    pods.create(
        &PostParams::default(),
        &pod("script", &[], &["sh", "-c", "echo hello; exit 3"]),
    )
    .await
    .unwrap();
    let mut env_pod = pod("env", &[], &["/app/run"]);
    env_pod.spec.as_mut().unwrap().containers[0].env = Some(vec![EnvVar {
        name: "SCARAB_TEST_EXIT".into(),
        value: Some("0".into()),
        ..EnvVar::default()
    }]);
    pods.create(&PostParams::default(), &env_pod).await.unwrap();
    let mut slow = pod("slow", &[], &["sh", "-c", "sleep 600"]);
    slow.spec.as_mut().unwrap().active_deadline_seconds = Some(1);
    pods.create(&PostParams::default(), &slow).await.unwrap();
    pods.create(
        &PostParams::default(),
        &pod("forever", &[], &["/app/serve"]),
    )
    .await
    .unwrap();

    let done = |name: &'static str| {
        let cluster = &cluster;
        move || {
            cluster
                .pod(name)
                .filter(|p| matches!(phase(p).as_str(), "Succeeded" | "Failed"))
        }
    };
    let script = eventually("script done", done("script")).await;
    assert_eq!(
        json_of(&script)["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        3
    );
    assert_eq!(
        pods.logs("script", &LogParams::default()).await.unwrap(),
        "hello\n"
    );
    assert_eq!(
        phase(&eventually("env done", done("env")).await),
        "Succeeded"
    );
    let slow = eventually("deadline", done("slow")).await;
    assert_eq!(
        slow.status.unwrap().reason.as_deref(),
        Some("DeadlineExceeded")
    );

    eventually("forever running", || {
        cluster.pod("forever").filter(|p| phase(p) == "Running")
    })
    .await;
    pods.delete("forever", &DeleteParams::default())
        .await
        .unwrap();
    eventually("forever gone", || {
        cluster.pod("forever").is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn kubeconfig_points_a_client_at_the_cluster() {
    let cluster = FakeCluster::start().await;
    let dir = common::tempdir().unwrap();
    let path = cluster.kubeconfig_with_namespace(dir.path(), "team-a");
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    assert_eq!(config.default_namespace, "team-a");
    let client = kube::Client::try_from(config).unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    pods.create(&PostParams::default(), &pod("via-kubeconfig", &[], &[]))
        .await
        .unwrap();
    assert!(cluster.pod("team-a/via-kubeconfig").is_some());
    let (method, target) = cluster.request_log().pop().unwrap();
    assert_eq!(
        (method, target.as_str()),
        (Method::POST, "/api/v1/namespaces/team-a/pods")
    );
}

async fn raw(cluster: &FakeCluster, request: &str) -> String {
    let mut sock = tokio::net::TcpStream::connect(("127.0.0.1", cluster.port()))
        .await
        .unwrap();
    sock.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn malformed_requests_get_status_answers() {
    let cluster = FakeCluster::start().await;
    let close = "Connection: close\r\n";
    for (request, code) in [
        (format!("NONSENSE\r\n{close}\r\n"), "400"),
        (
            format!(
                "POST /api/v1/namespaces/default/pods HTTP/1.1\r\n{close}Content-Length: 5\r\n\r\n{{oops"
            ),
            "400",
        ),
        (
            format!("GET /api/v1/namespaces/default/pods?continue=zz HTTP/1.1\r\n{close}\r\n"),
            "400",
        ),
        (
            format!(
                "GET /api/v1/namespaces/default/pods?watch=1&resourceVersion=abc HTTP/1.1\r\n{close}\r\n"
            ),
            "400",
        ),
        (
            format!(
                "GET /api/v1/namespaces/default/pods?fieldSelector=spec.bogus%3Dx HTTP/1.1\r\n{close}\r\n"
            ),
            "400",
        ),
        (
            format!(
                "PATCH /api/v1/namespaces/default/pods/x/status HTTP/1.1\r\n{close}Content-Type: application/json-patch+json\r\nContent-Length: 2\r\n\r\n[]"
            ),
            "415",
        ),
        (
            format!("GET /apis/batch/v1/jobs HTTP/1.1\r\n{close}\r\n"),
            "404",
        ),
        (
            format!(
                "POST /api/v1/namespaces/default/pods/x HTTP/1.1\r\n{close}Content-Length: 0\r\n\r\n"
            ),
            "405",
        ),
        (
            format!(
                "POST /api/v1/namespaces/default/pods HTTP/1.1\r\n{close}Transfer-Encoding: chunked\r\n\r\n1\r\n{{\r\n1\r\n}}\r\n0\r\n\r\n"
            ),
            "422",
        ),
    ] {
        let answer = raw(&cluster, &request).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {code} ")),
            "{request:?} → {answer}"
        );
        assert!(answer.contains("\"kind\":\"Status\""), "{answer}");
    }
    // Still serving.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

//! Request routing for core/v1 Pods: create, get, list (selectors, paging),
//! watch, delete (graceful), status update/patch, log; plus `/version`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::admission::{self, now};
use super::http::{Request, Response};
use super::selector::{FieldSelector, LabelSelector};
use super::status::{self, StatusBody};
use super::store::{Key, Shared, State};
use super::watch::{LogSpec, WatchSpec};
use super::{Fault, kubelet};

/// The identity in Forbidden messages.
pub const USER: &str = "system:serviceaccount:scarab:scarab-runner";

fn status_response(s: StatusBody) -> Response {
    Response::json(s.code, s.to_json())
}

fn pod_response(code: u16, pod: &Pod) -> Response {
    Response::json(code, serde_json::to_vec(pod).unwrap_or_default())
}

enum Target<'a> {
    Version,
    Collection(Option<&'a str>),
    Item(&'a str, &'a str),
    Sub(&'a str, &'a str, &'a str),
}

fn parse_target(path: &str) -> Option<Target<'_>> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    match segs.as_slice() {
        ["version"] => Some(Target::Version),
        ["api", "v1", "pods"] => Some(Target::Collection(None)),
        ["api", "v1", "namespaces", ns, "pods"] => Some(Target::Collection(Some(ns))),
        ["api", "v1", "namespaces", ns, "pods", name] => Some(Target::Item(ns, name)),
        ["api", "v1", "namespaces", ns, "pods", name, sub] => Some(Target::Sub(ns, name, sub)),
        _ => None,
    }
}

fn verb(req: &Request, target: &Target<'_>) -> &'static str {
    match (req.method.as_str(), target) {
        ("GET", Target::Collection(_)) if req.flag("watch") => "watch",
        ("GET", Target::Collection(_)) => "list",
        ("GET", _) => "get",
        ("POST", _) => "create",
        ("DELETE", Target::Collection(_)) => "deletecollection",
        ("DELETE", _) => "delete",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        _ => "unknown",
    }
}

pub fn handle(shared: &Arc<Shared>, req: &Request) -> Response {
    let Some(target) = parse_target(&req.path) else {
        return status_response(status::path_not_found());
    };
    if let Target::Version = target {
        return Response::json(
            200,
            serde_json::to_vec(&json!({
                "major": "1", "minor": "34", "gitVersion": "v1.34.0",
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2025-08-27T00:00:00Z", "goVersion": "go1.24.6",
                "compiler": "gc", "platform": "linux/amd64"
            }))
            .unwrap_or_default(),
        );
    }
    let fault = shared.fault();
    if fault == Fault::Forbidden {
        let (ns, name, resource) = match &target {
            Target::Collection(ns) => (ns.unwrap_or(""), "", "pods".to_string()),
            Target::Item(ns, name) => (*ns, *name, "pods".to_string()),
            Target::Sub(ns, name, sub) => (*ns, *name, format!("pods/{sub}")),
            Target::Version => ("", "", String::new()),
        };
        return status_response(status::forbidden(
            USER,
            verb(req, &target),
            &resource,
            name,
            ns,
        ));
    }
    let ns_missing = fault == Fault::NamespaceMissing;
    match (req.method.as_str(), target) {
        ("POST", Target::Collection(Some(ns))) => {
            if ns_missing {
                return status_response(status::not_found("namespaces", ns));
            }
            let why = match fault {
                Fault::PodSecurity => Some(
                    "violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"step\" must set securityContext.allowPrivilegeEscalation=false), runAsNonRoot != true (pod or container \"step\" must set securityContext.runAsNonRoot=true)",
                ),
                Fault::QuotaExceeded => Some(
                    "exceeded quota: compute, requested: pods=1, used: pods=10, limited: pods=10",
                ),
                _ => None,
            };
            if let Some(why) = why {
                let name = serde_json::from_slice::<Pod>(&req.body)
                    .ok()
                    .and_then(|p| p.metadata.name)
                    .unwrap_or_default();
                return status_response(status::admission_forbidden(&name, why));
            }
            create(shared, req, ns)
        }
        ("GET", Target::Collection(ns)) if req.flag("watch") => watch(req, ns, ns_missing),
        ("GET", Target::Collection(ns)) => list(shared, req, ns, ns_missing),
        ("GET", Target::Item(ns, name)) | ("GET", Target::Sub(ns, name, "status")) => {
            match lookup(shared, ns, name, ns_missing) {
                Some(pod) => pod_response(200, &pod),
                None => status_response(status::not_found("pods", name)),
            }
        }
        ("DELETE", Target::Item(ns, name)) => {
            if ns_missing {
                return status_response(status::not_found("pods", name));
            }
            delete(shared, req, ns, name)
        }
        ("PATCH" | "PUT", Target::Item(ns, name)) => {
            if ns_missing {
                return status_response(status::not_found("pods", name));
            }
            update(shared, req, ns, name, false)
        }
        ("PATCH" | "PUT", Target::Sub(ns, name, "status")) => {
            if ns_missing {
                return status_response(status::not_found("pods", name));
            }
            update(shared, req, ns, name, true)
        }
        ("GET", Target::Sub(ns, name, "log")) => log(shared, req, ns, name, ns_missing),
        (_, Target::Sub(_, _, sub)) if !matches!(sub, "status" | "log") => {
            status_response(status::path_not_found())
        }
        (method, _) => status_response(status::method_not_supported("pods", method)),
    }
}

fn lookup(shared: &Shared, ns: &str, name: &str, ns_missing: bool) -> Option<Pod> {
    if ns_missing {
        return None;
    }
    shared
        .lock()
        .pods
        .get(&(ns.to_string(), name.to_string()))
        .cloned()
}

fn create(shared: &Arc<Shared>, req: &Request, ns: &str) -> Response {
    let pod: Pod = match serde_json::from_slice(&req.body) {
        Ok(p) => p,
        Err(e) => {
            return status_response(status::bad_request(&format!(
                "Pod in version \"v1\" cannot be handled as a Pod: {e}"
            )));
        }
    };
    let dry_run = req.param("dryRun") == Some("All");
    let result = shared.write(|st| -> Result<(Key, Pod), StatusBody> {
        let pod = admission::prepare_create(st, ns, pod)?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let key = (ns.to_string(), name.clone());
        if st.pods.contains_key(&key) {
            return Err(status::already_exists("pods", &name));
        }
        if dry_run {
            return Ok((key, pod));
        }
        let pod = st.insert(key.clone(), pod);
        Ok((key, pod))
    });
    match result {
        Ok((key, pod)) => {
            if !dry_run {
                kubelet::on_created(shared, &key);
            }
            pod_response(201, &pod)
        }
        Err(s) => status_response(s),
    }
}

fn selectors(req: &Request) -> Result<(LabelSelector, FieldSelector), Response> {
    let labels = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
        .map_err(|e| status_response(status::bad_request(&e)))?;
    let fields = FieldSelector::parse(req.param("fieldSelector").unwrap_or(""))
        .map_err(|e| status_response(status::bad_request(&e)))?;
    Ok((labels, fields))
}

fn watch(req: &Request, ns: Option<&str>, ns_missing: bool) -> Response {
    let (labels, fields) = match selectors(req) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let resource_version = match req.param("resourceVersion").unwrap_or("") {
        "" | "0" => None,
        rv => match rv.parse::<u64>() {
            Ok(v) => Some(v),
            Err(_) => {
                return status_response(status::bad_request(&format!(
                    "invalid resource version: {rv}"
                )));
            }
        },
    };
    let timeout = req
        .param("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    Response::Watch(WatchSpec {
        namespace: ns.map(str::to_string),
        labels,
        fields,
        resource_version,
        send_initial_events: req.flag("sendInitialEvents"),
        bookmarks: req.flag("allowWatchBookmarks"),
        timeout,
        empty_namespace: ns_missing,
    })
}

/// The opaque continue token: hex of `{"rv":N,"start":"ns/name"}`.
fn encode_continue(rv: u64, key: &Key) -> String {
    let raw = json!({ "rv": rv, "start": format!("{}/{}", key.0, key.1) }).to_string();
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Option<(u64, Key)> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let v: Value = serde_json::from_slice(&bytes?).ok()?;
    let rv = v.get("rv")?.as_u64()?;
    let (ns, name) = v.get("start")?.as_str()?.split_once('/')?;
    Some((rv, (ns.to_string(), name.to_string())))
}

fn list(shared: &Shared, req: &Request, ns: Option<&str>, ns_missing: bool) -> Response {
    let (labels, fields) = match selectors(req) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let limit = req
        .param("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let cont = match req.param("continue").filter(|c| !c.is_empty()) {
        None => None,
        Some(token) => match decode_continue(token) {
            Some(c) => Some(c),
            None => {
                return status_response(status::bad_request(
                    "continue key is not valid: illegal base64 data at input byte 0",
                ));
            }
        },
    };
    let st = shared.lock();
    let snapshot_rv = cont.as_ref().map(|(rv, _)| *rv).unwrap_or(st.rv);
    let matching: Vec<(&Key, &Pod)> = if ns_missing {
        Vec::new()
    } else {
        st.pods
            .iter()
            .filter(|(k, _)| ns.is_none_or(|ns| k.0 == ns))
            .filter(|(k, _)| cont.as_ref().is_none_or(|(_, start)| *k > start))
            .filter(|(_, p)| labels.matches(p.metadata.labels.as_ref()) && fields.matches(p))
            .collect()
    };
    let take = limit.unwrap_or(usize::MAX).min(matching.len());
    let items: Vec<Value> = matching[..take]
        .iter()
        .map(|(_, p)| serde_json::to_value(p).unwrap_or_default())
        .collect();
    let mut metadata = json!({ "resourceVersion": snapshot_rv.to_string() });
    if take < matching.len()
        && let Some((last, _)) = matching.get(take.wrapping_sub(1))
    {
        metadata["continue"] = json!(encode_continue(snapshot_rv, last));
        metadata["remainingItemCount"] = json!(matching.len() - take);
    }
    drop(st);
    let body =
        json!({ "kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items });
    Response::json(200, serde_json::to_vec(&body).unwrap_or_default())
}

#[derive(Default)]
struct DeleteOptions {
    grace: Option<i64>,
    uid: Option<String>,
    resource_version: Option<String>,
}

fn delete_options(req: &Request) -> Result<DeleteOptions, Response> {
    let mut opts = DeleteOptions::default();
    if !req.body.iter().all(u8::is_ascii_whitespace) {
        let v: Value = serde_json::from_slice(&req.body).map_err(|e| {
            status_response(status::bad_request(&format!(
                "DeleteOptions in version \"v1\" cannot be handled as a DeleteOptions: {e}"
            )))
        })?;
        opts.grace = v.get("gracePeriodSeconds").and_then(Value::as_i64);
        if let Some(pre) = v.get("preconditions") {
            opts.uid = pre.get("uid").and_then(Value::as_str).map(str::to_string);
            opts.resource_version = pre
                .get("resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
    }
    if let Some(g) = req.param("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
        opts.grace = Some(g);
    }
    Ok(opts)
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// pkg/registry/core/pod/strategy.go CheckGracefulDelete plus the generic
/// registry's BeforeDelete: unscheduled or terminal Pods go at once; others get a
/// deletionTimestamp of now+grace and stay until the kubelet finishes them.
fn delete(shared: &Arc<Shared>, req: &Request, ns: &str, name: &str) -> Response {
    let opts = match delete_options(req) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let key: Key = (ns.to_string(), name.to_string());
    enum Outcome {
        Gone(Pod),
        Terminating(Pod, bool),
    }
    let outcome = shared.write(|st: &mut State| -> Result<Outcome, StatusBody> {
        let Some(pod) = st.pods.get(&key) else {
            return Err(status::not_found("pods", name));
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Some(want) = &opts.uid
            && *want != uid
        {
            return Err(status::conflict(
                "pods",
                name,
                &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
            ));
        }
        let rv = pod.metadata.resource_version.clone().unwrap_or_default();
        if let Some(want) = &opts.resource_version
            && *want != rv
        {
            return Err(status::conflict(
                "pods",
                name,
                &format!("Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"),
            ));
        }
        let default_grace = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        let scheduled = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty());
        let terminal = matches!(phase(pod), "Succeeded" | "Failed");
        let mut grace = opts.grace.unwrap_or(default_grace).max(0);
        if !scheduled || terminal {
            grace = 0;
        }
        let existing = pod.metadata.deletion_grace_period_seconds;
        if grace == 0 {
            // Immediate: no intermediate write, a single DELETED event; the response
            // carries the deletion stamp (rest.BeforeDelete set it on the copy).
            let mut gone = st.remove(&key).ok_or_else(|| status::not_found("pods", name))?;
            gone.metadata.deletion_timestamp.get_or_insert_with(now);
            gone.metadata.deletion_grace_period_seconds = Some(0);
            return Ok(Outcome::Gone(gone));
        }
        if let Some(existing) = existing {
            if grace < existing {
                let pod = st
                    .modify(&key, |p| {
                        p.metadata.deletion_timestamp = Some(after(grace));
                        p.metadata.deletion_grace_period_seconds = Some(grace);
                    })
                    .ok_or_else(|| status::not_found("pods", name))?;
                return Ok(Outcome::Terminating(pod, false));
            }
            return Ok(Outcome::Terminating(st.pods[&key].clone(), false));
        }
        let pod = st
            .modify(&key, |p| {
                p.metadata.deletion_timestamp = Some(after(grace));
                p.metadata.deletion_grace_period_seconds = Some(grace);
                // rest.BeforeDelete bumps the generation of a graceful deletion.
                p.metadata.generation = Some(p.metadata.generation.unwrap_or(0) + 1);
            })
            .ok_or_else(|| status::not_found("pods", name))?;
        Ok(Outcome::Terminating(pod, true))
    });
    match outcome {
        Err(s) => status_response(s),
        Ok(Outcome::Gone(pod)) => pod_response(200, &pod),
        Ok(Outcome::Terminating(pod, started)) => {
            if started {
                kubelet::on_graceful_delete(shared, &key);
            }
            pod_response(200, &pod)
        }
    }
}

fn after(secs: i64) -> Time {
    let now = Timestamp::now();
    Time(
        now.checked_add(SignedDuration::from_secs(secs))
            .unwrap_or(now),
    )
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// PUT/PATCH on the Pod or its status subresource. Merge, strategic-merge (treated
/// as merge: lists are replaced) and apply (JSON body) patches are accepted.
fn update(
    shared: &Arc<Shared>,
    req: &Request,
    ns: &str,
    name: &str,
    status_only: bool,
) -> Response {
    let content_type = req
        .header("content-type")
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    if req.method == "PATCH"
        && !matches!(
            content_type.as_str(),
            "application/merge-patch+json"
                | "application/strategic-merge-patch+json"
                | "application/apply-patch+yaml"
        )
    {
        return status_response(status::unsupported_media_type(&content_type));
    }
    let body: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => {
            return status_response(status::bad_request(&format!("error decoding patch: {e}")));
        }
    };
    let key: Key = (ns.to_string(), name.to_string());
    let result = shared.write(|st: &mut State| -> Result<Pod, StatusBody> {
        let Some(current) = st.pods.get(&key) else {
            return Err(status::not_found("pods", name));
        };
        let current_rv = current.metadata.resource_version.clone().unwrap_or_default();
        if let Some(want) = body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            && want != current_rv
        {
            return Err(status::conflict(
                "pods",
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let mut merged = serde_json::to_value(current).unwrap_or_default();
        if req.method == "PUT" {
            merged = body.clone();
        } else {
            merge_patch(&mut merged, &body);
        }
        let incoming: Pod = serde_json::from_value(merged).map_err(|e| {
            status::bad_request(&format!("Pod in version \"v1\" cannot be handled as a Pod: {e}"))
        })?;
        let current = current.clone();
        let mut next = current.clone();
        if status_only {
            next.status = incoming.status;
        } else {
            next.metadata.labels = incoming.metadata.labels;
            next.metadata.annotations = incoming.metadata.annotations;
            next.metadata.finalizers = incoming.metadata.finalizers;
            next.metadata.owner_references = incoming.metadata.owner_references;
            if let (Some(spec), Some(new)) = (next.spec.as_mut(), incoming.spec) {
                spec.active_deadline_seconds = new.active_deadline_seconds;
                for (c, n) in spec.containers.iter_mut().zip(new.containers) {
                    c.image = n.image;
                }
            }
        }
        st.modify(&key, |p| *p = next)
            .ok_or_else(|| status::not_found("pods", name))
    });
    match result {
        Ok(pod) => pod_response(200, &pod),
        Err(s) => status_response(s),
    }
}

fn log(shared: &Shared, req: &Request, ns: &str, name: &str, ns_missing: bool) -> Response {
    let Some(pod) = lookup(shared, ns, name, ns_missing) else {
        return status_response(status::not_found("pods", name));
    };
    let spec_containers: Vec<String> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default();
    let container = match req.param("container").filter(|c| !c.is_empty()) {
        Some(c) if !spec_containers.iter().any(|n| n == c) => {
            return status_response(status::bad_request(&format!(
                "container {c} is not valid for pod {name}"
            )));
        }
        Some(c) => c.to_string(),
        None if spec_containers.len() == 1 => spec_containers[0].clone(),
        None => {
            return status_response(status::bad_request(&format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                spec_containers.join(" ")
            )));
        }
    };
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_none_or(str::is_empty)
    {
        return status_response(status::bad_request(&format!(
            "pod {name} does not have a host assigned"
        )));
    }
    let cs = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|l| l.iter().find(|c| c.name == container));
    let started = cs.is_some_and(|c| c.container_id.is_some());
    if !started {
        let reason = cs
            .and_then(|c| c.state.as_ref())
            .and_then(|s| {
                s.waiting
                    .as_ref()
                    .and_then(|w| w.reason.clone())
                    .or_else(|| s.terminated.as_ref().and_then(|t| t.reason.clone()))
            })
            .unwrap_or_else(|| "ContainerCreating".into());
        return status_response(status::bad_request(&format!(
            "container {container:?} in pod {name:?} is waiting to start: {reason}"
        )));
    }
    Response::Log(LogSpec {
        key: (ns.to_string(), name.to_string()),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        follow: req.flag("follow"),
        tail_lines: req.param("tailLines").and_then(|t| t.parse().ok()),
        limit_bytes: req.param("limitBytes").and_then(|t| t.parse().ok()),
    })
}

//! What the apiserver does to a Pod on create: validation (pkg/apis/core/validation
//! ValidatePodCreate: metadata.name is a DNS-1123 subdomain, containers required,
//! container names DNS-1123 labels, image required), defaulting
//! (pkg/apis/core/v1/defaults.go: restartPolicy Always, dnsPolicy ClusterFirst,
//! terminationGracePeriodSeconds 30, schedulerName default-scheduler,
//! terminationMessagePath/Policy, imagePullPolicy) and the registry strategy
//! (pkg/registry/core/pod/strategy.go PrepareForCreate: status reset to phase
//! Pending with qosClass).

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::status::{self, FieldError, StatusBody};
use super::store::State;

/// validation.go: dns1123SubdomainErrorMsg / dns1123LabelErrMsg with RegexError's examples.
const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

pub fn now() -> Time {
    Time(Timestamp::now())
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_label)
}

fn name_errors(field: &str, value: &str, subdomain: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let (max, ok, msg) = if subdomain {
        (253, is_dns1123_subdomain(value), SUBDOMAIN_MSG)
    } else {
        (63, is_label(value), LABEL_MSG)
    };
    if value.len() > max {
        errs.push(FieldError::invalid(
            field,
            value,
            &format!("must be no more than {max} characters"),
        ));
    }
    if !ok {
        errs.push(FieldError::invalid(field, value, msg));
    }
    errs
}

/// Pseudo-random lowercase hex from the sequence counter and the clock.
pub fn hex(state: &mut State, len: usize) -> String {
    let mut out = String::new();
    while out.len() < len {
        let seed = state.next_seq() as u128 ^ ulid::Ulid::new().0;
        out.push_str(&format!("{seed:032x}"));
    }
    out.truncate(len);
    out
}

pub fn new_uid(state: &mut State) -> String {
    let h = hex(state, 32);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// names.SimpleNameGenerator: 5 chars from the apiserver's alphabet.
fn generate_suffix(state: &mut State) -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let h = hex(state, 10);
    h.as_bytes()
        .chunks(2)
        .map(|c| {
            let v = u8::from_str_radix(std::str::from_utf8(c).unwrap_or("0"), 16).unwrap_or(0);
            ALPHA[v as usize % ALPHA.len()] as char
        })
        .collect()
}

/// qos.GetPodQOS, simplified: no requests/limits → BestEffort; every container with
/// limits equal to requests for cpu and memory → Guaranteed; else Burstable.
fn qos_class(pod: &Pod) -> &'static str {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or(&[]);
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        let r = c.resources.as_ref();
        let req = r.and_then(|r| r.requests.clone()).unwrap_or_default();
        let lim = r.and_then(|r| r.limits.clone()).unwrap_or_default();
        if !req.is_empty() || !lim.is_empty() {
            any = true;
        }
        for res in ["cpu", "memory"] {
            match (lim.get(res), req.get(res)) {
                (Some(l), Some(q)) if l == q => {}
                (Some(_), None) => {}
                _ => guaranteed = false,
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// Validates, defaults and stamps a Pod for `POST .../namespaces/{ns}/pods`.
/// Does not check for an existing name (the caller does, after generateName).
pub fn prepare_create(state: &mut State, ns: &str, mut pod: Pod) -> Result<Pod, StatusBody> {
    if let Some(body_ns) = pod.metadata.namespace.as_deref()
        && !body_ns.is_empty()
        && body_ns != ns
    {
        return Err(status::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let mut name = pod.metadata.name.clone().unwrap_or_default();
    if name.is_empty()
        && let Some(prefix) = pod.metadata.generate_name.as_deref()
        && !prefix.is_empty()
    {
        name = format!("{prefix}{}", generate_suffix(state));
    }

    let mut errs = Vec::new();
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        errs.extend(name_errors("metadata.name", &name, true));
    }
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    if containers.is_empty() {
        errs.push(FieldError::required("spec.containers", ""));
    }
    for (i, c) in containers.iter().enumerate() {
        let field = format!("spec.containers[{i}].name");
        if c.name.is_empty() {
            errs.push(FieldError::required(&field, ""));
        } else {
            errs.extend(name_errors(&field, &c.name, false));
        }
        if c.image.as_deref().unwrap_or("").trim().is_empty() {
            errs.push(FieldError::required(
                &format!("spec.containers[{i}].image"),
                "",
            ));
        }
    }
    if let Some(s) = pod.spec.as_ref()
        && let Some(d) = s.active_deadline_seconds
        && d <= 0
    {
        errs.push(FieldError::invalid(
            "spec.activeDeadlineSeconds",
            &d.to_string(),
            "must be between 1 and 2147483647, inclusive",
        ));
    }
    if !errs.is_empty() {
        return Err(status::invalid("Pod", &name, &errs));
    }

    // Registry strategy and defaults.
    let uid = new_uid(state);
    let meta = &mut pod.metadata;
    meta.name = Some(name);
    meta.namespace = Some(ns.to_string());
    meta.uid = Some(uid);
    meta.creation_timestamp = Some(now());
    meta.generation = Some(1);
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.resource_version = None;
    meta.managed_fields = None;

    if let Some(spec) = pod.spec.as_mut() {
        spec.restart_policy.get_or_insert_with(|| "Always".into());
        spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
        spec.scheduler_name
            .get_or_insert_with(|| "default-scheduler".into());
        spec.termination_grace_period_seconds.get_or_insert(30);
        spec.service_account_name
            .get_or_insert_with(|| "default".into());
        spec.enable_service_links.get_or_insert(true);
        spec.preemption_policy
            .get_or_insert_with(|| "PreemptLowerPriority".into());
        spec.priority.get_or_insert(0);
        spec.security_context.get_or_insert_with(Default::default);
        for c in &mut spec.containers {
            c.termination_message_path
                .get_or_insert_with(|| "/dev/termination-log".into());
            c.termination_message_policy
                .get_or_insert_with(|| "File".into());
            c.resources.get_or_insert_with(Default::default);
            if c.image_pull_policy.is_none() {
                let image = c.image.clone().unwrap_or_default();
                let last = image.rsplit('/').next().unwrap_or("");
                let tagged = last.contains(':') && !last.ends_with(":latest");
                c.image_pull_policy = Some(if tagged || image.contains('@') {
                    "IfNotPresent".into()
                } else {
                    "Always".into()
                });
            }
        }
    }
    let qos = qos_class(&pod);
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        qos_class: Some(qos.into()),
        ..PodStatus::default()
    });
    Ok(pod)
}

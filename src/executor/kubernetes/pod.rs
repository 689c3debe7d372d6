//! The Pod of one attempt: its deterministic name, its labels, its spec.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::engine::{Fence, RunId};
use crate::store::records::{LaunchRecord, PodRecord};

/// Every Pod Scarab creates carries this label; the one watch and the start-up LIST
/// select on it.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "scarab";
pub const SELECTOR: &str = "app.kubernetes.io/managed-by=scarab";
pub const LABEL_RUN: &str = "scarab.dev/run";
pub const LABEL_STEP: &str = "scarab.dev/step";
pub const LABEL_ATTEMPT: &str = "scarab.dev/attempt";
pub const LABEL_FENCE: &str = "scarab.dev/fence";
pub const ANNOTATION_STEP_NAME: &str = "scarab.dev/step-name";
/// The step's container: the one whose process is "the step".
pub const CONTAINER: &str = "step";

/// `<run>-s<step index>-f<fence>`: a valid DNS-1123 label (lower-case run id, digits),
/// at most 27 + 7 + 22 = 56 characters, so never truncated; the same attempt always
/// gets the same name, which makes creation idempotent per fence.
pub fn pod_name(run: RunId, step: usize, fence: Fence) -> String {
    format!("{}{fence}", step_prefix(run, step))
}

/// What the names of one step's Pods start with (and no other step's: `-f` follows).
pub fn step_prefix(run: RunId, step: usize) -> String {
    format!("{run}-s{step}-f")
}

/// The attempt a Pod belongs to, from its labels: (run, step index, fence).
pub fn identity(pod: &Pod) -> Option<(RunId, usize, Fence)> {
    let labels = pod.metadata.labels.as_ref()?;
    if labels.get(MANAGED_BY).map(String::as_str) != Some(MANAGED_BY_VALUE) {
        return None;
    }
    let run = labels.get(LABEL_RUN)?.parse().ok()?;
    let step = labels.get(LABEL_STEP)?.parse().ok()?;
    let fence = labels.get(LABEL_FENCE)?.parse().ok()?;
    Some((run, step, Fence(fence)))
}

/// The Pod for one attempt: `restartPolicy: Never` (a retry is Scarab's decision, with a
/// new fence), `activeDeadlineSeconds` = the step timeout (the kubelet kills a hung step
/// even while Scarab is down), and the step's `SCARAB_*` environment.
pub fn build(order: &LaunchRecord, template: &PodRecord) -> Pod {
    let name = pod_name(order.run, usize::from(order.step), order.fence);
    let labels = BTreeMap::from([
        (MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
        (LABEL_RUN.to_string(), order.run.to_string()),
        (LABEL_STEP.to_string(), order.step.to_string()),
        (LABEL_ATTEMPT.to_string(), order.attempt.to_string()),
        (LABEL_FENCE.to_string(), order.fence.0.to_string()),
    ]);
    let annotations = BTreeMap::from([(ANNOTATION_STEP_NAME.to_string(), order.step_name.clone())]);
    let mut env = vec![
        env_var("SCARAB_RUN_ID", &order.run.to_string()),
        env_var("SCARAB_STEP", &order.step_name),
        env_var("SCARAB_ATTEMPT", &order.attempt.to_string()),
        env_var("SCARAB_FENCE", &order.fence.0.to_string()),
    ];
    env.extend(template.env.iter().map(|(k, v)| env_var(k, v)));
    // A named secret is a Kubernetes Secret of the namespace: the kubelet puts its `value`
    // into the container; Scarab never sees it.
    env.extend(template.secrets.iter().map(|(variable, secret)| EnvVar {
        name: variable.clone(),
        value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
            secret_key_ref: Some(k8s_openapi::api::core::v1::SecretKeySelector {
                name: secret.clone(),
                key: SECRET_KEY.to_string(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }));
    let quantities = |pairs: &[(String, String)]| {
        (!pairs.is_empty()).then(|| {
            pairs
                .iter()
                .map(|(k, v)| (k.clone(), Quantity(v.clone())))
                .collect()
        })
    };
    let container = Container {
        name: CONTAINER.to_string(),
        image: Some(template.image.clone()),
        command: (!template.command.is_empty()).then(|| template.command.clone()),
        args: (!template.args.is_empty()).then(|| template.args.clone()),
        env: Some(env),
        working_dir: template.workdir.clone(),
        resources: Some(ResourceRequirements {
            requests: quantities(&template.requests),
            limits: quantities(&template.limits),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };
    let deadline_s = order.timeout_ms.div_ceil(1000).max(1);
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            restart_policy: Some("Never".to_string()),
            active_deadline_seconds: Some(i64::try_from(deadline_s).unwrap_or(i64::MAX)),
            service_account_name: template.service_account.clone(),
            node_selector: (!template.node_selector.is_empty())
                .then(|| template.node_selector.iter().cloned().collect()),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The key of a Kubernetes Secret that `env: {VAR: {secret: NAME}}` reads.
pub const SECRET_KEY: &str = "value";

fn env_var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        ..EnvVar::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::records::LaunchAction;

    #[test]
    fn names_are_dns_labels_and_labels_round_trip() {
        let run: RunId = "r01m8xaz6t4hpa5m3jsn0p2xd4n".parse().expect("run id");
        let name = pod_name(run, 99, Fence(u64::MAX));
        assert!(name.len() <= 63, "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
        let template = PodRecord {
            image: "alpine".into(),
            command: vec![],
            args: vec!["x".into()],
            env: vec![("A".into(), "1".into())],
            secrets: vec![("TOKEN".into(), "registry-key".into())],
            workdir: None,
            requests: vec![("cpu".into(), "100m".into())],
            limits: vec![],
            service_account: None,
            node_selector: vec![],
        };
        let order = LaunchRecord {
            run,
            step: 3,
            step_name: "build".into(),
            attempt: 2,
            fence: Fence(41),
            timeout_ms: 1500,
            action: LaunchAction::Kubernetes(Box::new(template.clone())),
        };
        let pod = build(&order, &template);
        assert_eq!(identity(&pod), Some((run, 3, Fence(41))));
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.active_deadline_seconds, Some(2), "rounded up");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let env = spec.containers[0].env.clone().expect("env");
        assert!(
            env.iter()
                .any(|e| e.name == "SCARAB_FENCE" && e.value.as_deref() == Some("41"))
        );
        // A named secret is a reference the kubelet resolves, never a value.
        let token = env
            .iter()
            .find(|e| e.name == "TOKEN")
            .expect("secret variable");
        assert_eq!(token.value, None);
        let reference = token
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("secretKeyRef");
        assert_eq!(
            (reference.name.as_str(), reference.key.as_str()),
            ("registry-key", "value")
        );
        assert!(
            spec.containers[0].command.is_none(),
            "the image's entrypoint is kept"
        );
    }
}

//! Label and field selectors as the apiserver parses them
//! (staging/src/k8s.io/apimachinery/pkg/labels/selector.go,
//! pkg/fields/selector.go, and the Pod field labels of pkg/registry/core/pod/strategy.go).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed `labelSelector`; empty matches everything. Terms are ANDed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
}

/// Splits on commas that are not inside parentheses.
fn split_terms(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("found '{rest}', expected: '('"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            if let Some(key) = term.strip_prefix('!') {
                let key = key.trim();
                if !valid_key(key) {
                    return Err(format!(
                        "unable to parse requirement: invalid label key {key:?}"
                    ));
                }
                reqs.push(Requirement {
                    key: key.to_string(),
                    op: Op::NotExists,
                });
                continue;
            }
            let key_end = term
                .find(|c: char| c.is_whitespace() || matches!(c, '=' | '!' | '('))
                .unwrap_or(term.len());
            let key = &term[..key_end];
            if !valid_key(key) {
                return Err(format!(
                    "unable to parse requirement: invalid label key {key:?}"
                ));
            }
            let rest = term[key_end..].trim_start();
            let op = if rest.is_empty() {
                Op::Exists
            } else if let Some(v) = rest.strip_prefix("!=") {
                Op::NotEq(v.trim().to_string())
            } else if let Some(v) = rest.strip_prefix("==") {
                Op::Eq(v.trim().to_string())
            } else if let Some(v) = rest.strip_prefix('=') {
                Op::Eq(v.trim().to_string())
            } else if let Some(v) = rest.strip_prefix("notin") {
                Op::NotIn(parse_set(v)?)
            } else if let Some(v) = rest.strip_prefix("in") {
                Op::In(parse_set(v)?)
            } else {
                return Err(format!(
                    "found '{rest}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            };
            reqs.push(Requirement {
                key: key.to_string(),
                op,
            });
        }
        Ok(LabelSelector { reqs })
    }

    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let empty = BTreeMap::new();
        let labels = labels.unwrap_or(&empty);
        self.reqs.iter().all(|r| {
            let v = labels.get(&r.key);
            match &r.op {
                Op::Eq(want) => v == Some(want),
                Op::NotEq(want) => v != Some(want),
                Op::In(set) => v.is_some_and(|v| set.contains(v)),
                Op::NotIn(set) => v.is_none_or(|v| !set.contains(v)),
                Op::Exists => v.is_some(),
                Op::NotExists => v.is_none(),
            }
        })
    }
}

/// A parsed `fieldSelector` over the Pod field labels the apiserver supports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>, // (field, equal?, value)
}

const POD_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

fn pod_field(pod: &Pod, field: &str) -> String {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    match field {
        "metadata.name" => pod.metadata.name.clone(),
        "metadata.namespace" => pod.metadata.namespace.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.restartPolicy" => spec.and_then(|s| s.restart_policy.clone()),
        "spec.schedulerName" => spec.and_then(|s| s.scheduler_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "spec.hostNetwork" => Some(
            spec.and_then(|s| s.host_network)
                .unwrap_or(false)
                .to_string(),
        ),
        "status.phase" => status.and_then(|s| s.phase.clone()),
        "status.podIP" => status.and_then(|s| s.pod_ip.clone()),
        "status.nominatedNodeName" => status.and_then(|s| s.nominated_node_name.clone()),
        _ => None,
    }
    .unwrap_or_default()
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<FieldSelector, String> {
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            let (field, eq, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            let field = field.trim();
            if !POD_FIELDS.contains(&field) {
                return Err(format!("field label not supported: {field}"));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector { reqs })
    }

    pub fn matches(&self, pod: &Pod) -> bool {
        self.reqs
            .iter()
            .all(|(field, eq, value)| (pod_field(pod, field) == *value) == *eq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selector_forms() {
        let l = labels(&[("app", "scarab"), ("tier", "b")]);
        for (sel, want) in [
            ("", true),
            ("app=scarab", true),
            ("app==scarab", true),
            ("app!=scarab", false),
            ("app=scarab,tier=a", false),
            ("tier in (a, b)", true),
            ("tier notin (a,b)", false),
            ("app", true),
            ("!app", false),
            ("missing", false),
            ("!missing", true),
            ("app=scarab,tier in (b),!missing", true),
        ] {
            let s = LabelSelector::parse(sel).unwrap();
            assert_eq!(s.matches(Some(&l)), want, "{sel}");
        }
        assert!(LabelSelector::parse("app ~ x").is_err());
    }
}

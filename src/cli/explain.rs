//! `scarab explain-pod FILE [--now RFC3339] [--container NAME] [-o json]`: judges a Pod
//! document as `kubectl get pod -o json` (or `-o yaml`) prints it, with the very function
//! the Kubernetes executor uses ([`judge`]), and prints the verdict (docs/api.md).
//!
//! Grace periods are measured from the Pod's own timestamps up to `--now` (default: the
//! wall clock), so an old capture can be replayed as of the moment it was taken.

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use serde_json::Value;

use crate::engine::Timestamp;
use crate::executor::kubernetes::classify::{GracePeriods, Judgement, judge};

/// A Pod object is bounded by etcd's 1.5 MiB request limit; pretty-printed YAML of one
/// stays far below this. Anything larger is not a Pod.
const DOCUMENT_MAX_BYTES: u64 = 8 * 1024 * 1024;

/// Explains the Pod in `file` (`-` reads standard input). Exit 0 with the judgement on
/// stdout; exit 2 with the reason on stderr when the input, `now` or `container` is bad.
pub fn run(
    file: &Path,
    now: Option<&str>,
    container: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let judgement = match explain(file, now, container) {
        Ok(judgement) => judgement,
        Err(message) => {
            eprintln!("error: {message}");
            return Ok(ExitCode::from(2));
        }
    };
    let line = if json {
        json_line(&judgement)?
    } else {
        human_line(&judgement)
    };
    // No println!: a closed pipe is an error to report, not a panic.
    writeln!(std::io::stdout().lock(), "{line}")?;
    Ok(ExitCode::SUCCESS)
}

/// Everything that can be wrong with the input, as a message naming what is wrong.
fn explain(file: &Path, now: Option<&str>, container: Option<&str>) -> Result<Judgement, String> {
    let now = match now {
        Some(text) => parse_now(text)?,
        None => crate::clock::now(),
    };
    let text = read_document(file)?;
    explain_text(&text, now, container).map_err(|e| format!("{}: {e}", file.display()))
}

/// The judgement of a Pod document's text, or what is wrong with it.
pub(crate) fn explain_text(
    text: &str,
    now: Timestamp,
    container: Option<&str>,
) -> Result<Judgement, String> {
    let pod = parse_pod(text)?;
    let main = main_container(&pod, container)?;
    Ok(judge(&pod, &main, now, &GracePeriods::default()))
}

fn parse_now(text: &str) -> Result<Timestamp, String> {
    let time: k8s_openapi::jiff::Timestamp = text
        .trim()
        .parse()
        .map_err(|e| format!("--now {text:?} is not an RFC 3339 time: {e}"))?;
    u64::try_from(time.as_millisecond())
        .map(Timestamp)
        .map_err(|_| format!("--now {text:?} is before 1970"))
}

fn read_document(file: &Path) -> Result<String, String> {
    let name = file.display();
    let mut bytes = Vec::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(DOCUMENT_MAX_BYTES + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(file)
            .and_then(|f| f.take(DOCUMENT_MAX_BYTES + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| format!("reading {name}: {e}"))?;
    if bytes.len() as u64 > DOCUMENT_MAX_BYTES {
        return Err(format!(
            "{name}: larger than {DOCUMENT_MAX_BYTES} bytes; not a single Pod"
        ));
    }
    String::from_utf8(bytes).map_err(|_| format!("{name}: not UTF-8 text"))
}

/// JSON when the document starts with `{` (what `-o json` prints), YAML otherwise.
fn parse_pod(text: &str) -> Result<Pod, String> {
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    if trimmed.is_empty() {
        return Err("empty document; expected a Pod".to_string());
    }
    let value: Value = if trimmed.starts_with('{') {
        serde_json::from_str(trimmed).map_err(|e| format!("not valid JSON: {e}"))?
    } else {
        serde_saphyr::from_str(trimmed).map_err(|e| format!("not valid YAML or JSON: {e}"))?
    };
    check_kind(&value)?;
    serde_json::from_value(value).map_err(|e| format!("not a valid Pod: {e}"))
}

fn check_kind(value: &Value) -> Result<(), String> {
    let Some(object) = value.as_object() else {
        return Err("expected a Pod object".to_string());
    };
    match object.get("kind").and_then(Value::as_str) {
        Some("Pod") => Ok(()),
        Some("List" | "PodList") => Err(
            "a list of objects, not one Pod: pass one (`kubectl get pod NAME -o json`)".to_string(),
        ),
        Some(other) => Err(format!("kind is {other:?}, not \"Pod\"")),
        // Hand-trimmed documents may drop `kind`; a Pod still has a spec or a status.
        None if object.contains_key("spec") || object.contains_key("status") => Ok(()),
        None => Err("not a Pod: no kind, spec or status".to_string()),
    }
}

/// `--container`, checked against the Pod; by default the first container of the spec.
fn main_container(pod: &Pod, wanted: Option<&str>) -> Result<String, String> {
    let mut names: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.as_str()))
        .collect();
    if names.is_empty() {
        // A trimmed document without spec: fall back to the reported containers.
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_deref());
        names = statuses
            .unwrap_or(&[])
            .iter()
            .map(|s| s.name.as_str())
            .collect();
    }
    match wanted {
        Some(name) if names.contains(&name) || names.is_empty() => Ok(name.to_string()),
        Some(name) => Err(format!(
            "--container {name:?} is not in the Pod (containers: {})",
            names.join(", ")
        )),
        None => Ok(names.first().map_or_else(String::new, |n| (*n).to_string())),
    }
}

/// Exactly the §9 contract: these five keys, in this order, nothing else.
#[derive(Serialize)]
struct Explained<'a> {
    verdict: &'static str,
    class: Option<&'static str>,
    started: bool,
    reason: &'a str,
    rule: &'static str,
}

fn json_line(judgement: &Judgement) -> serde_json::Result<String> {
    serde_json::to_string(&Explained {
        verdict: judgement.verdict.as_str(),
        class: judgement.class.map(|c| c.as_str()),
        started: judgement.started,
        reason: &judgement.reason,
        rule: judgement.rule,
    })
}

fn human_line(judgement: &Judgement) -> String {
    let class = judgement
        .class
        .map_or_else(String::new, |c| format!(" ({c})"));
    let started = if judgement.started {
        "main container started"
    } else {
        "main container never started"
    };
    let delete = if judgement.delete {
        "; the executor deletes this Pod"
    } else {
        ""
    };
    format!(
        "{}{class}: {} [{started}; rule {}{delete}]",
        judgement.verdict, judgement.reason, judgement.rule
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_and_json_parse_to_the_same_pod() {
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},
            "spec":{"containers":[{"name":"step","image":"x"}]},"status":{"phase":"Running"}}"#;
        let yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: step\n    image: x\nstatus:\n  phase: Running\n";
        assert_eq!(parse_pod(json), parse_pod(yaml));
        assert!(parse_pod(json).is_ok());
    }

    #[test]
    fn not_a_pod_is_named() {
        let cases = [
            ("", "empty"),
            ("[1, 2]", "expected a Pod object"),
            (r#"{"kind": "List", "items": []}"#, "list"),
            ("kind: Deployment\nspec: {}\n", "not \"Pod\""),
            ("{\"kind\": \"Pod\",", "not valid JSON"),
            ("hello: [", "not valid YAML"),
            (r#"{"metadata": {"name": "x"}}"#, "no kind"),
            (
                r#"{"kind": "Pod", "spec": {"containers": 3}}"#,
                "not a valid Pod",
            ),
        ];
        for (text, expected) in cases {
            let error = parse_pod(text).expect_err(text);
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }

    #[test]
    fn now_must_be_rfc3339() {
        assert_eq!(parse_now("1970-01-01T00:00:01Z"), Ok(Timestamp(1000)));
        assert_eq!(
            parse_now("2025-03-01T12:00:00+02:00"),
            parse_now("2025-03-01T10:00:00Z")
        );
        assert!(parse_now("yesterday").is_err());
        assert!(parse_now("1969-12-31T23:59:59Z").is_err());
    }

    #[test]
    fn unknown_container_is_an_error() {
        let pod = parse_pod(r#"{"kind":"Pod","spec":{"containers":[{"name":"a"},{"name":"b"}]}}"#)
            .expect("pod");
        assert_eq!(main_container(&pod, None), Ok("a".to_string()));
        assert_eq!(main_container(&pod, Some("b")), Ok("b".to_string()));
        assert!(main_container(&pod, Some("c")).is_err());
    }

    #[test]
    fn json_has_exactly_the_contract_keys_in_order() {
        let pod = parse_pod(r#"{"kind":"Pod","status":{"phase":"Pending"}}"#).expect("pod");
        let line =
            json_line(&judge(&pod, "", Timestamp(0), &GracePeriods::default())).expect("json");
        assert!(
            line.starts_with(r#"{"verdict":"pending","class":null,"started":false,"reason":"#),
            "{line}"
        );
        assert!(line.ends_with(r#","rule":"pending"}"#), "{line}");
    }
}

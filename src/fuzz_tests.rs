//! Fuzz targets on stable Rust (proptest): every reader of outside input — the pipeline
//! parser, the Pod classifier behind `explain-pod`, the stored-record decoders and the
//! attempt-directory files — takes arbitrary and mutated input without a panic, and
//! either accepts it or says what is wrong. `PROPTEST_CASES` sets the cases per target
//! (256 in the suite); docs/benchmarks.md has a longer run.

use proptest::prelude::*;

use crate::engine::Timestamp;

/// Text that looks like YAML or JSON often enough to get past the first byte.
fn document_text() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("name: ".to_string()),
        Just("steps:\n".to_string()),
        Just("  - ".to_string()),
        Just("run: ".to_string()),
        Just("[sh, -c, x]".to_string()),
        Just("needs: [a]".to_string()),
        Just("gate: {}".to_string()),
        Just("retry: {on: step, max: 3}".to_string()),
        Just("env: {A: {secret: s}}".to_string()),
        Just("concurrency: {group: g, limit: 2}".to_string()),
        Just("slots: 3".to_string()),
        Just("locks: [gpu, gpu]".to_string()),
        Just("priority: -5".to_string()),
        Just("executor: kubernetes".to_string()),
        Just("image: x".to_string()),
        Just("timeout: 1h".to_string()),
        Just("${steps.a.outputs.b}".to_string()),
        Just("&a ".to_string()),
        Just("*a".to_string()),
        Just("!!binary ".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("\"".to_string()),
        Just("\n".to_string()),
        Just("    ".to_string()),
        "[a-z0-9:_ -]{0,12}",
        any::<char>().prop_map(|c| c.to_string()),
    ];
    proptest::collection::vec(token, 0..60).prop_map(|parts| parts.concat())
}

const PIPELINE: &str = "name: p\npriority: 3\nparallelism: 2\nconcurrency: {group: g}\nsteps:\n  - name: a\n    run: [sh, -c, 'echo hi']\n    slots: 2\n    locks: [gpu]\n    retry: {on: [step, lost], max: 2, backoff: {initial: 1s}}\n  - name: b\n    needs: [a]\n    env: {X: '${steps.a.outputs.v}'}\n    run: ['true']\n  - name: c\n    needs: [b]\n    gate: {auto_release: 1m, expires: 1h}\n";

/// `base` with a few bytes replaced, inserted or removed (kept UTF-8).
fn mutated(base: &'static str) -> impl Strategy<Value = String> {
    proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..8).prop_map(move |edits| {
        let mut bytes = base.as_bytes().to_vec();
        for (at, byte, kind) in edits {
            let at = at % (bytes.len() + 1);
            match kind {
                0 if at < bytes.len() => bytes[at] = byte,
                1 => bytes.insert(at, byte),
                _ if at < bytes.len() => {
                    bytes.remove(at);
                }
                _ => {}
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// A JSON value built from the words of a Pod's status, nested a few levels.
fn pod_json() -> impl Strategy<Value = serde_json::Value> {
    let key = prop_oneof![
        Just("phase"),
        Just("reason"),
        Just("message"),
        Just("containerStatuses"),
        Just("initContainerStatuses"),
        Just("name"),
        Just("state"),
        Just("lastState"),
        Just("terminated"),
        Just("waiting"),
        Just("running"),
        Just("exitCode"),
        Just("signal"),
        Just("startedAt"),
        Just("finishedAt"),
        Just("conditions"),
        Just("type"),
        Just("status"),
        Just("startTime"),
        Just("restartCount"),
        Just("ready"),
    ];
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        prop_oneof![
            Just("Pending"),
            Just("Running"),
            Just("Succeeded"),
            Just("Failed"),
            Just("Unknown"),
            Just("OOMKilled"),
            Just("ImagePullBackOff"),
            Just("ErrImagePull"),
            Just("CreateContainerConfigError"),
            Just("Evicted"),
            Just("DeadlineExceeded"),
            Just("PodScheduled"),
            Just("False"),
            Just("True"),
            Just("Unschedulable"),
            Just("step"),
            Just("2026-12-03T10:00:00Z"),
            Just("not a time"),
        ]
        .prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 64, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            proptest::collection::vec((key.clone(), inner), 0..6).prop_map(|pairs| {
                serde_json::Value::Object(
                    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                )
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_pipeline_parser_takes_any_text(text in document_text()) {
        for format in [crate::pipeline::Format::Yaml, crate::pipeline::Format::Json] {
            if let Err(errors) = crate::pipeline::parse(&text, format) {
                prop_assert!(!errors.is_empty(), "a rejection names at least one error");
            }
        }
    }

    #[test]
    fn the_pipeline_parser_takes_any_mutation_of_a_valid_pipeline(text in mutated(PIPELINE)) {
        if let Err(errors) = crate::pipeline::parse(&text, crate::pipeline::Format::Yaml) {
            prop_assert!(errors.iter().all(|e| !e.message.is_empty()));
        }
    }

    #[test]
    fn explain_pod_judges_any_pod_document(status in pod_json(), as_yaml in any::<bool>()) {
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "r1-s0-f1", "labels": {"scarab.dev/fence": "1"}},
            "spec": {"containers": [{"name": "step", "image": "x"}]},
            "status": status,
        });
        let text = if as_yaml {
            serde_saphyr::to_string(&pod).unwrap_or_default()
        } else {
            pod.to_string()
        };
        let _ = crate::cli::explain::explain_text(&text, Timestamp(1_796_000_000_000), None);
    }

    #[test]
    fn stored_record_decoders_take_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512), format in 0u8..6) {
        let mut input = vec![format];
        input.extend(bytes);
        decode_all(&input);
    }

    #[test]
    fn stored_record_decoders_take_mutated_records(edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        for record in valid_records() {
            let mut bytes = record;
            for (at, byte) in &edits {
                let at = at % bytes.len();
                bytes[at] = *byte;
            }
            decode_all(&bytes);
        }
    }

    #[test]
    fn attempt_files_of_any_content_are_read_or_refused(content in proptest::collection::vec(any::<u8>(), 0..300), pick in 0usize..5) {
        let dir = std::env::temp_dir().join(format!("scarab-fuzz-{}-{pick}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        use crate::executor::local::files;
        let names = [files::ATTEMPT, files::KILL, files::LEGACY_SPEC, files::LEGACY_SUPERVISOR, files::LEGACY_VERDICT];
        std::fs::write(dir.join(names[pick]), &content).expect("write");
        let _ = files::read_spec(&dir);
        let _ = files::read_verdict(&dir);
        let _ = files::read_kill(&dir);
        let _ = files::read_supervision(&dir);
        let _ = (files::child_recorded(&dir), files::supervisor_recorded(&dir), files::verdict_recorded(&dir));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Every stored kind's decoder on `bytes`: an error or a value, never a panic.
fn decode_all(bytes: &[u8]) {
    use crate::store::codec::decode;
    use crate::store::records::{DeadLetter, HistoryRecord, OutboxMessage, PipelineSource};
    let _ = decode::<crate::engine::RunHeader>(bytes);
    let _ = decode::<crate::engine::RunStep>(bytes);
    let _ = decode::<crate::engine::Attempt>(bytes);
    let _ = decode::<PipelineSource>(bytes);
    let _ = decode::<OutboxMessage>(bytes);
    let _ = decode::<DeadLetter>(bytes);
    let _ = decode::<HistoryRecord>(bytes);
}

/// A valid encoding of a few stored kinds, to mutate.
fn valid_records() -> Vec<Vec<u8>> {
    use crate::engine::{RunAdmission, RunHeader, RunId, RunState, RunStep, StepState};
    use crate::store::codec::encode;
    let header = RunHeader {
        id: RunId(7),
        pipeline_name: "p".into(),
        origin: "local".into(),
        state: RunState::Queued,
        created_at: Timestamp(1),
        updated_at: Timestamp(2),
        cancel: None,
        budget: None,
        auto_retry: Default::default(),
        admission: RunAdmission {
            priority: 3,
            parallelism: Some(2),
            group: Some(crate::pipeline::Concurrency {
                group: "g".into(),
                limit: 1,
                supersede: true,
            }),
            group_held: true,
        },
    };
    let step = RunStep::in_state(StepState::Queued {
        since: Timestamp(5),
    });
    let source = crate::store::records::PipelineSource {
        format: crate::store::records::SourceFormat::Yaml,
        text: PIPELINE.into(),
        params: Some(Vec::new()),
    };
    vec![
        encode(&header).expect("encodes"),
        encode(&step).expect("encodes"),
        encode(&source).expect("encodes"),
    ]
}

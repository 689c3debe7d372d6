//! Upgrade safety: every fixture store under `tests/fixtures/stores/` (one per record
//! format a released build wrote, each written by that build with `make-fixture.sh`)
//! opens with this build. Its runs read back exactly as the writing build's API showed
//! them, and the service carries on from where the writer was cut off: the attempt whose
//! supervisor died is judged (never run again), due timers fire, the dead letter and the
//! idempotency key are still there, and new fences are above every old one.
//!
//! A change to a stored record type without a decoder for the old format fails here.

use crate::common;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::common::{Server, attempts};

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stores");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("fixture stores")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.join("expected.json").is_file())
        .collect();
    found.sort();
    assert!(!found.is_empty(), "no fixture stores in {}", root.display());
    found
}

/// A private copy of a fixture's state dir (opening a store may write to it).
fn copy_state(fixture: &Path, into: &Path) -> PathBuf {
    // Into the state dir the scratch dir links to (see `common::tempdir`).
    let state = into.join("state");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(fixture.join("state").join("."))
        .arg(&state)
        .status()
        .expect("cp");
    assert!(status.success());
    // As an admin keeps it, whatever modes the checkout gave the files.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    state
}

fn expected(fixture: &Path) -> Value {
    let text = std::fs::read_to_string(fixture.join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("expected.json is JSON")
}

fn role(expected: &Value, name: &str) -> String {
    expected["roles"][name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} run in the fixture"))
        .to_string()
}

/// The highest fence any run of the fixture had.
/// `value` without the object key `key`, at any depth.
fn without(key: &str, value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != key)
                .map(|(k, v)| (k.clone(), without(key, v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| without(key, v)).collect()),
        other => other.clone(),
    }
}

/// A run detail read now equals what the writing build answered, but for fields added to
/// the contract since (it only grows): those are left out, and an old run shows their
/// defaults.
fn assert_same_detail(fixture: &Path, what: &str, got: &Value, want: &Value) {
    let mut added = Vec::new();
    let got = without_added(got, want, &mut added);
    for (key, value) in &added {
        let default = match key.as_str() {
            "admission" => {
                serde_json::json!({"priority": 0, "parallelism": null, "concurrency": null})
            }
            "cancel_reason" | "waiting_for" => Value::Null,
            "params" => serde_json::json!({}),
            other => panic!(
                "{}: field {other} is new but not known to this test",
                fixture.display()
            ),
        };
        assert_eq!(value, &default, "{}: {what}: {key}", fixture.display());
    }
    assert_eq!(
        &got,
        want,
        "{}: {what} reads back differently",
        fixture.display()
    );
}

/// `got` without the object keys `want` does not have (recursively), each left out key
/// and its value collected in `added`.
fn without_added(got: &Value, want: &Value, added: &mut Vec<(String, Value)>) -> Value {
    match (got, want) {
        (Value::Object(got), Value::Object(want)) => Value::Object(
            got.iter()
                .filter_map(|(key, value)| match want.get(key) {
                    Some(wanted) => Some((key.clone(), without_added(value, wanted, added))),
                    None => {
                        added.push((key.clone(), value.clone()));
                        None
                    }
                })
                .collect(),
        ),
        (Value::Array(got), Value::Array(want)) if got.len() == want.len() => Value::Array(
            got.iter()
                .zip(want)
                .map(|(g, w)| without_added(g, w, added))
                .collect(),
        ),
        _ => got.clone(),
    }
}

fn highest_fence(expected: &Value) -> u64 {
    let runs = expected["runs"].as_object().expect("runs");
    runs.values()
        .flat_map(|run| {
            run["detail"]["steps"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|step| step["attempts"].as_array().cloned().unwrap_or_default())
        .filter_map(|attempt| attempt["fence"].as_u64())
        .max()
        .expect("fences")
}

/// Read with the store and rendered with the API's own types, before anything runs:
/// every run, every step and attempt, the dead-letter queue and the idempotency key
/// equal what the writing build answered.
#[test]
fn every_fixture_store_reads_back_as_its_writer_answered() {
    for fixture in fixtures() {
        let temp = common::tempdir().expect("tempdir");
        let state = copy_state(&fixture, temp.path());
        let expected = expected(&fixture);
        let store = scarab::store::Store::open(&state.join("scarab.redb")).expect("opens");
        let read = store.read().expect("read");
        for (id, want) in expected["runs"].as_object().expect("runs") {
            let stored = read
                .run(id.parse().expect("run id"))
                .unwrap_or_else(|e| panic!("{}: run {id} does not decode: {e}", fixture.display()))
                .unwrap_or_else(|| panic!("{}: run {id} is missing", fixture.display()));
            let run = scarab::service::driver_rebuild(stored).expect("rebuilds");
            let got =
                serde_json::to_value(scarab::api::dto::run_detail(&run, 0, &[])).expect("json");
            // What a queued step waits for is the live scheduler's, not the store's.
            let (got, want) = (
                without("waiting_for", &got),
                without("waiting_for", &want["detail"]),
            );
            assert_same_detail(&fixture, &format!("run {id}"), &got, &want);
        }
        let letters: Vec<Value> = read
            .dead_letters(None, 100)
            .expect("dead letters decode")
            .iter()
            .map(scarab::api::dto::dead_letter)
            .collect();
        assert_eq!(
            Value::Array(letters),
            expected["dead_letters"]["dead_letters"]
        );
        let key = expected["idempotency_key"]["key"].as_str().expect("key");
        let run = read.idempotency_get(key).expect("reads").expect("key kept");
        assert_eq!(
            run.to_string(),
            expected["idempotency_key"]["run"].as_str().expect("run")
        );
    }
}

/// The current build serving each fixture store: finished runs answer as before, every
/// history goes on from where it was, and what was in progress carries on correctly.
#[test]
fn every_fixture_store_carries_on_under_this_build() {
    for fixture in fixtures() {
        let temp = common::tempdir().expect("tempdir");
        let state = copy_state(&fixture, temp.path());
        let expected = expected(&fixture);
        // The writer ran with `auto_retry.max = 0` (so its sweep quarantined at once); the
        // run detail shows that maximum.
        let config = temp.path().join("scarab.toml");
        std::fs::write(&config, "[auto_retry]\nmax = 0\n").expect("config");
        let server = Server::start_with(&state, &["--config", config.to_str().expect("utf-8")]);

        for name in [
            "succeeded",
            "failed",
            "cancelled",
            "dead_lettered",
            "quarantined",
        ] {
            let id = role(&expected, name);
            assert_same_detail(
                &fixture,
                &format!("the {name} run"),
                &server.run(&id),
                &expected["runs"][&id]["detail"],
            );
        }
        let (_, letters) = server.get("/v1/dlq");
        assert_eq!(letters, expected["dead_letters"]);

        let old_highest = highest_fence(&expected);
        // The attempt whose supervisor died with the writer may have run: judged `lost`,
        // never started again.
        let id = role(&expected, "running");
        let was = &expected["runs"][&id]["detail"];
        let run = server.wait_terminal(&id, Duration::from_secs(30));
        let judged = attempts(&run, 0);
        assert_eq!(judged.len(), 1, "{run:#}");
        assert_eq!(judged[0]["fence"], was["steps"][0]["attempts"][0]["fence"]);
        assert_eq!(judged[0]["class"], "lost", "{run:#}");
        assert_eq!(judged[0]["started"], true);

        // The retry backoff came due while nothing ran: the retry runs with a new fence
        // (and fails again, like the first; the next backoff is minutes away).
        let id = role(&expected, "retry_due");
        let run = server.wait_for(&id, Duration::from_secs(30), |run| {
            attempts(run, 0)
                .get(1)
                .is_some_and(|a| a["state"] == "finished")
        });
        let retry = &attempts(&run, 0)[1];
        assert!(retry["fence"].as_u64() > Some(old_highest), "{run:#}");
        assert_eq!(retry["class"], "step", "{run:#}");

        // The gate's auto-release came due: released by the system, the deploy ran.
        let id = role(&expected, "waiting");
        let run = server.wait_terminal(&id, Duration::from_secs(30));
        assert_eq!(run["state"], "succeeded", "{run:#}");
        assert_eq!(
            run["steps"][1]["gate"]["decision"]["outcome"],
            "auto_released"
        );
        assert!(attempts(&run, 2)[0]["fence"].as_u64() > Some(old_highest));

        // The Pod launch waiting in the outbox keeps its attempt and fence (this service
        // has no cluster either, so it goes on failing its deliveries).
        let id = role(&expected, "queued");
        let run = server.run(&id);
        assert_eq!(
            attempts(&run, 0)[0]["fence"],
            expected["runs"][&id]["detail"]["steps"][0]["attempts"][0]["fence"]
        );
        assert_eq!(attempts(&run, 0).len(), 1);

        // Format 4 on: what admission control stored carries on.
        if expected["roles"].get("pool_queued").is_some() {
            let id = role(&expected, "superseded");
            let run = server.run(&id);
            assert_same_detail(
                &fixture,
                "the superseded run",
                &run,
                &expected["runs"][&id]["detail"],
            );
            assert_eq!(run["cancel_reason"], "superseded");
            // The run holding its group's slot at its gate still holds it; the one queued
            // for the group still waits, first in line.
            let held = server.run(&role(&expected, "group_held"));
            assert_eq!(held["state"], "waiting", "{held:#}");
            assert_eq!(held["admission"]["concurrency"]["held"], true);
            let queued = server.run(&role(&expected, "group_queued"));
            let wait = &queued["steps"][0]["waiting_for"];
            assert_eq!(queued["steps"][0]["state"], "queued", "{queued:#}");
            assert_eq!(
                (&wait["reason"], &wait["name"], &wait["position"]),
                (&"group".into(), &"fixture-group".into(), &1.into()),
                "{queued:#}"
            );
            // The step waiting for the whole pool starts once the lost attempt gave its
            // slot back, with a fence above the old build's; or, if the writer had already
            // prepared its launch (builds with `engine.prepared_local`), under the fence
            // of that launch, delivered again.
            let id = role(&expected, "pool_queued");
            let run = server.wait_terminal(&id, Duration::from_secs(30));
            assert_eq!(run["state"], "succeeded", "{run:#}");
            assert_eq!(run["admission"]["priority"], 7);
            let prepared = &expected["runs"][&id]["detail"]["steps"][0]["attempts"][0]["fence"];
            let fence = &attempts(&run, 0)[0]["fence"];
            if prepared.is_null() {
                assert!(fence.as_u64() > Some(old_highest), "{run:#}");
                assert!(server.history_kinds(&id).iter().any(|k| k == "admitted"));
            } else {
                // Admitted beyond the pool at once, it never waited in the queue.
                assert_eq!(fence, prepared, "{run:#}");
                assert_eq!(attempts(&run, 0).len(), 1, "{run:#}");
            }
        }

        // Format 5 on: a run submitted with a parameter value uses it after its gate.
        if expected["roles"].get("params").is_some() {
            let id = role(&expected, "params");
            let (status, body) = server.post_json(
                &format!("/v1/runs/{id}/gates/approve/approve"),
                &serde_json::json!({"by": "fixture"}),
            );
            assert_eq!(status, 200, "{body}");
            let run = server.wait_terminal(&id, Duration::from_secs(30));
            assert_eq!(run["state"], "succeeded", "{run:#}");
            assert_eq!(run["params"]["target"], "prod");
            let (status, log) = server.get(&format!("/v1/runs/{id}/steps/ship/logs"));
            assert_eq!((status, log.as_str()), (200, Some("shipping to prod\n")));
        }

        // Histories are append-only: each goes on from the writer's.
        for (id, want) in expected["runs"].as_object().expect("runs") {
            let (_, history) = server.get(&format!("/v1/runs/{id}/history?limit=1000"));
            let old = want["history"]["events"].as_array().expect("events");
            let now = history["events"].as_array().expect("events");
            assert_eq!(&now[..old.len()], &old[..], "history of {id}");
        }

        // The idempotency key still names its run.
        let (status, body) = server.request(
            "POST",
            "/v1/runs",
            "application/yaml",
            b"name: other\nsteps:\n  - name: a\n    run: [\"true\"]\n",
            &[("Idempotency-Key", "fixture-key-1")],
        );
        assert_eq!(status, 409, "{body}");
        assert!(
            body.to_string().contains(&role(&expected, "succeeded")),
            "{body}"
        );

        // New work gets fences above every fence the old build minted.
        let id = server.submit("name: new\nsteps:\n  - name: a\n    run: [\"true\"]\n");
        let run = server.wait_terminal(&id, Duration::from_secs(30));
        assert_eq!(run["state"], "succeeded", "{run:#}");
        let fence = attempts(&run, 0)[0]["fence"].as_u64().expect("fence");
        assert!(fence > old_highest, "fence {fence} not above {old_highest}");
    }
}

/// A record that does not decode wedges nothing: the service starts, every other run
/// carries on, and the run is named in `/readyz`, counted in `/metrics` and logged.
#[test]
fn a_run_whose_record_does_not_decode_is_named_not_silently_stuck() {
    let fixture = &fixtures()[0];
    let temp = common::tempdir().expect("tempdir");
    let state = copy_state(fixture, temp.path());
    let expected = expected(fixture);
    let broken = role(&expected, "waiting");
    {
        let steps: redb::TableDefinition<(u128, u16), &[u8]> = redb::TableDefinition::new("steps");
        let db = redb::Database::create(state.join("scarab.redb")).expect("open");
        let write = db.begin_write().expect("write");
        let id: scarab::engine::RunId = broken.parse().expect("run id");
        write
            .open_table(steps)
            .expect("steps")
            .insert((id.0, 1), [2u8, 0xff, 0xff, 0xff].as_slice())
            .expect("insert");
        write.commit().expect("commit");
    }
    let server = Server::start(&state);
    let (status, ready) = server.get("/readyz");
    assert_eq!(status, 200, "{ready}");
    let unreadable = ready["progress"]["unreadable"]
        .as_array()
        .expect("unreadable");
    assert_eq!(unreadable.len(), 1, "{ready}");
    assert_eq!(unreadable[0]["run"], broken.as_str());
    assert!(
        unreadable[0]["problem"]
            .as_str()
            .unwrap_or("")
            .contains("step"),
        "{ready}"
    );
    let (_, metrics) = server.get("/metrics");
    let text = metrics.as_str().expect("text").to_string();
    assert!(text.contains("scarab_unreadable_runs 1"), "{text}");
    assert!(server.log().contains("cannot restore a stored run"));
    // Everything else carries on.
    let id = role(&expected, "running");
    let run = server.wait_terminal(&id, Duration::from_secs(30));
    assert_eq!(attempts(&run, 0)[0]["class"], "lost");
    let (status, _) = server.get(&format!("/v1/runs/{broken}"));
    assert_eq!(status, 500);
}

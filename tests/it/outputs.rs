//! Scarab as a cooperating sink: step outputs are accepted only from the step's current
//! attempt, by its own token; a zombie gets 409 stale_fence.

use crate::common;

use std::time::Duration;

use common::{BIN, Server, attempts, fences};

const WITHIN: Duration = Duration::from_secs(60);

#[test]
fn outputs_flow_to_later_steps_and_show_in_the_run_detail() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let out = dir.path().join("out");
    let yaml = format!(
        "name: o\nsteps:\n  - name: build\n    run: ['{BIN}', output, set, digest, 'sha256:abc']\n  - name: deploy\n    needs: [build]\n    run: [sh, -c, 'echo \"$DIGEST\" > {}']\n    env: {{DIGEST: '${{steps.build.outputs.digest}}'}}\n",
        out.display()
    );
    let id = server.submit(&yaml);
    let run = server.wait_terminal(&id, WITHIN);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(attempts(&run, 0)[0]["outputs"]["digest"], "sha256:abc");
    assert_eq!(std::fs::read_to_string(&out).expect("out"), "sha256:abc\n");
}

#[test]
fn a_zombie_attempt_is_answered_409_stale_fence() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    let token_file = dir.path().join("token");
    let yaml = format!(
        "name: z\nsteps:\n  - name: s\n    run: [sh, -c, 'if [ \"$SCARAB_ATTEMPT\" = 1 ]; then echo \"$SCARAB_STEP_TOKEN\" > {}; exit 1; fi; sleep 30']\n    retry: {{ on: step, max: 1, backoff: {{ initial: 10ms }} }}\n",
        token_file.display()
    );
    let id = server.submit(&yaml);
    let run = server.wait_for(&id, WITHIN, |run| {
        attempts(run, 0).len() == 2 && attempts(run, 0)[1]["state"] == "running"
    });
    let current = fences(&run, 0)[1];
    let stale = std::fs::read_to_string(&token_file)
        .expect("token")
        .trim()
        .to_string();
    let url = format!("/v1/runs/{id}/steps/s/outputs");
    let agent = common::agent();
    let put = |token: &str| {
        let mut response = agent
            .put(format!("{}{url}", server.url))
            .header("Authorization", format!("Bearer {token}"))
            .header("Content-Type", "application/json")
            .send(br#"{"digest": "from-a-zombie"}"#.as_slice())
            .expect("http");
        let status = response.status().as_u16();
        let body: serde_json::Value =
            serde_json::from_str(&response.body_mut().read_to_string().unwrap_or_default())
                .unwrap_or_default();
        (status, body)
    };
    let (status, body) = put(&stale);
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "stale_fence");
    assert_eq!(body["current"], current);
    let (status, _) = put("1.deadbeef");
    assert_eq!(status, 401, "a forged token");
    let (status, _) = put(&server.token);
    assert_eq!(status, 401, "the admin token is not a step token");
    let run = server.run(&id);
    assert!(
        attempts(&run, 0)
            .iter()
            .all(|a| a["outputs"].as_object().is_none_or(|o| o.is_empty())),
        "{run:#}"
    );
}

/// PUT outputs as a running step's own token would, returning (status, body).
fn put_outputs(server: &Server, path: &str, token: &str, body: &[u8]) -> (u16, serde_json::Value) {
    let mut response = common::agent()
        .put(format!("{}{path}", server.url))
        .header("Authorization", format!("Bearer {token}"))
        .header("Content-Type", "application/json")
        .send(body)
        .expect("http");
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or_default())
}

/// Nothing is looked up for a caller without a genuine step token: unknown runs and
/// steps answer 401 like known ones. Values with a NUL and names beyond the attempt's
/// bound are refused naming the key, and nothing of the refused write is stored.
#[test]
fn outputs_are_authenticated_first_and_never_dropped_silently() {
    let dir = common::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("state"));
    for path in [
        "/v1/runs/r01m8y57tfmvwmvb565r30rzdve/steps/nope/outputs".to_string(),
        "/v1/runs/not-a-run/steps/s/outputs".to_string(),
    ] {
        let (status, body) = put_outputs(&server, &path, "1.deadbeef", b"{}");
        assert_eq!(status, 401, "{path}: {body}");
    }

    let token_file = dir.path().join("token");
    let id = server.submit(&format!(
        "name: o\nsteps:\n  - name: s\n    run: [sh, -c, 'echo \"$SCARAB_STEP_TOKEN\" > {}; sleep 30']\n",
        token_file.display()
    ));
    server.wait_for(&id, WITHIN, |run| {
        attempts(run, 0)
            .first()
            .is_some_and(|a| a["state"] == "running")
    });
    // `running` is recorded before the step is let go (the launch handshake): the file
    // comes a moment later.
    let deadline = std::time::Instant::now() + WITHIN;
    let token = loop {
        let token = std::fs::read_to_string(&token_file).unwrap_or_default();
        if token.ends_with('\n') {
            break token.trim().to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the step wrote no token"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let path = format!("/v1/runs/{id}/steps/s/outputs");
    let (status, body) = put_outputs(&server, &path, &token, br#"{"bad": "a\u0000b"}"#);
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "bad");

    let first: serde_json::Map<String, serde_json::Value> = (0..32)
        .map(|i| (format!("k{i}"), serde_json::json!("v")))
        .collect();
    let (status, body) = put_outputs(&server, &path, &token, &serde_json::to_vec(&first).unwrap());
    assert_eq!(status, 200, "{body}");
    let (status, body) = put_outputs(&server, &path, &token, br#"{"k0": "again", "k32": "v"}"#);
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["field"], "k32");
    let run = server.run(&id);
    let stored = attempts(&run, 0)[0]["outputs"].clone();
    assert_eq!(stored.as_object().map(|o| o.len()), Some(32), "{stored}");
    assert_eq!(stored["k0"], "v", "the refused write changed nothing");
}

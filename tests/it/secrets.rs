//! Named secrets: given to the steps that reference them and to nothing else. The value
//! never reaches the store, an attempt directory, a backup or the API, and shows as
//! `***` in the step's log even when written in pieces.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::common::{self, BIN, Server};

const VALUE: &str = "hunter2-scarab-canary-7d1c";

fn write_secret(dir: &Path, name: &str, value: &str) {
    let path = dir.join(name);
    std::fs::write(&path, format!("{value}\n")).expect("secret");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// Every file under `root` whose bytes contain `needle`.
fn files_containing(root: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("metadata");
        if meta.is_dir() {
            pending.extend(
                std::fs::read_dir(&path)
                    .expect("dir")
                    .map(|e| e.expect("entry").path()),
            );
        } else if meta.is_file() {
            let bytes = std::fs::read(&path).expect("read");
            if bytes.windows(needle.len()).any(|w| w == needle) {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[test]
fn a_secret_reaches_its_step_masked_and_nowhere_else() {
    let dir = common::tempdir().expect("tempdir");
    let secrets = dir.path().join("etc").join("secrets");
    std::fs::create_dir(&secrets).expect("secrets dir");
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    write_secret(&secrets, "registry-key", VALUE);
    let config = dir.path().join("etc").join("scarab.toml");
    std::fs::write(
        &config,
        format!("[secrets]\ndir = \"{}\"\n", secrets.display()),
    )
    .expect("config");
    let state = dir.path().join("state");
    let server = Server::start_with(&state, &["--config", config.to_str().expect("utf-8")]);

    // The step checks it got the value, prints it whole, prints it in two writes a moment
    // apart, tries to read it from the secrets dir, and reports it back as an output.
    let script = dir.path().join("step.sh");
    std::fs::write(
        &script,
        format!(
            "test \"$API_KEY\" = '{VALUE}' && echo matches\n\
             echo \"whole=$API_KEY\"\n\
             printf 'split=%s' \"$(printf %s \"$API_KEY\" | head -c 9)\"; sleep 0.3\n\
             printf '%s\\n' \"$(printf %s \"$API_KEY\" | tail -c +10)\"\n\
             echo \"stderr=$API_KEY\" >&2\n\
             cat '{}/registry-key' >/dev/null 2>&1 || echo 'secrets dir: denied'\n\
             '{BIN}' output set leaked \"prefix-$API_KEY\"\n",
            secrets.display()
        ),
    )
    .expect("script");
    let id = server.submit(&format!(
        "name: s\nsteps:\n  - name: use\n    env: {{API_KEY: {{secret: registry-key}}}}\n    run: [sh, '{}']\n",
        script.display()
    ));
    let run = server.wait_terminal(&id, Duration::from_secs(30));
    assert_eq!(run["state"], "succeeded", "{run:#}");

    let (status, log) = server.get(&format!("/v1/runs/{id}/steps/use/logs"));
    assert_eq!(status, 200);
    let log = log.as_str().expect("log text").to_string();
    for line in ["matches", "whole=***", "split=***", "secrets dir: denied"] {
        assert!(log.contains(line), "{line}: {log}");
    }
    assert!(!log.contains(VALUE), "{log}");
    let (_, detail) = server.get(&format!("/v1/runs/{id}"));
    assert!(detail.to_string().contains("prefix-***"), "{detail:#}");

    // Nowhere on disk: the store, the attempt directories (spec, logs), a backup; and
    // nowhere in what the API answers.
    let backup = dir.path().join("backup.redb");
    let status = std::process::Command::new(BIN)
        .args(["backup", "--out"])
        .arg(&backup)
        .args(["--url", &server.url, "--token", &server.token])
        .status()
        .expect("backup");
    assert!(status.success());
    let real_state = std::fs::canonicalize(&state).expect("state");
    assert_eq!(
        files_containing(&real_state, VALUE.as_bytes()),
        Vec::<String>::new()
    );
    assert_eq!(
        files_containing(&backup, VALUE.as_bytes()),
        Vec::<String>::new()
    );
    for path in [
        format!("/v1/runs/{id}"),
        format!("/v1/runs/{id}/history"),
        "/v1/runs".to_string(),
    ] {
        let (status, body) = server.get(&path);
        assert_eq!(status, 200, "{path}");
        assert!(!body.to_string().contains(VALUE), "{path}: {body}");
    }

    // An unknown or unusable secret is refused at submit, naming the field.
    let (status, body) = server.submit_yaml(
        "name: s\nsteps:\n  - name: use\n    env: {X: {secret: nope}}\n    run: [\"true\"]\n",
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        body["errors"][0]["field"], "steps[0].env.X.secret",
        "{body}"
    );
    assert!(body.to_string().contains("unknown secret"), "{body}");
    let world = secrets.join("world");
    std::fs::write(&world, "w").expect("secret");
    std::fs::set_permissions(&world, std::fs::Permissions::from_mode(0o644)).expect("chmod");

    // SIGHUP reloads the secrets dir: a new secret is usable, the world-readable one is
    // refused with why.
    write_secret(&secrets, "later", "another-value-93af");
    server.signal(libc::SIGHUP);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = server.submit_yaml(
            "name: s\nsteps:\n  - name: use\n    env: {X: {secret: later}}\n    run: [\"true\"]\n",
        );
        if status == 201 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "reload: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body) = server.submit_yaml(
        "name: s\nsteps:\n  - name: use\n    env: {X: {secret: world}}\n    run: [\"true\"]\n",
    );
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("mode 644"), "{body}");
}

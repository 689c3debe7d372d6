//! Steps run without Scarab's authority: they see a clean environment, never the
//! service's own variables (its tokens, its configuration).

use std::time::Duration;

use crate::common::Server;

#[test]
fn a_step_sees_a_clean_environment_and_only_the_variables_let_through() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("scarab.toml");
    std::fs::write(
        &config,
        "[engine]\nstep_env_passthrough = [\"BUILD_CACHE\"]\n",
    )
    .expect("config");
    let server = Server::start_with_env(
        &dir.path().join("state"),
        &["--config", config.to_str().expect("utf-8")],
        &[
            ("CANARY_SECRET", "canary-7f3a"),
            ("SCARAB_CANARY", "canary-scarab"),
            ("BUILD_CACHE", "/var/cache/build"),
        ],
    );
    let out = dir.path().join("env.txt");
    let id = server.submit(&format!(
        "name: env\nsteps:\n  - name: s\n    env: {{ MINE: mine }}\n    run: [sh, -c, 'env > {}']\n",
        out.display()
    ));
    let run = server.wait_terminal(&id, Duration::from_secs(30));
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let env = std::fs::read_to_string(&out).expect("env");
    let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    assert!(!env.contains("canary-7f3a"), "{env}");
    assert!(!env.contains("canary-scarab"), "{env}");
    assert!(
        !names.contains(&"SCARAB_LOG"),
        "the service's own SCARAB_* stay out: {env}"
    );
    for expected in [
        "PATH",
        "BUILD_CACHE",
        "MINE",
        "SCARAB_FENCE",
        "SCARAB_RUN_ID",
        "SCARAB_STEP_TOKEN",
    ] {
        assert!(names.contains(&expected), "{expected} missing: {env}");
    }
    assert!(env.contains("BUILD_CACHE=/var/cache/build"), "{env}");
}

#[test]
fn a_passthrough_of_scarab_variables_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("scarab.toml");
    std::fs::write(
        &config,
        "[engine]\nstep_env_passthrough = [\"OK\", \"SCARAB_LOG\"]\n",
    )
    .expect("config");
    let output = std::process::Command::new(crate::common::BIN)
        .args(["config", "check"])
        .arg(&config)
        .output()
        .expect("config check");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("engine.step_env_passthrough[1]"),
        "{stderr}"
    );
}

/// Under umask 022 every file Scarab writes is still private (0600, directories 0700),
/// backups included, while the step gets the service's umask back for its own files.
#[test]
fn files_in_the_state_dir_are_private_whatever_the_umask() {
    use crate::common::UmaskExt;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let server = Server::start(&state);
    let made = dir.path().join("made-by-step");
    let id = server.submit(&format!(
        "name: files\nsteps:\n  - name: s\n    run: [sh, -c, 'echo out; echo err >&2; touch {}']\n",
        made.display()
    ));
    let run = server.wait_terminal(&id, Duration::from_secs(30));
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let backup = dir.path().join("backup.redb");
    let output = std::process::Command::new(crate::common::BIN)
        .args(["backup", "--out"])
        .arg(&backup)
        .args(["--url", &server.url, "--token", &server.token])
        .pre_exec_umask(0o022)
        .output()
        .expect("scarab backup");
    assert!(output.status.success(), "{output:?}");
    let mode = |path: &std::path::Path| {
        std::fs::symlink_metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&backup), 0o600, "the backup");
    assert_eq!(
        mode(&made),
        0o644,
        "the step's own file follows its umask (022)"
    );
    let mut seen = 0;
    let mut pending = vec![state.clone()];
    while let Some(path) = pending.pop() {
        let m = mode(&path);
        assert_eq!(m & 0o077, 0, "{} is mode {m:o}", path.display());
        seen += 1;
        if path.is_dir() {
            pending.extend(
                std::fs::read_dir(&path)
                    .expect("read dir")
                    .map(|e| e.expect("entry").path()),
            );
        }
    }
    assert!(
        seen >= 8,
        "the store, the tokens, attempts and logs: {seen}"
    );
}

#[test]
fn a_state_dir_other_users_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir(&state).expect("state dir");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let output = std::process::Command::new(crate::common::BIN)
        .arg("serve")
        .arg("--state-dir")
        .arg(&state)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .expect("scarab serve");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("other users can write it"), "{stderr}");
    assert!(!state.join("scarab.redb").exists(), "nothing was created");
}

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

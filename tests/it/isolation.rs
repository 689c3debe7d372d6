//! Steps run without Scarab's authority: they see a clean environment, never the
//! service's own variables (its tokens, its configuration).

use crate::common;
use std::time::Duration;

use crate::common::Server;

#[test]
fn a_step_sees_a_clean_environment_and_only_the_variables_let_through() {
    let dir = common::tempdir().expect("tempdir");
    let config = dir.path().join("etc").join("scarab.toml");
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
    let dir = common::tempdir().expect("tempdir");
    let config = dir.path().join("etc").join("scarab.toml");
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
    let dir = common::tempdir().expect("tempdir");
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
    let mut pending = vec![std::fs::canonicalize(&state).expect("state dir")];
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
    let dir = common::tempdir().expect("tempdir");
    let state = dir.path().join("open-state");
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

/// A step cannot read or write Scarab's files: the admin token, the step-token key, the
/// store, another attempt's directory, its own spec, the config and the token files it
/// names; it cannot signal its supervisor nor look into it through `/proc`. The same step
/// still does ordinary work: `/tmp`, a compiler, the network, its scratch files.
#[test]
fn a_confined_step_cannot_touch_scarab_but_still_does_ordinary_work() {
    use scarab::executor::local::confine::Isolation;
    let Isolation::Landlock { abi } = Isolation::of_kernel() else {
        panic!("this kernel has no Landlock: the suite needs it (step_isolation would be none)");
    };
    let dir = common::tempdir().expect("tempdir");
    let reader_token = dir.path().join("etc").join("reader.token");
    std::fs::write(&reader_token, "reader-secret-1234567890\n").expect("token file");
    let config = dir.path().join("etc").join("scarab.toml");
    std::fs::write(
        &config,
        format!(
            "[[tokens]]\nname = \"reader\"\nrole = \"read_only\"\nfile = \"{}\"\n",
            reader_token.display()
        ),
    )
    .expect("config");
    let state = dir.path().join("state");
    let server = Server::start_with(&state, &["--config", config.to_str().expect("utf-8")]);
    let first = server.submit("name: first\nsteps:\n  - name: s\n    run: [echo, first]\n");
    let run = server.wait_terminal(&first, Duration::from_secs(30));
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let other_fence = common::fences(&run, 0)[0];

    let real_state = std::fs::canonicalize(&state).expect("state");
    let probes = [
        ("admin.token", real_state.join("admin.token")),
        ("step-token.key", real_state.join("step-token.key")),
        ("store", real_state.join("scarab.redb")),
        (
            "other attempt log",
            real_state.join(format!("attempts/{other_fence}/stdout.log")),
        ),
        ("config", config.clone()),
        ("token file", reader_token.clone()),
    ];
    // The step is `bash -c 'bash probe.sh'`: its supervisor is the parent of the outer one.
    let mut script = String::from("cd \"$SCRATCH\"\nsup=$(awk '{print $4}' /proc/$PPID/stat)\n");
    for (name, path) in &probes {
        script.push_str(&format!(
            "if cat '{}' >/dev/null 2>err; then echo '{name}: read'; \
             elif grep -q 'Permission denied' err; then echo '{name}: denied'; \
             else echo \"{name}: $(cat err)\"; fi\n",
            path.display()
        ));
    }
    script.push_str(&format!(
        "ls '{0}/attempts/{other_fence}' >/dev/null 2>&1 || echo 'other attempt listing: denied'\n\
         cat \"{0}/attempts/$SCARAB_FENCE/attempt.jsonl\" >/dev/null 2>&1 || echo 'own spec: denied'\n\
         echo planted > '{0}/planted' 2>/dev/null || echo 'write into state: denied'\n\
         rm -f '{0}/scarab.redb' 2>/dev/null; test -e '{0}/scarab.redb' && echo 'store still there'\n\
         kill -0 $sup 2>/dev/null || echo 'signal supervisor: denied'\n\
         readlink /proc/$sup/cwd >/dev/null 2>&1 || echo 'supervisor cwd: denied'\n\
         t=$(mktemp) && echo tmp > \"$t\" && cat \"$t\" >/dev/null && rm \"$t\" && echo 'tmp: ok'\n\
         printf 'int main(void){{return 0;}}\\n' > hello.c && cc -o hello hello.c && ./hello && echo 'compiler: ok'\n\
         exec 3<>/dev/tcp/127.0.0.1/{1} && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q 200 && echo 'network: ok'\n",
        real_state.display(),
        server.url.rsplit(':').next().expect("port"),
    ));
    let script_file = dir.path().join("probe.sh");
    std::fs::write(&script_file, script).expect("script");
    let report = dir.path().join("report.txt");
    let id = server.submit(&format!(
        "name: probe\nsteps:\n  - name: s\n    env: {{ SCRATCH: '{}' }}\n    run: [bash, -c, 'bash {} > {} 2>&1']\n",
        dir.path().display(),
        script_file.display(),
        report.display()
    ));
    let run = server.wait_terminal(&id, Duration::from_secs(60));
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let report = std::fs::read_to_string(&report).expect("report");
    for (name, _) in &probes {
        assert!(
            report.contains(&format!("{name}: denied")),
            "{name}: {report}"
        );
    }
    for line in [
        "other attempt listing: denied",
        "own spec: denied",
        "write into state: denied",
        "store still there",
        "supervisor cwd: denied",
        "tmp: ok",
        "compiler: ok",
        "network: ok",
    ] {
        assert!(report.contains(line), "{line}: {report}");
    }
    if abi >= 6 {
        assert!(report.contains("signal supervisor: denied"), "{report}");
    }
    assert!(!real_state.join("planted").exists());
    // The service says which protection is in force.
    let (status, ready) = server.get("/readyz");
    assert_eq!(status, 200);
    assert_eq!(ready["step_isolation"], "landlock", "{ready:#}");
}

//! Upgrade in place, the way `apt` does it: the service is stopped (SIGTERM) while local
//! steps run, the executable is replaced on disk by a rename (running supervisors keep
//! the old file), and the build now at that path starts on the same state dir. The steps
//! are re-adopted: same attempt, same fence, run once. (Old stores opening with this
//! build are `fixture_stores`' part.)
//!
//! The build installed first is this one, or the executable `SCARAB_UPGRADE_FROM` names
//! (an older release, to upgrade from it for real: its supervisors write the attempt
//! files of their day, and its service reads only those). With the release before the
//! attempt files became one `attempt.jsonl` (2ba8742), the second test fails if this
//! build's supervisors do not keep an older service's layout.

use crate::common;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{BIN, Server, attempts, fences};

/// dpkg's way: the new file is written beside the old one and renamed over it.
fn install(from: &Path, to: &Path) {
    let staged = to.with_extension("dpkg-new");
    std::fs::copy(from, &staged).expect("stage the executable");
    std::fs::rename(&staged, to).expect("rename over the installed one");
}

/// The build installed first (see above) at `bin/scarab` under `dir`, its service
/// started on `state`, and the directory (`ran`) where the steps record each run.
fn installed_first(dir: &Path) -> (PathBuf, PathBuf, Server) {
    let installed = dir.join("bin/scarab");
    std::fs::create_dir_all(installed.parent().expect("parent")).expect("bin dir");
    let from = std::env::var_os("SCARAB_UPGRADE_FROM").unwrap_or_else(|| BIN.into());
    install(Path::new(&from), &installed);
    let ran = dir.join("ran");
    std::fs::create_dir_all(&ran).expect("ran dir");
    let server = Server::start_binary(&installed, &dir.join("state"), &[]);
    (installed, ran, server)
}

#[test]
fn an_upgrade_in_place_readopts_the_running_steps() {
    let dir = common::tempdir().expect("tempdir");
    let (installed, ran, mut server) = installed_first(dir.path());

    let runs: Vec<String> = (0..3)
        .map(|i| {
            server.submit(&format!(
                "name: upgrade\nsteps:\n  - name: s\n    run: [sh, -c, 'echo $SCARAB_FENCE >> {}/{i}; sleep 3; echo done']\n",
                ran.display()
            ))
        })
        .collect();
    let before: Vec<u64> = runs
        .iter()
        .map(|id| {
            let run = server.wait_for(id, Duration::from_secs(30), |run| {
                attempts(run, 0)
                    .first()
                    .is_some_and(|a| a["state"] == "running")
            });
            fences(&run, 0)[0]
        })
        .collect();

    assert_eq!(server.terminate(), Some(0), "a clean stop");
    install(Path::new(BIN), &installed);
    server.resume();

    for (i, (id, fence)) in runs.iter().zip(&before).enumerate() {
        let run = server.wait_terminal(id, Duration::from_secs(60));
        assert_eq!(run["state"], "succeeded", "{run:#}");
        assert_eq!(fences(&run, 0), vec![*fence], "same attempt, same fence");
        let lines = std::fs::read_to_string(ran.join(i.to_string())).expect("ran");
        assert_eq!(lines.trim(), fence.to_string(), "the step ran exactly once");
    }
}

/// The other half of dpkg's way: it replaces the executable while the old service still
/// runs (the restart comes after), and that service starts its supervisors (its zygote,
/// started at its first launch) from the file now at its path, the new build. Those
/// supervisors must report in a way the old service reads: each step runs once and
/// succeeds, and after the restart the new service reads them too.
#[test]
fn a_service_whose_executable_was_replaced_under_it_still_runs_each_step_once() {
    let dir = common::tempdir().expect("tempdir");
    let (installed, ran, mut server) = installed_first(dir.path());
    // Replaced before the old service launched anything: its zygote comes from the new
    // file.
    install(Path::new(BIN), &installed);
    let runs: Vec<String> = (0..3)
        .map(|i| {
            server.submit(&format!(
                "name: unpacked\nsteps:\n  - name: s\n    run: [sh, -c, 'echo $SCARAB_FENCE >> {}/{i}']\n",
                ran.display()
            ))
        })
        .collect();
    let check = |server: &Server| {
        for (i, id) in runs.iter().enumerate() {
            let run = server.wait_terminal(id, Duration::from_secs(60));
            assert_eq!(run["state"], "succeeded", "{run:#}");
            let lines = std::fs::read_to_string(ran.join(i.to_string())).expect("ran");
            assert_eq!(
                lines.trim(),
                fences(&run, 0)[0].to_string(),
                "the step ran exactly once"
            );
        }
    };
    check(&server);
    // The postinst's restart: the new build reads what the supervisors wrote.
    assert_eq!(server.terminate(), Some(0), "a clean stop");
    server.resume();
    check(&server);
}

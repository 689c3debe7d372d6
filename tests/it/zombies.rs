//! What an executor reports cannot push the fence counter to its end: attempt
//! directories named with implausible fences (u64::MAX, or far above anything this store
//! minted) are foreign, and never raise the counter. (Pods: `kubernetes`.)

use crate::common;
use std::time::Duration;

use crate::common::{Server, fences};

#[test]
fn implausible_attempt_directories_never_raise_the_fence_counter() {
    let dir = common::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let attempts = state.join("attempts");
    let far_ahead = (1u64 << 40) + 7;
    for fence in [u64::MAX, 1 << 62, far_ahead] {
        let attempt = attempts.join(fence.to_string());
        std::fs::create_dir_all(&attempt).expect("attempt dir");
        std::fs::write(attempt.join("attempt.jsonl"), b"{\"not\": \"a spec\"}\n").expect("spec");
    }
    let server = Server::start(&state);
    let id = server.submit("name: z\nsteps:\n  - name: a\n    run: [\"true\"]\n");
    let run = server.wait_terminal(&id, Duration::from_secs(30));
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(fences(&run, 0), vec![1], "the counter was not raised");
    assert!(
        server.log().contains("implausible fence"),
        "each is logged: {}",
        server.log()
    );
}

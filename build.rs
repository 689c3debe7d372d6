//! Records the commit this build comes from, for `scarab version`: `SCARAB_COMMIT` if the
//! packager sets it, else `git rev-parse` of the checkout, else "unknown".

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SCARAB_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let commit = std::env::var("SCARAB_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let output = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            output
                .status
                .success()
                .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
        })
        .filter(|c| !c.is_empty() && c.len() <= 64 && c.chars().all(|c| c.is_ascii_graphic()))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=SCARAB_BUILD_COMMIT={commit}");
}

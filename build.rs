//! Records the commit this build comes from, for `scarab version`: `SCARAB_COMMIT` if the
//! packager sets it, else `git rev-parse` of the checkout, else "unknown". On GNU/Linux with
//! glibc 2.36 or later it also links the binary with packed relative relocations.

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
    // The binary is position-independent, and about 64,000 of its pointers (vtables,
    // static tables) are relocated at every exec. As RELA entries they are 1.5 MB that
    // the dynamic loader reads, which then stays resident in every Scarab process (the
    // service, its zygote, each CLI call); packed as RELR they are 25 KB. glibc reads
    // RELR since 2.36, and the linker records that version as a dependency.
    // Where the C library linked against is older, the binary links with RELA as before.
    if glibc_reads_relr() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the build is for GNU/Linux on this machine and its glibc (the one linked
/// against) is 2.36 or later: `getconf GNU_LIBC_VERSION` says "glibc 2.36".
fn glibc_reads_relr() -> bool {
    let var = |name| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
        || var("HOST") != var("TARGET")
    {
        return false;
    }
    let Ok(output) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let Some((major, minor)) = text
        .trim()
        .strip_prefix("glibc ")
        .and_then(|version| version.split_once('.'))
    else {
        return false;
    };
    let minor = minor.split('.').next().unwrap_or_default();
    match (major.parse::<u32>(), minor.parse::<u32>()) {
        (Ok(major), Ok(minor)) => (major, minor) >= (2, 36),
        _ => false,
    }
}

//! Confinement of a local step: it cannot read or write Scarab's own files.
//!
//! Linux Landlock, with `no_new_privs`. Landlock rules only ever grant access, so a
//! protected directory (the state dir, the config file, the secrets dir) cannot be carved
//! out of a wider grant: instead every filesystem entry *beside* the path to a protected
//! one is granted in full, and the directories on that path get nothing of their own. For
//! a state dir `/var/lib/scarab` that means: everything under `/usr`, `/etc`, `/tmp`,
//! `/home`, `/var/tmp`, `/var/lib/apt`... is the step's to use as the service user's Unix
//! permissions allow, while `/var/lib/scarab` and the ancestors' own entries are not: a
//! step cannot list `/`, `/var` or `/var/lib`, nor create, remove or rename entries
//! directly in them, and an entry created there after the step started is out of its
//! reach. The grant follows the filesystem from one attempt to the next: the zygote keeps
//! the last ruleset only while the protected paths and the directories on the way to them
//! are unchanged (`Kept`). Symbolic links are never granted (their targets are, where
//! they lie beside the protected paths).
//!
//! The domain also scopes signals and abstract Unix sockets (Landlock ABI 6): the step
//! cannot signal its supervisor or the service, nor ptrace them or read their memory or
//! environment (`/proc/PID/environ`), which Landlock refuses to any process outside the
//! step's own domain. Each attempt has its own domain, so steps cannot reach each other.
//!
//! The ruleset is built before the step starts (by the zygote, or by a supervisor started
//! without one). The step's own process applies it between the supervisor's clone and
//! its `execve` (`spawn`): Landlock domains and `no_new_privs` belong to a task and what
//! it starts, so the supervisor itself stays unconfined.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};

/// The newest Landlock ABI whose rights Scarab asks for; older kernels get what they
/// support (best effort), and the service says which protection is in force.
const TARGET_ABI: ABI = ABI::V6;

/// What protects Scarab's files from steps on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// Landlock at this ABI version (6 and above also scope signals).
    Landlock { abi: u32 },
    /// The kernel has no Landlock (or it is disabled): steps run with the service user's
    /// full access.
    None,
}

impl Isolation {
    /// What the running kernel offers.
    pub fn of_kernel() -> Isolation {
        // SAFETY: the version query takes no pointer it dereferences (NULL, size 0).
        let version = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                1u32, // LANDLOCK_CREATE_RULESET_VERSION
            )
        };
        match u32::try_from(version) {
            Ok(abi) if abi >= 1 => Isolation::Landlock { abi },
            _ => Isolation::None,
        }
    }

    /// The name `/readyz` and the logs use.
    pub fn name(self) -> &'static str {
        match self {
            Isolation::Landlock { .. } => "landlock",
            Isolation::None => "none",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("protected path {path}: {source}")]
    Protected {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("the root directory cannot be protected from steps")]
    Root,
    #[error("the list of protected paths does not decode: {0}")]
    List(String),
    #[error("landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
}

/// A ruleset ready to be applied in the step's process (`apply`). `None` inside when the
/// kernel has no Landlock: the step then runs unconfined, as the service said at start.
pub struct Confinement {
    ruleset: Option<OwnedFd>,
}

impl Confinement {
    /// Builds the ruleset that grants everything except what lies beneath `protected`
    /// (paths that do not exist are skipped: nothing there to protect yet).
    pub fn build(protected: &[PathBuf]) -> Result<Confinement, ConfineError> {
        let protected = canonical(protected)?;
        let ancestors = ancestors(&protected)?;
        Self::build_canonical(&protected, &ancestors)
    }

    /// `build` for the canonical protected paths and their ancestors.
    fn build_canonical(
        protected: &[PathBuf],
        ancestors: &HashSet<PathBuf>,
    ) -> Result<Confinement, ConfineError> {
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(TARGET_ABI))?
            .scope(Scope::from_all(TARGET_ABI))?
            .create()?;
        for ancestor in ancestors {
            let Ok(entries) = std::fs::read_dir(ancestor) else {
                // Unlistable by the service user: nothing beneath it is granted, which
                // only ever denies more.
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if protected.contains(&path) || ancestors.contains(&path) {
                    continue;
                }
                let Some((fd, is_dir)) = open_beside(&path) else {
                    continue;
                };
                let access = if is_dir {
                    AccessFs::from_all(TARGET_ABI)
                } else {
                    AccessFs::from_file(TARGET_ABI)
                };
                ruleset = ruleset.add_rule(PathBeneath::new(fd, access))?;
            }
        }
        Ok(Confinement {
            ruleset: ruleset.into(),
        })
    }

    /// Another handle on the same ruleset.
    pub fn try_clone(&self) -> io::Result<Confinement> {
        let ruleset = match &self.ruleset {
            Some(fd) => Some(fd.try_clone()?),
            None => None,
        };
        Ok(Confinement { ruleset })
    }

    /// Applies the ruleset to the calling thread and whatever it starts from now on (both
    /// `no_new_privs` and a Landlock domain belong to a thread). Only async-signal-safe
    /// system calls run here (prctl, landlock_restrict_self).
    pub fn apply(&self) -> io::Result<()> {
        let Some(ruleset) = &self.ruleset else {
            return Ok(());
        };
        // SAFETY: plain system calls on integers; no memory of the parent is touched.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The ruleset last built, kept for the next attempts while nothing it was built from
/// changed (for the zygote, which forks many supervisors; see `zygote`).
///
/// A ruleset is derived from the canonical protected paths and the listing of every
/// directory on the way to them. Those paths are resolved again for every attempt, and
/// each of those directories is checked by its identity and its modification and change
/// times, which the kernel updates whenever an entry is created, removed or renamed in
/// it: any difference builds a new ruleset. What a kept ruleset grants is therefore what
/// a ruleset built at an earlier moment grants for today's protected paths; whatever
/// appeared since (a same-tick change the times cannot show) is denied, never granted.
#[derive(Default)]
pub struct Kept {
    last: Option<(Stamp, Confinement)>,
}

/// What a ruleset was built from: the canonical protected paths, and the identity and
/// times of each directory on the way to them.
#[derive(PartialEq, Eq)]
struct Stamp {
    protected: Vec<PathBuf>,
    directories: Vec<(PathBuf, [i64; 6])>,
}

impl Kept {
    /// The confinement for `protected`: the kept one if nothing changed, else a new one
    /// (then kept).
    pub fn confinement(&mut self, protected: &[PathBuf]) -> Result<Confinement, ConfineError> {
        let protected = canonical(protected)?;
        let ancestors = ancestors(&protected)?;
        // Taken before the listings are read: a change during the build shows next time.
        let stamp = Stamp::of(&protected, &ancestors);
        if let (Some(stamp), Some((kept, confinement))) = (&stamp, &self.last)
            && stamp == kept
        {
            return confinement
                .try_clone()
                .map_err(|source| ConfineError::Protected {
                    path: "the kept ruleset".into(),
                    source,
                });
        }
        self.last = None;
        let built = Confinement::build_canonical(&protected, &ancestors)?;
        if let Some(stamp) = stamp
            && let Ok(kept) = built.try_clone()
        {
            self.last = Some((stamp, kept));
        }
        Ok(built)
    }
}

impl Stamp {
    /// `None` when a directory cannot be examined (then nothing is kept).
    fn of(protected: &[PathBuf], ancestors: &HashSet<PathBuf>) -> Option<Stamp> {
        let mut directories = Vec::with_capacity(ancestors.len());
        for directory in ancestors {
            let stat = rustix::fs::stat(directory).ok()?;
            directories.push((
                directory.clone(),
                [
                    stat.st_dev as i64,
                    stat.st_ino as i64,
                    stat.st_mtime as i64,
                    stat.st_mtime_nsec as i64,
                    stat.st_ctime as i64,
                    stat.st_ctime_nsec as i64,
                ],
            ));
        }
        directories.sort();
        Some(Stamp {
            protected: protected.to_vec(),
            directories,
        })
    }
}

/// Every directory on the way to a protected path (the root included).
fn ancestors(protected: &[PathBuf]) -> Result<HashSet<PathBuf>, ConfineError> {
    if protected.iter().any(|p| p.parent().is_none()) {
        return Err(ConfineError::Root);
    }
    Ok(protected
        .iter()
        .flat_map(|p| p.ancestors().skip(1).map(Path::to_path_buf))
        .collect())
}

/// Canonical forms of the protected paths that exist.
fn canonical(protected: &[PathBuf]) -> Result<Vec<PathBuf>, ConfineError> {
    let mut out = Vec::with_capacity(protected.len());
    for path in protected {
        match std::fs::canonicalize(path) {
            Ok(path) => out.push(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ConfineError::Protected {
                    path: path.display().to_string(),
                    source,
                });
            }
        }
    }
    Ok(out)
}

/// Opens an entry beside a protected path without following a symbolic link (a link
/// swapped in after listing must not grant its target). `None` for links and entries
/// that vanished; `Some((fd, is_dir))` otherwise.
fn open_beside(path: &Path) -> Option<(OwnedFd, bool)> {
    use rustix::fs::{FileType, OFlags};
    let fd = rustix::fs::open(
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .ok()?;
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd).ok()?.st_mode);
    match kind {
        FileType::Symlink => None,
        FileType::Directory => Some((fd, true)),
        _ => Some((fd, false)),
    }
}

/// The variable through which a supervisor learns what else to protect besides its state
/// dir. Never passed on to the step.
pub const PROTECT_VAR: &str = "SCARAB_SUPERVISOR_PROTECT";

/// `PROTECT_VAR`'s value: a JSON array of each path's bytes, so that any path (UTF-8 or
/// not) can be passed and none is ever dropped.
pub fn encode_protected(paths: &[PathBuf]) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes: Vec<&[u8]> = paths.iter().map(|p| p.as_os_str().as_bytes()).collect();
    serde_json::to_string(&bytes).unwrap_or_else(|_| unreachable!("byte arrays always encode"))
}

/// Reads `PROTECT_VAR` back. A value that does not decode is an error, never "nothing more
/// to protect".
pub fn decode_protected(value: &str) -> Result<Vec<PathBuf>, ConfineError> {
    use std::os::unix::ffi::OsStringExt;
    let bytes: Vec<Vec<u8>> =
        serde_json::from_str(value).map_err(|e| ConfineError::List(e.to_string()))?;
    Ok(bytes
        .into_iter()
        .map(|b| PathBuf::from(std::ffi::OsString::from_vec(b)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Can a thread confined by `confinement` open `path`?
    fn reaches(confinement: Confinement, path: PathBuf) -> bool {
        std::thread::spawn(move || {
            confinement.apply().expect("apply");
            std::fs::read_dir(&path).is_ok() || std::fs::File::open(&path).is_ok()
        })
        .join()
        .expect("thread")
    }

    #[test]
    fn a_kept_ruleset_is_rebuilt_when_an_entry_or_a_protected_path_appears() {
        if Isolation::of_kernel() == Isolation::None {
            eprintln!("skipped: this kernel has no Landlock");
            return;
        }
        let root = std::env::temp_dir().join(format!("scarab-kept-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("state")).expect("state");
        std::fs::write(root.join("a.txt"), "a").expect("a");
        let protected = vec![root.join("state"), root.join("secrets")];
        let mut kept = Kept::default();
        let mut confinement = || kept.confinement(&protected).expect("confinement");
        assert!(
            reaches(confinement(), root.join("a.txt")),
            "beside: granted"
        );
        assert!(!reaches(confinement(), root.join("state")), "protected");
        // Kernels with coarse timestamps show a change within the same tick only later
        // (the new entry is denied until then, never the other way round).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(root.join("b.txt"), "b").expect("b");
        assert!(
            reaches(confinement(), root.join("b.txt")),
            "a new entry beside is granted by the next confinement"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::create_dir(root.join("secrets")).expect("secrets");
        assert!(
            !reaches(confinement(), root.join("secrets")),
            "a protected path that appears is protected from then on"
        );
        assert!(reaches(confinement(), root.join("a.txt")));
        std::fs::remove_dir_all(&root).expect("clean up");
    }

    #[test]
    fn any_path_passes_to_the_supervisor_and_garbage_is_an_error() {
        use std::os::unix::ffi::OsStringExt;
        let odd = PathBuf::from(std::ffi::OsString::from_vec(b"/etc/sc\xffarab\nx".to_vec()));
        let paths = vec![PathBuf::from("/etc/scarab/scarab.toml"), odd];
        let decoded = decode_protected(&encode_protected(&paths)).expect("decodes");
        assert_eq!(decoded, paths);
        assert!(matches!(
            decode_protected("/etc/scarab"),
            Err(ConfineError::List(_))
        ));
    }
}

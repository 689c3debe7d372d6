//! The fence-named attempt directory shared by the service and its supervisors.
//!
//! `<state>/attempts/<fence>/` holds `spec.json` (what to run), `supervisor.json` (written
//! before the step is spawned: its presence means the step may have run; the step's own
//! identity is appended to it once spawned), `kill.json` (Scarab's stop request),
//! `stdout.log`, `stderr.log` and, last, `verdict.json`. The live supervisor holds a lock
//! on the directory itself: a PID-reuse-safe liveness check.
//!
//! Few files, because each is an inode to allocate per attempt. Supervisors started by
//! an older build (before an upgrade) held a `lock` file and wrote the step's identity to
//! `child.json`; both are still honoured when present.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::engine::{Fence, KillReason, Verdict};
use crate::store::records::{LaunchAction, LaunchRecord, v3};

pub const SPEC: &str = "spec.json";
/// The lock file of supervisors from older builds (they now lock the directory).
pub const LEGACY_LOCK: &str = "lock";
pub const SUPERVISOR: &str = "supervisor.json";
/// Where supervisors from older builds recorded the step (it is now appended to
/// `supervisor.json`).
pub const LEGACY_CHILD: &str = "child.json";
pub const KILL: &str = "kill.json";
/// Left by a supervisor that gave up at the launch handshake: the step never started.
pub const ABORTED: &str = "aborted";
pub const VERDICT: &str = "verdict.json";
pub const STDOUT: &str = "stdout.log";
pub const STDERR: &str = "stderr.log";

/// What the supervisor runs: the launch as the store recorded it, and the stop grace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    pub launch: LaunchRecord,
    pub kill_grace_ms: u64,
}

// The attempt files are read by other builds than the one that wrote them (a supervisor
// started before an upgrade reports to the service after it), so their JSON is that of
// the frozen record types, never of the engine's: format 3's, whose launch reads a
// format-2 `spec.json` too (its one new field, `secrets`, defaults to none).

/// `spec.json`.
#[derive(Serialize, Deserialize)]
struct SpecFile {
    launch: v3::LaunchRecord,
    kill_grace_ms: u64,
}

/// `kill.json`.
#[derive(Serialize, Deserialize)]
struct KillFile {
    reason: v3::KillReason,
}

pub fn write_spec(dir: &Path, spec: &Spec) -> io::Result<()> {
    let file = SpecFile {
        launch: (&spec.launch).into(),
        kill_grace_ms: spec.kill_grace_ms,
    };
    write_json(dir, SPEC, &file, false)
}

/// `Ok(None)` when there is no spec; an implausible one is `InvalidData`.
pub fn read_spec(dir: &Path) -> io::Result<Option<Spec>> {
    let Some(file) = read_json::<SpecFile>(dir, SPEC)? else {
        return Ok(None);
    };
    let launch = LaunchRecord::try_from(file.launch)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{SPEC}: {e}")))?;
    Ok(Some(Spec {
        launch,
        kill_grace_ms: file.kill_grace_ms,
    }))
}

/// Scarab's stop request, written durably: the supervisor acts on it even after a crash.
pub fn write_kill(dir: &Path, reason: KillReason) -> io::Result<()> {
    let file = KillFile {
        reason: reason.into(),
    };
    write_json(dir, KILL, &file, true)
}

pub fn read_kill(dir: &Path) -> io::Result<Option<KillReason>> {
    Ok(read_json::<KillFile>(dir, KILL)?.map(|file| file.reason.into()))
}

pub fn write_verdict(dir: &Path, verdict: &Verdict) -> io::Result<()> {
    write_json(dir, VERDICT, &v3::Verdict::from(verdict), false)
}

pub fn read_verdict(dir: &Path) -> io::Result<Option<Verdict>> {
    Ok(read_json::<v3::Verdict>(dir, VERDICT)?.map(Verdict::from))
}

/// The local command of a spec.
pub struct LocalCommand<'a> {
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
    /// (variable, secret name).
    pub secrets: &'a [(String, String)],
    pub workdir: Option<&'a str>,
}

impl Spec {
    /// `None` for a spec of another executor's step (never written by this one).
    pub fn local(&self) -> Option<LocalCommand<'_>> {
        match &self.launch.action {
            LaunchAction::Local {
                argv,
                env,
                secrets,
                workdir,
            } => Some(LocalCommand {
                argv,
                env,
                secrets,
                workdir: workdir.as_deref(),
            }),
            LaunchAction::Kubernetes(_) => None,
        }
    }
}

/// A process identity that survives PID reuse: the pid plus its start time in clock ticks
/// since boot (`/proc/<pid>/stat` field 22).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessIdentity {
    pub pid: i32,
    pub start_ticks: u64,
}

impl ProcessIdentity {
    pub fn of(pid: i32) -> Option<ProcessIdentity> {
        Some(ProcessIdentity {
            pid,
            start_ticks: start_ticks(pid)?,
        })
    }

    /// True only if this very process (not a later one with the same pid) is alive.
    pub fn is_alive(&self) -> bool {
        start_ticks(self.pid) == Some(self.start_ticks)
    }
}

fn start_ticks(pid: i32) -> Option<u64> {
    // Read with room for the whole line at once: procfs gives no size, and growing from
    // nothing would take several reads.
    let mut stat = String::with_capacity(1024);
    io::Read::read_to_string(
        &mut File::open(format!("/proc/{pid}/stat")).ok()?,
        &mut stat,
    )
    .ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields resume after the
    // last ')'. Field 3 is the state; a zombie has finished running.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

pub fn attempt_dir(attempts: &Path, fence: Fence) -> PathBuf {
    attempts.join(fence.0.to_string())
}

/// Writes `name` in `dir` so that readers see the old content or the whole new one,
/// and (with `durable`) so that it survives a power cut once this returns.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let written = File::create(&tmp).and_then(|mut file| {
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        Ok(())
    });
    if let Err(error) = written.and_then(|()| fs::rename(&tmp, dir.join(name))) {
        // A full disk leaves no half-written temporary behind.
        let _ = fs::remove_file(&tmp);
        return Err(error);
    }
    if durable {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

pub fn write_json<T: Serialize>(
    dir: &Path,
    name: &str,
    value: &T,
    durable: bool,
) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    write_atomic(dir, name, &bytes, durable)
}

/// `Ok(None)` when the file does not exist.
pub fn read_json<T: DeserializeOwned>(dir: &Path, name: &str) -> io::Result<Option<T>> {
    match fs::read(dir.join(name)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {e}"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Opens the attempt directory to lock it: the supervisor holds an exclusive lock on it
/// for as long as it supervises the attempt.
pub fn open_lock(dir: &Path) -> io::Result<File> {
    File::open(dir)
}

/// Is a supervisor holding this attempt's lock? The kernel drops the lock when the
/// process dies, so unlike a pid this cannot be fooled by reuse. Probes with a shared
/// lock so that a supervisor's blocking exclusive lock merely waits, never fails.
pub fn supervisor_holds_lock(dir: &Path) -> io::Result<bool> {
    // The directory, then the `lock` file a supervisor of an older build holds instead.
    for path in [dir.to_path_buf(), dir.join(LEGACY_LOCK)] {
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        match rustix::fs::flock(
            file.as_fd(),
            rustix::fs::FlockOperation::NonBlockingLockShared,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(true),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(false)
}

/// What `supervisor.json` says: the supervisor, and the step once it was spawned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Supervision {
    pub supervisor: ProcessIdentity,
    pub child: Option<ProcessIdentity>,
}

/// Records the supervisor, atomically: the file is whole or absent.
pub fn write_supervisor(dir: &Path, me: &ProcessIdentity) -> io::Result<()> {
    write_atomic(dir, SUPERVISOR, &record_line(me)?, false)
}

/// Appends the spawned step's identity to `supervisor.json` in one write. A record cut
/// short (a power cut) is read as not written.
pub fn append_child(dir: &Path, child: &ProcessIdentity) -> io::Result<()> {
    OpenOptions::new()
        .append(true)
        .open(dir.join(SUPERVISOR))?
        .write_all(&record_line(child)?)
}

fn record_line(identity: &ProcessIdentity) -> io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(identity).map_err(io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

/// `Ok(None)` when there is no `supervisor.json`; one whose first record is unreadable
/// is `InvalidData`. The step's identity comes from the second record, or from the
/// `child.json` of a supervisor of an older build.
pub fn read_supervision(dir: &Path) -> io::Result<Option<Supervision>> {
    let bytes = match fs::read(dir.join(SUPERVISOR)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let (first, rest) = first_record(&bytes);
    let supervisor = match first {
        Some(Ok(supervisor)) => supervisor,
        Some(Err(e)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{SUPERVISOR}: {e}"),
            ));
        }
        None => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{SUPERVISOR}: empty"),
            ));
        }
    };
    let child = match serde_json::Deserializer::from_slice(rest)
        .into_iter::<ProcessIdentity>()
        .next()
    {
        Some(Ok(child)) => Some(child),
        Some(Err(_)) => None,
        None => read_json::<ProcessIdentity>(dir, LEGACY_CHILD)
            .ok()
            .flatten(),
    };
    Ok(Some(Supervision { supervisor, child }))
}

/// May the step have been spawned, as far as the attempt directory tells? Anything after
/// the supervisor's record, even a record cut short, and an unreadable record say yes; an
/// empty file says no.
pub fn child_recorded(dir: &Path) -> bool {
    if dir.join(LEGACY_CHILD).exists() {
        return true;
    }
    let bytes = match fs::read(dir.join(SUPERVISOR)) {
        Ok(bytes) => bytes,
        Err(e) => return e.kind() != io::ErrorKind::NotFound,
    };
    match first_record(&bytes) {
        (Some(Ok(_)), rest) => rest.iter().any(|b| !b.is_ascii_whitespace()),
        (Some(Err(_)), _) => true,
        (None, _) => false,
    }
}

/// `supervisor.json`'s first record (the supervisor's; `None` if the file is empty) and
/// the bytes after it.
fn first_record(bytes: &[u8]) -> (Option<serde_json::Result<ProcessIdentity>>, &[u8]) {
    let mut records = serde_json::Deserializer::from_slice(bytes).into_iter::<ProcessIdentity>();
    let first = records.next();
    (first, &bytes[records.byte_offset()..])
}

/// Removes an attempt directory with everything in it; a missing one is fine.
pub fn remove_attempt_dir(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(pid: i32) -> ProcessIdentity {
        ProcessIdentity {
            pid,
            start_ticks: 1000 + pid as u64,
        }
    }

    fn attempt() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("7");
        fs::create_dir(&dir).expect("attempt dir");
        (root, dir)
    }

    #[test]
    fn the_steps_identity_is_appended_to_the_supervisors_record_and_a_torn_one_is_not_read() {
        let (_root, dir) = attempt();
        assert_eq!(read_supervision(&dir).expect("read"), None);
        assert!(!child_recorded(&dir));

        write_supervisor(&dir, &identity(10)).expect("supervisor");
        let alone = read_supervision(&dir).expect("read").expect("recorded");
        assert_eq!((alone.supervisor, alone.child), (identity(10), None));
        assert!(!child_recorded(&dir), "no step yet");

        append_child(&dir, &identity(11)).expect("child");
        let both = read_supervision(&dir).expect("read").expect("recorded");
        assert_eq!(
            (both.supervisor, both.child),
            (identity(10), Some(identity(11)))
        );
        assert!(child_recorded(&dir));

        // A power cut in the middle of the append: the step may have been spawned, but
        // its identity is not made up from half a record.
        let bytes = fs::read(dir.join(SUPERVISOR)).expect("bytes");
        let first = bytes.iter().position(|&b| b == b'\n').expect("a line") + 1;
        fs::write(dir.join(SUPERVISOR), &bytes[..first + 8]).expect("torn");
        let torn = read_supervision(&dir).expect("read").expect("recorded");
        assert_eq!((torn.supervisor, torn.child), (identity(10), None));
        assert!(child_recorded(&dir), "something was appended");

        // Cut short in the supervisor's own record: unreadable, and it may have spawned.
        fs::write(dir.join(SUPERVISOR), &bytes[..first / 2]).expect("torn");
        let error = read_supervision(&dir).expect_err("torn record");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(child_recorded(&dir));
        // An empty file (a power cut before its data reached the disk) recorded nothing.
        fs::write(dir.join(SUPERVISOR), b"").expect("empty");
        assert!(!child_recorded(&dir));
    }

    #[test]
    fn the_files_of_a_supervisor_from_an_older_build_are_still_read() {
        let (_root, dir) = attempt();
        // Older builds wrote pretty JSON to `supervisor.json` and the step to `child.json`.
        write_json(&dir, SUPERVISOR, &identity(20), false).expect("old supervisor");
        let alone = read_supervision(&dir).expect("read").expect("recorded");
        assert_eq!((alone.supervisor, alone.child), (identity(20), None));
        assert!(!child_recorded(&dir));
        write_json(&dir, LEGACY_CHILD, &identity(21), false).expect("old child");
        let both = read_supervision(&dir).expect("read").expect("recorded");
        assert_eq!(
            (both.supervisor, both.child),
            (identity(20), Some(identity(21)))
        );
        assert!(child_recorded(&dir));
    }

    #[test]
    fn a_supervisor_holds_the_directorys_lock_or_an_older_builds_lock_file() {
        let (_root, dir) = attempt();
        assert!(!supervisor_holds_lock(&dir).expect("probe"));
        let exclusive = |file: &File| {
            rustix::fs::flock(file.as_fd(), rustix::fs::FlockOperation::LockExclusive)
                .expect("flock")
        };

        let held = open_lock(&dir).expect("open");
        exclusive(&held);
        assert!(supervisor_holds_lock(&dir).expect("probe"));
        drop(held);
        assert!(!supervisor_holds_lock(&dir).expect("probe"), "released");

        let legacy = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LEGACY_LOCK))
            .expect("old lock file");
        assert!(!supervisor_holds_lock(&dir).expect("probe"), "not held");
        exclusive(&legacy);
        assert!(supervisor_holds_lock(&dir).expect("probe"));
        drop(legacy);
        assert!(!supervisor_holds_lock(&dir).expect("probe"), "released");

        // The probe only peeks: a supervisor can still take the lock after it.
        let taken = open_lock(&dir).expect("open");
        rustix::fs::flock(
            taken.as_fd(),
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        )
        .expect("the probe left the lock free");
    }
}

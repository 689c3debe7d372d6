//! The fence-named attempt directory shared by the service and its supervisors.
//!
//! `<state>/attempts/<fence>/` holds `spec.json` (what to run), `lock` (held by the live
//! supervisor: a PID-reuse-safe liveness check), `supervisor.json` (written before the step
//! is spawned: its presence means the step may have run), `child.json`, `kill.json`
//! (Scarab's stop request), `stdout.log`, `stderr.log` and, last, `verdict.json`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::engine::{Fence, KillReason, Verdict};
use crate::store::records::{LaunchAction, LaunchRecord, v3};

pub const SPEC: &str = "spec.json";
pub const LOCK: &str = "lock";
pub const SUPERVISOR: &str = "supervisor.json";
pub const CHILD: &str = "child.json";
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

/// Opens the attempt's lock file (creating it).
pub fn open_lock(dir: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(LOCK))
}

/// Is a supervisor holding this attempt's lock? The kernel drops the lock when the
/// process dies, so unlike a pid this cannot be fooled by reuse. Probes with a shared
/// lock so that a supervisor's blocking exclusive lock merely waits, never fails.
pub fn supervisor_holds_lock(dir: &Path) -> io::Result<bool> {
    let file = match OpenOptions::new().read(true).open(dir.join(LOCK)) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match rustix::fs::flock(
        file.as_fd(),
        rustix::fs::FlockOperation::NonBlockingLockShared,
    ) {
        Ok(()) => Ok(false),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Removes an attempt directory with everything in it; a missing one is fine.
pub fn remove_attempt_dir(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

//! The fence-named attempt directory shared by the service and its supervisors.
//!
//! `<state>/attempts/<fence>/` holds `attempt.jsonl`, the attempt's record: one JSON
//! record per line. The service writes the first, the spec (what to run), before the
//! supervisor starts; the supervisor appends the others, each in one write: its own
//! identity before the launch handshake (from the go on, its presence means the step may
//! have run), the step's identity once spawned, and last the verdict. Beside it
//! `kill.json` (Scarab's stop request), `stdout.log`, `stderr.log` and `aborted` (a
//! supervisor that gave up at the launch handshake). The live supervisor holds a lock on
//! the directory itself: a PID-reuse-safe liveness check.
//!
//! One record file rather than a file per record, because each file is an inode to
//! allocate per attempt. Older builds wrote `spec.json`, `supervisor.json` (and before
//! that `child.json`), `verdict.json` and held a `lock` file; what supervisors started by
//! them (before an upgrade) left is still read, and a supervisor whose spec is in an
//! older `spec.json` writes that build's files ([`Layout`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::engine::{Fence, KillReason, Verdict};
use crate::store::records::{LaunchAction, LaunchRecord, v3};

/// The attempt's record.
pub const ATTEMPT: &str = "attempt.jsonl";
pub const KILL: &str = "kill.json";
/// Left by a supervisor that gave up at the launch handshake: the step never started.
pub const ABORTED: &str = "aborted";
pub const STDOUT: &str = "stdout.log";
pub const STDERR: &str = "stderr.log";
/// Where older builds kept the spec, the supervisor's record and the verdict (now
/// records of `attempt.jsonl`).
pub const LEGACY_SPEC: &str = "spec.json";
pub const LEGACY_SUPERVISOR: &str = "supervisor.json";
pub const LEGACY_VERDICT: &str = "verdict.json";
/// Where still older builds recorded the step (later appended to `supervisor.json`).
pub const LEGACY_CHILD: &str = "child.json";
/// The lock file of supervisors from older builds (they now lock the directory).
pub const LEGACY_LOCK: &str = "lock";

/// What the supervisor runs: the launch as the store recorded it, and the stop grace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    pub launch: LaunchRecord,
    pub kill_grace_ms: u64,
}

// The attempt files are read by other builds than the one that wrote them (a supervisor
// started before an upgrade reports to the service after it), so their JSON is that of
// the frozen record types, never of the engine's: format 3's, whose launch reads a
// format-2 spec too (its one new field, `secrets`, defaults to none).

/// The spec: `attempt.jsonl`'s first record, and the whole of an older `spec.json`.
#[derive(Serialize, Deserialize)]
struct SpecFile {
    launch: v3::LaunchRecord,
    kill_grace_ms: u64,
}

/// A record the supervisor appends to `attempt.jsonl`.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Entry {
    Supervisor(ProcessIdentity),
    Child(ProcessIdentity),
    Verdict(v3::Verdict),
}

/// Where a supervisor writes an attempt's records: this build's `attempt.jsonl`, or the
/// files of the build before it (`supervisor.json` with the step's record appended,
/// `verdict.json`) when the spec is in a `spec.json`. That spec was written by an older
/// service, which may still be the one running (dpkg replaces the executable before the
/// service restarts), and which reads only those files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Records,
    Legacy,
}

impl Layout {
    /// The layout of the attempt in `dir`: that of the file its spec is in.
    pub fn of(dir: &Path) -> Layout {
        Taken::read(dir).layout(dir)
    }
}

/// `kill.json`.
#[derive(Serialize, Deserialize)]
struct KillFile {
    reason: v3::KillReason,
}

/// `attempt.jsonl` as read.
struct Records {
    /// The first line, or why it cannot be read.
    spec: Result<SpecFile, String>,
    /// The lines after it, in order: `None` for one that cannot be read (cut short by a
    /// power cut, or by a full disk before this build cut such a record off again).
    entries: Vec<Option<Entry>>,
}

impl Records {
    /// `Ok(None)` when there is no `attempt.jsonl`.
    fn read(dir: &Path) -> io::Result<Option<Records>> {
        let Some(bytes) = read_bounded(dir, ATTEMPT)? else {
            return Ok(None);
        };
        let mut lines = bytes
            .split(|&b| b == b'\n')
            .filter(|line| !line.iter().all(u8::is_ascii_whitespace));
        let spec = match lines.next() {
            None => Err("empty".to_string()),
            Some(line) => serde_json::from_slice(line).map_err(|e| e.to_string()),
        };
        let entries = lines
            .map(|line| serde_json::from_slice(line).ok())
            .collect();
        Ok(Some(Records { spec, entries }))
    }

    fn verdict(&self) -> Option<&v3::Verdict> {
        self.entries.iter().find_map(|entry| match entry {
            Some(Entry::Verdict(verdict)) => Some(verdict),
            _ => None,
        })
    }

    /// The supervisor's record, and the step's after it. A record that cannot be read
    /// before the supervisor's is `InvalidData`: it may have been the supervisor's.
    fn supervision(&self) -> io::Result<Option<Supervision>> {
        let mut entries = self.entries.iter();
        let supervisor = loop {
            match entries.next() {
                None => return Ok(None),
                Some(None) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{ATTEMPT}: a record before the supervisor's is unreadable"),
                    ));
                }
                Some(Some(Entry::Supervisor(supervisor))) => break *supervisor,
                Some(Some(Entry::Child(_))) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{ATTEMPT}: a step's record before the supervisor's"),
                    ));
                }
                // A verdict written before any supervisor recorded itself (stopped
                // before it started).
                Some(Some(Entry::Verdict(_))) => {}
            }
        };
        let child = entries.find_map(|entry| match entry {
            Some(Entry::Child(child)) => Some(*child),
            _ => None,
        });
        Ok(Some(Supervision { supervisor, child }))
    }
}

/// Writes the spec as the first and only record of `attempt.jsonl`, replacing whatever
/// the file held (atomically: a reader sees the old file or the new one).
pub fn write_spec(dir: &Path, spec: &Spec) -> io::Result<()> {
    let file = SpecFile {
        launch: (&spec.launch).into(),
        kill_grace_ms: spec.kill_grace_ms,
    };
    let mut line = serde_json::to_vec(&file).map_err(io::Error::other)?;
    line.push(b'\n');
    write_atomic(dir, ATTEMPT, &line, false)
}

/// `Ok(None)` when there is no spec; an unreadable or implausible one is `InvalidData`.
pub fn read_spec(dir: &Path) -> io::Result<Option<Spec>> {
    Taken::read(dir).spec(dir)
}

/// `attempt.jsonl` read once, for the checks a supervisor makes when it takes its
/// attempt: a verdict already written, the spec, a supervisor before it. It holds the
/// attempt's lock and only a supervisor appends to the file, so one read answers them
/// all.
pub struct Taken {
    records: io::Result<Option<Records>>,
}

impl Taken {
    pub fn read(dir: &Path) -> Taken {
        Taken {
            records: Records::read(dir),
        }
    }

    /// The verdict of `attempt.jsonl`, or of an older build's `verdict.json` (one that
    /// cannot be read is an error).
    pub fn verdict(&self, dir: &Path) -> io::Result<Option<Verdict>> {
        let records = match &self.records {
            Ok(records) => records.as_ref(),
            Err(e) => return Err(io::Error::new(e.kind(), e.to_string())),
        };
        if let Some(verdict) = records.and_then(Records::verdict) {
            return Ok(Some(verdict.clone().into()));
        }
        Ok(read_json::<v3::Verdict>(dir, LEGACY_VERDICT)?.map(Verdict::from))
    }

    /// Has a supervisor written a verdict (one that cannot be read counts)?
    pub fn verdict_recorded(&self, dir: &Path) -> bool {
        !matches!(self.verdict(dir), Ok(None))
    }

    /// Did a supervisor take this attempt (so its step may have run)? Anything after
    /// the spec says yes, even a record that cannot be read, and so does whatever cannot
    /// be read at all.
    pub fn supervisor_recorded(&self, dir: &Path) -> bool {
        dir.join(LEGACY_SUPERVISOR).exists()
            || match &self.records {
                Ok(Some(records)) => !records.entries.is_empty(),
                Ok(None) => false,
                Err(_) => true,
            }
    }

    /// The layout of the attempt: that of the file its spec is in.
    pub fn layout(&self, dir: &Path) -> Layout {
        match &self.records {
            Ok(None) if dir.join(LEGACY_SPEC).exists() => Layout::Legacy,
            _ => Layout::Records,
        }
    }

    /// The spec: `Ok(None)` when there is none; an unreadable or implausible one is
    /// `InvalidData`.
    pub fn spec(self, dir: &Path) -> io::Result<Option<Spec>> {
        let file = match self.records? {
            Some(records) => records.spec.map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{ATTEMPT}: spec: {e}"))
            })?,
            None => match read_json::<SpecFile>(dir, LEGACY_SPEC)? {
                Some(file) => file,
                None => return Ok(None),
            },
        };
        let launch = LaunchRecord::try_from(file.launch)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("spec: {e}")))?;
        Ok(Some(Spec {
            launch,
            kill_grace_ms: file.kill_grace_ms,
        }))
    }
}

/// Appends one record to `attempt.jsonl` in one write. One that fails part-way (a full
/// disk) is cut off again, and one cut short by a power cut (the file does not end with
/// its newline) is ended first, so that no record lands behind half of another.
fn append(dir: &Path, entry: &Entry) -> io::Result<()> {
    let mut line = serde_json::to_vec(entry).map_err(io::Error::other)?;
    line.push(b'\n');
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .open(dir.join(ATTEMPT))?;
    let before = file.metadata()?.len();
    if before > 0 {
        let mut last = [0u8];
        file.read_exact_at(&mut last, before - 1)?;
        if last[0] != b'\n' {
            line.insert(0, b'\n');
        }
    }
    if let Err(error) = file.write_all(&line) {
        let _ = file.set_len(before);
        return Err(error);
    }
    Ok(())
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

/// Records the verdict, the attempt's last record. Not fsynced: the service commits it
/// durably to the store.
pub fn write_verdict(dir: &Path, layout: Layout, verdict: &Verdict) -> io::Result<()> {
    match layout {
        Layout::Records => append(dir, &Entry::Verdict(verdict.into())),
        Layout::Legacy => write_json(dir, LEGACY_VERDICT, &v3::Verdict::from(verdict), false),
    }
}

/// The verdict of `attempt.jsonl`, or of an older build's `verdict.json` (one that
/// cannot be read is `InvalidData`).
pub fn read_verdict(dir: &Path) -> io::Result<Option<Verdict>> {
    Taken::read(dir).verdict(dir)
}

/// Has a supervisor written a verdict (one that cannot be read counts)?
pub fn verdict_recorded(dir: &Path) -> bool {
    Taken::read(dir).verdict_recorded(dir)
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
    /// This process's identity. Read once per process (a zygote's supervisors are forks:
    /// each reads its own once), not once per attempt.
    pub fn own() -> Option<ProcessIdentity> {
        static OWN: std::sync::Mutex<Option<ProcessIdentity>> = std::sync::Mutex::new(None);
        let pid = std::process::id() as i32;
        let mut own = OWN.lock().ok()?;
        match *own {
            Some(identity) if identity.pid == pid => Some(identity),
            _ => {
                *own = ProcessIdentity::of(pid);
                *own
            }
        }
    }

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
    let Some(bytes) = read_bounded(dir, name)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {e}")))
}

/// An attempt file, `Ok(None)` when it does not exist; one larger than
/// `limits::ATTEMPT_FILE_MAX_BYTES` (no build writes one) is `InvalidData`.
fn read_bounded(dir: &Path, name: &str) -> io::Result<Option<Vec<u8>>> {
    let file = match File::open(dir.join(name)) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let max = crate::limits::ATTEMPT_FILE_MAX_BYTES;
    // Room for what an attempt's files usually hold, so one read takes it (from nothing,
    // the buffer would grow over several).
    let mut bytes = Vec::with_capacity(4096);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name}: larger than {max} bytes"),
        ));
    }
    Ok(Some(bytes))
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

/// What the supervisor's records say: the supervisor, and the step once it was spawned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Supervision {
    pub supervisor: ProcessIdentity,
    pub child: Option<ProcessIdentity>,
}

/// Records the supervisor, before the launch handshake.
pub fn write_supervisor(dir: &Path, layout: Layout, me: &ProcessIdentity) -> io::Result<()> {
    match layout {
        Layout::Records => append(dir, &Entry::Supervisor(*me)),
        Layout::Legacy => write_atomic(dir, LEGACY_SUPERVISOR, &record_line(me)?, false),
    }
}

/// Records the spawned step. A record cut short (a power cut) is read as not written.
pub fn append_child(dir: &Path, layout: Layout, child: &ProcessIdentity) -> io::Result<()> {
    match layout {
        Layout::Records => append(dir, &Entry::Child(*child)),
        Layout::Legacy => OpenOptions::new()
            .append(true)
            .open(dir.join(LEGACY_SUPERVISOR))?
            .write_all(&record_line(child)?),
    }
}

fn record_line(identity: &ProcessIdentity) -> io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(identity).map_err(io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

/// Removes the `aborted` marker durably (the directory is fsynced): once the step may
/// start, a power cut must not bring the marker back, or the next start would start the
/// step again under the same fence.
pub fn remove_aborted(dir: &Path) -> io::Result<()> {
    match fs::remove_file(dir.join(ABORTED)) {
        Ok(()) => File::open(dir)?.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// `Ok(None)` when no supervisor recorded itself; an unreadable record where the
/// supervisor's would be is `InvalidData`. From `attempt.jsonl`, or from an older build's
/// `supervisor.json` (the step's identity as its second record, or in `child.json`).
pub fn read_supervision(dir: &Path) -> io::Result<Option<Supervision>> {
    if let Some(supervision) = Records::read(dir)?
        .map(|records| records.supervision())
        .transpose()?
        .flatten()
    {
        return Ok(Some(supervision));
    }
    let bytes = match read_bounded(dir, LEGACY_SUPERVISOR)? {
        Some(bytes) => bytes,
        None => return Ok(None),
    };
    let (first, rest) = first_record(&bytes);
    let supervisor = match first {
        Some(Ok(supervisor)) => supervisor,
        Some(Err(e)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{LEGACY_SUPERVISOR}: {e}"),
            ));
        }
        None => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{LEGACY_SUPERVISOR}: empty"),
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

/// Did a supervisor take this attempt (so its step may have run)? As
/// [`Taken::supervisor_recorded`].
pub fn supervisor_recorded(dir: &Path) -> bool {
    Taken::read(dir).supervisor_recorded(dir)
}

/// May the step have been spawned, as far as the attempt directory tells? A record of
/// the step says yes, and so does a record that cannot be read (it may have been the
/// step's, cut short) and whatever cannot be read at all.
pub fn child_recorded(dir: &Path) -> bool {
    if dir.join(LEGACY_CHILD).exists() {
        return true;
    }
    match Records::read(dir) {
        Ok(Some(records))
            if records
                .entries
                .iter()
                .any(|entry| matches!(entry, None | Some(Entry::Child(_)))) =>
        {
            return true;
        }
        Ok(_) => {}
        Err(_) => return true,
    }
    let bytes = match read_bounded(dir, LEGACY_SUPERVISOR) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return false,
        Err(_) => return true,
    };
    match first_record(&bytes) {
        (Some(Ok(_)), rest) => rest.iter().any(|b| !b.is_ascii_whitespace()),
        (Some(Err(_)), _) => true,
        (None, _) => false,
    }
}

/// Forgets a supervisor that gave up at the launch handshake (its step never started):
/// `attempt.jsonl` keeps only the spec, and an older build's `supervisor.json` goes.
pub fn forget_supervisor(dir: &Path) -> io::Result<()> {
    match fs::remove_file(dir.join(LEGACY_SUPERVISOR)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let Some(bytes) = read_bounded(dir, ATTEMPT)? else {
        return Ok(());
    };
    if let Some(end) = bytes.iter().position(|&b| b == b'\n') {
        OpenOptions::new()
            .write(true)
            .open(dir.join(ATTEMPT))?
            .set_len(end as u64 + 1)?;
    }
    Ok(())
}

/// An older build's `supervisor.json`: its first record (the supervisor's; `None` if the
/// file is empty) and the bytes after it.
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

    #[test]
    fn one_read_answers_a_supervisors_checks() {
        let (_root, dir) = attempt();
        write_spec(&dir, &spec(7)).expect("spec");
        let before = Taken::read(&dir);
        write_supervisor(&dir, Layout::Records, &identity(10)).expect("supervisor");
        // Read before the supervisor's record: it answers as the file was then.
        assert!(!before.verdict_recorded(&dir));
        assert!(!before.supervisor_recorded(&dir));
        assert_eq!(before.layout(&dir), Layout::Records);
        assert_eq!(before.spec(&dir).expect("read"), Some(spec(7)));
        let taken = Taken::read(&dir);
        assert!(taken.supervisor_recorded(&dir) && !taken.verdict_recorded(&dir));
        // Too large to read: a verdict and a supervisor may be in it, the spec is not
        // readable.
        let large = crate::limits::ATTEMPT_FILE_MAX_BYTES as usize + 1;
        fs::write(dir.join(ATTEMPT), vec![b'x'; large]).expect("write");
        let unreadable = Taken::read(&dir);
        assert!(unreadable.verdict_recorded(&dir) && unreadable.supervisor_recorded(&dir));
        assert_eq!(unreadable.layout(&dir), Layout::Records);
        let error = unreadable.spec(&dir).expect_err("unreadable");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_processs_own_identity_is_read_once_and_is_its_own() {
        let own = ProcessIdentity::own().expect("own identity");
        assert_eq!(Some(own), ProcessIdentity::of(std::process::id() as i32));
        assert!(own.is_alive());
        assert_eq!(
            ProcessIdentity::own(),
            Some(own),
            "the same the second time"
        );
        // A forked child reads its own, not its parent's.
        let (mut ours, mut theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
        // SAFETY: the child only reads its identity, writes it to the socket and exits.
        match unsafe { libc::fork() } {
            0 => {
                let child = ProcessIdentity::own().map(|me| me.pid).unwrap_or(0);
                let _ = theirs.write_all(&child.to_le_bytes());
                // SAFETY: ends the child without running the test harness's exit.
                unsafe { libc::_exit(0) }
            }
            -1 => panic!("fork: {}", io::Error::last_os_error()),
            pid => {
                drop(theirs);
                let mut bytes = [0u8; 4];
                ours.read_exact(&mut bytes).expect("the child's pid");
                // SAFETY: reaps the child forked above.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
                assert_eq!(i32::from_le_bytes(bytes), pid);
            }
        }
    }

    fn attempt() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("7");
        fs::create_dir(&dir).expect("attempt dir");
        (root, dir)
    }

    fn spec(fence: u64) -> Spec {
        Spec {
            launch: LaunchRecord {
                run: crate::engine::RunId(3),
                step: 0,
                step_name: "s".into(),
                attempt: 1,
                fence: Fence(fence),
                action: LaunchAction::Local {
                    argv: vec!["true".into()],
                    env: vec![],
                    secrets: vec![],
                    workdir: None,
                },
                timeout_ms: 1000,
            },
            kill_grace_ms: 500,
        }
    }

    /// A fixed verdict: its time is a constant so two calls compare equal.
    fn verdict() -> Verdict {
        Verdict {
            outcome: crate::engine::Outcome::Succeeded,
            started: true,
            reason: "exited 0\non two lines".into(),
            exit_code: Some(0),
            started_at: None,
            finished_at: crate::engine::Timestamp(1_796_624_821_539),
        }
    }

    /// Keeps the first `whole` lines of the record file, and `extra` bytes of the next.
    fn cut(dir: &Path, whole: usize, extra: usize) {
        let bytes = fs::read(dir.join(ATTEMPT)).expect("bytes");
        let mut end = 0;
        for _ in 0..whole {
            end += bytes[end..]
                .iter()
                .position(|&b| b == b'\n')
                .expect("a line")
                + 1;
        }
        fs::write(dir.join(ATTEMPT), &bytes[..end + extra]).expect("cut");
    }

    #[test]
    fn the_records_follow_the_spec_in_one_file_and_a_torn_one_is_not_read() {
        let (_root, dir) = attempt();
        assert_eq!(read_spec(&dir).expect("read"), None);
        assert!(
            write_supervisor(&dir, Layout::Records, &identity(9)).is_err(),
            "no spec, no file"
        );
        write_spec(&dir, &spec(7)).expect("spec");
        assert_eq!(read_spec(&dir).expect("read"), Some(spec(7)));
        assert_eq!(read_supervision(&dir).expect("read"), None);
        assert!(!supervisor_recorded(&dir) && !child_recorded(&dir));

        write_supervisor(&dir, Layout::Records, &identity(10)).expect("supervisor");
        let alone = read_supervision(&dir).expect("read").expect("recorded");
        assert_eq!((alone.supervisor, alone.child), (identity(10), None));
        assert!(supervisor_recorded(&dir));
        assert!(!child_recorded(&dir), "no step yet");

        append_child(&dir, Layout::Records, &identity(11)).expect("child");
        let both = read_supervision(&dir).expect("read").expect("recorded");
        assert_eq!(
            (both.supervisor, both.child),
            (identity(10), Some(identity(11)))
        );
        assert!(child_recorded(&dir));
        assert_eq!(read_verdict(&dir).expect("read"), None);
        assert!(!verdict_recorded(&dir));
        write_verdict(&dir, Layout::Records, &verdict()).expect("verdict");
        assert_eq!(read_verdict(&dir).expect("read"), Some(verdict()));
        assert!(verdict_recorded(&dir));
        assert_eq!(read_spec(&dir).expect("read"), Some(spec(7)), "still first");
        assert_eq!(Layout::of(&dir), Layout::Records);

        // A record cut short by a power cut: the next one starts on a line of its own.
        let whole = fs::read(dir.join(ATTEMPT)).expect("bytes");
        cut(&dir, 3, 10);
        write_verdict(&dir, Layout::Records, &verdict()).expect("verdict again");
        assert_eq!(read_verdict(&dir).expect("read"), Some(verdict()));
        assert_eq!(read_supervision(&dir).expect("read"), Some(both));
        fs::write(dir.join(ATTEMPT), whole).expect("restore");

        // A power cut in the middle of the verdict: no verdict, the rest as it was.
        cut(&dir, 3, 10);
        assert_eq!(read_verdict(&dir).expect("read"), None);
        assert_eq!(read_supervision(&dir).expect("read"), Some(both));
        // In the middle of the step's record: the step may have been spawned, but its
        // identity is not made up from half a record.
        cut(&dir, 2, 8);
        let torn = read_supervision(&dir).expect("read").expect("recorded");
        assert_eq!((torn.supervisor, torn.child), (identity(10), None));
        assert!(child_recorded(&dir), "something was appended");
        // In the supervisor's own record: unreadable, and it may have spawned.
        cut(&dir, 1, 5);
        let error = read_supervision(&dir).expect_err("torn record");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(supervisor_recorded(&dir) && child_recorded(&dir));
        // A supervisor that gave up at the handshake is forgotten: the spec alone is left.
        forget_supervisor(&dir).expect("forget");
        assert_eq!(read_supervision(&dir).expect("read"), None);
        assert!(!supervisor_recorded(&dir) && !child_recorded(&dir));
        assert_eq!(read_spec(&dir).expect("read"), Some(spec(7)));
        // In the spec: unreadable, and so is an empty file (a power cut before its data
        // reached the disk).
        cut(&dir, 0, 20);
        let error = read_spec(&dir).expect_err("torn spec");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        fs::write(dir.join(ATTEMPT), b"").expect("empty");
        assert!(read_spec(&dir).is_err());
        assert!(!supervisor_recorded(&dir) && !child_recorded(&dir));
        // A record that cannot be read before the supervisor's may have been it.
        fs::write(dir.join(ATTEMPT), b"{}\n\0\0\0\n").expect("zeros");
        assert!(read_supervision(&dir).is_err());
        assert!(supervisor_recorded(&dir) && child_recorded(&dir));
        // Nor can a step's record come before its supervisor's.
        fs::write(
            dir.join(ATTEMPT),
            b"{}\n{\"child\":{\"pid\":1,\"start_ticks\":2}}\n",
        )
        .expect("out of order");
        assert!(read_supervision(&dir).is_err());
    }

    #[test]
    fn a_file_larger_than_any_build_writes_is_refused_unread() {
        let (_root, dir) = attempt();
        let large = crate::limits::ATTEMPT_FILE_MAX_BYTES as usize + 1;
        fs::write(dir.join(ATTEMPT), vec![b' '; large]).expect("large");
        let error = read_spec(&dir).expect_err("too large");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(error.to_string().contains(ATTEMPT), "{error}");
        assert!(supervisor_recorded(&dir) && child_recorded(&dir));
    }

    #[test]
    fn the_files_of_a_supervisor_from_an_older_build_are_still_read() {
        let (_root, dir) = attempt();
        // The spec record is the whole of an older build's `spec.json`.
        write_spec(&dir, &spec(8)).expect("spec");
        fs::rename(dir.join(ATTEMPT), dir.join(LEGACY_SPEC)).expect("rename");
        assert_eq!(read_spec(&dir).expect("read"), Some(spec(8)));
        // They wrote pretty JSON to `supervisor.json` and, earlier, the step to
        // `child.json`.
        write_json(&dir, LEGACY_SUPERVISOR, &identity(20), false).expect("old supervisor");
        let alone = read_supervision(&dir).expect("read").expect("recorded");
        assert_eq!((alone.supervisor, alone.child), (identity(20), None));
        assert!(supervisor_recorded(&dir));
        assert!(!child_recorded(&dir));
        write_json(&dir, LEGACY_CHILD, &identity(21), false).expect("old child");
        let both = read_supervision(&dir).expect("read").expect("recorded");
        assert_eq!(
            (both.supervisor, both.child),
            (identity(20), Some(identity(21)))
        );
        assert!(child_recorded(&dir));
        // The build before this one appended the step's record to `supervisor.json`, and
        // this one writes that layout where the spec is in `spec.json`.
        fs::remove_file(dir.join(LEGACY_CHILD)).expect("remove");
        assert_eq!(Layout::of(&dir), Layout::Legacy);
        write_supervisor(&dir, Layout::Legacy, &identity(20)).expect("supervisor");
        append_child(&dir, Layout::Legacy, &identity(22)).expect("child");
        assert!(
            !dir.join(ATTEMPT).exists(),
            "nothing of this build's layout"
        );
        let appended = read_supervision(&dir).expect("read").expect("recorded");
        assert_eq!(appended.child, Some(identity(22)));
        assert!(child_recorded(&dir));
        // Their verdict, and one torn by a power cut.
        assert!(!verdict_recorded(&dir));
        write_verdict(&dir, Layout::Legacy, &verdict()).expect("verdict");
        assert!(dir.join(LEGACY_VERDICT).exists());
        assert_eq!(read_verdict(&dir).expect("read"), Some(verdict()));
        fs::write(dir.join(LEGACY_VERDICT), b"{\"outcome\":").expect("torn");
        assert_eq!(
            read_verdict(&dir).expect_err("torn").kind(),
            io::ErrorKind::InvalidData
        );
        assert!(
            verdict_recorded(&dir),
            "a torn verdict is not a missing one"
        );
        // A supervisor that gave up at the handshake is forgotten in that layout too.
        forget_supervisor(&dir).expect("forget");
        assert!(!dir.join(LEGACY_SUPERVISOR).exists());
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

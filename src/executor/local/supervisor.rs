//! `scarab supervise DIR`: the small process that owns one local attempt.
//!
//! It runs detached from the service (its own session), so it outlives a crash or restart
//! of it. It owns the kill-timer (a hung step dies at its timeout even while the service
//! is down), captures the step's output, and writes the verdict atomically into the
//! attempt directory. It classifies exactly as docs/failure-classes.md says for local steps.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use super::confine::{ConfineError, Confinement};
use super::files::{self, ProcessIdentity, Spec};
use super::mask::Masker;
use crate::engine::{FailureClass, KillReason, Outcome, Timestamp, Verdict};

#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("attempt directory {dir}: {source}")]
    Io {
        dir: String,
        #[source]
        source: io::Error,
    },
    #[error("attempt directory {0} has no spec.json")]
    NoSpec(String),
}

enum Event {
    Exited(ExitStatus),
    Signalled,
    /// The launch handshake's answer: the go (with the step's secrets), or `None` for end
    /// of file.
    Go(Option<Go>),
}

/// Runs the attempt in `dir` to its verdict, with the launch handshake on stdin. Returns
/// once `verdict.json` is written (or when another supervisor already finished this
/// attempt).
pub fn supervise(dir: &Path) -> Result<(), SuperviseError> {
    let handshake =
        io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| SuperviseError::Io {
                dir: dir.display().to_string(),
                source,
            })?;
    supervise_confined(dir, None, handshake).map(|_| ())
}

/// How a supervision ended, for a zygote's supervisor deciding whether to take another
/// attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// Nothing of the attempt is left in this process: no thread, no descriptor.
    Clean,
    /// Something of it may be (output still draining from a process that left the step's
    /// group, a step it lost track of), or the service is gone: this process must end.
    Exit,
}

/// `supervise`, with the step's confinement already built (by the zygote) or `None` to
/// build it here, and `handshake` the service's launch handshake (read for the go). The
/// handshake is closed only once the verdict is written and the attempt's lock released,
/// so a service holding the other end of a socket sees end of file exactly when the
/// attempt is over, whether or not this process goes on.
pub fn supervise_confined(
    dir: &Path,
    confinement: Option<Result<Confinement, ConfineError>>,
    handshake: std::os::fd::OwnedFd,
) -> Result<Ending, SuperviseError> {
    let io_error = |source| SuperviseError::Io {
        dir: dir.display().to_string(),
        source,
    };
    // Its own session: it survives the service, and no terminal signal reaches it. Done
    // here rather than by the spawner, so the service can spawn without a fork hook
    // (posix_spawn). It fails only if this process already leads a group, which a
    // process spawned plainly never does (and a zygote's supervisor did it at its first
    // attempt).
    let _ = rustix::process::setsid();
    let lock = files::open_lock(dir).map_err(io_error)?;
    // Blocking: a service probing liveness holds a shared lock for an instant.
    rustix::fs::flock(lock.as_fd(), rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| io_error(e.into()))?;
    if dir.join(files::VERDICT).exists() {
        return Ok(Ending::Clean);
    }
    // A marker left by an earlier supervisor that gave up at the handshake is stale now
    // that this one owns the attempt.
    match std::fs::remove_file(dir.join(files::ABORTED)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(e)),
    }
    let spec: Spec = files::read_spec(dir)
        .map_err(io_error)?
        .ok_or_else(|| SuperviseError::NoSpec(dir.display().to_string()))?;
    let mut ending = Ending::Clean;
    let Some(verdict) =
        run_attempt(dir, &spec, confinement, &handshake, &mut ending).map_err(io_error)?
    else {
        return Ok(Ending::Exit);
    };
    // Atomic but not fsynced: the service commits the verdict durably to the store. A
    // power cut before that commit loses the file and the attempt is then reported
    // `lost`: conservative, never a second run under this fence.
    write_verdict_patiently(dir, &verdict).map_err(io_error)?;
    drop(lock);
    drop(handshake);
    Ok(ending)
}

/// Writes the verdict, waiting out a full disk (the service frees its reserve when it hits
/// one) for up to `limits::VERDICT_WRITE_PATIENCE`: the step has ended, and a verdict on
/// disk is worth more than a `lost`.
fn write_verdict_patiently(dir: &Path, verdict: &Verdict) -> io::Result<()> {
    let deadline = Instant::now() + crate::limits::VERDICT_WRITE_PATIENCE;
    loop {
        match files::write_verdict(dir, verdict) {
            Err(error)
                if matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// `Ok(None)`: the launch was never recorded, so nothing ran and no verdict is written;
/// the attempt directory is left looking fresh, so the next service relaunches this fence.
///
/// `ending` becomes `Ending::Exit` when something of the attempt may outlive this call.
fn run_attempt(
    dir: &Path,
    spec: &Spec,
    confinement: Option<Result<Confinement, ConfineError>>,
    handshake: &std::os::fd::OwnedFd,
    ending: &mut Ending,
) -> io::Result<Option<Verdict>> {
    if dir.join(files::SUPERVISOR).exists() {
        // A supervisor of this fence ran before and died without a verdict: its step may
        // have run. Never start it again under the same fence.
        return Ok(Some(never_ran_verdict(
            Outcome::Failed(FailureClass::Lost),
            "an earlier supervisor of this attempt died without a verdict",
            true,
        )));
    }
    if let Some(reason) = files::read_kill(dir)? {
        return Ok(Some(never_ran_verdict(
            stop_outcome(reason),
            "stopped before it started",
            false,
        )));
    }
    // Signals first: a stop request must never kill the supervisor itself.
    let (events_tx, events) = mpsc::channel();
    // Ends (and is joined) when this function returns, whichever way.
    let _listener = listen(events_tx.clone(), handshake.try_clone()?)?;
    let me = ProcessIdentity::of(std::process::id() as i32)
        .ok_or_else(|| io::Error::other("cannot read this process's own start time"))?;
    // Not fsynced: what makes a relaunch safe after a power cut is the store, not this
    // file. The step starts only once the service has durably recorded the launch as
    // confirmed (below), and the store never relaunches a confirmed attempt.
    if let Err(error) = files::write_supervisor(dir, &me) {
        // Before the go, so the step has not started: a full disk here is a step that
        // never started (retried), not a supervisor gone without a verdict (`lost`). The
        // verdict is written patiently, as every verdict is.
        return Ok(Some(never_ran_verdict(
            Outcome::Failed(FailureClass::InfraNeverStarted),
            &format!("cannot record the supervisor in the attempt directory: {error}"),
            false,
        )));
    }
    // Built while the service records the launch (it needs nothing the go brings): the
    // step's start then waits only for the fork. Judged after the go, as before.
    let confinement = confinement.unwrap_or_else(|| {
        protected_paths(
            dir,
            std::env::var(super::confine::PROTECT_VAR).ok().as_deref(),
        )
        .and_then(|paths| Confinement::build(&paths))
    });
    let go = match wait_for_go(dir, &events)? {
        Handshake::Go(go) => go,
        Handshake::Stop(reason) => {
            return Ok(Some(never_ran_verdict(
                stop_outcome(reason),
                "stopped before it started",
                false,
            )));
        }
        Handshake::ServiceGone => {
            files::write_atomic(dir, files::ABORTED, b"", false)?;
            std::fs::remove_file(dir.join(files::SUPERVISOR))?;
            return Ok(None);
        }
    };

    let Some(local) = spec.local().filter(|l| !l.argv.is_empty()) else {
        let reason = "not a local command: this attempt belongs to another executor";
        return Ok(Some(never_ran_verdict(
            Outcome::Failed(FailureClass::Config),
            reason,
            false,
        )));
    };
    if let Some(workdir) = local.workdir
        && !Path::new(workdir).is_dir()
    {
        let reason = format!("working directory {workdir:?} does not exist or is not a directory");
        return Ok(Some(never_ran_verdict(
            Outcome::Failed(FailureClass::Config),
            &reason,
            false,
        )));
    }
    // Every secret the step references, or it does not start: running it with a variable
    // missing could do the wrong thing quietly.
    let given: Vec<&str> = go
        .env
        .iter()
        .map(|(variable, _)| variable.as_str())
        .collect();
    if let Some((variable, problem)) = go.missing.first().cloned().or_else(|| {
        local
            .secrets
            .iter()
            .find(|(variable, _)| !given.contains(&variable.as_str()))
            .map(|(variable, name)| (variable.clone(), format!("secret {name:?} was not given")))
    }) {
        let reason = format!("env.{variable}: {problem}");
        return Ok(Some(never_ran_verdict(
            Outcome::Failed(FailureClass::Config),
            &reason,
            false,
        )));
    }
    // Built before the fork: the child only applies it (see `confine`).
    let confinement = match confinement {
        Ok(confinement) => confinement,
        Err(error) => {
            let reason = format!("cannot confine the step: {error}");
            return Ok(Some(never_ran_verdict(
                Outcome::Failed(FailureClass::InfraNeverStarted),
                &reason,
                false,
            )));
        }
    };
    let masker = || Masker::new(go.env.iter().map(|(_, value)| value.as_bytes()));
    let started_at = now();
    let spawned = spawn_confined(command(spec, &local, &go.env), confinement, events_tx);
    let started = match spawned {
        Ok(child) => child,
        Err(Spawn::Confine(error)) => {
            let reason = format!("cannot confine the step: {error}");
            return Ok(Some(never_ran_verdict(
                Outcome::Failed(FailureClass::InfraNeverStarted),
                &reason,
                false,
            )));
        }
        Err(Spawn::Exec(error)) => {
            let (class, reason) = classify_spawn_error(&error, &local.argv[0]);
            return Ok(Some(never_ran_verdict(
                Outcome::Failed(class),
                &reason,
                false,
            )));
        }
    };
    let Started {
        pid,
        stdout,
        stderr,
        thread,
    } = started;
    let (copied_tx, copied) = mpsc::channel();
    let mut streams = Vec::with_capacity(2);
    if let Some(out) = stdout {
        streams.push(Stream::new(out.into(), dir.join(files::STDOUT), masker()));
    }
    if let Some(err) = stderr {
        streams.push(Stream::new(err.into(), dir.join(files::STDERR), masker()));
    }
    capture(streams, copied_tx);
    // What lets a later service stop this step if this supervisor dies. A full disk must
    // not end the supervision of a step that already runs (returning here would orphan
    // it): without the record, this supervisor still stops the step's group at its end.
    if let Some(identity) = ProcessIdentity::of(pid) {
        let _ = files::append_child(dir, &identity);
    }
    let ended = wait_for_end(dir, spec, pid, &events);
    if ended.is_err() {
        // Whatever went wrong, nothing of this attempt may outlive its supervisor.
        signal_group(pid, Signal::KILL);
    }
    let (status, stopped_for) = ended?;
    // Leftovers of the step (its background children) die with it: a retry must never
    // overlap anything of this attempt.
    signal_group(pid, Signal::KILL);
    // The output's last bytes reach the log before the verdict. A process that left the
    // step's group and still holds a pipe is not waited for beyond a bound; the thread
    // copying it then goes on, so this process must not take another attempt.
    if copied.recv_timeout(OUTPUT_DRAIN).is_err() {
        *ending = Ending::Exit;
    }
    // The spawning thread's last act was to send the step's exit status.
    if thread.join().is_err() {
        *ending = Ending::Exit;
    }
    Ok(Some(classify_exit(status, stopped_for, spec, started_at)))
}

/// The launch handshake: the service writes one byte to our stdin once its store holds
/// the launch as confirmed. End of file (the service died or stopped first) means the
/// launch was never recorded, so the step must not start.
fn wait_for_go(dir: &Path, events: &mpsc::Receiver<Event>) -> io::Result<Handshake> {
    let go = loop {
        match events.recv() {
            Ok(Event::Go(Some(go))) => break go,
            Ok(Event::Go(None)) | Err(_) => return Ok(Handshake::ServiceGone),
            // A stop request while waiting: the step never starts.
            Ok(Event::Signalled) => {
                if let Some(reason) = files::read_kill(dir)? {
                    return Ok(Handshake::Stop(reason));
                }
            }
            Ok(Event::Exited(_)) => {}
        }
    };
    // A stop written just before the go byte.
    match files::read_kill(dir)? {
        Some(reason) => Ok(Handshake::Stop(reason)),
        None => Ok(Handshake::Go(go)),
    }
}

enum Handshake {
    Go(Go),
    Stop(KillReason),
    ServiceGone,
}

/// The byte the service sends when the launch is durable.
pub const GO: u8 = b'g';

/// The go of the launch handshake: the go byte, then one line of JSON with the values of
/// the secrets the step references (and which of them the service could not give). A
/// go byte and an empty line (or end of file) is a go without secrets.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Go {
    /// (variable, value).
    pub env: Vec<(String, String)>,
    /// (variable, why its secret cannot be given).
    pub missing: Vec<(String, String)>,
}

impl Go {
    /// The most a go line may hold: every variable at the largest secret value.
    const MAX_BYTES: u64 =
        (crate::limits::ENV_MAX_VARS * (crate::limits::SECRET_VALUE_MAX_BYTES * 6 + 256)) as u64;

    /// The values of `secrets` (variable, secret name) as the service has them now.
    pub fn resolve(secrets: &[(String, String)], from: &crate::secrets::Secrets) -> Go {
        let mut go = Go::default();
        for (variable, name) in secrets {
            match from.get(name) {
                Ok(value) => go.env.push((variable.clone(), value.to_owned())),
                Err(problem) => go.missing.push((variable.clone(), problem.to_string())),
            }
        }
        go
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = vec![GO];
        if !self.env.is_empty() || !self.missing.is_empty() {
            // JSON escapes every newline inside strings: the line is the whole message.
            bytes.extend(serde_json::to_vec(self).unwrap_or_default());
        }
        // Always ended: a zygote's supervisor reads the go from a socket the service keeps
        // open (to see the attempt end), so end of file cannot end the line.
        bytes.push(b'\n');
        bytes
    }

    /// Reads a go; `None` at end of file before the go byte, or for anything else.
    fn read(input: &mut impl io::BufRead) -> Option<Go> {
        use std::io::{BufRead, Read};
        let mut byte = [0u8; 1];
        if !matches!(input.read(&mut byte), Ok(1) if byte[0] == GO) {
            return None;
        }
        let mut line = Vec::new();
        match input.take(Self::MAX_BYTES).read_until(b'\n', &mut line) {
            Ok(_) if line.trim_ascii().is_empty() => Some(Go::default()),
            Ok(_) => serde_json::from_slice(line.trim_ascii_end()).ok(),
            Err(_) => None,
        }
    }
}

/// How long the supervisor waits, once the step's group is gone, for the last of its
/// output to reach the log.
const OUTPUT_DRAIN: Duration = Duration::from_secs(5);

/// What the step must not reach: the state dir (the attempt directory's grandparent) and
/// what the service names besides it (`list`, as `confine::PROTECT_VAR` holds it: the
/// config file, the secrets dir, token files).
pub fn protected_paths(dir: &Path, list: Option<&str>) -> Result<Vec<PathBuf>, ConfineError> {
    let mut paths = match list {
        Some(list) => super::confine::decode_protected(list)?,
        None => Vec::new(),
    };
    if let Some(state) = dir.parent().and_then(Path::parent) {
        paths.push(state.to_path_buf());
    }
    Ok(paths)
}

fn command(spec: &Spec, local: &files::LocalCommand, secrets: &[(String, String)]) -> Command {
    let mut command = Command::new(&local.argv[0]);
    command
        .args(&local.argv[1..])
        .stdin(Stdio::null())
        // Pipes this supervisor holds: the step never gets a path or a descriptor of its
        // log files, and what it writes is masked on the way (`capture`).
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("SCARAB_RUN_ID", spec.launch.run.to_string())
        .env("SCARAB_STEP", &spec.launch.step_name)
        .env("SCARAB_ATTEMPT", spec.launch.attempt.to_string())
        .env("SCARAB_FENCE", spec.launch.fence.0.to_string())
        .envs(local.env.iter().map(|(k, v)| (k, v)))
        .envs(secrets.iter().map(|(k, v)| (k, v)))
        .env_remove(crate::service::STEP_UMASK_VAR)
        .env_remove(super::confine::PROTECT_VAR)
        // Its own process group, so the whole step can be stopped at once.
        .process_group(0);
    if let Some(workdir) = local.workdir {
        command.current_dir(workdir);
    }
    command
}

/// Why a step could not be started.
enum Spawn {
    /// Its umask or its confinement could not be put in place.
    Confine(io::Error),
    /// Spawning it failed (see `classify_spawn_error`).
    Exec(io::Error),
}

/// The step once spawned: its pid, the supervisor's ends of its output pipes, and the
/// thread that waits for it.
struct Started {
    pid: i32,
    stdout: Option<std::process::ChildStdout>,
    stderr: Option<std::process::ChildStderr>,
    thread: std::thread::JoinHandle<()>,
}

/// Spawns the step from a thread of its own that first takes on what the step must
/// inherit: the umask the service was started with (Scarab's own files are private, umask
/// 077, see `service::private_files`) in a filesystem context of its own, and the
/// Landlock confinement, which binds the calling thread and what it starts, never the
/// rest of this supervisor. With no hook to run between fork and exec, the standard
/// library starts the step with `posix_spawn` (a vfork: no copy of this process's memory
/// to make and tear down again), where it can. The thread then waits for the step and
/// sends its exit status to `exited`.
fn spawn_confined(
    mut command: Command,
    confinement: Confinement,
    exited: mpsc::Sender<Event>,
) -> Result<Started, Spawn> {
    let mask = std::env::var(crate::service::STEP_UMASK_VAR)
        .ok()
        .and_then(|m| u32::from_str_radix(&m, 8).ok())
        .filter(|m| *m <= 0o777)
        .map(rustix::fs::Mode::from_bits_truncate);
    let (started_tx, started) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        let spawned = (|| {
            if let Some(mask) = mask {
                // SAFETY: a plain system call; it gives this thread its own copy of the
                // process's filesystem context (cwd, root, umask).
                if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
                    return Err(Spawn::Confine(io::Error::last_os_error()));
                }
                rustix::process::umask(mask);
            }
            confinement.apply().map_err(Spawn::Confine)?;
            command.spawn().map_err(Spawn::Exec)
        })();
        let mut child = match spawned {
            Ok(child) => child,
            Err(failure) => {
                let _ = started_tx.send(Err(failure));
                return;
            }
        };
        let _ = started_tx.send(Ok((
            child.id() as i32,
            child.stdout.take(),
            child.stderr.take(),
        )));
        if let Ok(status) = child.wait() {
            let _ = exited.send(Event::Exited(status));
        }
    });
    match started.recv() {
        Ok(Ok((pid, stdout, stderr))) => Ok(Started {
            pid,
            stdout,
            stderr,
            thread,
        }),
        Ok(Err(failure)) => {
            let _ = thread.join();
            Err(failure)
        }
        Err(_) => Err(Spawn::Confine(io::Error::other(
            "the spawning thread ended early",
        ))),
    }
}

/// One of the step's output pipes, the log file it goes to, and its masker.
struct Stream {
    from: std::os::fd::OwnedFd,
    /// The log file, created at the first byte to write (a step that prints nothing
    /// leaves none: the logs endpoint reads a missing log as empty).
    path: PathBuf,
    to: Option<File>,
    masker: Masker,
    /// A log that cannot be written (a full disk) is cut there: the pipe is still
    /// drained so the step never blocks on it, and a marker says where, if it fits.
    cut: Option<io::Error>,
}

impl Stream {
    fn new(from: std::os::fd::OwnedFd, path: PathBuf, masker: Masker) -> Stream {
        Stream {
            from,
            path,
            to: None,
            masker,
            cut: None,
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        let masked = self.masker.push(bytes);
        if self.cut.is_none()
            && let Err(error) = self.append(&masked)
        {
            self.cut = Some(error);
        }
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        if bytes.is_empty() {
            return Ok(());
        }
        let to = match &mut self.to {
            Some(to) => to,
            None => self.to.insert(append(&self.path)?),
        };
        to.write_all(bytes)
    }

    /// The masker's held-back tail, or the marker of where the log was cut.
    fn finish(mut self) {
        let tail = self.masker.finish();
        let _ = match self.cut.take() {
            None => self.append(&tail),
            Some(error) => {
                let marker =
                    format!("\n[scarab: output cut here, the log could not be written: {error}]\n");
                self.append(marker.as_bytes())
            }
        };
    }
}

/// Copies the step's output pipes into their log files from one thread, masking secret
/// values. Signals `done` once every stream has ended.
fn capture(mut streams: Vec<Stream>, done: mpsc::Sender<()>) {
    use rustix::event::{PollFd, PollFlags};
    std::thread::spawn(move || {
        // Not zeroed: the pages are touched only as output arrives, and a step that prints
        // nothing costs none.
        let mut buffer: Vec<u8> = Vec::with_capacity(64 * 1024);
        while !streams.is_empty() {
            let mut ready: Vec<PollFd> = streams
                .iter()
                .map(|stream| PollFd::new(&stream.from, PollFlags::IN))
                .collect();
            match rustix::event::poll(&mut ready, None) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => break,
            }
            let readable: Vec<bool> = ready.iter().map(|r| !r.revents().is_empty()).collect();
            drop(ready);
            let mut ended = Vec::new();
            for (index, stream) in streams.iter_mut().enumerate() {
                if !readable[index] {
                    continue;
                }
                match rustix::io::read(&stream.from, buffer.spare_capacity_mut()) {
                    Ok(([], _)) => ended.push(index),
                    Ok((read, _)) => stream.write(read),
                    Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                    Err(_) => ended.push(index),
                }
            }
            for index in ended.into_iter().rev() {
                streams.remove(index).finish();
            }
        }
        for stream in streams {
            stream.finish();
        }
        let _ = done.send(());
    });
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Waits for the step to exit, stopping it at its timeout or at Scarab's request.
/// Returns its exit status and why Scarab stopped it, if it did.
fn wait_for_end(
    dir: &Path,
    spec: &Spec,
    pid: i32,
    events: &mpsc::Receiver<Event>,
) -> io::Result<(ExitStatus, Option<KillReason>)> {
    let deadline = Instant::now() + Duration::from_millis(spec.launch.timeout_ms);
    let grace = Duration::from_millis(spec.kill_grace_ms);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(Event::Exited(status)) => return Ok((status, None)),
            Ok(Event::Go(_)) => {}
            Ok(Event::Signalled) => {
                // The service asks by writing kill.json first; a bare signal (a stray
                // `kill`, a terminal hang-up) is not a stop request.
                if let Some(reason) = files::read_kill(dir)? {
                    return Ok((stop(pid, grace, events)?, Some(reason)));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Ok((stop(pid, grace, events)?, Some(KillReason::Timeout)));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(io::Error::other("lost track of the step process"));
            }
        }
    }
}

/// SIGTERM to the step's group, SIGKILL after the grace period; waits for the exit.
fn stop(pid: i32, grace: Duration, events: &mpsc::Receiver<Event>) -> io::Result<ExitStatus> {
    signal_group(pid, Signal::TERM);
    let deadline = Instant::now() + grace;
    let mut killed = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let wait = if killed {
            Duration::from_secs(3600)
        } else {
            left
        };
        match events.recv_timeout(wait) {
            Ok(Event::Exited(status)) => return Ok(status),
            Ok(Event::Signalled | Event::Go(_)) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                signal_group(pid, Signal::KILL);
                killed = true;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(io::Error::other("lost track of the step process"));
            }
        }
    }
}

/// The supervisor's listening thread for one attempt: the launch handshake's answer (one
/// `Event::Go`), and stop requests (SIGTERM, SIGINT, SIGHUP, through a self-pipe) as
/// `Event::Signalled`. A stop request must never kill the supervisor itself. The thread
/// ends, and is joined, when the returned `Listener` is dropped.
fn listen(events: mpsc::Sender<Event>, handshake: std::os::fd::OwnedFd) -> io::Result<Listener> {
    use rustix::event::{PollFd, PollFlags};
    use std::io::Read;
    let signals = signal_pipe()?;
    let (quit, quit_tx) = io::pipe()?;
    let thread = std::thread::spawn(move || {
        let mut handshake = Some(io::BufReader::new(File::from(handshake)));
        loop {
            let (signalled, answered, quitting) = {
                let mut ready = vec![
                    PollFd::new(signals, PollFlags::IN),
                    PollFd::new(&quit, PollFlags::IN),
                ];
                if let Some(handshake) = &handshake {
                    ready.push(PollFd::new(handshake.get_ref(), PollFlags::IN));
                }
                match rustix::event::poll(&mut ready, None) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(_) => return,
                }
                let seen = |i: usize| ready.get(i).is_some_and(|r| !r.revents().is_empty());
                (seen(0), seen(2), seen(1))
            };
            if quitting {
                return;
            }
            if signalled {
                let mut bytes = [0u8; 64];
                while matches!((&*signals).read(&mut bytes), Ok(n) if n > 0) {}
                if events.send(Event::Signalled).is_err() {
                    return;
                }
            }
            if answered
                && let Some(mut reader) = handshake.take()
                && events.send(Event::Go(Go::read(&mut reader))).is_err()
            {
                return;
            }
        }
    });
    Ok(Listener {
        quit: Some(quit_tx),
        thread: Some(thread),
    })
}

/// The listening thread of one attempt; dropping this ends and joins it.
struct Listener {
    quit: Option<io::PipeWriter>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Closing the write end wakes the thread's poll.
        self.quit.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The read end of the self-pipe that SIGTERM, SIGINT and SIGHUP write to, registered
/// once per process (a zygote's supervisor serves many attempts). A signal meant for an
/// earlier attempt may reach a later one's listener: it is a stop request only if the
/// attempt directory holds one, so it is ignored there.
fn signal_pipe() -> io::Result<&'static std::os::unix::net::UnixStream> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    static SIGNALS: std::sync::OnceLock<std::os::unix::net::UnixStream> =
        std::sync::OnceLock::new();
    if let Some(signals) = SIGNALS.get() {
        return Ok(signals);
    }
    let (signals, pipe) = std::os::unix::net::UnixStream::pair()?;
    signals.set_nonblocking(true)?;
    pipe.set_nonblocking(true)?;
    for signal in [SIGTERM, SIGINT, SIGHUP] {
        signal_hook::low_level::pipe::register(signal, pipe.try_clone()?)?;
    }
    Ok(SIGNALS.get_or_init(|| signals))
}

fn classify_exit(
    status: ExitStatus,
    stopped_for: Option<KillReason>,
    spec: &Spec,
    started_at: Timestamp,
) -> Verdict {
    let exit_code = status.code();
    let (outcome, reason) = match (stopped_for, exit_code, status.signal()) {
        (Some(KillReason::Timeout), _, _) => (
            Outcome::Failed(FailureClass::Timeout),
            format!(
                "TimedOut: killed after its timeout of {}",
                humantime::format_duration(Duration::from_millis(spec.launch.timeout_ms))
            ),
        ),
        (Some(KillReason::Cancel), _, _) => {
            (Outcome::Stopped, "stopped: run cancelled".to_string())
        }
        (Some(KillReason::Budget), _, _) => (
            Outcome::Stopped,
            "stopped: the run's budget ran out".to_string(),
        ),
        (None, Some(0), _) => (Outcome::Succeeded, "exit code 0".to_string()),
        (None, Some(code), _) => (
            Outcome::Failed(FailureClass::Step),
            format!("exit code {code}"),
        ),
        (None, None, Some(signal)) => (
            Outcome::Failed(FailureClass::InfraPostStart),
            format!(
                "killed by signal {} ({signal}), not sent by Scarab",
                signal_name(signal)
            ),
        ),
        (None, None, None) => (
            Outcome::Failed(FailureClass::Lost),
            "exit status unknown".to_string(),
        ),
    };
    Verdict {
        outcome,
        started: true,
        reason,
        exit_code,
        started_at: Some(started_at),
        finished_at: now(),
    }
}

fn stop_outcome(reason: KillReason) -> Outcome {
    match reason {
        KillReason::Cancel | KillReason::Budget => Outcome::Stopped,
        KillReason::Timeout => Outcome::Failed(FailureClass::Timeout),
    }
}

/// Spawn errors, by errno: what can never work as written is `config`; what the kernel
/// may grant next time is `infra_never_started`.
pub fn classify_spawn_error(error: &io::Error, program: &str) -> (FailureClass, String) {
    use rustix::io::Errno;
    let errno = error.raw_os_error().map(Errno::from_raw_os_error);
    let config = |what: &str| {
        (
            FailureClass::Config,
            format!("{program:?}: {what} ({error})"),
        )
    };
    if error.kind() == io::ErrorKind::InvalidInput {
        // Refused before exec: an argument or an environment value the kernel cannot
        // take (a NUL byte). Nothing transient about it.
        return config("the command or its environment cannot be passed to exec");
    }
    match errno {
        Some(Errno::NOENT) => config("executable not found"),
        Some(Errno::ACCESS | Errno::PERM) => config("not executable or not permitted"),
        Some(Errno::NOEXEC) => config("not an executable format"),
        Some(Errno::ISDIR | Errno::NOTDIR) => config("not an executable file"),
        Some(Errno::TOOBIG | Errno::NAMETOOLONG | Errno::LOOP) => {
            config("cannot be executed as written")
        }
        _ => (
            FailureClass::InfraNeverStarted,
            format!("{program:?}: spawn failed transiently ({error})"),
        ),
    }
}

fn never_ran_verdict(outcome: Outcome, reason: &str, started: bool) -> Verdict {
    Verdict {
        outcome,
        started,
        reason: crate::limits::clip(reason, crate::limits::REASON_MAX_BYTES),
        exit_code: None,
        started_at: None,
        finished_at: now(),
    }
}

/// Signals the step's process group (its pgid is its pid). Errors mean it is gone.
fn signal_group(pid: i32, signal: Signal) {
    if let Some(group) = Pid::from_raw(pid).filter(|p| !p.is_init()) {
        let _ = rustix::process::kill_process_group(group, signal);
    }
}

pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGQUIT => "SIGQUIT",
        _ => "signal",
    }
}

fn now() -> Timestamp {
    crate::clock::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_errors_that_can_never_work_are_config() {
        let class = |error: io::Error| classify_spawn_error(&error, "tool").0;
        // What std refuses before exec: a NUL byte in an argument or the environment.
        let nul = std::process::Command::new("true")
            .env("A", "x\0y")
            .spawn()
            .expect_err("a NUL byte in the environment");
        assert_eq!(class(nul), FailureClass::Config);
        assert_eq!(
            class(io::Error::from_raw_os_error(libc::ENOENT)),
            FailureClass::Config
        );
        assert_eq!(
            class(io::Error::from_raw_os_error(libc::E2BIG)),
            FailureClass::Config
        );
        assert_eq!(
            class(io::Error::from_raw_os_error(libc::ETXTBSY)),
            FailureClass::InfraNeverStarted
        );
        assert_eq!(
            class(io::Error::from_raw_os_error(libc::EAGAIN)),
            FailureClass::InfraNeverStarted
        );
    }
}

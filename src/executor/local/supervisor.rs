//! `scarab supervise DIR`: the small process that owns one local attempt.
//!
//! It runs detached from the service (its own session), so it outlives a crash or restart
//! of it. It owns the kill-timer (a hung step dies at its timeout even while the service
//! is down), captures the step's output, and writes the verdict atomically into the
//! attempt directory. It classifies exactly as docs/failure-classes.md says for local steps.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use super::confine::{ConfineError, Confinement};
use super::files::{self, ProcessIdentity, Spec};
use super::mask::Masker;
use super::spawn::{self, Step};
use crate::engine::{FailureClass, KillReason, Outcome, Timestamp, Verdict};

#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("attempt directory {dir}: {source}")]
    Io {
        dir: String,
        #[source]
        source: io::Error,
    },
    #[error("attempt directory {0} has no spec")]
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
/// once its verdict is recorded (or when another supervisor already finished this
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
    // One read of the attempt's records answers the checks below.
    let taken = files::Taken::read(dir);
    if taken.verdict_recorded(dir) {
        return Ok(Ending::Clean);
    }
    // A marker left by an earlier supervisor that gave up at the handshake is stale now
    // that this one owns the attempt.
    files::remove_aborted(dir).map_err(io_error)?;
    // An attempt an older service launched keeps that build's files: during an upgrade
    // that service may still be the one that reads them.
    let layout = taken.layout(dir);
    let supervised_before = taken.supervisor_recorded(dir);
    let spec: Spec = taken
        .spec(dir)
        .map_err(io_error)?
        .ok_or_else(|| SuperviseError::NoSpec(dir.display().to_string()))?;
    let mut ending = Ending::Clean;
    let Some(verdict) = run_attempt(
        dir,
        layout,
        &spec,
        supervised_before,
        confinement,
        &handshake,
        &mut ending,
    )
    .map_err(io_error)?
    else {
        return Ok(Ending::Exit);
    };
    // Atomic but not fsynced: the service commits the verdict durably to the store. A
    // power cut before that commit loses the file and the attempt is then reported
    // `lost`: conservative, never a second run under this fence.
    write_verdict_patiently(dir, layout, &verdict).map_err(io_error)?;
    drop(lock);
    drop(handshake);
    Ok(ending)
}

/// Writes the verdict, waiting out a full disk (the service frees its reserve when it hits
/// one) for up to `limits::VERDICT_WRITE_PATIENCE`: the step has ended, and a verdict on
/// disk is worth more than a `lost`.
fn write_verdict_patiently(dir: &Path, layout: files::Layout, verdict: &Verdict) -> io::Result<()> {
    let deadline = Instant::now() + crate::limits::VERDICT_WRITE_PATIENCE;
    loop {
        match files::write_verdict(dir, layout, verdict) {
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
/// `supervised_before`: the attempt's records say a supervisor took it before this one.
/// `ending` becomes `Ending::Exit` when something of the attempt may outlive this call.
fn run_attempt(
    dir: &Path,
    layout: files::Layout,
    spec: &Spec,
    supervised_before: bool,
    confinement: Option<Result<Confinement, ConfineError>>,
    handshake: &std::os::fd::OwnedFd,
    ending: &mut Ending,
) -> io::Result<Option<Verdict>> {
    if supervised_before {
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
    let mut watch = Watch::new(File::from(handshake.try_clone()?))?;
    let me = ProcessIdentity::own()
        .ok_or_else(|| io::Error::other("cannot read this process's own start time"))?;
    // Not fsynced: what makes a relaunch safe after a power cut is the store, not this
    // file. The step starts only once the service has durably recorded the launch as
    // confirmed (below), and the store never relaunches a confirmed attempt.
    if let Err(error) = files::write_supervisor(dir, layout, &me) {
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
    let go = match wait_for_go(dir, &mut watch)? {
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
            files::forget_supervisor(dir)?;
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
    let env = environment(spec, &local, &go.env);
    let spawned = spawn::start(&spawn::Request {
        argv: local.argv,
        env: &env,
        workdir: local.workdir.map(Path::new),
        umask: mask_for_steps(),
        confinement: Some(&confinement),
    });
    drop(confinement);
    let mut child = match spawned {
        Ok(child) => child,
        Err(failure) => {
            let (class, reason) = judged(&failure, &local.argv[0]);
            return Ok(Some(never_ran_verdict(
                Outcome::Failed(class),
                &reason,
                false,
            )));
        }
    };
    let pid = child.pid();
    // Pipes this supervisor holds: the step never gets a path or a descriptor of its log
    // files, and what it writes is masked on the way.
    if let Some(out) = child.stdout.take() {
        watch.capture(Stream::new(out, dir.join(files::STDOUT), masker()));
    }
    if let Some(err) = child.stderr.take() {
        watch.capture(Stream::new(err, dir.join(files::STDERR), masker()));
    }
    watch.watch_exit(child);
    // What lets a later service stop this step if this supervisor dies. A full disk must
    // not end the supervision of a step that already runs (returning here would orphan
    // it): without the record, this supervisor still stops the step's group at its end.
    if let Some(identity) = ProcessIdentity::of(pid) {
        let _ = files::append_child(dir, layout, &identity);
    }
    let ended = wait_for_end(dir, spec, pid, &mut watch);
    if ended.is_err() {
        // Whatever went wrong, nothing of this attempt may outlive its supervisor.
        signal_group(pid, Signal::KILL);
        *ending = Ending::Exit;
    }
    let (status, stopped_for) = ended?;
    // Leftovers of the step (its background children) die with it: a retry must never
    // overlap anything of this attempt.
    signal_group(pid, Signal::KILL);
    // The output's last bytes reach the log before the verdict. A process that left the
    // step's group and still holds a pipe is not waited for beyond a bound; it may still
    // run, so this process must not take another attempt.
    if !watch.drain(Instant::now() + OUTPUT_DRAIN)? {
        *ending = Ending::Exit;
    }
    Ok(Some(classify_exit(status, stopped_for, spec, started_at)))
}

/// The launch handshake: the service writes one byte to our stdin once its store holds
/// the launch as confirmed. End of file (the service died or stopped first) means the
/// launch was never recorded, so the step must not start.
fn wait_for_go(dir: &Path, watch: &mut Watch) -> io::Result<Handshake> {
    let go = loop {
        match watch.next(None)? {
            Some(Event::Go(Some(go))) => break go,
            Some(Event::Go(None)) => return Ok(Handshake::ServiceGone),
            // A stop request while waiting: the step never starts.
            Some(Event::Signalled) => {
                if let Some(reason) = files::read_kill(dir)? {
                    return Ok(Handshake::Stop(reason));
                }
            }
            Some(Event::Exited(_)) | None => {}
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

/// The step's environment: this supervisor's (what the service let through to steps),
/// without what only supervisors read, with the attempt's identity, the step's own
/// variables and its secrets.
fn environment(
    spec: &Spec,
    local: &files::LocalCommand,
    secrets: &[(String, String)],
) -> BTreeMap<OsString, OsString> {
    let mut env: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
    env.remove(std::ffi::OsStr::new(crate::service::STEP_UMASK_VAR));
    env.remove(std::ffi::OsStr::new(super::confine::PROTECT_VAR));
    let attempt = [
        ("SCARAB_RUN_ID", spec.launch.run.to_string()),
        ("SCARAB_STEP", spec.launch.step_name.clone()),
        ("SCARAB_ATTEMPT", spec.launch.attempt.to_string()),
        ("SCARAB_FENCE", spec.launch.fence.0.to_string()),
    ];
    for (name, value) in attempt {
        env.insert(name.into(), value.into());
    }
    // Later ones win: the step's own variables over the attempt's, its secrets over both.
    for (name, value) in local.env.iter().chain(secrets) {
        env.insert(name.into(), value.into());
    }
    env
}

/// The class and reason of a step that never started; `program` is its `argv[0]`.
fn judged(failure: &spawn::Failure, program: &str) -> (FailureClass, String) {
    match failure {
        spawn::Failure::Confine(error) => (
            FailureClass::InfraNeverStarted,
            format!("cannot confine the step: {error}"),
        ),
        spawn::Failure::Exec(error) => classify_spawn_error(error, program),
    }
}

/// The umask steps are started with (`service::STEP_UMASK_VAR`), if the service set one.
fn mask_for_steps() -> Option<rustix::fs::Mode> {
    std::env::var(crate::service::STEP_UMASK_VAR)
        .ok()
        .and_then(|m| u32::from_str_radix(&m, 8).ok())
        .filter(|m| *m <= 0o777)
        .map(rustix::fs::Mode::from_bits_truncate)
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

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// What one attempt's supervisor waits for, all from its one thread: stop requests (SIGTERM,
/// SIGINT, SIGHUP, through the self-pipe), the launch handshake's go, the step's exit (its
/// pidfd) and its output, which is copied into the log files as it arrives, masking
/// secret values. A stop request must never kill the supervisor itself.
struct Watch {
    signals: &'static std::os::unix::net::UnixStream,
    /// The service's end of the launch handshake, until its answer (the go or end of file).
    handshake: Option<io::BufReader<File>>,
    /// The step once spawned, until it is reaped.
    step: Option<Watched>,
    streams: Vec<Stream>,
    buffer: Vec<u8>,
}

/// A spawned step and what tells its exit: a pidfd, readable once it has exited, or `None`
/// on a kernel without them (before Linux 5.3), where it is looked at every `EXIT_POLL`.
struct Watched {
    child: Step,
    exit: Option<std::os::fd::OwnedFd>,
}

/// How often a step's exit is looked for where the kernel has no pidfd.
const EXIT_POLL: Duration = Duration::from_millis(10);

impl Watch {
    fn new(handshake: File) -> io::Result<Watch> {
        Ok(Watch::with_signals(handshake, signal_pipe()?))
    }

    /// With `signals` as the stop-signal pipe (tests give their own, so that the test
    /// process's own signals keep their default actions).
    fn with_signals(handshake: File, signals: &'static std::os::unix::net::UnixStream) -> Watch {
        Watch {
            signals,
            handshake: Some(io::BufReader::new(handshake)),
            step: None,
            streams: Vec::with_capacity(2),
            // Not zeroed: the pages are touched only as output arrives, and a step that
            // prints nothing costs none.
            buffer: Vec::with_capacity(64 * 1024),
        }
    }

    fn capture(&mut self, stream: Stream) {
        self.streams.push(stream);
    }

    fn watch_exit(&mut self, mut child: Step) {
        let exit = child.pidfd.take();
        self.step = Some(Watched { child, exit });
    }

    /// The next event, copying output meanwhile; `None` once `deadline` has passed.
    fn next(&mut self, deadline: Option<Instant>) -> io::Result<Option<Event>> {
        loop {
            match self.poll(deadline)? {
                Polled::Event(event) => return Ok(Some(event)),
                Polled::Copied => {}
                Polled::Late => return Ok(None),
            }
        }
    }

    /// Waits once, until something is ready or `deadline` passes.
    fn poll(&mut self, deadline: Option<Instant>) -> io::Result<Polled> {
        use rustix::event::{PollFd, PollFlags};
        use std::io::Read;
        if let Some(step) = &mut self.step
            && step.exit.is_none()
            && let Some(status) = step.child.try_wait()?
        {
            self.step = None;
            return Ok(Polled::Event(Event::Exited(status)));
        }
        let mut wait = deadline.map(|at| at.saturating_duration_since(Instant::now()));
        if wait == Some(Duration::ZERO) {
            return Ok(Polled::Late);
        }
        if self.step.as_ref().is_some_and(|step| step.exit.is_none()) {
            wait = Some(wait.map_or(EXIT_POLL, |wait| wait.min(EXIT_POLL)));
        }
        let (signalled, answered, exited, readable) = {
            let mut ready = vec![PollFd::new(self.signals, PollFlags::IN)];
            let handshake_at = self.handshake.as_ref().map(|handshake| {
                ready.push(PollFd::new(handshake.get_ref(), PollFlags::IN));
                ready.len() - 1
            });
            let exit_at = self
                .step
                .as_ref()
                .and_then(|step| step.exit.as_ref())
                .map(|exit| {
                    ready.push(PollFd::new(exit, PollFlags::IN));
                    ready.len() - 1
                });
            let streams_at = ready.len();
            ready.extend(
                self.streams
                    .iter()
                    .map(|stream| PollFd::new(&stream.from, PollFlags::IN)),
            );
            let timeout = wait.and_then(|wait| rustix::fs::Timespec::try_from(wait).ok());
            match rustix::event::poll(&mut ready, timeout.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(error) => return Err(error.into()),
            }
            let seen = |at: Option<usize>| {
                at.and_then(|i| ready.get(i))
                    .is_some_and(|r| !r.revents().is_empty())
            };
            let readable: Vec<bool> = ready[streams_at..]
                .iter()
                .map(|r| !r.revents().is_empty())
                .collect();
            (seen(Some(0)), seen(handshake_at), seen(exit_at), readable)
        };
        self.copy(&readable);
        if signalled {
            let mut bytes = [0u8; 64];
            while matches!(self.signals.read(&mut bytes), Ok(n) if n > 0) {}
            return Ok(Polled::Event(Event::Signalled));
        }
        if answered && let Some(mut handshake) = self.handshake.take() {
            return Ok(Polled::Event(Event::Go(Go::read(&mut handshake))));
        }
        if exited && let Some(mut step) = self.step.take() {
            // Readable once it has exited: reaping it does not block.
            let status = step.child.wait()?;
            return Ok(Polled::Event(Event::Exited(status)));
        }
        Ok(Polled::Copied)
    }

    /// Copies what the readable streams hold; a stream at its end is finished.
    fn copy(&mut self, readable: &[bool]) {
        let mut ended = Vec::new();
        for (index, stream) in self.streams.iter_mut().enumerate() {
            if !readable.get(index).copied().unwrap_or(false) {
                continue;
            }
            match rustix::io::read(&stream.from, self.buffer.spare_capacity_mut()) {
                Ok(([], _)) => ended.push(index),
                Ok((read, _)) => stream.write(read),
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                Err(_) => ended.push(index),
            }
        }
        for index in ended.into_iter().rev() {
            self.streams.remove(index).finish();
        }
    }

    /// Copies output until every stream has ended (`true`) or `until` passes (`false`):
    /// then what was read is in the log and the pipes are closed.
    fn drain(&mut self, until: Instant) -> io::Result<bool> {
        // Stop requests and the handshake no longer matter: the step has ended.
        self.handshake = None;
        while !self.streams.is_empty() {
            if let Polled::Late = self.poll(Some(until))? {
                for stream in self.streams.drain(..) {
                    stream.finish();
                }
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// What one wait of a `Watch` saw.
enum Polled {
    Event(Event),
    /// Output only (or nothing, a signal interrupted the wait).
    Copied,
    /// The deadline passed.
    Late,
}

/// Waits for the step to exit, stopping it at its timeout or at Scarab's request.
/// Returns its exit status and why Scarab stopped it, if it did.
fn wait_for_end(
    dir: &Path,
    spec: &Spec,
    pid: i32,
    watch: &mut Watch,
) -> io::Result<(ExitStatus, Option<KillReason>)> {
    let deadline = Instant::now() + Duration::from_millis(spec.launch.timeout_ms);
    let grace = Duration::from_millis(spec.kill_grace_ms);
    loop {
        match watch.next(Some(deadline))? {
            Some(Event::Exited(status)) => return Ok((status, None)),
            Some(Event::Go(_)) => {}
            Some(Event::Signalled) => {
                // The service asks by writing kill.json first; a bare signal (a stray
                // `kill`, a terminal hang-up) is not a stop request.
                if let Some(reason) = files::read_kill(dir)? {
                    return Ok((stop(pid, grace, watch)?, Some(reason)));
                }
            }
            None => return Ok((stop(pid, grace, watch)?, Some(KillReason::Timeout))),
        }
    }
}

/// SIGTERM to the step's group, SIGKILL after the grace period; waits for the exit.
fn stop(pid: i32, grace: Duration, watch: &mut Watch) -> io::Result<ExitStatus> {
    signal_group(pid, Signal::TERM);
    let deadline = Instant::now() + grace;
    let mut killed = false;
    loop {
        match watch.next((!killed).then_some(deadline))? {
            Some(Event::Exited(status)) => return Ok(status),
            Some(Event::Signalled | Event::Go(_)) => {}
            None => {
                signal_group(pid, Signal::KILL);
                killed = true;
            }
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
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    /// A watch on a handshake and a signal pipe of the test's own: the ends to write the
    /// go and the "signals" to, and the watch.
    fn watch() -> (UnixStream, UnixStream, Watch) {
        let (service, supervisor) = UnixStream::pair().expect("handshake");
        let (signals, raised) = UnixStream::pair().expect("signal pipe");
        raised.set_nonblocking(true).expect("nonblocking");
        let raised: &'static UnixStream = Box::leak(Box::new(raised));
        let watch = Watch::with_signals(File::from(std::os::fd::OwnedFd::from(supervisor)), raised);
        (service, signals, watch)
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("scarab-watch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch");
        dir
    }

    /// Spawns `script` with piped output, watched by `watch`; `pidfd: false` takes the path
    /// of a kernel without pidfds (the exit looked for every `EXIT_POLL`).
    fn start(watch: &mut Watch, dir: &Path, script: &str, pidfd: bool) {
        let argv: Vec<String> = ["sh", "-c", script].map(String::from).to_vec();
        let env: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        let mut child = spawn::start(&spawn::Request {
            argv: &argv,
            env: &env,
            workdir: None,
            umask: None,
            confinement: None,
        })
        .unwrap_or_else(|_| panic!("sh did not start"));
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        let secret = || Masker::new([b"hunter2".as_slice()]);
        watch.capture(Stream::new(out, dir.join(files::STDOUT), secret()));
        watch.capture(Stream::new(err, dir.join(files::STDERR), secret()));
        watch.watch_exit(child);
        if !pidfd {
            watch.step.as_mut().expect("watched").exit = None;
        }
    }

    #[test]
    fn a_watch_sees_the_go_then_the_exit_with_all_output_copied_and_masked() {
        for pidfd in [true, false] {
            let dir = scratch(&format!("exit-{pidfd}"));
            let (mut service, _signals, mut watch) = watch();
            service.write_all(b"g\n").expect("go");
            match watch.next(Some(Instant::now() + Duration::from_secs(10))) {
                Ok(Some(Event::Go(Some(go)))) => assert_eq!(go, Go::default()),
                _ => panic!("no go"),
            }
            start(
                &mut watch,
                &dir,
                "seq 1 20000; echo the hunter2 secret >&2; exit 3",
                pidfd,
            );
            let status = loop {
                match watch.next(Some(Instant::now() + Duration::from_secs(10))) {
                    Ok(Some(Event::Exited(status))) => break status,
                    Ok(Some(_)) => {}
                    Ok(None) => panic!("the step's exit was not seen (pidfd: {pidfd})"),
                    Err(error) => panic!("{error}"),
                }
            };
            assert_eq!(status.code(), Some(3));
            assert!(watch.step.is_none(), "the step was reaped");
            assert!(
                watch
                    .drain(Instant::now() + Duration::from_secs(10))
                    .expect("drain")
            );
            let out = std::fs::read_to_string(dir.join(files::STDOUT)).expect("stdout.log");
            assert_eq!(out.lines().count(), 20000);
            assert_eq!(out.lines().last(), Some("20000"));
            let err = std::fs::read_to_string(dir.join(files::STDERR)).expect("stderr.log");
            assert!(!err.contains("hunter2"), "{err}");
            assert!(
                err.starts_with("the ") && err.ends_with(" secret\n"),
                "{err}"
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn a_watch_reports_signals_a_deadline_and_the_service_gone() {
        let dir = scratch("deadline");
        let (service, mut signals, mut watch) = watch();
        signals.write_all(&[1]).expect("signal");
        assert!(matches!(watch.next(None), Ok(Some(Event::Signalled))));
        // The service closes its end before any go: end of file, not a go.
        drop(service);
        assert!(matches!(watch.next(None), Ok(Some(Event::Go(None)))));
        start(&mut watch, &dir, "echo started; exec sleep 30", true);
        let began = Instant::now();
        assert!(
            matches!(
                watch.next(Some(began + Duration::from_millis(200))),
                Ok(None)
            ),
            "a running step ended the wait before its deadline"
        );
        assert!(began.elapsed() >= Duration::from_millis(200));
        let pid = watch.step.as_ref().expect("still watched").child.pid();
        signal_group(pid, Signal::KILL);
        match watch.next(Some(Instant::now() + Duration::from_secs(10))) {
            Ok(Some(Event::Exited(status))) => assert_eq!(status.signal(), Some(libc::SIGKILL)),
            _ => panic!("the killed step's exit was not seen"),
        }
        assert!(
            watch
                .drain(Instant::now() + Duration::from_secs(10))
                .expect("drain")
        );
        let out = std::fs::read_to_string(dir.join(files::STDOUT)).expect("stdout.log");
        assert_eq!(out, "started\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_watch_stops_draining_at_its_bound_when_a_process_keeps_the_output_open() {
        let dir = scratch("drain");
        let (_service, _signals, mut watch) = watch();
        // The background sleep holds stdout open after the shell exits.
        start(&mut watch, &dir, "echo early; sleep 30 & exit 0", true);
        let pid = watch.step.as_ref().expect("watched").child.pid();
        loop {
            match watch.next(Some(Instant::now() + Duration::from_secs(10))) {
                Ok(Some(Event::Exited(status))) => {
                    assert_eq!(status.code(), Some(0));
                    break;
                }
                Ok(Some(_)) => {}
                _ => panic!("the step's exit was not seen"),
            }
        }
        let began = Instant::now();
        assert!(
            !watch
                .drain(began + Duration::from_millis(300))
                .expect("drain")
        );
        assert!(began.elapsed() >= Duration::from_millis(300));
        assert!(watch.streams.is_empty(), "the pipes were closed");
        signal_group(pid, Signal::KILL);
        let out = std::fs::read_to_string(dir.join(files::STDOUT)).expect("stdout.log");
        assert_eq!(out, "early\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn spawn_errors_that_can_never_work_are_config() {
        let class = |error: io::Error| classify_spawn_error(&error, "tool").0;
        // What is refused before exec: a NUL byte in an argument or the environment.
        let argv = vec!["true".to_string()];
        let env = BTreeMap::from([(OsString::from("A"), OsString::from("x\0y"))]);
        let nul = spawn::start(&spawn::Request {
            argv: &argv,
            env: &env,
            workdir: None,
            umask: None,
            confinement: None,
        });
        let Err(spawn::Failure::Exec(nul)) = nul else {
            panic!("a NUL byte in the environment was passed on");
        };
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

//! The local executor: every attempt is a `scarab supervise` process in its own session,
//! working in a fence-named directory under the state dir.

pub mod confine;
pub mod files;
pub mod mask;
pub mod spawn;
pub mod supervisor;
pub mod zygote;

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Signal};
use tokio::sync::mpsc;

use super::{Adoption, Executor, ExecutorError, Report, Target};
use crate::engine::{FailureClass, Fence, KillReason, Outcome, RunId, Verdict};
use crate::store::records::LaunchRecord;
use files::{ProcessIdentity, Spec};

type BoxedTask<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

#[derive(Clone)]
pub struct LocalExecutor {
    inner: Arc<Inner>,
}

struct Inner {
    attempts_dir: PathBuf,
    supervisor_exe: PathBuf,
    steps: StepSettings,
    reports: mpsc::Sender<Report>,
    /// Fences with a watcher task, so a redelivered launch never watches twice.
    watching: Mutex<HashSet<Fence>>,
    /// Supervisors waiting for the store to record their launch (their stdin).
    /// With the secrets (variable, secret name) their step references, resolved only
    /// when the go is sent.
    awaiting_go: Mutex<HashMap<Fence, AwaitingGo>>,
    /// Forks supervisors (see `zygote`); started at the first launch, and again after it
    /// failed.
    zygote: tokio::sync::Mutex<Option<zygote::Zygote>>,
}

/// The write end of a supervisor's stdin, and the secrets (variable, secret name) its
/// step references.
type AwaitingGo = (OwnedFd, Vec<(String, String)>);

/// What an attempt directory says about its attempt.
enum Probe {
    /// No supervisor ever started: safe to start (again) under this fence.
    Fresh,
    Alive(ProcessIdentity),
    Finished(Verdict),
    /// A supervisor started and is gone without a verdict.
    Vanished,
    /// A supervisor gave up at the launch handshake: the step never started.
    Aborted,
}

/// How local steps are run.
#[derive(Clone, Debug, Default)]
pub struct StepSettings {
    /// SIGTERM-to-SIGKILL grace when Scarab stops a step.
    pub kill_grace: Duration,
    /// What of the service's environment steps see (`step_environment`).
    pub env_passthrough: Vec<String>,
    /// What steps must not reach besides the state dir (see `confine`) that no reload
    /// changes: the config file, the kubeconfig. (The token files and the secrets dir come
    /// from `live`.)
    pub protected: Vec<PathBuf>,
    /// Where secret values come from (`Live::secrets`, replaced by SIGHUP).
    pub live: Arc<arc_swap::ArcSwap<crate::config::Live>>,
}

impl LocalExecutor {
    /// `supervisor_exe` is this very binary (`scarab supervise` is one of its commands).
    pub fn new(
        attempts_dir: PathBuf,
        supervisor_exe: PathBuf,
        steps: StepSettings,
        reports: mpsc::Sender<Report>,
    ) -> io::Result<Self> {
        std::fs::create_dir_all(&attempts_dir)?;
        // Absolute, so that a supervisor (and the zygote) finds its attempt directory
        // whatever its working directory.
        let attempts_dir = std::path::absolute(&attempts_dir)?;
        Ok(LocalExecutor {
            inner: Arc::new(Inner {
                attempts_dir,
                supervisor_exe,
                steps,
                reports,
                watching: Mutex::new(HashSet::new()),
                awaiting_go: Mutex::new(HashMap::new()),
                zygote: tokio::sync::Mutex::new(None),
            }),
        })
    }

    pub fn attempt_dir(&self, fence: Fence) -> PathBuf {
        files::attempt_dir(&self.inner.attempts_dir, fence)
    }

    fn io_error(path: &Path) -> impl FnOnce(io::Error) -> ExecutorError + '_ {
        move |source| ExecutorError::Io {
            path: path.display().to_string(),
            source,
        }
    }

    /// Reads the attempt directory. A supervisor that holds the lock but has not yet
    /// recorded itself is waited for briefly.
    ///
    /// A record that cannot be read is one being appended (looked at again while its
    /// supervisor lives) or the leftover of a power cut: a torn verdict is no verdict
    /// (`lost`), a torn supervisor record is a supervisor that is gone.
    async fn probe(&self, dir: &Path) -> io::Result<Probe> {
        for _ in 0..200 {
            if let Some(probe) = read_verdict(dir)? {
                return Ok(probe);
            }
            let alive = files::supervisor_holds_lock(dir)?;
            if !alive && dir.join(files::ABORTED).exists() {
                return Ok(Probe::Aborted);
            }
            let identity = match files::read_supervision(dir).map(|s| s.map(|s| s.supervisor)) {
                Err(e) if e.kind() == io::ErrorKind::InvalidData && !alive => {
                    return Ok(Probe::Vanished);
                }
                // A live supervisor may be appending its record at this very moment.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => None,
                other => other?,
            };
            match (alive, identity) {
                (true, Some(identity)) => return Ok(Probe::Alive(identity)),
                (true, None) => tokio::time::sleep(Duration::from_millis(10)).await,
                // It may have written its verdict between our two reads.
                (false, Some(_)) => return Ok(read_verdict(dir)?.unwrap_or(Probe::Vanished)),
                (false, None) => return Ok(Probe::Fresh),
            }
        }
        Err(io::Error::other(
            "supervisor holds the lock but never recorded itself",
        ))
    }

    /// Takes over an attempt found on disk. `Aborted` only reaches here for an attempt
    /// the store holds as confirmed (a re-adoption): its step never started, so it is
    /// started now under the same fence, with no new attempt and no budget used.
    async fn take_over(&self, run: RunId, step: usize, fence: Fence, probe: Probe) {
        match probe {
            Probe::Finished(verdict) => self.report(run, step, fence, verdict).await,
            Probe::Alive(identity) => self.watch_adopted(run, step, fence, identity),
            Probe::Vanished => self.report_vanished(run, step, fence).await,
            Probe::Aborted => self.restart_confirmed(run, step, fence).await,
            Probe::Fresh => {
                self.report(
                    run,
                    step,
                    fence,
                    lost("the attempt's supervisor never started"),
                )
                .await
            }
        }
    }

    async fn spawn_supervisor(
        &self,
        run: RunId,
        step: usize,
        fence: Fence,
        dir: &Path,
        secrets: Vec<(String, String)>,
    ) -> Result<(), ExecutorError> {
        let protected = self.protected_paths();
        let exit = match self.fork_supervisor(dir, &protected).await {
            Ok((pidfd, go, handshake)) => {
                self.await_go(fence, go, secrets);
                Exit::Forked { pidfd, handshake }
            }
            Err(error) => {
                tracing::warn!(%fence, %error, "no supervisor from the zygote; executing the supervisor instead");
                match self.exec_supervisor(dir, &protected) {
                    Ok((child, go)) => {
                        if let Some(go) = go {
                            self.await_go(fence, go, secrets);
                        }
                        Exit::Child(child)
                    }
                    Err(error) => {
                        // The shim never ran, so neither did the step: never-started,
                        // retryable.
                        let reason = format!("could not start the supervisor: {error}");
                        let verdict = never_started(FailureClass::InfraNeverStarted, reason);
                        self.report(run, step, fence, verdict).await;
                        return Ok(());
                    }
                }
            }
        };
        if !self.start_watching(fence) {
            return Ok(());
        }
        let this = self.clone();
        let dir = dir.to_path_buf();
        tokio::spawn(async move {
            match exit {
                Exit::Child(mut child) => {
                    let _ = child.wait().await;
                }
                // A zygote's supervisor closes its end of the handshake once the verdict
                // is written, and goes on to the next attempt.
                Exit::Forked { pidfd, handshake } => tokio::select! {
                    () = wait_for_pidfd(pidfd) => {}
                    () = wait_for_hangup(handshake) => {}
                },
            }
            this.forget_go(fence);
            this.on_supervisor_exit(run, step, fence, &dir, false).await;
        });
        Ok(())
    }

    /// The supervisor (and the zygote) start from a clean environment: they, and the
    /// steps after them, never see the service's own (its tokens, its configuration), only
    /// what `step_environment` lets through.
    fn supervisor_command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.inner.supervisor_exe);
        command
            .env_clear()
            .envs(step_environment(&self.inner.steps.env_passthrough))
            .env(
                crate::service::STEP_UMASK_VAR,
                format!("{:o}", crate::service::private_files()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    /// A supervisor from the zygote (started first if there is none): its pidfd, the
    /// service's end of its launch handshake (a socket pair) to send the go on, and another
    /// copy of that end, which sees end of file once the attempt is over. A zygote that
    /// fails is dropped (it ends when its socket closes) and started afresh at the next
    /// launch.
    async fn fork_supervisor(
        &self,
        dir: &Path,
        protected: &str,
    ) -> Result<(OwnedFd, OwnedFd, OwnedFd), zygote::Failed> {
        // A handshake that cannot be made is this launch's problem, not the zygote's.
        let no_handshake = |e: io::Error| zygote::Failed::Refused(format!("no handshake: {e}"));
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(no_handshake)?;
        let go = OwnedFd::from(ours.try_clone().map_err(no_handshake)?);
        let mut slot = self.inner.zygote.lock().await;
        let zygote = match &mut *slot {
            Some(zygote) => zygote,
            empty => {
                let mut command = self.supervisor_command();
                command.args(zygote::ARGS);
                empty.insert(zygote::Zygote::start(command).map_err(zygote::Failed::Broken)?)
            }
        };
        let forked = zygote.fork(dir, protected, theirs.into()).await;
        if matches!(forked, Err(zygote::Failed::Broken(_))) {
            *slot = None;
        }
        Ok((forked?, go, ours.into()))
    }

    /// A supervisor executed as `scarab supervise DIR` (when the zygote gives none), and
    /// the write end of its launch handshake.
    fn exec_supervisor(
        &self,
        dir: &Path,
        protected: &str,
    ) -> io::Result<(tokio::process::Child, Option<OwnedFd>)> {
        let mut command = self.supervisor_command();
        command
            .arg("supervise")
            .arg(dir)
            .env(confine::PROTECT_VAR, protected)
            // The launch handshake (see `supervisor::wait_for_go`).
            .stdin(Stdio::piped());
        // No pre_exec hook: the supervisor makes its own session (see `supervise`).
        let mut child = command.spawn()?;
        let go = child.stdin.take().and_then(|s| s.into_owned_fd().ok());
        Ok((child, go))
    }

    fn await_go(&self, fence: Fence, go: OwnedFd, secrets: Vec<(String, String)>) {
        if let Ok(mut awaiting) = self.inner.awaiting_go.lock() {
            awaiting.insert(fence, (go, secrets));
        }
    }

    /// Starts a new supervisor for a confirmed attempt whose step never started, and lets
    /// it go at once: the store already holds the launch.
    fn restart_confirmed(&self, run: RunId, step: usize, fence: Fence) -> BoxedTask<'_> {
        // Boxed: starting a supervisor spawns its watcher, which may come back here.
        Box::pin(async move {
            let dir = self.attempt_dir(fence);
            tracing::info!(%fence, "the step never started (launch handshake cut short); starting it under the same fence");
            // The marker, durably, and what a supervisor of an older build may have left
            // of itself (it wrote the marker before removing its record).
            if let Err(error) =
                files::remove_aborted(&dir).and_then(|()| files::forget_supervisor(&dir))
            {
                let verdict = lost(&format!("cannot restart an aborted launch: {error}"));
                self.report(run, step, fence, verdict).await;
                return;
            }
            let secrets = match files::read_spec(&dir) {
                Ok(Some(spec)) => spec.local().map(|l| l.secrets.to_vec()).unwrap_or_default(),
                _ => Vec::new(),
            };
            if let Err(error) = self.spawn_supervisor(run, step, fence, &dir, secrets).await {
                tracing::error!(%fence, %error, "restarting an aborted launch failed");
            }
            self.launch_recorded(fence);
        })
    }

    /// What steps must not reach besides the state dir, as `PROTECT_VAR` passes it: the
    /// fixed paths, and the token files and secrets dir of the configuration as last
    /// (re)loaded.
    fn protected_paths(&self) -> String {
        let live = self.inner.steps.live.load();
        let mut paths = self.inner.steps.protected.clone();
        paths.extend(live.step_protected.iter().cloned());
        confine::encode_protected(&paths)
    }

    fn forget_go(&self, fence: Fence) {
        if let Ok(mut awaiting) = self.inner.awaiting_go.lock() {
            awaiting.remove(&fence);
        }
    }

    fn start_watching(&self, fence: Fence) -> bool {
        self.inner
            .watching
            .lock()
            .map(|mut w| w.insert(fence))
            .unwrap_or(false)
    }

    /// Watches a supervisor that is not our child (it outlived an earlier service) through
    /// a pidfd: it becomes readable when that very process exits.
    fn watch_adopted(&self, run: RunId, step: usize, fence: Fence, identity: ProcessIdentity) {
        if !self.start_watching(fence) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let dir = this.attempt_dir(fence);
            wait_for_exit(identity, &dir).await;
            this.on_supervisor_exit(run, step, fence, &dir, true).await;
        });
    }

    /// A supervisor exited. `confirmed`: the store holds its launch as confirmed (it was
    /// adopted); an own child that gave up at the handshake is left for the redelivered
    /// launch instead.
    async fn on_supervisor_exit(
        &self,
        run: RunId,
        step: usize,
        fence: Fence,
        dir: &Path,
        confirmed: bool,
    ) {
        if let Ok(mut watching) = self.inner.watching.lock() {
            watching.remove(&fence);
        }
        match files::read_verdict(dir) {
            Ok(Some(verdict)) => self.report(run, step, fence, verdict).await,
            Ok(None) if dir.join(files::ABORTED).exists() => {
                if confirmed {
                    self.restart_confirmed(run, step, fence).await;
                }
            }
            Ok(None) => self.report_vanished(run, step, fence).await,
            Err(error) => {
                self.report(
                    run,
                    step,
                    fence,
                    lost(&format!("unreadable verdict: {error}")),
                )
                .await
            }
        }
    }

    /// The supervisor died without a verdict: stop what is left of its step (it may still
    /// run, orphaned) and report `lost`.
    async fn report_vanished(&self, run: RunId, step: usize, fence: Fence) {
        let dir = self.attempt_dir(fence);
        if let Ok(Some(files::Supervision {
            child: Some(child), ..
        })) = files::read_supervision(&dir)
            && child.is_alive()
            && let Some(group) = Pid::from_raw(child.pid).filter(|p| !p.is_init())
        {
            let _ = rustix::process::kill_process_group(group, Signal::KILL);
        }
        self.report(
            run,
            step,
            fence,
            lost("the supervisor and its verdict are gone"),
        )
        .await;
    }

    async fn report(&self, run: RunId, step: usize, fence: Fence, verdict: Verdict) {
        let report = Report {
            run,
            step,
            fence,
            verdict,
        };
        if self.inner.reports.send(report).await.is_err() {
            tracing::debug!(%fence, "driver gone; verdict stays on disk for re-adoption");
        }
    }
}

impl Executor for LocalExecutor {
    async fn launch(&self, order: &LaunchRecord) -> Result<(), ExecutorError> {
        if order.action.executor() != crate::store::records::ExecutorKind::Local {
            // Only reachable without a Kubernetes executor: the launch waits in the outbox.
            return Err(ExecutorError::Unavailable(
                "no kubernetes executor is configured on this service".into(),
            ));
        }
        let dir = self.attempt_dir(order.fence);
        let io_error = Self::io_error(&dir);
        let step = usize::from(order.step);
        // A directory this launch created is empty: nothing to probe.
        let created = match std::fs::create_dir(&dir) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(_) => {
                std::fs::create_dir_all(&dir).map_err(Self::io_error(&dir))?;
                false
            }
        };
        let probe = if created {
            Probe::Fresh
        } else {
            self.probe(&dir).await.map_err(Self::io_error(&dir))?
        };
        // A launch is delivered only while the store holds it unconfirmed, and a step starts
        // only after confirmation: so a supervisor that is gone without having spawned the
        // step (no record of the step) never ran it, and the fence is started afresh.
        match probe {
            Probe::Fresh => {}
            Probe::Aborted => {
                // The marker, durably, and what a supervisor of an older build may have
                // left of itself (it wrote the marker before removing its record).
                files::remove_aborted(&dir)
                    .and_then(|()| files::forget_supervisor(&dir))
                    .map_err(Self::io_error(&dir))?
            }
            Probe::Vanished if !files::child_recorded(&dir) => {
                files::forget_supervisor(&dir).map_err(Self::io_error(&dir))?
            }
            other => {
                self.take_over(order.run, step, order.fence, other).await;
                return Ok(());
            }
        }
        let spec = Spec {
            launch: order.clone(),
            kill_grace_ms: u64::try_from(self.inner.steps.kill_grace.as_millis())
                .unwrap_or(u64::MAX),
        };
        files::write_spec(&dir, &spec).map_err(io_error)?;
        let secrets = spec.local().map(|l| l.secrets.to_vec()).unwrap_or_default();
        self.spawn_supervisor(order.run, step, order.fence, &dir, secrets)
            .await
    }

    async fn kill(&self, target: Target, reason: KillReason) -> Result<(), ExecutorError> {
        self.stop(target.fence, reason).await
    }

    /// Never fails silently: whatever cannot be read is reported as `lost`, so every
    /// adopted attempt gets a verdict or a watcher.
    async fn adopt(&self, adoption: &Adoption) -> Result<(), ExecutorError> {
        if let Err(error) = self.try_adopt(adoption).await {
            let verdict = lost(&format!("cannot re-adopt: {error}"));
            self.report(adoption.run, adoption.step, adoption.fence, verdict)
                .await;
        }
        Ok(())
    }

    fn launch_recorded(&self, fence: Fence) {
        let awaiting = self
            .inner
            .awaiting_go
            .lock()
            .ok()
            .and_then(|mut a| a.remove(&fence));
        let Some((fd, secrets)) = awaiting else {
            return;
        };
        // The go byte, then the step's secrets as one line: they travel only through this
        // pipe, never through a file. A few KiB into an empty pipe never blocks; a
        // supervisor that already exited (it was stopped first) makes this fail harmlessly.
        let go = supervisor::Go::resolve(&secrets, &self.inner.steps.live.load().secrets);
        let _ = std::io::Write::write_all(&mut std::fs::File::from(fd), &go.to_bytes());
    }

    async fn clean_up(&self, target: Target) -> Result<(), ExecutorError> {
        let fence = target.fence;
        let dir = self.attempt_dir(fence);
        if files::supervisor_holds_lock(&dir).map_err(Self::io_error(&dir))? {
            return Err(ExecutorError::Unavailable(format!(
                "attempt {fence} is still supervised"
            )));
        }
        files::remove_attempt_dir(&dir).map_err(|source| ExecutorError::Io {
            path: dir.display().to_string(),
            source,
        })
    }

    /// Attempt directories whose fence this store never minted (at or above
    /// `minted_below`) and whose supervisor still runs are foreign: they are stopped. Only
    /// that range is probed, so start-up does not open every attempt directory.
    async fn recover(
        &self,
        _inflight: &[Adoption],
        minted_below: Fence,
        _retained: &super::Retained,
    ) -> Result<Option<Fence>, ExecutorError> {
        let mut highest = None;
        for fence in self.fences_on_disk()? {
            let plausible = fence.is_plausible(minted_below);
            if plausible && fence < minted_below {
                highest = highest.max(Some(fence));
                continue;
            }
            // Minted by no store of this lineage yet (a newer lineage after a restore) or
            // by nothing of Scarab's at all (an implausible fence): a foreign zombie.
            let dir = self.attempt_dir(fence);
            if files::supervisor_holds_lock(&dir).map_err(Self::io_error(&dir))? {
                tracing::warn!(%fence, "stopping a foreign attempt: its fence was never minted by this store");
                self.stop(fence, KillReason::Cancel).await?;
            }
            if plausible {
                highest = highest.max(Some(fence));
            } else {
                tracing::warn!(%fence, "an attempt directory with an implausible fence: not counted");
            }
        }
        Ok(highest)
    }
}

impl LocalExecutor {
    /// Writes the stop request, then signals a live supervisor.
    async fn stop(&self, fence: Fence, reason: KillReason) -> Result<(), ExecutorError> {
        let dir = self.attempt_dir(fence);
        std::fs::create_dir_all(&dir).map_err(Self::io_error(&dir))?;
        // Written first: a supervisor that has not started yet reads it and never starts
        // the step; a running one reads it when signalled.
        files::write_kill(&dir, reason).map_err(Self::io_error(&dir))?;
        if let Probe::Alive(identity) = self.probe(&dir).await.map_err(Self::io_error(&dir))?
            && let Some(pidfd) = pidfd_for(identity, &dir)
        {
            let _ = rustix::process::pidfd_send_signal(&pidfd, Signal::TERM);
        }
        Ok(())
    }

    async fn try_adopt(&self, adoption: &Adoption) -> Result<(), ExecutorError> {
        let dir = self.attempt_dir(adoption.fence);
        let spec = files::read_spec(&dir).map_err(Self::io_error(&dir))?;

        if let Some(spec) = spec
            && (spec.launch.run, usize::from(spec.launch.step)) != (adoption.run, adoption.step)
        {
            // Same fence, other run or step: not ours to adopt. Stop it, and our attempt
            // has no verdict.
            tracing::warn!(fence = %adoption.fence, found_run = %spec.launch.run, "attempt directory belongs to another run; stopping it");
            self.stop(adoption.fence, KillReason::Cancel).await?;
            let verdict = lost("the attempt directory under this fence belongs to another run");
            self.report(adoption.run, adoption.step, adoption.fence, verdict)
                .await;
            return Ok(());
        }
        let probe = self.probe(&dir).await.map_err(Self::io_error(&dir))?;
        self.take_over(adoption.run, adoption.step, adoption.fence, probe)
            .await;
        Ok(())
    }

    /// Fences of every attempt directory: only names this executor writes count (a
    /// decimal number without leading zeros); whether each is plausible is `recover`'s
    /// decision.
    fn fences_on_disk(&self) -> Result<Vec<Fence>, ExecutorError> {
        let dir = &self.inner.attempts_dir;
        let entries = std::fs::read_dir(dir).map_err(Self::io_error(dir))?;
        let mut fences = Vec::new();
        for entry in entries {
            let entry = entry.map_err(Self::io_error(dir))?;
            let name = entry.file_name();
            if let Some(fence) = name
                .to_str()
                .and_then(|n| n.parse::<u64>().ok().filter(|f| f.to_string() == n))
            {
                fences.push(Fence(fence));
            }
        }
        Ok(fences)
    }
}

/// What a local step sees of the service's environment: `PATH` (a standard one if the
/// service has none), `HOME`, `LANG` and the names of `engine.step_env_passthrough`.
/// Scarab's own `SCARAB_*` variables for the step and its pipeline's `env` come on top,
/// from the supervisor.
pub fn step_environment(passthrough: &[String]) -> Vec<(String, std::ffi::OsString)> {
    let mut env = vec![(
        "PATH".to_string(),
        std::env::var_os("PATH").unwrap_or_else(|| {
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
        }),
    )];
    for name in ["HOME", "LANG"]
        .into_iter()
        .chain(passthrough.iter().map(String::as_str))
    {
        if let Some(value) = std::env::var_os(name) {
            env.push((name.to_string(), value));
        }
    }
    env
}

/// A pidfd for the supervisor, only if the lock proves it is still that process: opened
/// first, then checked, so the pidfd cannot point at a later process with the same pid.
fn pidfd_for(identity: ProcessIdentity, dir: &Path) -> Option<OwnedFd> {
    let pid = Pid::from_raw(identity.pid)?;
    let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty()).ok()?;
    let alive = files::supervisor_holds_lock(dir).unwrap_or(false) && identity.is_alive();
    alive.then_some(pidfd)
}

/// Waits until the supervisor is done with the attempt in `dir`: it exits (a pidfd
/// becomes readable when that very process ends), or it releases the attempt's lock and
/// goes on to another attempt (a supervisor from the zygote); the lock is checked twice a
/// second.
async fn wait_for_exit(identity: ProcessIdentity, dir: &Path) {
    let supervising = || identity.is_alive() && files::supervisor_holds_lock(dir).unwrap_or(false);
    let polled = async {
        while supervising() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    match pidfd_for(identity, dir) {
        Some(pidfd) => tokio::select! {
            () = wait_for_pidfd(pidfd) => {}
            () = polled => {}
        },
        None => polled.await,
    }
}

/// Waits until the process of `pidfd` ends (its pidfd becomes readable); where the pidfd
/// cannot be registered with the reactor, it is polled twice a second.
async fn wait_for_pidfd(pidfd: OwnedFd) {
    let readable = tokio::io::Interest::READABLE;
    // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and refers to
    // the same pidfd for the AsyncFd's whole life.
    let pidfd = match unsafe { tokio::io::unix::AsyncFd::register_with_interest(pidfd, readable) } {
        Ok(fd) => {
            let _ = fd.readable().await;
            return;
        }
        Err(refused) => refused.into_parts().0,
    };
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    loop {
        let mut ready = [rustix::event::PollFd::new(
            &pidfd,
            rustix::event::PollFlags::IN,
        )];
        if !matches!(rustix::event::poll(&mut ready, Some(&now)), Ok(0)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// How the end of a supervision is noticed: an own child is waited for; one from the
/// zygote (its parent is the zygote) ends the attempt when it closes its end of the
/// handshake, or when it dies (its pidfd).
enum Exit {
    Child(tokio::process::Child),
    Forked { pidfd: OwnedFd, handshake: OwnedFd },
}

/// Waits until the other end of the socket `handshake` is closed (by every process that
/// held it). The descriptor stays blocking (it shares its file description with the end
/// the go is written to); reads here never wait.
async fn wait_for_hangup(handshake: OwnedFd) {
    let readable = tokio::io::Interest::READABLE;
    // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and refers to
    // the same socket for the AsyncFd's whole life.
    let Ok(socket) =
        (unsafe { tokio::io::unix::AsyncFd::register_with_interest(handshake, readable) })
    else {
        // Left to the pidfd.
        return std::future::pending().await;
    };
    let mut bytes = [0u8; 64];
    loop {
        let Ok(mut guard) = socket.readable().await else {
            return std::future::pending().await;
        };
        match rustix::net::recv(
            socket.get_ref(),
            &mut bytes,
            rustix::net::RecvFlags::DONTWAIT,
        ) {
            Ok((0, _)) => return,
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => guard.clear_ready(),
            Err(_) => return,
        }
    }
}

fn never_started(class: FailureClass, reason: String) -> Verdict {
    Verdict {
        outcome: Outcome::Failed(class),
        started: false,
        reason,
        exit_code: None,
        started_at: None,
        finished_at: crate::clock::now(),
    }
}

fn lost(reason: &str) -> Verdict {
    Verdict {
        outcome: Outcome::Failed(FailureClass::Lost),
        started: true,
        reason: reason.to_string(),
        exit_code: None,
        started_at: None,
        finished_at: crate::clock::now(),
    }
}

/// The verdict file as a probe result: `None` when there is none yet.
fn read_verdict(dir: &Path) -> io::Result<Option<Probe>> {
    match files::read_verdict(dir) {
        Ok(found) => Ok(found.map(Probe::Finished)),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Ok(Some(Probe::Finished(lost(
            &format!("unreadable verdict: {e}"),
        )))),
        Err(e) => Err(e),
    }
}

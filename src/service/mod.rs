//! The running service: one driver loop that owns the engine and every write, an outbox
//! dispatcher that delivers what the driver committed, and the executor's reports.
//!
//! Used by `scarab serve` (with the HTTP API in front) and by `scarab run` (in-process).

#[cfg(test)]
mod backstop_tests;
#[cfg(test)]
mod crash_sim;
pub mod disk;
mod dispatch;
mod driver;
pub mod events;
pub mod forward_progress;
mod history;
pub mod protocol;
pub mod sweep;
#[cfg(test)]
mod sweep_tests;
pub mod tokens;
pub mod webhooks;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use crate::engine::{EngineSettings, RunId};
use crate::executor::Executors;
use crate::executor::kubernetes::KubeExecutor;
use crate::executor::local::LocalExecutor;
use crate::executor::{Executor, Report};
use crate::pipeline::Pipeline;
use crate::store::records::{PipelineSource, StoredSchedule};
use crate::store::{Store, StoreError};

pub use driver::{parse_stored, rebuild as driver_rebuild};
use protocol::{Answer, Command};
pub use protocol::{
    DecideError, DecideRejected, Decided, DeliveryFailure, DlqError, DlqRejected, OutputError,
    OutputRejected, RunActionError, RunRejected, ScheduleAction, ScheduleRejected, ServiceError,
    SubmitError, SubmitRejected, Submitted,
};

/// Global settings of a service instance.
#[derive(Clone, Debug)]
pub struct Settings {
    pub engine: EngineSettings,
    /// SIGTERM-to-SIGKILL grace when Scarab stops a local step.
    pub kill_grace: Duration,
    /// Variables of the service's environment that local steps also see.
    pub step_env_passthrough: Vec<String>,
    /// What local steps must not reach besides the state dir and what `live` names: the
    /// config file and the kubeconfig.
    pub step_protected: Vec<PathBuf>,
    /// Delivery attempts per outbox message (dead-lettering on exhaustion comes with the
    /// dead-letter queue; until then a message keeps retrying at the capped backoff).
    pub max_deliveries: u32,
    /// Per-attempt step tokens for the output API (`None` when there is no API, as in
    /// `scarab run`).
    pub step_tokens: Option<tokens::StepTokens>,
    /// What a SIGHUP replaces at once (webhooks, tokens, log level, auto-retry): read
    /// through `live()` at each use, never cached across a batch boundary.
    pub live: Arc<arc_swap::ArcSwap<crate::config::Live>>,
    /// The cluster for `executor: kubernetes` steps; `None`: such steps wait in the
    /// outbox as "executor unavailable".
    pub kubernetes: Option<KubernetesSettings>,
}

impl Settings {
    /// Everything about a valid pipeline this service refuses as configured now: secrets
    /// it does not hold, slots over a pool's limit or locks it does not name, Kubernetes
    /// steps without a cluster. Checked at submit and at each scheduled fire.
    pub fn check_pipeline(
        &self,
        pipeline: &crate::pipeline::Pipeline,
    ) -> Vec<crate::pipeline::FieldError> {
        let live = self.live();
        let missing = live.secrets.check(pipeline);
        if !missing.is_empty() {
            return missing;
        }
        let mut refused = live.admission.check(pipeline);
        refused.extend(self.check_executors(pipeline));
        refused
    }

    /// The current reloadable settings.
    pub fn live(&self) -> Arc<crate::config::Live> {
        self.live.load_full()
    }

    /// Replaces the reloadable settings at once (SIGHUP).
    pub fn replace_live(&self, live: crate::config::Live) {
        self.live.store(Arc::new(live));
    }
}

/// Where the Kubernetes executor finds its cluster.
#[derive(Clone, Debug)]
pub struct KubernetesSettings {
    /// A kubeconfig file; `None`: the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    pub namespace: String,
    pub grace: crate::executor::kubernetes::classify::GracePeriods,
    pub delete_grace: Duration,
    /// The API's URL as Pods reach it: Pod steps get it and their token when set.
    pub callback_url: Option<String>,
}

impl Settings {
    /// What of a pipeline this service cannot run: a Kubernetes step on a service with
    /// no cluster configured. Checked at submit; each error names its field.
    pub fn check_executors(
        &self,
        pipeline: &crate::pipeline::Pipeline,
    ) -> Vec<crate::pipeline::FieldError> {
        if self.kubernetes.is_some() {
            return Vec::new();
        }
        pipeline
            .steps
            .iter()
            .enumerate()
            .filter(|(_, step)| matches!(step.action, crate::pipeline::StepAction::Kubernetes(_)))
            .map(|(index, _)| crate::pipeline::FieldError {
                field: format!("steps[{index}].executor"),
                line: None,
                message: "this service has no Kubernetes cluster configured (kubernetes.kubeconfig or kubernetes.in_cluster)".into(),
            })
            .collect()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            engine: EngineSettings::default(),
            kill_grace: crate::limits::KILL_GRACE,
            step_env_passthrough: Vec::new(),
            step_protected: Vec::new(),
            max_deliveries: 10,
            kubernetes: None,
            step_tokens: None,
            live: Arc::default(),
        }
    }
}

/// Where a service keeps its state: `scarab.redb` and `attempts/` under one directory.
#[derive(Clone, Debug)]
pub struct StateDir {
    pub root: PathBuf,
}

impl StateDir {
    pub fn new(root: &Path) -> StateDir {
        StateDir {
            root: root.to_path_buf(),
        }
    }

    pub fn database(&self) -> PathBuf {
        self.root.join("scarab.redb")
    }

    /// Space kept in reserve for when the disk fills (`limits::DISK_RESERVE_BYTES`).
    pub fn reserve(&self) -> PathBuf {
        self.root.join("reserve")
    }

    pub fn attempts(&self) -> PathBuf {
        self.root.join("attempts")
    }

    pub fn admin_token(&self) -> PathBuf {
        self.root.join("admin.token")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("state dir {path}: {source}")]
    StateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", held_message(path, *pid))]
    Held { path: String, pid: Option<u32> },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("executor: {0}")]
    Executor(String),
}

fn held_message(path: &str, pid: Option<u32>) -> String {
    let who = match pid {
        Some(pid) => format!("another Scarab (pid {pid})"),
        None => "another Scarab".to_string(),
    };
    format!("state dir {path}: {who} is using it; stop it first, or name another --state-dir")
}

/// The state dir's lock file: whoever holds a lock on it serves the state dir, and it
/// holds that process's pid so the next one can say who.
const LOCK_FILE: &str = "scarab.lock";

/// The state dir held by this process until dropped (the kernel lets go of it when the
/// process dies, kill -9 included).
pub struct StateDirLock {
    _file: std::fs::File,
}

/// Takes the state dir's lock, or says which process holds it.
pub fn lock_state_dir(root: &Path) -> Result<StateDirLock, StartError> {
    use std::io::{Read, Seek, Write};
    let path = root.join(LOCK_FILE);
    let fail = |source: std::io::Error| StartError::StateDir {
        path: root.display().to_string(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(fail)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = Read::by_ref(&mut file).take(32).read_to_string(&mut text);
            return Err(StartError::Held {
                path: root.display().to_string(),
                pid: text.trim().parse().ok(),
            });
        }
        Err(std::fs::TryLockError::Error(error)) => return Err(fail(error)),
    }
    file.set_len(0).map_err(fail)?;
    file.rewind().map_err(fail)?;
    writeln!(file, "{}", std::process::id()).map_err(fail)?;
    Ok(StateDirLock { _file: file })
}

/// Which process serves the state dir now, if one does (`Err` names it); the lock is
/// let go of at once. For a clear refusal before anything is done.
pub fn check_state_dir_free(root: &Path) -> Result<(), StartError> {
    if !root.join(LOCK_FILE).exists() {
        return Ok(());
    }
    lock_state_dir(root).map(drop)
}

/// A handle to a running service. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    pub store: Arc<Store>,
    pub state_dir: StateDir,
    pub settings: Arc<Settings>,
    commands: mpsc::Sender<Command>,
    ready: watch::Receiver<bool>,
    outbox: dispatch::Outbox,
    /// Live logs of running Pod steps (finished ones are archived in the state dir).
    pub pod_logs: Option<kube::Api<k8s_openapi::api::core::v1::Pod>>,
    /// The auto-retry sweep's counters.
    pub sweep_stats: Arc<sweep::SweepStats>,
    /// Prometheus metrics (`/metrics`).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Run and step changes as they commit (`GET /v1/events`).
    pub events: Arc<events::Events>,
    /// What keeps local steps away from Scarab's files on this kernel.
    pub step_isolation: crate::executor::local::confine::Isolation,
    /// The last forward-progress check and when it ran.
    progress:
        Arc<tokio::sync::Mutex<Option<(std::time::Instant, forward_progress::ProgressReport)>>>,
}

/// Tasks of a running service, for an orderly stop.
pub struct Running {
    pub service: Service,
    /// Let go of when the service is dropped after `stop`.
    _lock: Option<StateDirLock>,
    shutdown: watch::Sender<bool>,
    driver: tokio::task::JoinHandle<()>,
    dispatcher: tokio::task::JoinHandle<()>,
    sweep: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops taking inputs, lets the current transaction finish and returns once every
    /// task that holds the store has ended, so the store can be opened again at once.
    /// Running steps are left alone: the next start re-adopts them.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.driver.await;
        let _ = self.dispatcher.await;
        let _ = self.sweep.await;
    }
}

/// The process's umask before `private_files` tightened it: what steps get back.
static STEP_UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// The variable through which a supervisor learns the umask to give its step back.
pub const STEP_UMASK_VAR: &str = "SCARAB_SUPERVISOR_STEP_UMASK";

/// Makes everything this process writes from now on private (umask 077: files 0600,
/// directories 0700, whatever umask the service was started with), and returns the umask
/// it had, which steps get back. Idempotent.
pub fn private_files() -> u32 {
    *STEP_UMASK.get_or_init(|| {
        use rustix::fs::Mode;
        rustix::process::umask(Mode::from_bits_truncate(0o077)).bits()
    })
}

/// Opens (or creates) the state dir as a private directory: created 0700; one that
/// another user can write is refused (they could replace the store or plant attempt
/// directories); the directory and what Scarab keeps at its top are tightened to 0700
/// and 0600 if an older version or a permissive umask left them looser.
pub fn prepare_state_dir(root: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    private_files();
    let fail = |source: std::io::Error| StartError::StateDir {
        path: root.display().to_string(),
        source,
    };
    if std::fs::metadata(root).is_ok_and(|meta| !meta.is_dir()) {
        return Err(fail(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            "it is a file, not a directory",
        )));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
        .map_err(fail)?;
    let mode = std::fs::metadata(root).map_err(fail)?.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(fail(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("other users can write it (mode {mode:o}); make it 0700 (chmod 700)"),
        )));
    }
    for (path, private) in [
        (root.to_path_buf(), 0o700),
        (root.join("attempts"), 0o700),
        (root.join("scarab.redb"), 0o600),
        (root.join("admin.token"), 0o600),
        (root.join("step-token.key"), 0o600),
    ] {
        match std::fs::metadata(&path) {
            Ok(meta) if meta.permissions().mode() & 0o077 != 0 => {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(private))
                    .map_err(fail)?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(e)),
        }
    }
    Ok(())
}

/// Opens the state dir and starts the service with the local executor.
pub async fn start(
    state_dir: StateDir,
    settings: Settings,
    supervisor_exe: PathBuf,
) -> Result<Running, StartError> {
    prepare_state_dir(&state_dir.root)?;
    let attempts = state_dir.attempts();
    let steps = crate::executor::local::StepSettings {
        kill_grace: settings.kill_grace,
        env_passthrough: settings.step_env_passthrough.clone(),
        protected: settings.step_protected.clone(),
        live: settings.live.clone(),
    };
    let isolation = crate::executor::local::confine::Isolation::of_kernel();
    match isolation {
        crate::executor::local::confine::Isolation::Landlock { abi } => {
            tracing::info!(abi, "local steps are confined with Landlock");
        }
        crate::executor::local::confine::Isolation::None => tracing::warn!(
            "this kernel has no Landlock: local steps can read and write the state dir \
             (step_isolation: none); see docs/security.md"
        ),
    }
    let client = match &settings.kubernetes {
        Some(kube) => Some(kube_client(kube).await?),
        None => None,
    };
    let kube_settings = settings.kubernetes.clone();
    let pod_logs = client
        .clone()
        .zip(kube_settings.as_ref())
        .map(|(client, kube)| kube::Api::namespaced(client, &kube.namespace));
    let mut running = start_with(state_dir, settings, move |reports| {
        let kubernetes = client.zip(kube_settings).map(|(client, kube)| {
            let settings = crate::executor::kubernetes::KubeSettings {
                namespace: kube.namespace,
                grace: kube.grace,
                delete_grace: kube.delete_grace,
                attempts_dir: attempts.clone(),
            };
            KubeExecutor::start(client, settings, reports.clone())
        });
        let local = LocalExecutor::new(attempts, supervisor_exe, steps, reports)
            .map_err(|e| StartError::Executor(e.to_string()))?;
        Ok(Executors { local, kubernetes })
    })
    .await?;
    running.service.pod_logs = pod_logs;
    running.service.step_isolation = isolation;
    Ok(running)
}

/// A kube client with explicit timeouts, from a kubeconfig file or the in-cluster
/// environment.
async fn kube_client(settings: &KubernetesSettings) -> Result<kube::Client, StartError> {
    let error = |e: &dyn std::fmt::Display| StartError::Executor(format!("kubernetes client: {e}"));
    let mut config = match &settings.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| error(&e))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| error(&e))?
        }
        None => kube::Config::incluster().map_err(|e| error(&e))?,
    };
    // Spelled out: a hung API server must not hang a launch or the watch forever.
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(330));
    config.write_timeout = Some(Duration::from_secs(10));
    kube::Client::try_from(config).map_err(|e| error(&e))
}

/// Opens the state dir and starts the driver, the dispatcher and the executor that
/// `executor` builds around the reports channel. Returns once re-adoption of in-flight
/// attempts has been handed to the executor.
pub async fn start_with<E: Executor>(
    state_dir: StateDir,
    settings: Settings,
    executor: impl FnOnce(mpsc::Sender<Report>) -> Result<E, StartError>,
) -> Result<Running, StartError> {
    std::fs::create_dir_all(&state_dir.root).map_err(|source| StartError::StateDir {
        path: state_dir.root.display().to_string(),
        source,
    })?;
    let lock = lock_state_dir(&state_dir.root)?;
    let store = Arc::new(Store::open(&state_dir.database())?);
    let mut running = start_on(state_dir, store, settings, executor).await?;
    running._lock = Some(lock);
    Ok(running)
}

/// `start_with` on a store already open (the crash-point simulation opens its own).
pub(crate) async fn start_on<E: Executor>(
    state_dir: StateDir,
    store: Arc<Store>,
    settings: Settings,
    executor: impl FnOnce(mpsc::Sender<Report>) -> Result<E, StartError>,
) -> Result<Running, StartError> {
    let settings = Arc::new(settings);
    let (reports_tx, reports_rx) = mpsc::channel(crate::limits::INPUT_QUEUE_MAX);
    let executor = executor(reports_tx)?;
    let (commands_tx, commands_rx) = mpsc::channel(crate::limits::INPUT_QUEUE_MAX);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (ready_tx, ready_rx) = watch::channel(false);
    let outbox = dispatch::Outbox::new();
    let metrics: Arc<crate::metrics::Metrics> = Arc::default();
    let events: Arc<events::Events> = Arc::default();

    let reserve = state_dir.reserve();
    if let Err(error) = disk::make_reserve(&reserve) {
        tracing::warn!(%error, path = %reserve.display(), "cannot keep space in reserve");
    }
    let driver = driver::Driver::recover(
        store.clone(),
        settings.clone(),
        executor.clone(),
        outbox.clone(),
        metrics.clone(),
        reserve,
        events.clone(),
    )
    .await?;
    let driver = tokio::spawn(driver.run(commands_rx, reports_rx, shutdown_rx.clone(), ready_tx));
    let dispatcher = tokio::spawn(dispatch::run(
        store.clone(),
        settings.clone(),
        executor,
        outbox.clone(),
        commands_tx.clone(),
        shutdown_rx.clone(),
    ));
    let sweep_stats: Arc<sweep::SweepStats> = Arc::default();
    let sweep = tokio::spawn(sweep::run(
        store.clone(),
        commands_tx.clone(),
        settings.clone(),
        (sweep_stats.clone(), metrics.clone()),
        shutdown_rx.clone(),
    ));
    let service = Service {
        store,
        state_dir,
        settings,
        commands: commands_tx,
        ready: ready_rx,
        outbox,
        pod_logs: None,
        step_isolation: crate::executor::local::confine::Isolation::None,
        progress: Arc::default(),
        sweep_stats,
        metrics,
        events,
    };
    service.wait_ready().await;
    Ok(Running {
        service,
        _lock: None,
        shutdown: shutdown_tx,
        driver,
        dispatcher,
        sweep,
    })
}

#[derive(Debug, thiserror::Error)]
#[error("the service is shutting down")]
pub struct ShuttingDown;

impl Service {
    async fn wait_ready(&self) {
        let mut ready = self.ready.clone();
        let _ = ready.wait_for(|r| *r).await;
    }

    /// Each executor that has been used, and the error of its last delivery if that
    /// failed (it is unavailable until a delivery succeeds again).
    pub fn executor_availability(&self) -> Vec<(&'static str, Option<String>)> {
        self.outbox.availability()
    }

    /// The forward-progress check (`forward_progress::check`), at most one fresh pass per
    /// `PROGRESS_CHECK_MIN_INTERVAL`; callers in between get the last report.
    pub async fn forward_progress(&self) -> Result<forward_progress::ProgressReport, StoreError> {
        let mut last = self.progress.lock().await;
        if let Some((at, report)) = last.as_ref()
            && at.elapsed() < crate::limits::PROGRESS_CHECK_MIN_INTERVAL
        {
            return Ok(report.clone());
        }
        let store = self.store.clone();
        let report = tokio::task::spawn_blocking(move || forward_progress::check(&store))
            .await
            .map_err(|e| StoreError::Corrupt(format!("progress check panicked: {e}")))??;
        self.metrics
            .unreadable_runs
            .set(i64::try_from(report.unreadable.len()).unwrap_or(i64::MAX));
        *last = Some((std::time::Instant::now(), report.clone()));
        Ok(report)
    }

    /// The metrics in Prometheus text format, with the stored-state gauges read now.
    pub fn metrics_text(&self) -> Result<String, StoreError> {
        let read = self.store.read()?;
        let m = &self.metrics;
        for (state, count) in read.run_counts()? {
            m.runs
                .get_or_create(&crate::metrics::StateLabel {
                    state: state.as_str().to_string(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        m.outbox_depth
            .set(i64::try_from(read.outbox_depth()?).unwrap_or(i64::MAX));
        m.dead_letter_queue
            .set(i64::try_from(read.dead_letter_count()?).unwrap_or(i64::MAX));
        let age = read.oldest_outbox_created()?.map_or(0, |created| {
            crate::clock::now().0.saturating_sub(created.0) / 1000
        });
        m.outbox_oldest_age
            .set(i64::try_from(age).unwrap_or(i64::MAX));
        for (name, error) in self.executor_availability() {
            m.executor_available
                .get_or_create(&crate::metrics::ExecutorLabel {
                    executor: name.to_string(),
                })
                .set(i64::from(error.is_none()));
        }
        m.ready.set(i64::from(self.is_ready()));
        m.encode()
            .map_err(|_| StoreError::Corrupt("encoding metrics failed".into()))
    }

    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Commits a new run (durably) and returns its id.
    pub async fn submit(
        &self,
        source: PipelineSource,
        pipeline: Arc<Pipeline>,
        origin: String,
        admission: crate::engine::RunAdmission,
        idempotency_key: Option<String>,
    ) -> Result<Submitted, SubmitError> {
        self.request(|reply| Command::Submit {
            source,
            pipeline,
            origin,
            admission,
            idempotency_key,
            reply,
        })
        .await
    }

    /// Admission control as it stands: pools, locks, and what waits (for one run, or all).
    pub async fn queue(&self, run: Option<RunId>) -> Result<protocol::QueueView, ShuttingDown> {
        self.ask(|reply| Command::Queue { run, reply }).await
    }

    /// Puts a dead letter back in the outbox with a fresh delivery budget.
    pub async fn requeue(&self, id: u64, by: String) -> Result<(), DlqError> {
        self.request(|reply| Command::Requeue { id, by, reply })
            .await
    }

    /// Drops a dead letter for good; the reason is kept in the run's history.
    pub async fn discard(&self, id: u64, by: String, reason: String) -> Result<(), DlqError> {
        self.request(|reply| Command::Discard {
            id,
            by,
            reason,
            reply,
        })
        .await
    }

    /// Stores outputs for the step's attempt with this fence, if it is the current one.
    pub async fn set_outputs(
        &self,
        run: RunId,
        step: usize,
        fence: crate::engine::Fence,
        outputs: Vec<(String, String)>,
    ) -> Result<(), OutputError> {
        self.request(|reply| Command::SetOutputs {
            run,
            step,
            fence,
            outputs,
            reply,
        })
        .await
    }

    /// Approves or rejects the gate `step` of `run`; `caller` is the authenticated identity
    /// and `by` the name the person gave.
    pub async fn decide(
        &self,
        run: RunId,
        step: String,
        approve: bool,
        by: String,
        caller: String,
        comment: Option<String>,
    ) -> Result<Decided, DecideError> {
        self.request(|reply| Command::Decide {
            run,
            step,
            approve,
            by,
            caller,
            comment,
            reply,
        })
        .await
    }

    /// Answers once the driver loop has taken this command: it is not wedged.
    pub async fn ping(&self) -> Result<(), ShuttingDown> {
        self.ask(|reply| Command::Ping { reply }).await
    }

    /// Sends a request and waits for the driver's answer: the domain's, or the store's
    /// failure, or `ShuttingDown` when the driver is gone.
    async fn request<T, E: std::error::Error + 'static>(
        &self,
        command: impl FnOnce(Answer<T, E>) -> Command,
    ) -> Result<T, ServiceError<E>> {
        self.ask(command)
            .await
            .map_err(|_| ServiceError::ShuttingDown)?
    }

    /// Sends the command built around a reply channel and waits for the driver's answer.
    async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, ShuttingDown> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(command(reply))
            .await
            .map_err(|_| ShuttingDown)?;
        answer.await.map_err(|_| ShuttingDown)
    }

    /// Releases a quarantined run for a fresh try.
    /// Re-runs a finished run: its steps that did not succeed and, with `from`, that step
    /// and everything downstream of it. The names of the steps that start over.
    pub async fn retry(
        &self,
        run: RunId,
        from: Option<String>,
        by: String,
    ) -> Result<Vec<String>, RunActionError> {
        self.request(|reply| Command::Retry {
            run,
            from,
            by,
            reply,
        })
        .await
    }

    pub async fn create_schedule(
        &self,
        schedule: StoredSchedule,
    ) -> Result<StoredSchedule, ServiceError<ScheduleRejected>> {
        self.request(|reply| Command::CreateSchedule {
            schedule: Box::new(schedule),
            reply,
        })
        .await
    }

    /// Pauses, resumes or deletes a schedule; the schedule as it is now, `None` once
    /// deleted.
    pub async fn schedule_action(
        &self,
        name: String,
        action: ScheduleAction,
    ) -> Result<Option<StoredSchedule>, ServiceError<ScheduleRejected>> {
        self.request(|reply| Command::Schedule {
            name,
            action,
            reply,
        })
        .await
    }

    pub async fn release(&self, run: RunId, by: String) -> Result<(), RunActionError> {
        self.request(|reply| Command::Release { run, by, reply })
            .await
    }

    /// Discards a quarantined run: it is never auto-retried again.
    pub async fn discard_run(
        &self,
        run: RunId,
        by: String,
        reason: String,
    ) -> Result<(), RunActionError> {
        self.request(|reply| Command::DiscardRun {
            run,
            by,
            reason,
            reply,
        })
        .await
    }

    /// One auto-retry pass now, whether or not the sweep is enabled (the periodic task
    /// checks that).
    pub async fn sweep_pass(&self) -> Result<sweep::PassOutcome, StoreError> {
        let settings = self.settings.live().auto_retry.clone();
        let stats = (self.sweep_stats.clone(), self.metrics.clone());
        sweep::pass(&self.store, &self.commands, &settings, &stats).await
    }

    pub async fn cancel(&self, run: RunId, by: String) -> Result<(), RunActionError> {
        self.request(|reply| Command::Cancel { run, by, reply })
            .await
    }
}

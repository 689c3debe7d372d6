//! The Kubernetes adapter: one Pod per attempt, one watch for all of them.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;

use super::classify::{GracePeriods, PodVerdict, judge};
use super::pod::{self, CONTAINER, SELECTOR};
use crate::engine::{FailureClass, Fence, KillReason, Outcome, RunId, Verdict};
use crate::executor::{Adoption, Executor, ExecutorError, Report, Target};
use crate::store::records::{LaunchAction, LaunchRecord};

/// How the service reaches its cluster.
#[derive(Clone, Debug)]
pub struct KubeSettings {
    pub namespace: String,
    pub grace: GracePeriods,
    /// Grace Scarab gives a Pod it deletes (a cancel, a timeout, a zombie).
    pub delete_grace: Duration,
    /// Where finished attempts' logs are archived (`<dir>/<fence>/stdout.log`).
    pub attempts_dir: PathBuf,
}

#[derive(Clone)]
pub struct KubeExecutor {
    inner: Arc<Inner>,
}

struct Inner {
    api: Api<Pod>,
    settings: KubeSettings,
    reports: mpsc::Sender<Report>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Attempts being supervised, by Pod name.
    tracked: HashMap<String, Tracked>,
    /// The latest copy of every managed Pod, as the watch delivers it.
    /// Ordered by name, so the Pods of one step (`{run}-s{step}-f…`) are one range.
    pods: std::collections::BTreeMap<String, Pod>,
    /// Pods seen during the current relist (between the watch's Init and InitDone).
    relisting: Option<HashSet<String>>,
    /// True once the watch has listed everything at least once.
    synced: bool,
    /// Stops requested before the attempt's Pod was created: the launch never creates it.
    stopped_early: HashMap<Fence, KillReason>,
    /// When a ResourceQuota first refused each attempt's Pod (in memory: a restart starts
    /// the wait again).
    quota_since: HashMap<Fence, std::time::Instant>,
    /// The start-up reconciliation (foreign Pods deleted, fences counted) is still to
    /// succeed: it retries in the background, and no Pod is created meanwhile.
    unreconciled: bool,
    /// Stale Pods found at start and not deleted yet, by name: no launch of their step
    /// creates (or adopts) a Pod until they are gone, since one may still run.
    zombies: std::collections::BTreeSet<String>,
    /// The highest fence a background reconciliation found, for the driver.
    fence_floor: Option<Fence>,
}

#[derive(Clone)]
struct Tracked {
    run: RunId,
    step: usize,
    fence: Fence,
    kill: Option<KillReason>,
    /// Did the main container ever start, as of the latest copy judged?
    started: bool,
}

impl KubeExecutor {
    /// Starts the one watch over every managed Pod (relisting on 410 Gone with backoff)
    /// and a ticker that re-judges waiting Pods from the watch's copies, so grace periods
    /// expire without any per-Pod request.
    pub fn start(
        client: kube::Client,
        settings: KubeSettings,
        reports: mpsc::Sender<Report>,
    ) -> KubeExecutor {
        let api = Api::namespaced(client, &settings.namespace);
        let executor = KubeExecutor {
            inner: Arc::new(Inner {
                api,
                settings,
                reports,
                state: Mutex::new(State::default()),
            }),
        };
        tokio::spawn(executor.clone().watch());
        tokio::spawn(executor.clone().tick());
        executor
    }

    async fn watch(self) {
        let config = watcher::Config::default().labels(SELECTOR);
        let mut events = watcher(self.inner.api.clone(), config)
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => self.on_event(event).await,
                Err(error) => tracing::warn!(%error, "kubernetes watch error; retrying"),
            }
        }
    }

    async fn tick(self) {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let names: Vec<String> = self.lock().tracked.keys().cloned().collect();
            for name in names {
                self.judge_tracked(&name).await;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn on_event(&self, event: watcher::Event<Pod>) {
        let mut gone = Vec::new();
        let mut changed = Vec::new();
        {
            let mut state = self.lock();
            match event {
                watcher::Event::Init => state.relisting = Some(HashSet::new()),
                watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => {
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    if let Some(seen) = state.relisting.as_mut() {
                        seen.insert(name.clone());
                    }
                    state.pods.insert(name.clone(), pod);
                    changed.push(name);
                }
                watcher::Event::Delete(pod) => {
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    state.pods.remove(&name);
                    gone.push(name);
                }
                watcher::Event::InitDone => {
                    // Whatever the relist did not show is gone.
                    let seen = state.relisting.take().unwrap_or_default();
                    let vanished: Vec<String> = state
                        .pods
                        .keys()
                        .filter(|n| !seen.contains(*n))
                        .cloned()
                        .collect();
                    for name in &vanished {
                        state.pods.remove(name);
                    }
                    gone.extend(vanished);
                    gone.extend(
                        state
                            .tracked
                            .keys()
                            .filter(|n| !state.pods.contains_key(*n))
                            .cloned(),
                    );
                    state.synced = true;
                }
            }
        }
        for name in changed {
            self.judge_tracked(&name).await;
        }
        for name in gone {
            self.on_gone(&name).await;
        }
    }

    /// Judges a supervised Pod from its latest copy; reports and stops supervising once
    /// it has a verdict.
    async fn judge_tracked(&self, name: &str) {
        let (tracked, pod) = {
            let state = self.lock();
            match (state.tracked.get(name), state.pods.get(name)) {
                (Some(tracked), Some(pod)) => (tracked.clone(), pod.clone()),
                _ => return,
            }
        };
        let judgement = judge(
            &pod,
            CONTAINER,
            crate::clock::now(),
            &self.inner.settings.grace,
        );
        if judgement.started
            && let Some(t) = self.lock().tracked.get_mut(name)
        {
            t.started = true;
        }
        if !matches!(
            judgement.verdict,
            PodVerdict::Succeeded | PodVerdict::Failed
        ) {
            return;
        }
        let outcome = match (tracked.kill, judgement.class) {
            (Some(KillReason::Cancel | KillReason::Budget), _) => Outcome::Stopped,
            // The engine backstop counts from the launch; a Pod stopped before its container
            // ever ran (a long pull, unschedulable) never started: not a step timeout.
            (Some(KillReason::Timeout), _) if !judgement.started => {
                Outcome::Failed(FailureClass::InfraNeverStarted)
            }
            (Some(KillReason::Timeout), _) => Outcome::Failed(FailureClass::Timeout),
            (None, Some(class)) => Outcome::Failed(class),
            (None, None) => Outcome::Succeeded,
        };
        let verdict = Verdict {
            outcome,
            started: judgement.started,
            reason: format!("{} (rule {})", judgement.reason, judgement.rule),
            exit_code: judgement.exit_code,
            started_at: None,
            finished_at: crate::clock::now(),
        };
        self.archive_logs(name, tracked.fence).await;
        // The verdict first: the deletion's watch event must find nothing left to judge.
        self.finish(name, tracked, verdict).await;
        if judgement.delete {
            self.delete(name).await;
        }
    }

    /// A supervised Pod vanished before it gave a verdict.
    async fn on_gone(&self, name: &str) {
        let Some(tracked) = self.lock().tracked.get(name).cloned() else {
            return;
        };
        let outcome = match tracked.kill {
            Some(KillReason::Cancel | KillReason::Budget) => Outcome::Stopped,
            Some(KillReason::Timeout) if !tracked.started => {
                Outcome::Failed(FailureClass::InfraNeverStarted)
            }
            Some(KillReason::Timeout) => Outcome::Failed(FailureClass::Timeout),
            None => Outcome::Failed(FailureClass::Lost),
        };
        let verdict = Verdict {
            outcome,
            started: true,
            reason: "the Pod is gone (404) after its creation was confirmed".into(),
            exit_code: None,
            started_at: None,
            finished_at: crate::clock::now(),
        };
        self.finish(name, tracked, verdict).await;
    }

    async fn finish(&self, name: &str, tracked: Tracked, verdict: Verdict) {
        if self.lock().tracked.remove(name).is_none() {
            return;
        }
        let report = Report {
            run: tracked.run,
            step: tracked.step,
            fence: tracked.fence,
            verdict,
        };
        let _ = self.inner.reports.send(report).await;
    }

    fn track(&self, name: &str, tracked: Tracked) {
        self.lock().tracked.insert(name.to_string(), tracked);
    }

    /// Deletes a Pod (gone already is fine). Callers that own an outbox message return
    /// the error so the message is retried; the others log it.
    async fn try_delete(&self, name: &str) -> Result<(), ExecutorError> {
        let grace = u32::try_from(self.inner.settings.delete_grace.as_secs()).unwrap_or(u32::MAX);
        let params = DeleteParams {
            grace_period_seconds: Some(grace),
            ..DeleteParams::default()
        };
        match self.inner.api.delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(unavailable(&error)),
        }
    }

    async fn delete(&self, name: &str) {
        if let Err(error) = self.try_delete(name).await {
            tracing::warn!(pod = name, %error, "deleting a Pod failed");
        }
    }

    /// Keeps what the step printed after its Pod is gone: `scarab logs` reads the archive.
    async fn archive_logs(&self, name: &str, fence: Fence) {
        let params = LogParams {
            container: Some(CONTAINER.to_string()),
            limit_bytes: Some(
                i64::try_from(crate::limits::LOG_CHUNK_MAX_BYTES * 16).unwrap_or(i64::MAX),
            ),
            ..LogParams::default()
        };
        let Ok(text) = self.inner.api.logs(name, &params).await else {
            return;
        };
        let dir =
            crate::executor::local::files::attempt_dir(&self.inner.settings.attempts_dir, fence);
        if std::fs::create_dir_all(&dir).is_ok() {
            let _ = crate::executor::local::files::write_atomic(
                &dir,
                crate::executor::local::files::STDOUT,
                text.as_bytes(),
                false,
            );
        }
    }

    /// Reports a launch that never produced a running Pod.
    async fn report_now(&self, order: &LaunchRecord, outcome: Outcome, reason: String) {
        let verdict = Verdict {
            outcome,
            started: false,
            reason,
            exit_code: None,
            started_at: None,
            finished_at: crate::clock::now(),
        };
        let report = Report {
            run: order.run,
            step: usize::from(order.step),
            fence: order.fence,
            verdict,
        };
        let _ = self.inner.reports.send(report).await;
    }

    fn tracked_from(order: &LaunchRecord) -> Tracked {
        Tracked {
            run: order.run,
            step: usize::from(order.step),
            fence: order.fence,
            kill: None,
            started: false,
        }
    }
}

fn unavailable(error: &kube::Error) -> ExecutorError {
    ExecutorError::Unavailable(format!("kubernetes API: {error}"))
}

impl Executor for KubeExecutor {
    async fn launch(&self, order: &LaunchRecord) -> Result<(), ExecutorError> {
        let LaunchAction::Kubernetes(template) = &order.action else {
            return Err(ExecutorError::Unavailable("not a kubernetes step".into()));
        };
        let stopped_early = self.lock().stopped_early.remove(&order.fence);
        if let Some(reason) = stopped_early {
            let outcome = match reason {
                KillReason::Cancel | KillReason::Budget => Outcome::Stopped,
                KillReason::Timeout => Outcome::Failed(FailureClass::InfraNeverStarted),
            };
            self.report_now(order, outcome, "stopped before its Pod was created".into())
                .await;
            return Ok(());
        }
        let manifest = pod::build(order, template);
        let name = pod::pod_name(order.run, usize::from(order.step), order.fence);
        {
            let state = self.lock();
            if state.unreconciled {
                return Err(ExecutorError::Unavailable(
                    "the start-up reconciliation with the cluster has not succeeded yet".into(),
                ));
            }
            let prefix = pod::step_prefix(order.run, usize::from(order.step));
            if let Some(stale) = state
                .zombies
                .range(prefix.clone()..)
                .next()
                .filter(|stale| stale.starts_with(&prefix))
            {
                return Err(ExecutorError::Unavailable(format!(
                    "a stale Pod of this step, {stale}, is being deleted"
                )));
            }
            if let Some(previous) = earlier_pod_not_over(&state.pods, order) {
                return Err(ExecutorError::Unavailable(format!(
                    "waiting for the Pod {previous} of an earlier attempt of this step to be gone"
                )));
            }
        }
        match self
            .inner
            .api
            .create(&PostParams::default(), &manifest)
            .await
        {
            Ok(_) => {
                self.lock().quota_since.remove(&order.fence);
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Created by an earlier delivery of this launch: adopt it only if it is
                // this very attempt.
                let existing = self
                    .inner
                    .api
                    .get(&name)
                    .await
                    .map_err(|e| unavailable(&e))?;
                if pod::identity(&existing)
                    != Some((order.run, usize::from(order.step), order.fence))
                {
                    let reason =
                        format!("a Pod named {name} exists but belongs to another attempt");
                    self.report_now(order, Outcome::Failed(FailureClass::Config), reason)
                        .await;
                    return Ok(());
                }
                self.lock().pods.insert(name.clone(), existing);
            }
            Err(kube::Error::Api(status)) if status.code == 422 => {
                let reason = format!("Pod rejected by the API server: {}", status.message);
                self.report_now(order, Outcome::Failed(FailureClass::Config), reason)
                    .await;
                return Ok(());
            }
            // Pod Security admission: the Pod as written can never be admitted here.
            Err(kube::Error::Api(status))
                if status.code == 403 && status.message.contains("violates PodSecurity") =>
            {
                let reason = format!("Pod Security admission refused the Pod: {}", status.message);
                self.report_now(order, Outcome::Failed(FailureClass::Config), reason)
                    .await;
                return Ok(());
            }
            // A used-up ResourceQuota clears when other Pods end: wait (the outbox
            // redelivers with backoff) until the pending grace, then give up: it never
            // started.
            Err(kube::Error::Api(status))
                if status.code == 403 && status.message.contains("exceeded quota") =>
            {
                let grace = self.inner.settings.grace.pending;
                let waited = {
                    let mut state = self.lock();
                    let since = *state
                        .quota_since
                        .entry(order.fence)
                        .or_insert_with(std::time::Instant::now);
                    since.elapsed()
                };
                if waited < grace {
                    return Err(ExecutorError::Unavailable(format!(
                        "waiting for room in a ResourceQuota ({}s of {}s): {}",
                        waited.as_secs(),
                        grace.as_secs(),
                        status.message
                    )));
                }
                self.lock().quota_since.remove(&order.fence);
                let reason = format!(
                    "no room in a ResourceQuota for {}s (kubernetes.grace_pending): {}",
                    grace.as_secs(),
                    status.message
                );
                self.report_now(
                    order,
                    Outcome::Failed(FailureClass::InfraNeverStarted),
                    reason,
                )
                .await;
                return Ok(());
            }
            Err(error) => return Err(unavailable(&error)),
        }
        self.track(&name, Self::tracked_from(order));
        self.judge_tracked(&name).await;
        Ok(())
    }

    async fn kill(&self, target: Target, reason: KillReason) -> Result<(), ExecutorError> {
        let name = {
            let mut state = self.lock();
            let found = state
                .tracked
                .iter_mut()
                .find(|(_, t)| t.fence == target.fence);
            let Some((name, tracked)) = found else {
                // Not created yet (its launch is still in the outbox): it never will be.
                state.stopped_early.insert(target.fence, reason);
                return Ok(());
            };
            tracked.kill = Some(reason);
            name.clone()
        };
        // The verdict follows from the watch: the Pod ends or disappears.
        self.try_delete(&name).await
    }

    async fn adopt(&self, adoption: &Adoption) -> Result<(), ExecutorError> {
        let name = pod::pod_name(adoption.run, adoption.step, adoption.fence);
        self.track(
            &name,
            Tracked {
                run: adoption.run,
                step: adoption.step,
                fence: adoption.fence,
                kill: None,
                started: false,
            },
        );
        let (present, synced) = {
            let state = self.lock();
            (state.pods.contains_key(&name), state.synced)
        };
        if present {
            self.judge_tracked(&name).await;
        } else if synced {
            self.on_gone(&name).await;
        }
        // Not synced yet: the watch's first listing settles it.
        Ok(())
    }

    async fn clean_up(&self, target: Target) -> Result<(), ExecutorError> {
        let name = {
            let state = self.lock();
            state
                .pods
                .iter()
                .find(|(_, pod)| {
                    pod::identity(pod).is_some_and(|(_, _, fence)| fence == target.fence)
                })
                .map(|(name, _)| name.clone())
        };
        if let Some(name) = name {
            self.try_delete(&name).await?;
        }
        // The archived logs go with the Pod.
        let dir = crate::executor::local::files::attempt_dir(
            &self.inner.settings.attempts_dir,
            target.fence,
        );
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(ExecutorError::Io {
                path: dir.display().to_string(),
                source,
            }),
        }
    }

    fn fence_floor(&self) -> Option<Fence> {
        self.lock().fence_floor.take()
    }

    /// The start-up reconciliation: one LIST (readiness waits for it, not for the
    /// deletions, which run in the background, bounded). If the API cannot be reached it
    /// is retried in the background with backoff until it succeeds; until then no Pod is
    /// created, and the fence counter is raised through `fence_floor` once it did.
    async fn recover(
        &self,
        inflight: &[Adoption],
        minted_below: Fence,
        retained: &crate::executor::Retained,
    ) -> Result<Option<Fence>, ExecutorError> {
        let wanted: HashSet<(RunId, usize, Fence)> =
            inflight.iter().map(|a| (a.run, a.step, a.fence)).collect();
        let retained = retained.clone();
        match self.reconcile(&wanted, &retained, minted_below).await {
            Ok(highest) => Ok(highest),
            Err(error) => {
                self.lock().unreconciled = true;
                let me = self.clone();
                tokio::spawn(async move {
                    let mut wait = Duration::from_secs(1);
                    loop {
                        tokio::time::sleep(wait).await;
                        match me.reconcile(&wanted, &retained, minted_below).await {
                            Ok(highest) => {
                                let mut state = me.lock();
                                state.unreconciled = false;
                                state.fence_floor = highest;
                                tracing::warn!(
                                    ?highest,
                                    "start-up reconciliation with the cluster done"
                                );
                                return;
                            }
                            Err(error) => {
                                tracing::warn!(%error, retry_in = ?wait, "start-up reconciliation with the cluster failed");
                                wait = (wait * 2).min(Duration::from_secs(30));
                            }
                        }
                    }
                });
                Err(error)
            }
        }
    }
}

/// A Pod of an earlier attempt of the same step that is not over (its phase is not
/// terminal: it may still start or run, also while it is being deleted): a retry waits for
/// it to be gone (a DELETED event takes it out of the watch's copy), so two attempts of a
/// step never run at once. Kept Pods of finished attempts run nothing and do not count.
/// Looks only at the range of names of this step's Pods, not at every Pod.
fn earlier_pod_not_over(
    pods: &std::collections::BTreeMap<String, Pod>,
    order: &LaunchRecord,
) -> Option<String> {
    let step = usize::from(order.step);
    let prefix = pod::step_prefix(order.run, step);
    let mut of_step = pods
        .range(prefix.clone()..)
        .take_while(|(name, _)| name.starts_with(&prefix));
    of_step.find_map(|(name, pod)| {
        let (run, pod_step, fence) = pod::identity(pod)?;
        let over = is_over(pod);
        (run == order.run && pod_step == step && fence < order.fence && !over).then(|| name.clone())
    })
}

/// The Pod's phase is terminal: its containers run nothing more.
fn is_over(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

impl KubeExecutor {
    /// One paged LIST of the managed Pods. Those of in-flight attempts (run, step and
    /// fence all match) are kept for the watch; so are the ended Pods of finished
    /// attempts still within their retention (`retained`). The others are deleted in the
    /// background (at most 16 at a time): Pods of attempts past their retention or that
    /// this store does not know (a newer lineage after a restore), a Pod still running for
    /// an attempt that has ended, and foreign zombies. The highest plausible fence seen.
    async fn reconcile(
        &self,
        wanted: &HashSet<(RunId, usize, Fence)>,
        retained: &crate::executor::Retained,
        minted_below: Fence,
    ) -> Result<Option<Fence>, ExecutorError> {
        let mut stale = Vec::new();
        let mut highest = None;
        let mut continue_token: Option<String> = None;
        loop {
            let mut params = ListParams::default().labels(SELECTOR).limit(500);
            if let Some(token) = &continue_token {
                params = params.continue_token(token);
            }
            let page = self
                .inner
                .api
                .list(&params)
                .await
                .map_err(|e| unavailable(&e))?;
            for found in &page.items {
                let name = found.metadata.name.clone().unwrap_or_default();
                match pod::identity(found) {
                    Some(id @ (_, _, fence)) if fence.is_plausible(minted_below) => {
                        highest = highest.max(Some(fence));
                        let (run, step, _) = id;
                        if wanted.contains(&id) || (is_over(found) && retained(run, step, fence)) {
                            self.lock().pods.insert(name, found.clone());
                        } else {
                            tracing::warn!(pod = %name, %fence, "deleting a Pod that belongs to no in-flight attempt and is not kept for retention");
                            stale.push(name);
                        }
                    }
                    // Labels that cannot be read, or a fence no store of this lineage
                    // could have minted: a foreign zombie, deleted, its fence not counted.
                    identity => {
                        let fence = identity.map(|(_, _, fence)| fence);
                        tracing::warn!(pod = %name, ?fence, "deleting a managed Pod without a plausible run, step and fence");
                        if !name.is_empty() {
                            stale.push(name);
                        }
                    }
                }
            }
            continue_token = page.metadata.continue_.filter(|t| !t.is_empty());
            if continue_token.is_none() {
                break;
            }
        }
        self.delete_stale(stale);
        Ok(highest)
    }

    /// Deletes stale Pods in the background, 16 at a time, each retried with backoff until
    /// it is gone; their names are barred from launches until then.
    fn delete_stale(&self, names: Vec<String>) {
        if names.is_empty() {
            return;
        }
        self.lock().zombies.extend(names.iter().cloned());
        let me = self.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            futures::stream::iter(names)
                .for_each_concurrent(16, |name| {
                    let me = me.clone();
                    async move {
                        let mut wait = Duration::from_millis(200);
                        while let Err(error) = me.try_delete(&name).await {
                            tracing::warn!(pod = %name, %error, "deleting a stale Pod failed; retrying");
                            tokio::time::sleep(wait).await;
                            wait = (wait * 2).min(Duration::from_secs(30));
                        }
                        me.lock().zombies.remove(&name);
                    }
                })
                .await;
        });
    }
}

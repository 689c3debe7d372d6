//! Start-up: the store's non-terminal runs loaded, the executors' recovery (foreign attempts stopped, the fence counter raised above every plausible fence seen), and re-adoption of confirmed attempts.

use super::*;

impl<E: Executor> Driver<E> {
    /// counter above every fence the executor has seen.
    pub async fn recover(
        store: Arc<Store>,
        settings: Arc<Settings>,
        executor: E,
        outbox: Outbox,
        metrics: Arc<crate::metrics::Metrics>,
        reserve: std::path::PathBuf,
        events: Arc<crate::service::events::Events>,
    ) -> Result<Driver<E>, StoreError> {
        let engine = Engine::new(settings.engine.clone());
        let scheduler = Scheduler::new(settings.live().admission.clone());
        let mut driver = Driver {
            store,
            settings,
            engine,
            executor,
            outbox,
            runs: HashMap::new(),
            fences: FenceCounter::starting_at(1),
            next_timer: None,
            backstops: backstops::Backstops::default(),
            next_retention: None,
            scheduler,
            last_run_id: None,
            reserve,
            reported_skew_ms: 0,
            loaded: Vec::new(),
            metrics,
            started_at: Timestamp(0),
            events,
            parked: Vec::new(),
        };
        driver.reload().await?;
        // Schedule fires due before now came due while no service ran: missed.
        driver.started_at = clock::now();
        Ok(driver)
    }

    /// The executors' question at start: is this finished attempt's trace still within
    /// its log retention? Yes while its run is in progress (an earlier attempt of a
    /// retried step, a step before the current one) or ended less than
    /// `engine.log_retention` ago; no for an attempt this store does not know. A store
    /// that cannot be read answers yes: nothing is deleted on a guess.
    fn retained(&self) -> crate::executor::Retained {
        let store = self.store.clone();
        let retention = self.settings.engine.log_retention;
        Arc::new(move |run, step, fence| {
            let stored = match store.read().and_then(|read| read.run(run)) {
                Ok(stored) => stored,
                Err(error) => {
                    tracing::warn!(%run, %error, "cannot read a run to judge its retention: its traces are kept");
                    return true;
                }
            };
            let Some(stored) = stored else {
                return false;
            };
            let known = stored
                .steps
                .get(step)
                .is_some_and(|progress| progress.attempts.iter().any(|a| a.fence == fence));
            let ended_at = stored.header.updated_at;
            known
                && (!stored.header.state.is_terminal()
                    || ended_at.plus(retention).0 > clock::now().0)
        })
    }

    /// Loads every non-terminal run, lets the executor recover (stop foreign attempts,
    /// report the highest fence it holds) and raises the fence counter above it, all
    /// before anything new can be minted.
    pub(super) async fn reload(&mut self) -> Result<(), StoreError> {
        let read = self.store.read()?;
        let stored_next = read.fence_next()?;
        // Time never goes back across a restart, whatever the wall clock says.
        if let Some(last) = read.clock_last()? {
            clock::anchor_at_least(last);
        }
        self.fences = FenceCounter::starting_at(stored_next);
        self.runs.clear();
        self.loaded.clear();
        for id in read.active_run_ids()? {
            // One run that cannot be read back must not keep the others from starting: it
            // is logged, counted and named by /readyz (the progress check), and left as
            // it is.
            let stored = match read.run(id) {
                Ok(Some(stored)) => Ok(stored),
                Ok(None) => continue,
                Err(error) => {
                    self.metrics.unreadable_records.inc();
                    Err(error.to_string())
                }
            };
            match stored.and_then(rebuild) {
                Ok(run) => {
                    self.runs.insert(id, run);
                }
                Err(error) => {
                    tracing::error!(run = %id, %error, "cannot restore a stored run; it is left as it is")
                }
            }
        }
        self.next_timer = read.next_timer_due()?;
        self.next_retention = read.next_retention_due(self.retention_ms())?;
        drop(read);
        self.backstops = backstops::Backstops::of(self.runs.values());
        // Every active step of the loaded runs (re-adopted below) holds its slots and
        // locks before anything new is admitted.
        self.scheduler = Scheduler::new(self.settings.live().admission.clone());
        self.scheduler.sync_all(self.runs.values());
        let inflight = self.in_flight(|_| true);
        let retained = self.retained();
        match self
            .executor
            .recover(&inflight, crate::engine::Fence(stored_next), &retained)
            .await
        {
            Ok(Some(seen)) => {
                if !self.fences.raise_above(seen) {
                    tracing::error!(%seen, "an executor reported an implausible fence; the counter is not raised");
                }
            }
            Ok(None) => {}
            Err(error) => {
                tracing::error!(%error, "executor recovery failed; fences it holds may be unknown")
            }
        }
        if self.fences.next_value() > stored_next {
            tracing::warn!(
                from = stored_next,
                to = self.fences.next_value(),
                "fence counter raised above fences found on the executor"
            );
            let mut tx = self.store.write()?;
            tx.set_fence_next(self.fences.next_value())?;
            tx.commit()?;
        }
        Ok(())
    }

    /// The in-flight attempts of the loaded runs that `which` selects.
    pub(super) fn in_flight(
        &self,
        which: impl Fn(&crate::engine::Attempt) -> bool,
    ) -> Vec<Adoption> {
        let mut found = Vec::new();
        for run in self.runs.values() {
            for (step, progress) in run.steps.iter().enumerate() {
                let executor = ExecutorKind::of(&run.pipeline.steps[step].action);
                let attempt = progress.in_flight().filter(|a| which(a));
                if let Some((attempt, executor)) = attempt.zip(executor) {
                    found.push(Adoption {
                        run: run.id(),
                        step,
                        fence: attempt.fence,
                        executor,
                    });
                }
            }
        }
        found
    }

    /// Hands every attempt confirmed before the restart back to the executor, then
    /// declares the service ready. Attempts whose launch was never confirmed still have
    /// their launch message in the outbox, which the dispatcher redelivers under the same
    /// fence. Runs as its own task: adoption may report verdicts, which this loop applies.
    pub(super) fn readopt(&self, ready: Option<watch::Sender<bool>>) {
        let adoptions =
            self.in_flight(|a| matches!(a.state, crate::engine::AttemptState::Running { .. }));
        tracing::info!(
            attempts = adoptions.len(),
            runs = self.runs.len(),
            "re-adopting in-flight attempts"
        );
        let executor = self.executor.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let count = adoptions.len();
            for adoption in adoptions {
                if let Err(error) = executor.adopt(&adoption).await {
                    tracing::error!(fence = %adoption.fence, %error, "re-adoption failed");
                }
            }
            tracing::info!(
                attempts = count,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "re-adoption complete"
            );
            if let Some(ready) = ready {
                let _ = ready.send(true);
            }
        });
    }
}

/// Rebuilds the engine's run from its stored parts, re-validating the stored pipeline.
pub fn rebuild(stored: StoredRun) -> Result<Run, String> {
    let pipeline = parse_stored(&stored.source)?;
    if pipeline.steps.len() != stored.steps.len() {
        return Err(format!(
            "stored run has {} steps but its pipeline has {}",
            stored.steps.len(),
            pipeline.steps.len()
        ));
    }
    Ok(Run {
        header: stored.header,
        pipeline: Arc::new(pipeline),
        steps: stored.steps,
    })
}

pub fn parse_stored(source: &PipelineSource) -> Result<Pipeline, String> {
    let format = match source.format {
        SourceFormat::Yaml => Format::Yaml,
        SourceFormat::Json => Format::Json,
    };
    let binding = match &source.params {
        Some(values) => pipeline::Binding::Values(values),
        None => pipeline::Binding::Off,
    };
    pipeline::parse_with(&source.text, format, binding)
        .map(|outcome| outcome.pipeline)
        .map_err(|errors| {
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        })
}

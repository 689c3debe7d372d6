//! Admission control (docs/admission.md): which ready steps may start now.
//!
//! A ready step that cannot start is `queued` and passes four stages in order, each a
//! queue ordered by the run's admission key (priority aged by waiting, then submit order):
//!
//! 1. **group**: the run's concurrency group has a free run slot. A run that passes holds
//!    it until the run ends (gate waits included); its later steps skip this stage.
//! 2. **parallelism**: fewer than `parallelism` of the run's steps are active or past
//!    this stage.
//! 3. **locks**: every lock the step names has room, and no earlier step waits for any
//!    of them. The step takes them all at once (none while it waits), so two steps can
//!    never deadlock on locks.
//! 4. **pool**: its pool (`local` or `kubernetes`) has room for its slots. The first
//!    step of a pool's queue keeps the pool for itself until enough slots are free, so a
//!    step needing many slots is never overtaken forever by small ones.
//!
//! Everything a step took before it is admitted is taken for it (a lock, a group slot),
//! so a later step cannot overtake it there; steps held up at an earlier stage take
//! nothing from the later ones, so a pool never idles while a step that could use it
//! waits behind one waiting for a lock. Priority ages: a run of priority P submitted at
//! t is ordered as if submitted at t - P x `aging`, so whatever arrives later, a waiting
//! step is eventually first.
//!
//! The scheduler is pure and in memory: what it holds is a function of the runs'
//! committed state (active steps hold, queued steps wait, `group_held` runs hold their
//! group), rebuilt from the store at start, so a crash can neither leak a slot nor hand
//! one out twice. Each decision costs O(log n) in the number of queued steps: heads of
//! ordered sets, never a scan of a queue.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::state::{AttemptState, Run, StepState};
use super::{RunId, Timestamp};
use crate::pipeline::StepAction;

/// Whether a step that became ready may start now. The engine asks when a step becomes
/// ready; `false` leaves it `queued` until the driver admits it (`Input::Admit`).
pub trait Admission {
    /// On `true` the step's slots, locks and group slot are taken for it.
    fn admit(&mut self, run: &Run, step: usize, now: Timestamp) -> bool;
}

/// Admits everything (engine tests, and tools without limits).
pub struct Unlimited;

impl Admission for Unlimited {
    fn admit(&mut self, _: &Run, _: usize, _: Timestamp) -> bool {
        true
    }
}

/// A pool of step slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pool {
    Local,
    Kubernetes,
}

impl Pool {
    pub const ALL: [Pool; 2] = [Pool::Local, Pool::Kubernetes];

    pub fn as_str(self) -> &'static str {
        match self {
            Pool::Local => "local",
            Pool::Kubernetes => "kubernetes",
        }
    }

    fn index(self) -> usize {
        match self {
            Pool::Local => 0,
            Pool::Kubernetes => 1,
        }
    }

    fn of(action: &StepAction) -> Option<Pool> {
        match action {
            StepAction::Local(_) => Some(Pool::Local),
            StepAction::Kubernetes(_) => Some(Pool::Kubernetes),
            StepAction::Gate(_) => None,
        }
    }
}

/// The configured limits (reloadable).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Slots of local steps (`engine.max_parallel_local`).
    pub local: u32,
    /// Pods at once (`kubernetes.max_pods`).
    pub pods: u32,
    /// Named locks and their limits (`[[locks]]`).
    pub locks: BTreeMap<String, u32>,
    /// One point of priority is worth this much waiting, in milliseconds.
    pub aging_ms: u64,
    /// Runs in progress (not terminal) at most: a submission beyond is refused, so the
    /// queue is bounded (`engine.max_active_runs`).
    pub active_runs: u32,
    /// Local steps admitted beyond `local` while the pool is full (`engine.prepared_local`):
    /// their launch is prepared (a supervisor waits at the launch handshake) so that a freed
    /// slot starts the next step at once. What runs stays within `local`: a prepared launch
    /// starts only when [`Scheduler::may_start`] says so.
    pub prepared_local: u32,
}

impl Limits {
    pub fn pool(&self, pool: Pool) -> u32 {
        match pool {
            Pool::Local => self.local,
            Pool::Kubernetes => self.pods,
        }
    }

    /// The slots a pool may have admitted at once: its limit, plus the launches prepared
    /// ahead for the local pool.
    fn admitted(&self, pool: Pool) -> u64 {
        let prepared = match pool {
            Pool::Local => self.prepared_local,
            Pool::Kubernetes => 0,
        };
        u64::from(self.pool(pool)) + u64::from(prepared)
    }

    /// The slots a step asking for `slots` takes of `pool`: never more than the whole pool,
    /// so after a reload lowered the limit below them it waits for the pool to be empty.
    pub fn slots_of(&self, pool: Pool, slots: u32) -> u32 {
        slots.min(self.pool(pool).max(1))
    }

    /// A lock the configuration no longer names (removed by a reload while steps still
    /// name it) keeps a limit of 1.
    pub fn lock(&self, name: &str) -> u32 {
        self.locks.get(name).copied().unwrap_or(1)
    }
}

impl Limits {
    /// What of a pipeline these limits can never admit: a step's `slots` above its pool's
    /// limit, a lock the configuration does not name. Checked at submit; each error names
    /// its field.
    pub fn check(&self, pipeline: &crate::pipeline::Pipeline) -> Vec<crate::pipeline::FieldError> {
        let mut errors = Vec::new();
        let mut error = |field: String, message: String| {
            errors.push(crate::pipeline::FieldError {
                field,
                line: None,
                message,
            })
        };
        for (index, step) in pipeline.steps.iter().enumerate() {
            if let Some(pool) = Pool::of(&step.action) {
                let limit = self.pool(pool);
                if step.slots > limit {
                    let key = match pool {
                        Pool::Local => "engine.max_parallel_local",
                        Pool::Kubernetes => "kubernetes.max_pods",
                    };
                    error(
                        format!("steps[{index}].slots"),
                        format!(
                            "{} is more than the pool's limit {limit} ({key})",
                            step.slots
                        ),
                    );
                }
            }
            for (i, lock) in step.locks.iter().enumerate() {
                if !self.locks.contains_key(lock) {
                    let known: Vec<&str> = self.locks.keys().map(String::as_str).collect();
                    let known = if known.is_empty() {
                        "the configuration has no [[locks]]".to_string()
                    } else {
                        format!("configured: {}", known.join(", "))
                    };
                    error(
                        format!("steps[{index}].locks[{i}]"),
                        format!("unknown lock {lock:?} ({known})"),
                    );
                }
            }
        }
        errors
    }
}

/// What a queued step waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitingFor {
    Group,
    Parallelism,
    Lock,
    Pool,
}

impl WaitingFor {
    pub const ALL: [WaitingFor; 4] = [
        WaitingFor::Group,
        WaitingFor::Parallelism,
        WaitingFor::Lock,
        WaitingFor::Pool,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WaitingFor::Group => "group",
            WaitingFor::Parallelism => "parallelism",
            WaitingFor::Lock => "lock",
            WaitingFor::Pool => "pool",
        }
    }

    fn index(self) -> usize {
        match self {
            WaitingFor::Group => 0,
            WaitingFor::Parallelism => 1,
            WaitingFor::Lock => 2,
            WaitingFor::Pool => 3,
        }
    }
}

/// A queued step's wait, as shown to people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    pub run: RunId,
    pub step: usize,
    pub reason: WaitingFor,
    /// The group, the lock or the pool; the run's id for `parallelism`.
    pub name: String,
    /// 1 for the first in that queue.
    pub position: usize,
    pub since: Timestamp,
}

/// The order of admission: earlier first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    order: i64,
    run: RunId,
    step: usize,
}

#[derive(Debug)]
struct Hold {
    pool: Option<Pool>,
    slots: u32,
    locks: Vec<String>,
    /// Decided by the scheduler; the engine has not minted the attempt yet.
    pending: bool,
    /// Its attempt is launching: admitted, not yet started.
    launching: bool,
}

#[derive(Debug)]
struct Queued {
    key: Key,
    pool: Option<Pool>,
    slots: u32,
    locks: Vec<String>,
    stage: WaitingFor,
    /// Counted in the run's parallelism.
    passed_parallelism: bool,
    /// Its locks are taken for it (it waits at the pool stage).
    locks_taken: bool,
    since: Timestamp,
}

#[derive(Debug)]
struct RunEntry {
    order: i64,
    group: Option<(String, u32)>,
    parallelism: Option<u32>,
    /// Holds (or has been given) a slot of its group.
    member: bool,
    holds: BTreeMap<usize, Hold>,
    queued: BTreeMap<usize, Queued>,
}

impl RunEntry {
    /// Where the run's `step` stands in admission order.
    fn key(&self, run: RunId, step: usize) -> Key {
        Key {
            order: self.order,
            run,
            step,
        }
    }

    /// Steps counted against the run's parallelism: active ones and queued ones past
    /// that stage.
    fn parallel(&self) -> u32 {
        let active = self.holds.values().filter(|h| h.pool.is_some()).count();
        let passed = self
            .queued
            .values()
            .filter(|q| q.passed_parallelism)
            .count();
        u32::try_from(active + passed).unwrap_or(u32::MAX)
    }
}

#[derive(Default)]
struct Dirty {
    pools: [bool; 2],
    groups: BTreeSet<String>,
    runs: BTreeSet<RunId>,
    locks: BTreeSet<String>,
}

impl Dirty {
    fn is_empty(&self) -> bool {
        !self.pools.iter().any(|p| *p)
            && self.groups.is_empty()
            && self.runs.is_empty()
            && self.locks.is_empty()
    }
}

/// Pools, locks, groups and per-run parallelism: who holds what and who waits, in order.
pub struct Scheduler {
    limits: Limits,
    runs: HashMap<RunId, RunEntry>,
    /// Slots held per pool: by running steps and by launches not yet started.
    pool_used: [u64; 2],
    /// Per pool, the launches not yet started, in admission order (their slots).
    launching: [BTreeMap<Key, u32>; 2],
    launching_slots: [u64; 2],
    lock_used: HashMap<String, u32>,
    group_members: HashMap<String, HashSet<RunId>>,
    /// Runs waiting at the group stage, by (order, run).
    group_wait: HashMap<String, BTreeSet<(i64, RunId)>>,
    parallelism_wait: HashMap<RunId, BTreeSet<usize>>,
    lock_wait: HashMap<String, BTreeSet<Key>>,
    pool_wait: [BTreeSet<Key>; 2],
    waiting: [usize; 4],
    dirty: Dirty,
    decided: Vec<(RunId, usize)>,
}

impl Admission for Scheduler {
    fn admit(&mut self, run: &Run, step: usize, now: Timestamp) -> bool {
        if !self.runs.contains_key(&run.id()) {
            let entry = self.new_entry(run);
            self.runs.insert(run.id(), entry);
        }
        // Whatever this scheduler still had for the step is from before it became ready.
        self.release(run.id(), step);
        self.dequeue(run.id(), step);
        self.enqueue(run, step, now);
        self.process();
        let id = run.id();
        match self.decided.iter().position(|d| *d == (id, step)) {
            Some(index) => {
                self.decided.remove(index);
                if let Some(hold) = self.runs.get_mut(&id).and_then(|e| e.holds.get_mut(&step)) {
                    hold.pending = false;
                }
                true
            }
            None => false,
        }
    }
}

impl Scheduler {
    pub fn new(limits: Limits) -> Scheduler {
        Scheduler {
            limits,
            runs: HashMap::new(),
            pool_used: [0; 2],
            launching: [BTreeMap::new(), BTreeMap::new()],
            launching_slots: [0; 2],
            lock_used: HashMap::new(),
            group_members: HashMap::new(),
            group_wait: HashMap::new(),
            parallelism_wait: HashMap::new(),
            lock_wait: HashMap::new(),
            pool_wait: [BTreeSet::new(), BTreeSet::new()],
            waiting: [0; 4],
            dirty: Dirty::default(),
            decided: Vec::new(),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// New limits (a reload): nothing active is stopped; a lower limit only admits less
    /// until the pool drains below it, a higher one admits more at once.
    pub fn set_limits(&mut self, limits: Limits) {
        let reorder = limits.aging_ms != self.limits.aging_ms;
        self.limits = limits;
        if reorder {
            // The order of runs already queued stays as it was: their keys are fixed when
            // they enter the scheduler (a restart orders them with the new aging).
            tracing::info!("engine.priority_aging changed: it orders runs queued from now on");
        }
        self.dirty.pools = [true; 2];
        self.dirty.locks.extend(self.lock_wait.keys().cloned());
        self.dirty.groups.extend(self.group_wait.keys().cloned());
        self.process();
    }

    /// Slots held per pool: by every admitted step, launches not yet started included.
    pub fn used(&self, pool: Pool) -> u64 {
        self.pool_used[pool.index()]
    }

    /// Slots in use per pool: held by steps that started. Launches prepared ahead wait
    /// at the launch handshake and use none yet.
    pub fn started(&self, pool: Pool) -> u64 {
        self.pool_used[pool.index()] - self.launching_slots[pool.index()]
    }

    /// Launches admitted to `pool` that have not started yet.
    pub fn launching(&self, pool: Pool) -> usize {
        self.launching[pool.index()].len()
    }

    /// Whether the launch of `step` may start now: the slots of the steps that started,
    /// of the launches not yet started that come before it in admission order (priority
    /// aged by waiting, then submit order), and its own fit within the pool's limit. So
    /// what runs never exceeds the limit, and launches start in admission order whenever
    /// they were admitted: a launch prepared ahead does not start before a step of
    /// higher priority admitted after it, nor before a step needing many slots. A step
    /// that holds no slots, or whose launch started already, may.
    pub fn may_start(&self, id: RunId, step: usize) -> bool {
        let Some(entry) = self.runs.get(&id) else {
            return true;
        };
        let Some(hold) = entry.holds.get(&step) else {
            return true;
        };
        let (Some(pool), true) = (hold.pool, hold.launching) else {
            return true;
        };
        let key = entry.key(id, step);
        let ahead: u64 = self.launching[pool.index()]
            .range(..=key)
            .map(|(_, slots)| u64::from(*slots))
            .sum();
        self.started(pool) + ahead <= u64::from(self.limits.pool(pool))
    }

    /// Records whether the step's attempt is still launching (its launch not started).
    /// Only local launches are held at the launch handshake; a Pod starts as it is
    /// created, so a Kubernetes step counts as started from its admission.
    fn set_launching(&mut self, id: RunId, step: usize, launching: bool) {
        let Some(entry) = self.runs.get_mut(&id) else {
            return;
        };
        let key = entry.key(id, step);
        let Some(hold) = entry.holds.get_mut(&step) else {
            return;
        };
        if hold.pool != Some(Pool::Local) || hold.launching == launching {
            return;
        }
        hold.launching = launching;
        let pool = Pool::Local.index();
        if launching {
            self.launching[pool].insert(key, hold.slots);
            self.launching_slots[pool] += u64::from(hold.slots);
        } else {
            self.launching[pool].remove(&key);
            self.launching_slots[pool] -= u64::from(hold.slots);
        }
    }

    pub fn lock_used(&self, name: &str) -> u32 {
        self.lock_used.get(name).copied().unwrap_or(0)
    }

    /// Queued steps by what they wait for.
    pub fn waiting(&self, reason: WaitingFor) -> usize {
        self.waiting[reason.index()]
    }

    /// Runs holding (or given) a slot of `group`.
    pub fn group_members(&self, group: &str) -> usize {
        self.group_members.get(group).map_or(0, HashSet::len)
    }

    /// Whether admissions wait to be committed.
    pub fn has_decided(&self) -> bool {
        !self.decided.is_empty()
    }

    /// The runs of `group` still waiting for a slot of it, in admission order.
    pub fn group_waiting(&self, group: &str) -> Vec<RunId> {
        self.group_wait
            .get(group)
            .map(|w| w.iter().map(|(_, id)| *id).collect())
            .unwrap_or_default()
    }

    /// The steps decided since the last call: the driver admits each (`Input::Admit`)
    /// in the transaction that recorded what freed their slot.
    pub fn take_decided(&mut self) -> Vec<(RunId, usize)> {
        std::mem::take(&mut self.decided)
    }

    /// Brings the scheduler in line with a run's state (call after every change to a
    /// run, and for every run at start): active steps hold, queued steps wait, a
    /// terminal run holds nothing. Then admits what the change made room for; the steps
    /// decided are in [`Scheduler::take_decided`].
    pub fn sync(&mut self, run: &Run) {
        self.reconcile(run);
        self.process();
    }

    /// Forgets a run (it ended, or it is no longer loaded).
    pub fn forget(&mut self, id: RunId) {
        self.remove_run(id);
        self.process();
    }

    /// Like [`Scheduler::sync`] for many runs, admitting only once all are counted: at
    /// start, every re-adopted attempt holds its slot before anything new is admitted.
    pub fn sync_all<'a>(&mut self, runs: impl IntoIterator<Item = &'a Run>) {
        for run in runs {
            self.reconcile(run);
        }
        self.process();
    }

    fn new_entry(&mut self, run: &Run) -> RunEntry {
        let admission = &run.header.admission;
        let group = admission.group.as_ref().map(|g| (g.group.clone(), g.limit));
        let member = admission.group_held && group.is_some();
        if let (true, Some((name, _))) = (member, &group) {
            self.group_members
                .entry(name.clone())
                .or_default()
                .insert(run.id());
        }
        let aging = i64::try_from(self.limits.aging_ms).unwrap_or(i64::MAX);
        let created = i64::try_from(run.header.created_at.0).unwrap_or(i64::MAX);
        RunEntry {
            order: created.saturating_sub(i64::from(admission.priority).saturating_mul(aging)),
            group,
            parallelism: admission.parallelism,
            member,
            holds: BTreeMap::new(),
            queued: BTreeMap::new(),
        }
    }

    fn reconcile(&mut self, run: &Run) {
        let id = run.id();
        if run.header.state.is_terminal() {
            self.remove_run(id);
            return;
        }
        if !self.runs.contains_key(&id) {
            let entry = self.new_entry(run);
            self.runs.insert(id, entry);
        }
        if run.header.admission.group_held {
            self.join_group(id);
        }
        for (step, progress) in run.steps.iter().enumerate() {
            let entry = &self.runs[&id];
            let held = entry.holds.contains_key(&step);
            let queued = entry.queued.contains_key(&step);
            match &progress.state {
                StepState::Active => {
                    if let Some(hold) = self.runs.get_mut(&id).and_then(|e| e.holds.get_mut(&step))
                    {
                        hold.pending = false;
                    } else {
                        // Active without a decision of this scheduler: re-adopted at start, or
                        // an operator's requeue. It holds what it takes, whatever the limit.
                        self.dequeue(id, step);
                        self.force_hold(run, step);
                    }
                    let launching = progress
                        .in_flight()
                        .is_some_and(|a| a.state == AttemptState::Launching);
                    self.set_launching(id, step, launching);
                }
                StepState::Queued { since } => {
                    if held {
                        let pending = self.runs[&id].holds[&step].pending;
                        if !pending {
                            tracing::error!(run = %id, step, "bug: a queued step holds slots; released");
                            self.release(id, step);
                            self.enqueue(run, step, *since);
                        }
                    } else if !queued {
                        self.enqueue(run, step, *since);
                    }
                }
                _ => {
                    self.release(id, step);
                    self.dequeue(id, step);
                }
            }
        }
    }

    fn join_group(&mut self, id: RunId) {
        let Some(entry) = self.runs.get_mut(&id) else {
            return;
        };
        if entry.member {
            return;
        }
        let Some((name, _)) = entry.group.clone() else {
            return;
        };
        entry.member = true;
        let order = entry.order;
        self.group_members
            .entry(name.clone())
            .or_default()
            .insert(id);
        if let Some(wait) = self.group_wait.get_mut(&name) {
            wait.remove(&(order, id));
        }
        let steps: Vec<usize> = self.runs[&id]
            .queued
            .iter()
            .filter(|(_, q)| q.stage == WaitingFor::Group)
            .map(|(s, _)| *s)
            .collect();
        for step in steps {
            self.after_group(id, step);
        }
    }

    fn force_hold(&mut self, run: &Run, step: usize) {
        let spec = &run.pipeline.steps[step];
        let pool = Pool::of(&spec.action);
        let slots = pool.map_or(0, |p| self.limits.slots_of(p, spec.slots));
        if let Some(pool) = pool {
            self.pool_used[pool.index()] += u64::from(slots);
        }
        for lock in &spec.locks {
            *self.lock_used.entry(lock.clone()).or_default() += 1;
        }
        let hold = Hold {
            pool,
            slots,
            locks: spec.locks.clone(),
            pending: false,
            launching: false,
        };
        if let Some(entry) = self.runs.get_mut(&run.id()) {
            entry.holds.insert(step, hold);
        }
    }

    /// A step that stopped being active gives back what it held.
    fn release(&mut self, id: RunId, step: usize) {
        self.set_launching(id, step, false);
        let Some(hold) = self.runs.get_mut(&id).and_then(|e| e.holds.remove(&step)) else {
            return;
        };
        if let Some(pool) = hold.pool {
            let used = &mut self.pool_used[pool.index()];
            *used = used.saturating_sub(u64::from(hold.slots));
            self.dirty.pools[pool.index()] = true;
            self.dirty.runs.insert(id);
        }
        self.release_locks(&hold.locks);
    }

    fn release_locks(&mut self, locks: &[String]) {
        for lock in locks {
            if let Some(used) = self.lock_used.get_mut(lock) {
                *used = used.saturating_sub(1);
            }
            self.dirty.locks.insert(lock.clone());
        }
    }

    fn remove_run(&mut self, id: RunId) {
        let Some(entry) = self.runs.get(&id) else {
            return;
        };
        let steps: Vec<usize> = entry
            .holds
            .keys()
            .chain(entry.queued.keys())
            .copied()
            .collect();
        for step in steps {
            self.release(id, step);
            self.dequeue(id, step);
        }
        if let Some(entry) = self.runs.remove(&id)
            && let Some((name, _)) = entry.group
        {
            if let Some(members) = self.group_members.get_mut(&name) {
                members.remove(&id);
                if members.is_empty() {
                    self.group_members.remove(&name);
                }
            }
            self.dirty.groups.insert(name);
        }
        self.parallelism_wait.remove(&id);
        self.dirty.runs.remove(&id);
    }

    fn set_stage(&mut self, id: RunId, step: usize, stage: WaitingFor) {
        if let Some(queued) = self.runs.get_mut(&id).and_then(|e| e.queued.get_mut(&step)) {
            self.waiting[queued.stage.index()] -= 1;
            queued.stage = stage;
            self.waiting[stage.index()] += 1;
        }
    }

    /// A step that became ready enters the first stage it needs.
    fn enqueue(&mut self, run: &Run, step: usize, since: Timestamp) {
        let id = run.id();
        let spec = &run.pipeline.steps[step];
        let pool = Pool::of(&spec.action);
        let Some(entry) = self.runs.get_mut(&id) else {
            return;
        };
        let key = entry.key(id, step);
        entry.queued.insert(
            step,
            Queued {
                key,
                pool,
                slots: spec.slots,
                locks: spec.locks.clone(),
                stage: WaitingFor::Group,
                passed_parallelism: false,
                locks_taken: false,
                since,
            },
        );
        self.waiting[WaitingFor::Group.index()] += 1;
        match &entry.group {
            Some((name, _)) if !entry.member => {
                let name = name.clone();
                let order = entry.order;
                self.group_wait
                    .entry(name.clone())
                    .or_default()
                    .insert((order, id));
                self.dirty.groups.insert(name);
            }
            _ => self.after_group(id, step),
        }
    }

    /// Past the group stage: the parallelism stage, for a step that runs something.
    fn after_group(&mut self, id: RunId, step: usize) {
        let Some(entry) = self.runs.get(&id) else {
            return;
        };
        let Some(queued) = entry.queued.get(&step) else {
            return;
        };
        if queued.pool.is_none() {
            // A gate needs nothing but its group slot.
            self.decide(id, step);
            return;
        }
        match entry.parallelism {
            Some(_) => {
                self.set_stage(id, step, WaitingFor::Parallelism);
                self.parallelism_wait.entry(id).or_default().insert(step);
                self.dirty.runs.insert(id);
            }
            None => self.after_parallelism(id, step),
        }
    }

    /// Past the parallelism stage: the lock stage for a step that names locks.
    fn after_parallelism(&mut self, id: RunId, step: usize) {
        let Some(queued) = self.runs.get(&id).and_then(|e| e.queued.get(&step)) else {
            return;
        };
        if queued.locks.is_empty() {
            self.after_locks(id, step);
            return;
        }
        let key = queued.key;
        let locks = queued.locks.clone();
        self.set_stage(id, step, WaitingFor::Lock);
        for lock in locks {
            self.lock_wait.entry(lock.clone()).or_default().insert(key);
            self.dirty.locks.insert(lock);
        }
    }

    /// Past the lock stage (its locks taken for it): the pool stage.
    fn after_locks(&mut self, id: RunId, step: usize) {
        let Some(queued) = self.runs.get(&id).and_then(|e| e.queued.get(&step)) else {
            return;
        };
        let (key, pool) = (queued.key, queued.pool);
        let Some(pool) = pool else {
            self.decide(id, step);
            return;
        };
        self.set_stage(id, step, WaitingFor::Pool);
        self.pool_wait[pool.index()].insert(key);
        self.dirty.pools[pool.index()] = true;
    }

    /// The step is admitted: it holds what it took, and the driver is told.
    fn decide(&mut self, id: RunId, step: usize) {
        let Some(entry) = self.runs.get_mut(&id) else {
            return;
        };
        let Some(queued) = entry.queued.remove(&step) else {
            return;
        };
        self.waiting[queued.stage.index()] -= 1;
        entry.holds.insert(
            step,
            Hold {
                pool: queued.pool,
                slots: if queued.pool.is_some() {
                    queued.slots
                } else {
                    0
                },
                locks: queued.locks,
                pending: true,
                launching: false,
            },
        );
        // Its attempt is minted launching.
        self.set_launching(id, step, true);
        self.decided.push((id, step));
    }

    /// A queued step leaves the queue without being admitted (cancelled, skipped, its
    /// run ended): it gives back what was taken for it.
    fn dequeue(&mut self, id: RunId, step: usize) {
        let Some(entry) = self.runs.get_mut(&id) else {
            return;
        };
        let Some(queued) = entry.queued.remove(&step) else {
            return;
        };
        self.waiting[queued.stage.index()] -= 1;
        match queued.stage {
            WaitingFor::Group => {
                let still = entry.queued.values().any(|q| q.stage == WaitingFor::Group);
                if let (false, Some((name, _))) = (still, &entry.group)
                    && let Some(wait) = self.group_wait.get_mut(name)
                {
                    wait.remove(&(entry.order, id));
                    if wait.is_empty() {
                        self.group_wait.remove(name);
                    }
                }
            }
            WaitingFor::Parallelism => {
                if let Some(wait) = self.parallelism_wait.get_mut(&id) {
                    wait.remove(&step);
                }
            }
            WaitingFor::Lock => {
                for lock in &queued.locks {
                    if let Some(wait) = self.lock_wait.get_mut(lock) {
                        wait.remove(&queued.key);
                        if wait.is_empty() {
                            self.lock_wait.remove(lock);
                        }
                    }
                    self.dirty.locks.insert(lock.clone());
                }
            }
            WaitingFor::Pool => {
                if let Some(pool) = queued.pool {
                    self.pool_wait[pool.index()].remove(&queued.key);
                    self.dirty.pools[pool.index()] = true;
                }
            }
        }
        if queued.locks_taken {
            self.release_locks(&queued.locks);
        }
        if queued.passed_parallelism {
            self.dirty.runs.insert(id);
        }
    }

    /// Admits everything that can be, until no queue can move.
    fn process(&mut self) {
        while !self.dirty.is_empty() {
            if let Some(group) = self.dirty.groups.pop_first() {
                self.process_group(&group);
            } else if let Some(run) = self.dirty.runs.pop_first() {
                self.process_parallelism(run);
            } else if let Some(lock) = self.dirty.locks.pop_first() {
                self.process_lock(&lock);
            } else if let Some(pool) = Pool::ALL.into_iter().find(|p| self.dirty.pools[p.index()]) {
                self.dirty.pools[pool.index()] = false;
                self.process_pool(pool);
            }
        }
    }

    fn process_group(&mut self, group: &str) {
        loop {
            let Some(&(_, id)) = self.group_wait.get(group).and_then(|w| w.first()) else {
                self.group_wait.remove(group);
                return;
            };
            let limit = self
                .runs
                .get(&id)
                .and_then(|e| e.group.as_ref())
                .map_or(1, |g| g.1);
            let members = self.group_members.get(group).map_or(0, HashSet::len);
            if members >= usize::try_from(limit).unwrap_or(usize::MAX) {
                return;
            }
            self.join_group(id);
        }
    }

    fn process_parallelism(&mut self, id: RunId) {
        loop {
            let Some(entry) = self.runs.get(&id) else {
                return;
            };
            let Some(limit) = entry.parallelism else {
                return;
            };
            let Some(&step) = self.parallelism_wait.get(&id).and_then(|w| w.first()) else {
                self.parallelism_wait.remove(&id);
                return;
            };
            if entry.parallel() >= limit {
                return;
            }
            if let Some(wait) = self.parallelism_wait.get_mut(&id) {
                wait.remove(&step);
            }
            if let Some(queued) = self.runs.get_mut(&id).and_then(|e| e.queued.get_mut(&step)) {
                queued.passed_parallelism = true;
            }
            self.after_parallelism(id, step);
        }
    }

    fn process_lock(&mut self, lock: &str) {
        loop {
            let Some(&key) = self.lock_wait.get(lock).and_then(|w| w.first()) else {
                self.lock_wait.remove(lock);
                return;
            };
            let Some(queued) = self
                .runs
                .get(&key.run)
                .and_then(|e| e.queued.get(&key.step))
            else {
                // Never left behind by `dequeue`; dropped if it were.
                self.remove_lock_waiter(lock, key);
                continue;
            };
            let locks = queued.locks.clone();
            let free = locks.iter().all(|name| {
                self.lock_used(name) < self.limits.lock(name)
                    && self.lock_wait.get(name).and_then(|w| w.first()) == Some(&key)
            });
            if !free {
                return;
            }
            for name in &locks {
                *self.lock_used.entry(name.clone()).or_default() += 1;
                self.remove_lock_waiter(name, key);
                self.dirty.locks.insert(name.clone());
            }
            if let Some(queued) = self
                .runs
                .get_mut(&key.run)
                .and_then(|e| e.queued.get_mut(&key.step))
            {
                queued.locks_taken = true;
            }
            self.after_locks(key.run, key.step);
        }
    }

    fn remove_lock_waiter(&mut self, lock: &str, key: Key) {
        if let Some(wait) = self.lock_wait.get_mut(lock) {
            wait.remove(&key);
            if wait.is_empty() {
                self.lock_wait.remove(lock);
            }
        }
    }

    fn process_pool(&mut self, pool: Pool) {
        let limit = self.limits.admitted(pool);
        while let Some(&key) = self.pool_wait[pool.index()].first() {
            let Some(queued) = self
                .runs
                .get(&key.run)
                .and_then(|e| e.queued.get(&key.step))
            else {
                self.pool_wait[pool.index()].remove(&key);
                continue;
            };
            let slots = u64::from(self.limits.slots_of(pool, queued.slots));
            if self.pool_used[pool.index()] + slots > limit {
                return;
            }
            self.pool_wait[pool.index()].remove(&key);
            self.pool_used[pool.index()] += slots;
            if let Some(queued) = self
                .runs
                .get_mut(&key.run)
                .and_then(|e| e.queued.get_mut(&key.step))
            {
                queued.slots = u32::try_from(slots).unwrap_or(u32::MAX);
            }
            self.decide(key.run, key.step);
        }
    }

    /// What a queued step waits for, and its place in that queue.
    pub fn wait(&self, id: RunId, step: usize) -> Option<Wait> {
        let entry = self.runs.get(&id)?;
        let queued = entry.queued.get(&step)?;
        let key = queued.key;
        let (name, position) = match queued.stage {
            WaitingFor::Group => {
                let name = entry.group.as_ref().map_or(String::new(), |g| g.0.clone());
                let position = self
                    .group_wait
                    .get(&name)
                    .map_or(0, |w| w.range(..(entry.order, id)).count());
                (name, position)
            }
            WaitingFor::Parallelism => {
                let position = self
                    .parallelism_wait
                    .get(&id)
                    .map_or(0, |w| w.range(..step).count());
                (id.to_string(), position)
            }
            WaitingFor::Lock => {
                // The first lock that holds it up.
                let blocking = queued
                    .locks
                    .iter()
                    .find(|name| {
                        self.lock_used(name) >= self.limits.lock(name)
                            || self.lock_wait.get(*name).and_then(|w| w.first()) != Some(&key)
                    })
                    .or(queued.locks.first())
                    .cloned()
                    .unwrap_or_default();
                let position = self
                    .lock_wait
                    .get(&blocking)
                    .map_or(0, |w| w.range(..key).count());
                (blocking, position)
            }
            WaitingFor::Pool => {
                let pool = queued.pool.unwrap_or(Pool::Local);
                let position = self.pool_wait[pool.index()].range(..key).count();
                (pool.as_str().to_string(), position)
            }
        };
        Some(Wait {
            run: id,
            step,
            reason: queued.stage,
            name,
            position: position + 1,
            since: queued.since,
        })
    }

    /// Every queued step's wait, in admission order, at most `max`.
    pub fn queue(&self, max: usize) -> Vec<Wait> {
        let mut keys: Vec<Key> = self
            .runs
            .values()
            .flat_map(|e| e.queued.values().map(|q| q.key))
            .collect();
        keys.sort_unstable();
        keys.into_iter()
            .take(max)
            .filter_map(|k| self.wait(k.run, k.step))
            .collect()
    }

    /// The invariants the simulation checks after every input: nothing over a limit
    /// that was not over it already, and no queue that could move.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let mut pool_used = [0u64; 2];
        let mut lock_used: HashMap<&str, u32> = HashMap::new();
        for entry in self.runs.values() {
            for hold in entry.holds.values() {
                if let Some(pool) = hold.pool {
                    pool_used[pool.index()] += u64::from(hold.slots);
                }
                for lock in &hold.locks {
                    *lock_used.entry(lock).or_default() += 1;
                }
            }
            for queued in entry.queued.values().filter(|q| q.locks_taken) {
                for lock in &queued.locks {
                    *lock_used.entry(lock).or_default() += 1;
                }
            }
            if let Some(limit) = entry.parallelism
                && entry.parallel() > limit
            {
                return Err(format!("run over its parallelism {limit}"));
            }
        }
        for pool in Pool::ALL {
            if pool_used[pool.index()] != self.pool_used[pool.index()] {
                return Err(format!("{} pool count drifted", pool.as_str()));
            }
            let launching: u64 = self.launching[pool.index()]
                .values()
                .map(|s| u64::from(*s))
                .sum();
            let places = self
                .runs
                .values()
                .flat_map(|e| e.holds.values())
                .filter(|h| h.pool == Some(pool) && h.launching)
                .count();
            if launching != self.launching_slots[pool.index()]
                || places != self.launching[pool.index()].len()
            {
                return Err(format!("{} pool's launches drifted", pool.as_str()));
            }
            let limit = self.limits.admitted(pool);
            if pool_used[pool.index()] > limit {
                return Err(format!("{} pool over its limit", pool.as_str()));
            }
            if let Some(key) = self.pool_wait[pool.index()].first() {
                let queued = &self.runs[&key.run].queued[&key.step];
                let slots = u64::from(self.limits.slots_of(pool, queued.slots));
                if pool_used[pool.index()] + slots <= limit {
                    return Err(format!(
                        "{} pool has room but its first step waits",
                        pool.as_str()
                    ));
                }
            }
        }
        for (lock, used) in &lock_used {
            if self.lock_used(lock) != *used {
                return Err(format!("lock {lock} count drifted"));
            }
            if *used > self.limits.lock(lock) {
                return Err(format!("lock {lock} over its limit"));
            }
        }
        for (lock, wait) in &self.lock_wait {
            let Some(key) = wait.first() else { continue };
            let queued = &self.runs[&key.run].queued[&key.step];
            let free = queued.locks.iter().all(|name| {
                self.lock_used(name) < self.limits.lock(name)
                    && self.lock_wait.get(name).and_then(|w| w.first()) == Some(key)
            });
            if free {
                return Err(format!("lock {lock}'s first waiter could take its locks"));
            }
        }
        for (group, wait) in &self.group_wait {
            let Some((_, id)) = wait.first() else {
                continue;
            };
            let limit = self.runs[id].group.as_ref().map_or(1, |g| g.1);
            if self.group_members(group) < usize::try_from(limit).unwrap_or(usize::MAX) {
                return Err(format!("group {group} has room but its first run waits"));
            }
        }
        for (id, wait) in &self.parallelism_wait {
            if wait.is_empty() {
                continue;
            }
            let entry = &self.runs[id];
            if entry
                .parallelism
                .is_some_and(|limit| entry.parallel() < limit)
            {
                return Err(format!(
                    "run {id} has parallelism to spare but a step waits"
                ));
            }
        }
        Ok(())
    }
}

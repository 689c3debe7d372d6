//! The redb store: every table, index and the schema version declared in one place, and
//! typed transactions over them. One file holds the whole state.
//!
//! Writes go through [`WriteTx`], whose `commit` is durable (`Durability::Immediate`)
//! before it returns: a state change and its outbox messages land together or not at all.

pub mod codec;
pub mod records;
#[cfg(test)]
mod tests;

use std::path::Path;

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

use crate::engine::{Attempt, Fence, RunHeader, RunId, RunState, RunStep, Timestamp};
use records::{
    DeadLetter, HistoryRecord, OutboxMessage, PipelineSource, StoredRun, StoredSchedule, TimerKey,
    TimerKind,
};

/// Bumped when a table's layout or a record's meaning changes; `migrate` upgrades.
/// 2: the in-flight attempts index is gone (nothing read it: start-up finds in-flight
/// attempts in the active runs it loads), and so are the engine's backstop timers (each is
/// the `backstop_due` of its running attempt, which the driver keeps in memory); a
/// finished run's retention is found through the state index (`RETENTION_SWEPT`) rather
/// than by a timer of its own.
pub const SCHEMA_VERSION: u32 = 2;

type TimerKeyTuple = (u64, u128, u16, u8, u64);

/// Small singletons: schema version, fence counter, outbox id counter.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// RunId → `RunHeader`.
const RUNS: TableDefinition<u128, &[u8]> = TableDefinition::new("runs");
/// RunId → `PipelineSource`, written once per run.
const PIPELINES: TableDefinition<u128, &[u8]> = TableDefinition::new("pipelines");
/// (run, step index) → `StepState`.
const STEPS: TableDefinition<(u128, u16), &[u8]> = TableDefinition::new("steps");
/// (run, step index, attempt number) → `Attempt`.
const ATTEMPTS: TableDefinition<(u128, u16, u32), &[u8]> = TableDefinition::new("attempts");
/// Schema 1's index of attempts not yet finished (fence → (run, step, attempt number)),
/// deleted by the migration to schema 2.
const INFLIGHT_V1: &str = "inflight_attempts";
/// Index of runs by (state code, updated ms, run).
const RUNS_BY_STATE: TableDefinition<(u8, u64, u128), ()> = TableDefinition::new("runs_by_state");
/// Durable timers, keyed by due time first.
const TIMERS: TableDefinition<TimerKeyTuple, ()> = TableDefinition::new("timers");
/// Outbox message id → `OutboxMessage`.
const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
/// Index of outbox messages by (next delivery ms, id).
const OUTBOX_DUE: TableDefinition<(u64, u64), ()> = TableDefinition::new("outbox_due");
/// Append-only history: (run, sequence) → `HistoryRecord`.
const HISTORY: TableDefinition<(u128, u32), &[u8]> = TableDefinition::new("history");
/// The dead-letter queue: message id → `DeadLetter`.
const DEAD_LETTERS: TableDefinition<u64, &[u8]> = TableDefinition::new("dead_letters");
/// The auto-retry sweep's index: dead-lettered, auto-retryable runs by (eligible ms, run).
/// A pass reads it from the start up to now, never the runs table.
const AUTO_RETRY_DUE: TableDefinition<(u64, u128), ()> = TableDefinition::new("auto_retry_due");
/// How far the retention sweep has gone in each terminal state's part of the state index:
/// state code → the last (updated ms, run) it handed to clean-up.
const RETENTION_SWEPT: TableDefinition<u8, (u64, u128)> = TableDefinition::new("retention_swept");
/// Idempotency-Key → run.
const IDEMPOTENCY: TableDefinition<&str, u128> = TableDefinition::new("idempotency_keys");
/// Schedules by name (`records::StoredSchedule`).
const SCHEDULES: TableDefinition<&str, &[u8]> = TableDefinition::new("schedules");
/// (next fire ms, name) of every schedule that is not paused: the schedules' timers.
const SCHEDULE_DUE: TableDefinition<(u64, &str), ()> = TableDefinition::new("schedule_due");

const META_SCHEMA_VERSION: &str = "schema_version";
/// Set once the runs-per-state counters are kept (they are then exact).
const META_RUN_COUNTS: &str = "run_counts_kept";
const META_FENCE_NEXT: &str = "fence_next";
/// Scarab's time at the last commit: the next process's clock starts no earlier.
const META_CLOCK: &str = "clock_last_ms";
const META_OUTBOX_NEXT: &str = "outbox_next";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Redb(#[from] redb::Error),
    #[error("store record: {0}")]
    Codec(#[from] codec::CodecError),
    #[error(
        "store schema version {found} is newer than this build ({SCHEMA_VERSION}); upgrade scarab"
    )]
    SchemaTooNew { found: u64 },
    #[error("store is inconsistent: {0}")]
    Corrupt(String),
    #[error("store is closed: reopening it after an I/O error failed; retrying")]
    Closed,
}

impl StoreError {
    /// The filesystem is full (ENOSPC) or the quota is (EDQUOT).
    pub fn is_disk_full(&self) -> bool {
        let StoreError::Redb(error) = self else {
            return false;
        };
        match error {
            redb::Error::Io(io) => matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)),
            // redb keeps only the text of some I/O errors.
            other => {
                let text = other.to_string();
                text.contains("No space left on device") || text.contains("Disk quota exceeded")
            }
        }
    }

    /// redb refuses everything after an I/O error until the file is opened again.
    pub fn needs_reopen(&self) -> bool {
        matches!(
            self,
            StoreError::Redb(redb::Error::Io(_) | redb::Error::PreviousIo) | StoreError::Closed
        ) || self.is_disk_full()
    }
}

macro_rules! redb_into_store_error {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(error: $t) -> Self {
                StoreError::Redb(error.into())
            }
        }
    )*};
}
redb_into_store_error!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

/// The store file. After an I/O error (a full disk) redb refuses every later operation
/// until the database is closed and opened again: [`Store::reopen`] does that in place,
/// so the service goes on once the cause is gone.
pub struct Store {
    path: std::path::PathBuf,
    db: std::sync::RwLock<Option<Database>>,
    /// The crash-point simulation's plan: where this store "crashes".
    #[cfg(test)]
    pub(crate) crash: Option<std::sync::Arc<CrashPlan>>,
}

/// Where the crash-point simulation (`service::crash_sim`) cuts the power: before or
/// after the commit that brings `countdown` to zero. From then on every operation of the
/// store fails, as if the process were gone, until the next "process" opens the file.
#[cfg(test)]
pub(crate) struct CrashPlan {
    pub countdown: std::sync::atomic::AtomicU64,
    pub after_commit: bool,
    pub crashed: std::sync::atomic::AtomicBool,
}

#[cfg(test)]
impl CrashPlan {
    pub fn new(commits: u64, after_commit: bool) -> CrashPlan {
        CrashPlan {
            countdown: std::sync::atomic::AtomicU64::new(commits),
            after_commit,
            crashed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn crashed(&self) -> bool {
        self.crashed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// At a commit: `Some(true)` to commit and then crash, `Some(false)` to crash instead
    /// of committing, `None` to go on.
    fn at_commit(&self) -> Option<bool> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.crashed() {
            return Some(false);
        }
        let left = self.countdown.load(SeqCst);
        if left == 0 {
            return None;
        }
        if self.countdown.fetch_sub(1, SeqCst) == 1 {
            self.crashed.store(true, SeqCst);
            return Some(self.after_commit);
        }
        None
    }
}

impl Store {
    /// Opens (or creates) the store, creates missing tables and migrates older schemas.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        // Spelled out: the page cache is bounded, so memory does not grow with the store.
        let store = Store {
            path: path.to_path_buf(),
            db: std::sync::RwLock::new(Some(Self::open_database(path)?)),
            #[cfg(test)]
            crash: None,
        };
        store.initialize()?;
        Ok(store)
    }

    /// A store that crashes where `plan` says (the crash-point simulation).
    #[cfg(test)]
    pub(crate) fn open_crashing(
        path: &Path,
        plan: std::sync::Arc<CrashPlan>,
    ) -> Result<Store, StoreError> {
        let mut store = Store::open(path)?;
        store.crash = Some(plan);
        Ok(store)
    }

    #[cfg(test)]
    fn crashed(&self) -> bool {
        self.crash.as_ref().is_some_and(|plan| plan.crashed())
    }

    fn open_database(path: &Path) -> Result<Database, StoreError> {
        // Spelled out: the page cache is bounded, so memory does not grow with the store.
        Ok(Database::builder()
            .set_cache_size(crate::limits::STORE_CACHE_BYTES)
            .create(path)?)
    }

    /// Runs `f` on the open database; an error while it is closed (a reopen failed).
    fn with_db<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        #[cfg(test)]
        if self.crashed() {
            return Err(StoreError::Closed);
        }
        let slot = self
            .db
            .read()
            .map_err(|_| StoreError::Corrupt("the store's lock is poisoned".into()))?;
        match slot.as_ref() {
            Some(db) => f(db),
            None => Err(StoreError::Closed),
        }
    }

    /// Closes and opens the database file again: the way out of redb's "previous I/O
    /// error" state. Transactions begun before are cut off (their reads fail); nothing
    /// committed is lost. The caller holds no write transaction.
    pub fn reopen(&self) -> Result<(), StoreError> {
        #[cfg(test)]
        if self.crashed() {
            return Err(StoreError::Closed);
        }
        let mut slot = self
            .db
            .write()
            .map_err(|_| StoreError::Corrupt("the store's lock is poisoned".into()))?;
        if let Some(old) = slot.take()
            && let Err(error) = old.close()
        {
            tracing::warn!(%error, "closing the store before reopening it");
        }
        let db = Self::open_database(&self.path)?;
        *slot = Some(db);
        Ok(())
    }

    /// Writes a consistent snapshot of every table into a new store file at `dest` (which
    /// must not exist), from one read transaction: writers go on meanwhile and nothing of
    /// theirs after that transaction began is in the copy. The copy is committed durably
    /// (fsynced) before this returns, and its row counts are returned for verification.
    pub fn backup_to(&self, dest: &Path) -> Result<TableCounts, StoreError> {
        if dest.exists() {
            return Err(StoreError::Corrupt(format!(
                "{} already exists",
                dest.display()
            )));
        }
        let read = self.with_db(|db| Ok(db.begin_read()?))?;
        let copy = Database::builder()
            .set_cache_size(crate::limits::STORE_CACHE_BYTES)
            .create(dest)?;
        let mut write = copy.begin_write()?;
        write.set_durability(redb::Durability::Immediate)?;
        let counts = copy_tables(&read, &write)?;
        write.commit()?;
        drop(copy);
        std::fs::File::open(dest)
            .and_then(|f| f.sync_all())
            .map_err(|e| StoreError::Corrupt(format!("syncing {}: {e}", dest.display())))?;
        Ok(counts)
    }

    /// Row counts of every table, from one read transaction.
    pub fn table_counts(&self) -> Result<TableCounts, StoreError> {
        let read = self.with_db(|db| Ok(db.begin_read()?))?;
        count_tables(&read)
    }

    /// The names of the tables in the file.
    pub fn table_names(&self) -> Result<Vec<String>, StoreError> {
        use redb::TableHandle;
        let read = self.with_db(|db| Ok(db.begin_read()?))?;
        Ok(read.list_tables()?.map(|t| t.name().to_string()).collect())
    }

    fn initialize(&self) -> Result<(), StoreError> {
        let mut tx = self.write()?;
        {
            let t = &tx.inner;
            t.open_table(RUNS)?;
            t.open_table(PIPELINES)?;
            t.open_table(STEPS)?;
            t.open_table(ATTEMPTS)?;
            t.open_table(RUNS_BY_STATE)?;
            t.open_table(TIMERS)?;
            t.open_table(OUTBOX)?;
            t.open_table(OUTBOX_DUE)?;
            t.open_table(HISTORY)?;
            t.open_table(IDEMPOTENCY)?;
            t.open_table(DEAD_LETTERS)?;
            t.open_table(AUTO_RETRY_DUE)?;
            t.open_table(SCHEDULES)?;
            t.open_table(SCHEDULE_DUE)?;
            t.open_table(RETENTION_SWEPT)?;
        }
        // Runs-per-state counters, counted once for a store written before they existed.
        if tx.meta(META_RUN_COUNTS)?.is_none() {
            for state in RunState::ALL {
                let count = {
                    let by_state = tx.inner.open_table(RUNS_BY_STATE)?;
                    let range = by_state
                        .range((state.code(), 0, 0)..=(state.code(), u64::MAX, u128::MAX))?;
                    range.count() as u64
                };
                tx.set_meta(&state_count_key(state), count)?;
            }
            tx.set_meta(META_RUN_COUNTS, 1)?;
        }
        let found = tx.meta(META_SCHEMA_VERSION)?;
        match found {
            None => tx.set_meta(META_SCHEMA_VERSION, u64::from(SCHEMA_VERSION))?,
            Some(v) if v > u64::from(SCHEMA_VERSION) => {
                return Err(StoreError::SchemaTooNew { found: v });
            }
            Some(v) if v < u64::from(SCHEMA_VERSION) => {
                let started = std::time::Instant::now();
                migrate(&mut tx, v)?;
                tx.commit()?;
                tracing::info!(
                    from = v,
                    to = SCHEMA_VERSION,
                    took_ms = started.elapsed().as_millis() as u64,
                    "store upgraded to this build's schema"
                );
                return Ok(());
            }
            Some(_) => {}
        }
        tx.commit()
    }

    pub fn write(&self) -> Result<WriteTx, StoreError> {
        let mut inner = self.with_db(|db| Ok(db.begin_write()?))?;
        // Spelled out: a commit is on disk before `commit` returns.
        inner.set_durability(Durability::Immediate)?;
        Ok(WriteTx {
            inner,
            appended: Vec::new(),
            state_moves: [0; RunState::ALL.len()],
            #[cfg(test)]
            crash: self.crash.clone(),
        })
    }

    pub fn read(&self) -> Result<ReadTx, StoreError> {
        Ok(ReadTx {
            inner: self.with_db(|db| Ok(db.begin_read()?))?,
        })
    }
}

/// The migration hook: upgrades a store written by an older schema, inside the opening
/// transaction, so a store is either wholly upgraded or untouched.
fn migrate(tx: &mut WriteTx, from: u64) -> Result<(), StoreError> {
    if from < 2 {
        // The in-flight index was written and never read; backstop timers now live in
        // the driver's memory, rebuilt from the running attempts at every load.
        tx.inner
            .delete_table(TableDefinition::<u64, (u128, u16, u32)>::new(INFLIGHT_V1))?;
        let mut timers = tx.inner.open_table(TIMERS)?;
        timers.retain(|(_, _, _, kind, _), ()| kind != TimerKind::Backstop as u8)?;
        // Runs that ended under schema 1 have a retention timer each, which still fires:
        // the sweep starts after them.
        let by_state = tx.inner.open_table(RUNS_BY_STATE)?;
        let mut swept = tx.inner.open_table(RETENTION_SWEPT)?;
        for state in RunState::terminal() {
            let code = state.code();
            let last = by_state
                .range((code, 0, 0)..=(code, u64::MAX, u128::MAX))?
                .next_back();
            if let Some(entry) = last {
                let (_, updated, run) = entry?.0.value();
                swept.insert(code, (updated, run))?;
            }
        }
    }
    if from < u64::from(SCHEMA_VERSION) {
        tx.set_meta(META_SCHEMA_VERSION, u64::from(SCHEMA_VERSION))?;
    }
    Ok(())
}

/// What a batch rewrites of one run: its header (with its state and `updated_at` as last
/// stored, `None` for a new run), and the steps and attempts it changed.
pub struct RunRows<'a> {
    pub header: &'a RunHeader,
    pub previous: Option<(RunState, Timestamp)>,
    pub steps: Vec<(usize, &'a RunStep)>,
    /// (step, attempt).
    pub attempts: Vec<(usize, &'a Attempt)>,
}

pub struct WriteTx {
    inner: redb::WriteTransaction,
    /// History records appended in this transaction, for the live event stream once it
    /// committed (`take_appended`).
    appended: Vec<(RunId, u32, HistoryRecord)>,
    /// Runs that entered (+) and left (-) each state in this transaction, by
    /// `RunState::code`: written to the per-state counts once, at the commit.
    state_moves: [i64; RunState::ALL.len()],
    #[cfg(test)]
    crash: Option<std::sync::Arc<CrashPlan>>,
}

// `state_moves` is indexed by `RunState::code`: every code is its state's place in `ALL`.
const _: () = {
    let mut i = 0;
    while i < RunState::ALL.len() {
        assert!(RunState::ALL[i].code() as usize == i);
        i += 1;
    }
};

impl WriteTx {
    /// The history records appended so far (in order), to publish once committed.
    pub fn take_appended(&mut self) -> Vec<(RunId, u32, HistoryRecord)> {
        std::mem::take(&mut self.appended)
    }

    pub fn commit(mut self) -> Result<(), StoreError> {
        self.write_state_counts()?;
        #[cfg(test)]
        match self.crash.as_ref().and_then(|plan| plan.at_commit()) {
            Some(true) => {
                self.inner.commit()?;
                return Ok(());
            }
            Some(false) => return Err(StoreError::Closed),
            None => {}
        }
        self.inner.commit()?;
        Ok(())
    }

    /// The per-state counts moved by this transaction's `put_run`s.
    fn write_state_counts(&mut self) -> Result<(), StoreError> {
        for state in RunState::ALL {
            let moved = std::mem::take(&mut self.state_moves[usize::from(state.code())]);
            if moved != 0 {
                let key = state_count_key(state);
                let count = self.meta(&key)?.unwrap_or(0);
                self.set_meta(&key, count.saturating_add_signed(moved))?;
            }
        }
        Ok(())
    }

    /// A run's header as this transaction sees it (its own writes included).
    pub fn run_header(&self, run: RunId) -> Result<Option<RunHeader>, StoreError> {
        read_run_header(&self.inner, run)
    }

    /// The earliest due time of any timer or schedule, this transaction's own writes
    /// included: what the store holds once it commits.
    pub fn next_timer_due(&self) -> Result<Option<Timestamp>, StoreError> {
        read_next_timer_due(&self.inner)
    }

    /// A whole run as this transaction sees it: the writer reads what it writes, never
    /// through a read transaction of its own.
    pub fn run(&self, run: RunId) -> Result<Option<StoredRun>, StoreError> {
        read_run(&self.inner, run)
    }

    fn meta(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let table = self.inner.open_table(META)?;
        Ok(table.get(key)?.map(|v| v.value()))
    }

    fn set_meta(&mut self, key: &str, value: u64) -> Result<(), StoreError> {
        self.inner.open_table(META)?.insert(key, value)?;
        Ok(())
    }

    /// The next fence to mint (the durable counter).
    pub fn fence_next(&self) -> Result<u64, StoreError> {
        Ok(self.meta(META_FENCE_NEXT)?.unwrap_or(1))
    }

    /// Scarab's time at this commit (`clock::anchor_at_least` at the next start).
    pub fn set_clock(&mut self, now: Timestamp) -> Result<(), StoreError> {
        self.set_meta(META_CLOCK, now.0)
    }

    /// Fences only go up: lowering the counter is refused.
    pub fn set_fence_next(&mut self, next: u64) -> Result<(), StoreError> {
        let current = self.fence_next()?;
        if next < current {
            return Err(StoreError::Corrupt(format!(
                "fence counter would go down from {current} to {next}"
            )));
        }
        self.set_meta(META_FENCE_NEXT, next)
    }

    pub fn put_pipeline(&mut self, run: RunId, source: &PipelineSource) -> Result<(), StoreError> {
        self.inner
            .open_table(PIPELINES)?
            .insert(run.0, codec::encode(source)?.as_slice())?;
        Ok(())
    }

    /// Writes a run header and keeps the state index in step. `previous` is the header's
    /// (state, updated_at) as last stored, `None` for a new run.
    pub fn put_run(
        &mut self,
        header: &RunHeader,
        previous: Option<(RunState, Timestamp)>,
    ) -> Result<(), StoreError> {
        self.put_runs(&[RunRows {
            header,
            previous,
            steps: Vec::new(),
            attempts: Vec::new(),
        }])
    }

    /// Writes a step's state and its gate record (not its attempts).
    pub fn put_step(
        &mut self,
        run: RunId,
        step: usize,
        progress: &RunStep,
    ) -> Result<(), StoreError> {
        write_step(&mut self.inner.open_table(STEPS)?, run, step, progress)
    }

    pub fn put_attempt(
        &mut self,
        run: RunId,
        step: usize,
        attempt: &Attempt,
    ) -> Result<(), StoreError> {
        write_attempt(&mut self.inner.open_table(ATTEMPTS)?, run, step, attempt)
    }

    /// Writes each run's header (keeping the state index and the per-state counts in
    /// step), then the steps and attempts each names: every table is opened once for all
    /// of them, as a batch's end writes what it changed.
    pub fn put_runs(&mut self, rows: &[RunRows<'_>]) -> Result<(), StoreError> {
        {
            let mut by_state = self.inner.open_table(RUNS_BY_STATE)?;
            let mut runs = self.inner.open_table(RUNS)?;
            for row in rows {
                let header = row.header;
                if let Some((state, updated)) = row.previous {
                    by_state.remove((state.code(), updated.0, header.id.0))?;
                }
                by_state.insert((header.state.code(), header.updated_at.0, header.id.0), ())?;
                // Runs per state, kept in the same transaction (for /metrics, without a
                // scan): the moves are summed here and written once, as it commits.
                let from = row.previous.map(|(state, _)| state);
                if from != Some(header.state) {
                    if let Some(from) = from {
                        self.state_moves[usize::from(from.code())] -= 1;
                    }
                    self.state_moves[usize::from(header.state.code())] += 1;
                }
                runs.insert(header.id.0, codec::encode(header)?.as_slice())?;
            }
        }
        if rows.iter().any(|row| !row.steps.is_empty()) {
            let mut steps = self.inner.open_table(STEPS)?;
            for row in rows {
                for &(step, progress) in &row.steps {
                    write_step(&mut steps, row.header.id, step, progress)?;
                }
            }
        }
        if rows.iter().any(|row| !row.attempts.is_empty()) {
            let mut attempts = self.inner.open_table(ATTEMPTS)?;
            for row in rows {
                for &(step, attempt) in &row.attempts {
                    write_attempt(&mut attempts, row.header.id, step, attempt)?;
                }
            }
        }
        Ok(())
    }

    /// Appends one history record; `false` when the run's history is full.
    pub fn append_history(
        &mut self,
        run: RunId,
        record: &HistoryRecord,
    ) -> Result<bool, StoreError> {
        Ok(self.append_history_all(run, std::slice::from_ref(record))? == 1)
    }

    /// Appends a run's records in order, with one lookup of where its history ends; how
    /// many fit under `limits::HISTORY_EVENTS_PER_RUN_MAX` (the rest are not recorded).
    pub fn append_history_all(
        &mut self,
        run: RunId,
        records: &[HistoryRecord],
    ) -> Result<usize, StoreError> {
        if records.is_empty() {
            return Ok(0);
        }
        let mut history = self.inner.open_table(HISTORY)?;
        let first = match history.range((run.0, 0)..=(run.0, u32::MAX))?.next_back() {
            Some(entry) => entry?.0.value().1 + 1,
            None => 0,
        };
        let room = crate::limits::HISTORY_EVENTS_PER_RUN_MAX.saturating_sub(first) as usize;
        let taken = &records[..records.len().min(room)];
        for (seq, record) in (first..).zip(taken) {
            history.insert((run.0, seq), codec::encode(record)?.as_slice())?;
            self.appended.push((run, seq, record.clone()));
        }
        Ok(taken.len())
    }

    /// Up to `limit` runs of the terminal `state` whose last change was at or before
    /// `until`, oldest first, after those an earlier call returned: the cursor moves past
    /// them in this transaction. Every later change of a run is later than `until` as
    /// long as `until` is before this transaction's time, so none is ever skipped.
    pub fn take_retention_due(
        &mut self,
        state: RunState,
        until: Timestamp,
        limit: usize,
    ) -> Result<Vec<RunId>, StoreError> {
        let code = state.code();
        let mut swept = self.inner.open_table(RETENTION_SWEPT)?;
        let unswept = unswept(&swept, code, until.0)?;
        let by_state = self.inner.open_table(RUNS_BY_STATE)?;
        let mut due = Vec::new();
        let mut last = None;
        for entry in by_state.range::<(u8, u64, u128)>(unswept)?.take(limit) {
            let (_, updated, run) = entry?.0.value();
            due.push(RunId(run));
            last = Some((updated, run));
        }
        if let Some(last) = last {
            swept.insert(code, last)?;
        }
        Ok(due)
    }

    /// When the retention sweep has work next: the earliest last change, after the
    /// sweep's cursor, of any run in a terminal state, plus `retention`.
    pub fn next_retention_due(&self, retention: u64) -> Result<Option<Timestamp>, StoreError> {
        read_next_retention_due(&self.inner, retention)
    }

    pub fn auto_retry_index_put(&mut self, at: Timestamp, run: RunId) -> Result<(), StoreError> {
        self.inner
            .open_table(AUTO_RETRY_DUE)?
            .insert((at.0, run.0), ())?;
        Ok(())
    }

    pub fn auto_retry_index_delete(
        &mut self,
        at: Timestamp,
        run: RunId,
    ) -> Result<bool, StoreError> {
        Ok(self
            .inner
            .open_table(AUTO_RETRY_DUE)?
            .remove((at.0, run.0))?
            .is_some())
    }

    pub fn insert_timer(&mut self, key: TimerKey) -> Result<(), StoreError> {
        self.inner
            .open_table(TIMERS)?
            .insert(timer_tuple(key), ())?;
        Ok(())
    }

    pub fn delete_timer(&mut self, key: TimerKey) -> Result<bool, StoreError> {
        Ok(self
            .inner
            .open_table(TIMERS)?
            .remove(timer_tuple(key))?
            .is_some())
    }

    /// Removes and returns up to `limit` timers due at or before `now`, earliest first.
    pub fn take_due_timers(
        &mut self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<TimerKey>, StoreError> {
        let mut timers = self.inner.open_table(TIMERS)?;
        let mut due = Vec::new();
        for entry in timers
            .range(..=(now.0, u128::MAX, u16::MAX, u8::MAX, u64::MAX))?
            .take(limit)
        {
            let tuple = entry?.0.value();
            due.push(tuple);
        }
        for tuple in &due {
            timers.remove(*tuple)?;
        }
        due.into_iter().map(timer_from_tuple).collect()
    }

    /// Adds a message with a fresh id; returns the id.
    pub fn outbox_insert(&mut self, mut message: OutboxMessage) -> Result<u64, StoreError> {
        let id = self.meta(META_OUTBOX_NEXT)?.unwrap_or(1);
        self.set_meta(META_OUTBOX_NEXT, id + 1)?;
        message.id = id;
        self.outbox_put(&message, None)?;
        Ok(id)
    }

    /// Rewrites a message (after a failed delivery), moving it in the due index.
    pub fn outbox_put(
        &mut self,
        message: &OutboxMessage,
        previous_next_at: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        let mut due = self.inner.open_table(OUTBOX_DUE)?;
        if let Some(previous) = previous_next_at {
            due.remove((previous.0, message.id))?;
        }
        due.insert((message.next_at.0, message.id), ())?;
        self.inner
            .open_table(OUTBOX)?
            .insert(message.id, codec::encode(message)?.as_slice())?;
        Ok(())
    }

    pub fn outbox_get(&self, id: u64) -> Result<Option<OutboxMessage>, StoreError> {
        let table = self.inner.open_table(OUTBOX)?;
        let value = table.get(id)?;
        value
            .map(|v| codec::decode(v.value()).map_err(StoreError::from))
            .transpose()
    }

    /// Deletes a delivered message; returns it if it was still there.
    pub fn outbox_delete(&mut self, id: u64) -> Result<Option<OutboxMessage>, StoreError> {
        let Some(message) = self.outbox_get(id)? else {
            return Ok(None);
        };
        self.inner.open_table(OUTBOX)?.remove(id)?;
        self.inner
            .open_table(OUTBOX_DUE)?
            .remove((message.next_at.0, id))?;
        Ok(Some(message))
    }

    pub fn pipeline(&self, run: RunId) -> Result<Option<PipelineSource>, StoreError> {
        let table = self.inner.open_table(PIPELINES)?;
        let value = table.get(run.0)?;
        value
            .map(|v| codec::decode(v.value()).map_err(StoreError::from))
            .transpose()
    }

    /// Moves a message from the outbox to the dead-letter queue.
    pub fn dead_letter(&mut self, letter: &DeadLetter) -> Result<(), StoreError> {
        self.outbox_delete(letter.message.id)?;
        self.inner
            .open_table(DEAD_LETTERS)?
            .insert(letter.message.id, codec::encode(letter)?.as_slice())?;
        Ok(())
    }

    /// Removes a dead letter (requeued or discarded); returns it if it was there.
    pub fn take_dead_letter(&mut self, id: u64) -> Result<Option<DeadLetter>, StoreError> {
        let mut table = self.inner.open_table(DEAD_LETTERS)?;
        let removed = table.remove(id)?;
        removed
            .map(|v| codec::decode(v.value()).map_err(StoreError::from))
            .transpose()
    }

    pub fn idempotency_get(&self, key: &str) -> Result<Option<RunId>, StoreError> {
        let table = self.inner.open_table(IDEMPOTENCY)?;
        Ok(table.get(key)?.map(|v| RunId(v.value())))
    }

    pub fn idempotency_put(&mut self, key: &str, run: RunId) -> Result<(), StoreError> {
        self.inner.open_table(IDEMPOTENCY)?.insert(key, run.0)?;
        Ok(())
    }

    pub fn schedule(&self, name: &str) -> Result<Option<StoredSchedule>, StoreError> {
        read_schedule(&self.inner, name)
    }

    pub fn schedule_count(&self) -> Result<u64, StoreError> {
        Ok(self.inner.open_table(SCHEDULES)?.len()?)
    }

    /// Writes a schedule and moves its timer: `was_due` is its next fire as stored
    /// before (`None` for a new or paused one).
    pub fn put_schedule(
        &mut self,
        stored: &StoredSchedule,
        was_due: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        let name = stored.schedule.name.as_str();
        let bytes = codec::encode(stored)?;
        self.inner
            .open_table(SCHEDULES)?
            .insert(name, bytes.as_slice())?;
        let mut due = self.inner.open_table(SCHEDULE_DUE)?;
        if let Some(was) = was_due {
            due.remove((was.0, name))?;
        }
        if let Some(next) = stored.schedule.next_fire {
            due.insert((next.0, name), ())?;
        }
        Ok(())
    }

    /// Deletes a schedule and its timer; whether there was one.
    pub fn delete_schedule(&mut self, name: &str) -> Result<bool, StoreError> {
        let Some(stored) = self.schedule(name)? else {
            return Ok(false);
        };
        if let Some(next) = stored.schedule.next_fire {
            self.inner
                .open_table(SCHEDULE_DUE)?
                .remove((next.0, name))?;
        }
        self.inner.open_table(SCHEDULES)?.remove(name)?;
        Ok(true)
    }

    /// Up to `limit` schedules whose next fire is at or before `now`, earliest first
    /// (their timers stay until `put_schedule` moves them).
    pub fn due_schedules(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<(Timestamp, String)>, StoreError> {
        let due = self.inner.open_table(SCHEDULE_DUE)?;
        let mut found = Vec::new();
        for entry in due.range(..(now.0.saturating_add(1), ""))?.take(limit) {
            let key = entry?.0;
            let (at, name) = key.value();
            found.push((Timestamp(at), name.to_string()));
        }
        Ok(found)
    }
}

pub struct ReadTx {
    inner: redb::ReadTransaction,
}

/// A filter and cursor for listing runs, newest first.
#[derive(Clone, Debug, Default)]
pub struct RunQuery {
    pub state: Option<RunState>,
    /// Continue after this (updated ms, run) for state-filtered lists, or after this run
    /// for unfiltered ones.
    pub after: Option<(u64, RunId)>,
    pub limit: usize,
}

impl ReadTx {
    pub fn idempotency_get(&self, key: &str) -> Result<Option<RunId>, StoreError> {
        let table = self.inner.open_table(IDEMPOTENCY)?;
        Ok(table.get(key)?.map(|v| RunId(v.value())))
    }

    pub fn fence_next(&self) -> Result<u64, StoreError> {
        let table = self.inner.open_table(META)?;
        Ok(table.get(META_FENCE_NEXT)?.map(|v| v.value()).unwrap_or(1))
    }

    /// Scarab's time at the last commit, if one recorded it.
    pub fn clock_last(&self) -> Result<Option<Timestamp>, StoreError> {
        let table = self.inner.open_table(META)?;
        Ok(table.get(META_CLOCK)?.map(|v| Timestamp(v.value())))
    }

    pub fn run_header(&self, run: RunId) -> Result<Option<RunHeader>, StoreError> {
        read_run_header(&self.inner, run)
    }

    /// The whole run: header, source, steps and attempts.
    pub fn run(&self, run: RunId) -> Result<Option<StoredRun>, StoreError> {
        read_run(&self.inner, run)
    }

    /// Runs newest first (by id when unfiltered, by update time within a state).
    pub fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunHeader>, StoreError> {
        let mut headers = Vec::new();
        match query.state {
            None => {
                let runs = self.inner.open_table(RUNS)?;
                let upper = query.after.map_or(u128::MAX, |(_, run)| run.0);
                for entry in runs.range(..upper)?.rev().take(query.limit) {
                    headers.push(codec::decode(entry?.1.value())?);
                }
            }
            Some(state) => {
                let index = self.inner.open_table(RUNS_BY_STATE)?;
                let code = state.code();
                let upper = query
                    .after
                    .map_or((code, u64::MAX, u128::MAX), |(updated, run)| {
                        (code, updated, run.0)
                    });
                for entry in index.range((code, 0, 0)..upper)?.rev().take(query.limit) {
                    let (_, _, run) = entry?.0.value();
                    let header = self.run_header(RunId(run))?.ok_or_else(|| {
                        StoreError::Corrupt(format!("index names missing run {}", RunId(run)))
                    })?;
                    headers.push(header);
                }
            }
        }
        Ok(headers)
    }

    /// Runs not in a terminal state, read through the state index only.
    pub fn active_run_ids(&self) -> Result<Vec<RunId>, StoreError> {
        let index = self.inner.open_table(RUNS_BY_STATE)?;
        let mut ids = Vec::new();
        for state in [RunState::Queued, RunState::Running, RunState::Waiting] {
            let code = state.code();
            for entry in index.range((code, 0, 0)..=(code, u64::MAX, u128::MAX))? {
                ids.push(RunId(entry?.0.value().2));
            }
        }
        Ok(ids)
    }

    pub fn history(
        &self,
        run: RunId,
        after: Option<u32>,
        limit: usize,
    ) -> Result<Vec<(u32, HistoryRecord)>, StoreError> {
        let table = self.inner.open_table(HISTORY)?;
        let start = after.map_or(0, |seq| seq.saturating_add(1));
        let mut events = Vec::new();
        if after == Some(u32::MAX) {
            return Ok(events);
        }
        for entry in table.range((run.0, start)..=(run.0, u32::MAX))?.take(limit) {
            let (key, value) = entry?;
            events.push((key.value().1, codec::decode(value.value())?));
        }
        Ok(events)
    }

    /// Up to `limit` outbox messages due at or before `now`, in order of due time, leaving out (and not
    /// counting) those `skip` names: messages already being delivered, or launches waiting
    /// for a slot, must not take the room of the others.
    pub fn due_outbox(
        &self,
        now: Timestamp,
        limit: usize,
        skip: impl Fn(u64) -> bool,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        let due = self.inner.open_table(OUTBOX_DUE)?;
        let outbox = self.inner.open_table(OUTBOX)?;
        let mut messages = Vec::new();
        for entry in due.range(..=(now.0, u64::MAX))? {
            if messages.len() >= limit {
                break;
            }
            let (_, id) = entry?.0.value();
            if skip(id) {
                continue;
            }
            let value = outbox.get(id)?.ok_or_else(|| {
                StoreError::Corrupt(format!("outbox index names missing message {id}"))
            })?;
            messages.push(codec::decode(value.value())?);
        }
        Ok(messages)
    }

    pub fn outbox_message(&self, id: u64) -> Result<Option<OutboxMessage>, StoreError> {
        let table = self.inner.open_table(OUTBOX)?;
        let value = table.get(id)?;
        value
            .map(|v| codec::decode(v.value()).map_err(StoreError::from))
            .transpose()
    }

    /// Dead letters, oldest first, after `after` (a message id).
    pub fn dead_letters(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let table = self.inner.open_table(DEAD_LETTERS)?;
        let start = after.map_or(0, |id| id.saturating_add(1));
        let mut letters = Vec::new();
        for entry in table.range(start..)?.take(limit) {
            letters.push(codec::decode(entry?.1.value())?);
        }
        Ok(letters)
    }

    pub fn dead_letter(&self, id: u64) -> Result<Option<DeadLetter>, StoreError> {
        let table = self.inner.open_table(DEAD_LETTERS)?;
        let value = table.get(id)?;
        value
            .map(|v| codec::decode(v.value()).map_err(StoreError::from))
            .transpose()
    }

    pub fn next_outbox_due(&self) -> Result<Option<Timestamp>, StoreError> {
        let due = self.inner.open_table(OUTBOX_DUE)?;
        Ok(due.first()?.map(|(k, _)| Timestamp(k.value().0)))
    }

    /// How many runs are in each state (kept by `put_run`).
    pub fn run_counts(&self) -> Result<Vec<(RunState, u64)>, StoreError> {
        let table = self.inner.open_table(META)?;
        let mut counts = Vec::new();
        for state in RunState::ALL {
            let count = table
                .get(state_count_key(state).as_str())?
                .map_or(0, |v| v.value());
            counts.push((state, count));
        }
        Ok(counts)
    }

    /// The creation time of the oldest undelivered outbox message (ids only grow).
    pub fn oldest_outbox_created(&self) -> Result<Option<Timestamp>, StoreError> {
        let outbox = self.inner.open_table(OUTBOX)?;
        match outbox.first()? {
            Some((_, value)) => {
                let message: OutboxMessage = codec::decode(value.value())?;
                Ok(Some(message.created_at))
            }
            None => Ok(None),
        }
    }

    pub fn dead_letter_count(&self) -> Result<u64, StoreError> {
        Ok(self.inner.open_table(DEAD_LETTERS)?.len()?)
    }

    pub fn outbox_depth(&self) -> Result<u64, StoreError> {
        Ok(self.inner.open_table(OUTBOX)?.len()?)
    }

    /// The earliest due time of any timer or schedule.
    pub fn next_timer_due(&self) -> Result<Option<Timestamp>, StoreError> {
        read_next_timer_due(&self.inner)
    }

    /// See `WriteTx::next_retention_due`.
    pub fn next_retention_due(&self, retention: u64) -> Result<Option<Timestamp>, StoreError> {
        read_next_retention_due(&self.inner, retention)
    }

    pub fn schedule(&self, name: &str) -> Result<Option<StoredSchedule>, StoreError> {
        read_schedule(&self.inner, name)
    }

    /// Every schedule, by name (at most `limits::SCHEDULES_MAX` exist).
    pub fn schedules(&self) -> Result<Vec<StoredSchedule>, StoreError> {
        let table = self.inner.open_table(SCHEDULES)?;
        let mut found = Vec::new();
        for entry in table.iter()?.take(crate::limits::SCHEDULES_MAX) {
            found.push(codec::decode(entry?.1.value())?);
        }
        Ok(found)
    }

    /// Up to `limit` runs of the auto-retry index eligible at or before `now`, earliest
    /// first: the only rows one sweep pass reads.
    pub fn auto_retry_due(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<(Timestamp, RunId)>, StoreError> {
        let table = self.inner.open_table(AUTO_RETRY_DUE)?;
        let mut due = Vec::new();
        for entry in table.range(..=(now.0, u128::MAX))?.take(limit) {
            let (at, run) = entry?.0.value();
            due.push((Timestamp(at), RunId(run)));
        }
        Ok(due)
    }

    pub fn auto_retry_index_len(&self) -> Result<u64, StoreError> {
        Ok(self.inner.open_table(AUTO_RETRY_DUE)?.len()?)
    }

    pub fn timer_exists(&self, key: TimerKey) -> Result<bool, StoreError> {
        let timers = self.inner.open_table(TIMERS)?;
        Ok(timers.get(timer_tuple(key))?.is_some())
    }

    /// The fences of every launch waiting in the outbox (one pass over the outbox, whose
    /// size is bounded by the work in flight).
    pub fn outbox_launch_fences(&self) -> Result<std::collections::HashSet<Fence>, StoreError> {
        let outbox = self.inner.open_table(OUTBOX)?;
        let mut fences = std::collections::HashSet::new();
        for entry in outbox.iter()? {
            let message: OutboxMessage = codec::decode(entry?.1.value())?;
            if let records::OutboxPayload::Launch(launch) = message.payload {
                fences.insert(launch.fence);
            }
        }
        Ok(fences)
    }

    pub fn timers(&self, limit: usize) -> Result<Vec<TimerKey>, StoreError> {
        let timers = self.inner.open_table(TIMERS)?;
        let mut keys = Vec::new();
        for entry in timers.iter()?.take(limit) {
            keys.push(timer_from_tuple(entry?.0.value())?);
        }
        Ok(keys)
    }
}

/// The tables of a read or a write transaction, for the reads both make.
trait Tables {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        definition: TableDefinition<'_, K, V>,
    ) -> Result<impl ReadableTable<K, V> + '_, StoreError>;
}

impl Tables for redb::ReadTransaction {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        definition: TableDefinition<'_, K, V>,
    ) -> Result<impl ReadableTable<K, V> + '_, StoreError> {
        Ok(self.open_table(definition)?)
    }
}

impl Tables for redb::WriteTransaction {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        definition: TableDefinition<'_, K, V>,
    ) -> Result<impl ReadableTable<K, V> + '_, StoreError> {
        Ok(self.open_table(definition)?)
    }
}

fn read_schedule(tables: &impl Tables, name: &str) -> Result<Option<StoredSchedule>, StoreError> {
    let table = tables.table(SCHEDULES)?;
    let value = table.get(name)?;
    value
        .map(|v| codec::decode(v.value()).map_err(StoreError::from))
        .transpose()
}

fn read_next_timer_due(tables: &impl Tables) -> Result<Option<Timestamp>, StoreError> {
    let timer = tables
        .table(TIMERS)?
        .first()?
        .map(|(k, _)| Timestamp(k.value().0));
    let schedule = tables
        .table(SCHEDULE_DUE)?
        .first()?
        .map(|(k, _)| Timestamp(k.value().0));
    Ok(match (timer, schedule) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

fn read_next_retention_due(
    tables: &impl Tables,
    retention: u64,
) -> Result<Option<Timestamp>, StoreError> {
    let swept = tables.table(RETENTION_SWEPT)?;
    let by_state = tables.table(RUNS_BY_STATE)?;
    let mut earliest: Option<u64> = None;
    for state in RunState::terminal() {
        let unswept = unswept(&swept, state.code(), u64::MAX)?;
        if let Some(entry) = by_state.range::<(u8, u64, u128)>(unswept)?.next() {
            let updated = entry?.0.value().1;
            earliest = Some(earliest.map_or(updated, |e| e.min(updated)));
        }
    }
    Ok(earliest.map(|updated| Timestamp(updated.saturating_add(retention))))
}

/// The keys of the state index the retention sweep has not taken yet in one terminal
/// state (`code`), up to runs last changed at `until`: those after its cursor, or all.
fn unswept(
    swept: &impl ReadableTable<u8, (u64, u128)>,
    code: u8,
    until: u64,
) -> Result<StateIndexRange, StoreError> {
    use std::ops::Bound;
    let lower = match swept.get(code)?.map(|v| v.value()) {
        Some((updated, run)) => Bound::Excluded((code, updated, run)),
        None => Bound::Included((code, 0, 0)),
    };
    Ok((lower, Bound::Included((code, until, u128::MAX))))
}

type StateIndexRange = (
    std::ops::Bound<(u8, u64, u128)>,
    std::ops::Bound<(u8, u64, u128)>,
);

fn read_run_header(tables: &impl Tables, run: RunId) -> Result<Option<RunHeader>, StoreError> {
    let table = tables.table(RUNS)?;
    let value = table.get(run.0)?;
    value
        .map(|v| codec::decode(v.value()).map_err(StoreError::from))
        .transpose()
}

/// A run from its rows, checked as it is assembled (the load half of the pair checks):
/// steps without gaps, attempts numbered from 1 without gaps with fences that only go
/// up, the current try within the attempts, and only a step's last attempt in flight.
fn read_run(tables: &impl Tables, run: RunId) -> Result<Option<StoredRun>, StoreError> {
    let Some(header) = read_run_header(tables, run)? else {
        return Ok(None);
    };
    if header.id != run {
        return Err(StoreError::Corrupt(format!(
            "run {run}: its header names run {}",
            header.id
        )));
    }
    let corrupt = |problem: String| StoreError::Corrupt(format!("run {run}: {problem}"));
    let source = tables
        .table(PIPELINES)?
        .get(run.0)?
        .ok_or_else(|| corrupt("no pipeline".into()))
        .and_then(|v| Ok(codec::decode::<PipelineSource>(v.value())?))?;
    let mut steps: Vec<RunStep> = Vec::new();
    for entry in tables.table(STEPS)?.range((run.0, 0)..=(run.0, u16::MAX))? {
        let (key, value) = entry?;
        if usize::from(key.value().1) != steps.len() {
            return Err(corrupt("a gap in its steps".into()));
        }
        steps.push(codec::decode::<RunStep>(value.value())?);
    }
    for entry in tables
        .table(ATTEMPTS)?
        .range((run.0, 0, 0)..=(run.0, u16::MAX, u32::MAX))?
    {
        let (key, value) = entry?;
        let (_, step, number) = key.value();
        let attempt: Attempt = codec::decode(value.value())?;
        let progress = steps
            .get_mut(usize::from(step))
            .ok_or_else(|| corrupt(format!("an attempt of unknown step {step}")))?;
        if attempt.number != number || number as usize != progress.attempts.len() + 1 {
            return Err(corrupt(format!("step {step} attempt numbering")));
        }
        if let Some(previous) = progress.attempts.last() {
            if previous.fence >= attempt.fence {
                return Err(corrupt(format!("step {step}: fences do not go up")));
            }
            if previous.is_in_flight() {
                return Err(corrupt(format!(
                    "step {step}: attempt {} is in flight but not the last",
                    previous.number
                )));
            }
        }
        progress.attempts.push(attempt);
    }
    for (step, progress) in steps.iter().enumerate() {
        if progress.try_start > progress.attempts.len() {
            return Err(corrupt(format!(
                "step {step}: its try starts past its attempts"
            )));
        }
    }
    Ok(Some(StoredRun {
        header,
        source,
        steps,
    }))
}

/// Rows per table, by table name.
pub type TableCounts = Vec<(String, u64)>;

/// What a backup file holds, read without changing it: its row counts and decoded run
/// headers. Refuses a file that is not a Scarab store this build can read.
pub fn verify_file(path: &Path) -> Result<(TableCounts, u64), StoreError> {
    use redb::ReadableDatabase;
    let db = redb::ReadOnlyDatabase::open(path)?;
    let read = db.begin_read()?;
    let version = read
        .open_table(META)?
        .get(META_SCHEMA_VERSION)?
        .map(|v| v.value())
        .ok_or_else(|| StoreError::Corrupt("not a Scarab store: no schema version".into()))?;
    if version > u64::from(SCHEMA_VERSION) {
        return Err(StoreError::SchemaTooNew { found: version });
    }
    let counts = count_tables(&read)?;
    let mut runs = 0;
    for entry in read.open_table(RUNS)?.iter()? {
        let (_, value) = entry?;
        let _: RunHeader = codec::decode(value.value())?;
        runs += 1;
    }
    Ok((counts, runs))
}

fn copy_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    read: &redb::ReadTransaction,
    write: &redb::WriteTransaction,
    definition: TableDefinition<K, V>,
) -> Result<(String, u64), StoreError> {
    use redb::TableHandle;
    let mut target = write.open_table(definition)?;
    // A table newer than the store (an older build wrote it) copies as empty.
    let source = match read.open_table(definition) {
        Err(redb::TableError::TableDoesNotExist(_)) => {
            return Ok((definition.name().to_string(), 0));
        }
        other => other?,
    };
    let mut rows = 0;
    for entry in source.iter()? {
        let (key, value) = entry?;
        target.insert(key.value(), value.value())?;
        rows += 1;
    }
    Ok((definition.name().to_string(), rows))
}

fn count_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    read: &redb::ReadTransaction,
    definition: TableDefinition<K, V>,
) -> Result<(String, u64), StoreError> {
    use redb::TableHandle;
    let rows = match read.open_table(definition) {
        // A table newer than the store (an older build wrote it) counts as empty.
        Err(redb::TableError::TableDoesNotExist(_)) => 0,
        other => other?.len()?,
    };
    Ok((definition.name().to_string(), rows))
}

macro_rules! for_each_table {
    ($f:ident, $($arg:expr),*) => {
        vec![
            $f($($arg,)* META)?,
            $f($($arg,)* RUNS)?,
            $f($($arg,)* PIPELINES)?,
            $f($($arg,)* STEPS)?,
            $f($($arg,)* ATTEMPTS)?,
            $f($($arg,)* RUNS_BY_STATE)?,
            $f($($arg,)* TIMERS)?,
            $f($($arg,)* OUTBOX)?,
            $f($($arg,)* OUTBOX_DUE)?,
            $f($($arg,)* HISTORY)?,
            $f($($arg,)* DEAD_LETTERS)?,
            $f($($arg,)* AUTO_RETRY_DUE)?,
            $f($($arg,)* IDEMPOTENCY)?,
            $f($($arg,)* SCHEDULES)?,
            $f($($arg,)* SCHEDULE_DUE)?,
            $f($($arg,)* RETENTION_SWEPT)?,
        ]
    };
}

fn copy_tables(
    read: &redb::ReadTransaction,
    write: &redb::WriteTransaction,
) -> Result<TableCounts, StoreError> {
    Ok(for_each_table!(copy_table, read, write))
}

fn count_tables(read: &redb::ReadTransaction) -> Result<TableCounts, StoreError> {
    Ok(for_each_table!(count_table, read))
}

fn state_count_key(state: RunState) -> String {
    format!("runs_in_state:{}", state.as_str())
}

fn write_step(
    table: &mut redb::Table<(u128, u16), &[u8]>,
    run: RunId,
    step: usize,
    progress: &RunStep,
) -> Result<(), StoreError> {
    table.insert(
        (run.0, step_key(step)?),
        codec::encode(progress)?.as_slice(),
    )?;
    Ok(())
}

fn write_attempt(
    attempts: &mut redb::Table<(u128, u16, u32), &[u8]>,
    run: RunId,
    step: usize,
    attempt: &Attempt,
) -> Result<(), StoreError> {
    let step = step_key(step)?;
    attempts.insert(
        (run.0, step, attempt.number),
        codec::encode(attempt)?.as_slice(),
    )?;
    Ok(())
}

fn step_key(step: usize) -> Result<u16, StoreError> {
    u16::try_from(step).map_err(|_| StoreError::Corrupt(format!("step index {step} out of range")))
}

fn timer_tuple(key: TimerKey) -> TimerKeyTuple {
    (key.due.0, key.run.0, key.step, key.kind as u8, key.fence.0)
}

fn timer_from_tuple((due, run, step, kind, fence): TimerKeyTuple) -> Result<TimerKey, StoreError> {
    let kind = TimerKind::from_code(kind)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown timer kind {kind}")))?;
    Ok(TimerKey {
        due: Timestamp(due),
        run: RunId(run),
        step,
        kind,
        fence: Fence(fence),
    })
}

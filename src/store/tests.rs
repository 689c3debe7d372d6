//! The store against its own promises: round trips, indexes kept in step, timers taken
//! once, fences never lowered, outbox ordering by due time.

use super::records::*;
use super::*;
use crate::engine::{
    Attempt, AttemptState, Fence, KillReason, RunHeader, RunId, RunState, StepState, Timestamp,
};

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("s.redb")).expect("open");
    (dir, store)
}

fn header(id: u128, state: RunState, at: u64) -> RunHeader {
    RunHeader {
        id: RunId(id),
        pipeline_name: "p".into(),
        origin: "local".into(),
        state,
        created_at: Timestamp(at),
        updated_at: Timestamp(at),
        cancel: None,
        budget: None,
        auto_retry: Default::default(),
        admission: Default::default(),
    }
}

fn attempt(number: u32, fence: u64, finished: bool) -> Attempt {
    Attempt {
        number,
        fence: Fence(fence),
        created_at: Timestamp(1),
        state: if finished {
            AttemptState::Finished(crate::engine::Verdict {
                outcome: crate::engine::Outcome::Succeeded,
                started: true,
                reason: "exit code 0".into(),
                exit_code: Some(0),
                started_at: None,
                finished_at: Timestamp(2),
            })
        } else {
            AttemptState::Launching
        },
        kill: None,
        outputs: Vec::new(),
    }
}

#[test]
fn a_run_round_trips_and_the_indexes_follow_its_state() {
    let (_dir, store) = store();
    let source = PipelineSource {
        format: SourceFormat::Yaml,
        text: "name: p".into(),
        params: Some(Vec::new()),
    };
    let mut tx = store.write().expect("write");
    tx.put_pipeline(RunId(5), &source).expect("pipeline");
    tx.put_run(&header(5, RunState::Running, 10), None)
        .expect("run");
    tx.put_step(RunId(5), 0, &RunStep::in_state(StepState::Active))
        .expect("step");
    tx.put_attempt(RunId(5), 0, &attempt(1, 7, false))
        .expect("attempt");
    tx.commit().expect("commit");

    let read = store.read().expect("read");
    let stored = read.run(RunId(5)).expect("read run").expect("exists");
    assert_eq!(stored.header, header(5, RunState::Running, 10));
    assert_eq!(stored.source, source);
    assert_eq!(stored.steps[0].attempts, vec![attempt(1, 7, false)]);
    assert_eq!(read.active_run_ids().expect("active"), vec![RunId(5)]);
    drop(read);

    let mut tx = store.write().expect("write");
    tx.put_run(
        &header(5, RunState::Succeeded, 20),
        Some((RunState::Running, Timestamp(10))),
    )
    .expect("run");
    tx.put_attempt(RunId(5), 0, &attempt(1, 7, true))
        .expect("attempt");
    tx.commit().expect("commit");
    let read = store.read().expect("read");
    assert!(
        read.active_run_ids().expect("active").is_empty(),
        "no stale index entry"
    );
    let query = RunQuery {
        state: Some(RunState::Succeeded),
        after: None,
        limit: 10,
    };
    assert_eq!(read.list_runs(&query).expect("list").len(), 1);
}

/// The per-state counts are summed over a transaction's moves and written at its commit:
/// a run that arrives and one that moves twice across two transactions are each counted
/// once, in their last state.
#[test]
fn runs_per_state_follow_every_move_within_and_across_transactions() {
    let (_dir, store) = store();
    let counts = |store: &Store| -> Vec<(RunState, u64)> {
        let mut counts = store.read().expect("read").run_counts().expect("counts");
        counts.retain(|(_, n)| *n > 0);
        counts
    };
    let mut tx = store.write().expect("write");
    tx.put_run(&header(1, RunState::Queued, 1), None)
        .expect("1");
    tx.put_run(&header(2, RunState::Queued, 1), None)
        .expect("2");
    tx.put_run(&header(3, RunState::Running, 1), None)
        .expect("3");
    tx.commit().expect("commit");
    assert_eq!(
        counts(&store),
        vec![(RunState::Queued, 2), (RunState::Running, 1)]
    );

    // As a batch's end writes them: several runs with their steps and attempts at once.
    let mut tx = store.write().expect("write");
    let (running, succeeded) = (
        header(1, RunState::Running, 2),
        header(3, RunState::Succeeded, 2),
    );
    let (active, done) = (
        RunStep::in_state(StepState::Active),
        RunStep::in_state(StepState::Succeeded),
    );
    let (launching, finished) = (attempt(1, 11, false), attempt(1, 13, true));
    let source = PipelineSource {
        format: SourceFormat::Yaml,
        text: "name: p".into(),
        params: Some(Vec::new()),
    };
    tx.put_pipeline(RunId(3), &source).expect("pipeline");
    tx.put_runs(&[
        RunRows {
            header: &running,
            previous: Some((RunState::Queued, Timestamp(1))),
            steps: vec![(0, &active)],
            attempts: vec![(0, &launching)],
        },
        RunRows {
            header: &succeeded,
            previous: Some((RunState::Running, Timestamp(1))),
            steps: vec![(0, &done)],
            attempts: vec![(0, &finished)],
        },
    ])
    .expect("1 runs, 3 succeeds");
    // Written again in its state (a batch that changed only its steps): no move.
    tx.put_run(
        &header(2, RunState::Queued, 2),
        Some((RunState::Queued, Timestamp(1))),
    )
    .expect("2 stays");
    tx.put_run(&header(4, RunState::Succeeded, 2), None)
        .expect("4");
    tx.commit().expect("commit");
    assert_eq!(
        counts(&store),
        vec![
            (RunState::Queued, 1),
            (RunState::Running, 1),
            (RunState::Succeeded, 2)
        ]
    );
    let read = store.read().expect("read");
    let stored = read.run(RunId(3)).expect("read 3").expect("3 exists");
    assert_eq!(stored.header, succeeded);
    assert_eq!(stored.steps[0].attempts, vec![finished]);
    drop(read);

    // A transaction that is not committed moves nothing.
    let mut tx = store.write().expect("write");
    tx.put_run(
        &header(2, RunState::Cancelled, 3),
        Some((RunState::Queued, Timestamp(2))),
    )
    .expect("2 cancelled");
    drop(tx);
    assert_eq!(counts(&store)[0], (RunState::Queued, 1));
}

/// A run's history takes records in order up to its limit, several in one call, and
/// says how many it took.
#[test]
fn history_appends_in_order_up_to_the_limit() {
    let (_dir, store) = store();
    let record = |kind: &str| HistoryRecord {
        at: Timestamp(1),
        kind: kind.into(),
        detail: "{}".into(),
    };
    let max = crate::limits::HISTORY_EVENTS_PER_RUN_MAX as usize;
    let mut tx = store.write().expect("write");
    assert!(tx.append_history(RunId(9), &record("first")).expect("one"));
    let batch: Vec<_> = (1..max - 1).map(|i| record(&format!("e{i}"))).collect();
    assert_eq!(
        tx.append_history_all(RunId(9), &batch).expect("many"),
        max - 2
    );
    let over = [record("last"), record("over")];
    assert_eq!(
        tx.append_history_all(RunId(9), &over).expect("over"),
        1,
        "only one more fits"
    );
    assert!(!tx.append_history(RunId(9), &record("full")).expect("full"));
    assert_eq!(tx.take_appended().len(), max);
    tx.commit().expect("commit");
    let read = store.read().expect("read");
    let history = read.history(RunId(9), None, max + 10).expect("history");
    assert_eq!(history.len(), max);
    assert_eq!(history[0], (0, record("first")));
    assert_eq!(history[1], (1, record("e1")));
    assert_eq!(history[max - 1], (max as u32 - 1, record("last")));
}

#[test]
fn the_fence_counter_never_goes_down() {
    let (_dir, store) = store();
    let mut tx = store.write().expect("write");
    assert_eq!(tx.fence_next().expect("next"), 1);
    tx.set_fence_next(10).expect("raise");
    assert!(tx.set_fence_next(9).is_err(), "lowering is refused");
    tx.commit().expect("commit");
    assert_eq!(store.read().expect("read").fence_next().expect("next"), 10);
}

#[test]
fn due_timers_are_taken_once_in_due_order() {
    let (_dir, store) = store();
    let key = |due: u64, step: u16| TimerKey {
        due: Timestamp(due),
        run: RunId(1),
        step,
        kind: TimerKind::RetryDue,
        fence: Fence(0),
    };
    let mut tx = store.write().expect("write");
    for (due, step) in [(30, 2), (10, 0), (20, 1), (40, 3)] {
        tx.insert_timer(key(due, step)).expect("timer");
    }
    assert!(tx.delete_timer(key(40, 3)).expect("delete"));
    tx.commit().expect("commit");
    let mut tx = store.write().expect("write");
    let taken = tx.take_due_timers(Timestamp(25), 10).expect("take");
    assert_eq!(taken, vec![key(10, 0), key(20, 1)]);
    assert!(
        tx.take_due_timers(Timestamp(25), 10)
            .expect("take")
            .is_empty(),
        "taken once"
    );
    tx.commit().expect("commit");
    assert_eq!(
        store.read().expect("read").next_timer_due().expect("next"),
        Some(Timestamp(30))
    );
}

#[test]
fn outbox_messages_are_due_in_order_and_rescheduling_moves_them() {
    let (_dir, store) = store();
    let message = |next_at: u64| OutboxMessage {
        id: 0,
        payload: OutboxPayload::Kill {
            run: RunId(1),
            step: 0,
            fence: Fence(3),
            reason: KillReason::Cancel,
            executor: ExecutorKind::Local,
        },
        created_at: Timestamp(0),
        next_at: Timestamp(next_at),
        delivery_attempts: 0,
        max_deliveries: 10,
        last_error: None,
    };
    let mut tx = store.write().expect("write");
    let late = tx.outbox_insert(message(50)).expect("insert");
    let early = tx.outbox_insert(message(5)).expect("insert");
    tx.commit().expect("commit");
    let due: Vec<u64> = store
        .read()
        .expect("read")
        .due_outbox(Timestamp(100), 10, |_| false)
        .expect("due")
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(due, vec![early, late]);
    // A message left out (being delivered) does not take the room of the next.
    let due: Vec<u64> = store
        .read()
        .expect("read")
        .due_outbox(Timestamp(100), 1, |id| id == early)
        .expect("due")
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(due, vec![late]);

    let mut tx = store.write().expect("write");
    let mut moved = tx.outbox_get(early).expect("get").expect("exists");
    moved.delivery_attempts = 1;
    moved.last_error = Some("refused".into());
    moved.next_at = Timestamp(200);
    tx.outbox_put(&moved, Some(Timestamp(5))).expect("put");
    tx.commit().expect("commit");
    let read = store.read().expect("read");
    let due: Vec<u64> = read
        .due_outbox(Timestamp(100), 10, |_| false)
        .expect("due")
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(due, vec![late], "the rescheduled message is no longer due");
    assert_eq!(read.outbox_depth().expect("depth"), 2);
    drop(read);
    let mut tx = store.write().expect("write");
    assert!(tx.outbox_delete(late).expect("delete").is_some());
    assert!(
        tx.outbox_delete(late).expect("delete").is_none(),
        "idempotent"
    );
    tx.commit().expect("commit");
}

#[test]
fn a_store_from_a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    {
        let store = Store::open(&path).expect("open");
        let mut tx = store.write().expect("write");
        tx.set_meta(META_SCHEMA_VERSION, u64::from(SCHEMA_VERSION) + 1)
            .expect("meta");
        tx.commit().expect("commit");
    }
    assert!(matches!(
        Store::open(&path),
        Err(StoreError::SchemaTooNew { .. })
    ));
}

/// The retention sweep walks each terminal state's part of the state index once, oldest
/// first, up to a time and a limit; a run that ends again later comes after the cursor.
#[test]
fn the_retention_sweep_takes_each_ended_run_once_in_order() {
    let (_dir, store) = store();
    let mut tx = store.write().expect("write");
    for (id, state, at) in [
        (1, RunState::Succeeded, 10),
        (2, RunState::Failed, 20),
        (3, RunState::Succeeded, 30),
        (4, RunState::Running, 5),
        (5, RunState::Succeeded, 40),
    ] {
        tx.put_run(&header(id, state, at), None).expect("run");
    }
    assert_eq!(
        tx.next_retention_due(100).expect("next"),
        Some(Timestamp(110))
    );
    let take = |tx: &mut WriteTx, state, until, limit| {
        tx.take_retention_due(state, Timestamp(until), limit)
            .expect("take")
    };
    assert_eq!(take(&mut tx, RunState::Succeeded, 30, 1), vec![RunId(1)]);
    assert_eq!(take(&mut tx, RunState::Succeeded, 30, 10), vec![RunId(3)]);
    assert_eq!(take(&mut tx, RunState::Succeeded, 30, 10), vec![]);
    tx.commit().expect("commit");

    // The cursor is durable, and Failed has its own.
    let mut tx = store.write().expect("write");
    assert_eq!(
        tx.next_retention_due(100).expect("next"),
        Some(Timestamp(120))
    );
    assert_eq!(take(&mut tx, RunState::Failed, 30, 10), vec![RunId(2)]);
    // Run 1 ended again later (requeued, then succeeded): it is taken again, after 5.
    tx.put_run(
        &header(1, RunState::Succeeded, 50),
        Some((RunState::Succeeded, Timestamp(10))),
    )
    .expect("again");
    assert_eq!(
        take(&mut tx, RunState::Succeeded, 60, 10),
        vec![RunId(5), RunId(1)]
    );
    assert_eq!(tx.next_retention_due(100).expect("next"), None);
    tx.commit().expect("commit");
}

/// Schema 1 kept an index of in-flight attempts (never read) and stored the engine's
/// backstop timers: opening such a store drops both, in the opening transaction, and
/// keeps every other timer.
#[test]
fn a_schema_1_store_loses_its_in_flight_index_and_backstop_timers_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let timer = |kind, due| TimerKey {
        due: Timestamp(due),
        run: RunId(7),
        step: 0,
        kind,
        fence: Fence(if kind == TimerKind::Backstop { 3 } else { 0 }),
    };
    {
        let store = Store::open(&path).expect("open");
        let mut tx = store.write().expect("write");
        tx.set_meta(META_SCHEMA_VERSION, 1).expect("meta");
        tx.inner
            .open_table(TableDefinition::<u64, (u128, u16, u32)>::new(INFLIGHT_V1))
            .expect("schema 1 index")
            .insert(3, (7, 0, 1))
            .expect("entry");
        tx.insert_timer(timer(TimerKind::Backstop, 50))
            .expect("backstop");
        tx.insert_timer(timer(TimerKind::RetryDue, 60))
            .expect("retry");
        tx.put_run(&header(8, RunState::Succeeded, 20), None)
            .expect("ended under schema 1");
        tx.inner
            .delete_table(RETENTION_SWEPT)
            .expect("no cursor in schema 1");
        tx.commit().expect("commit");
        assert!(
            store
                .table_names()
                .expect("names")
                .contains(&INFLIGHT_V1.to_string())
        );
    }
    let store = Store::open(&path).expect("migrated");
    assert!(
        !store
            .table_names()
            .expect("names")
            .contains(&INFLIGHT_V1.to_string())
    );
    let read = store.read().expect("read");
    assert_eq!(
        read.timers(10).expect("timers"),
        vec![timer(TimerKind::RetryDue, 60)]
    );
    let version = read
        .inner
        .open_table(META)
        .expect("meta")
        .get(META_SCHEMA_VERSION)
        .expect("get")
        .map(|v| v.value());
    assert_eq!(version, Some(u64::from(SCHEMA_VERSION)));
    drop(read);
    // Run 8 ended under schema 1 and has its own retention timer: the sweep starts after
    // it.
    let mut tx = store.write().expect("write");
    assert_eq!(tx.next_retention_due(0).expect("next"), None);
    assert_eq!(
        tx.take_retention_due(RunState::Succeeded, Timestamp(100), 10)
            .expect("take"),
        vec![]
    );
}

#[test]
fn a_backup_copies_every_table_and_reopens_with_the_same_rows() {
    let (dir, store) = store();
    let source = PipelineSource {
        format: SourceFormat::Yaml,
        text: "name: p".into(),
        params: Some(Vec::new()),
    };
    let mut tx = store.write().expect("write");
    tx.put_pipeline(RunId(5), &source).expect("pipeline");
    tx.put_run(&header(5, RunState::Running, 10), None)
        .expect("run");
    tx.put_step(RunId(5), 0, &RunStep::in_state(StepState::Active))
        .expect("step");
    tx.put_attempt(RunId(5), 0, &attempt(1, 7, false))
        .expect("attempt");
    tx.set_fence_next(8).expect("fence");
    tx.commit().expect("commit");
    let dest = dir.path().join("backup.redb");
    let counts = store.backup_to(&dest).expect("backup");
    // Every table of the live file is in the copy (a new table must join the list).
    let names = store.table_names().expect("names");
    for name in &names {
        assert!(
            counts.iter().any(|(t, _)| t == name),
            "{name} not backed up"
        );
    }
    assert!(store.backup_to(&dest).is_err(), "never overwrites");
    assert_eq!(verify_file(&dest).expect("verify"), (counts.clone(), 1));
    assert_eq!(store.table_counts().expect("counts"), counts);
    let copy = Store::open(&dest).expect("reopen");
    assert_eq!(copy.read().expect("read").fence_next().expect("fence"), 8);
    // Not a store: refused.
    let junk = dir.path().join("junk");
    std::fs::write(&junk, b"not a database").expect("write");
    assert!(verify_file(&junk).is_err());
}

mod decoders {
    //! Whatever bytes a record holds, decoding returns a value or an error naming the
    //! record: never a panic, never an allocation sized by a corrupted length.

    use super::super::codec::{self, Record};
    use super::*;
    use proptest::prelude::*;

    fn never_panics<R: Record>(bytes: &[u8]) {
        let _ = codec::decode::<R>(bytes);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn arbitrary_bytes_decode_to_a_value_or_an_error(
            body in proptest::collection::vec(any::<u8>(), 0..256),
            version in prop_oneof![Just(2u8), any::<u8>()],
        ) {
            let mut bytes = vec![version];
            bytes.extend(&body);
            never_panics::<RunHeader>(&bytes);
            never_panics::<crate::engine::RunStep>(&bytes);
            never_panics::<Attempt>(&bytes);
            never_panics::<PipelineSource>(&bytes);
            never_panics::<OutboxMessage>(&bytes);
            never_panics::<DeadLetter>(&bytes);
            never_panics::<HistoryRecord>(&bytes);
        }
    }

    #[test]
    fn a_corrupted_length_is_an_error_not_an_allocation() {
        // Format 2, a history record whose `at` is 1 and whose `kind` claims 2^62 bytes.
        let mut bytes = vec![2u8, 1];
        bytes.push(255);
        bytes.extend((1u64 << 62).to_le_bytes());
        let error = codec::decode::<HistoryRecord>(&bytes).expect_err("refused");
        assert!(error.to_string().starts_with("history:"), "{error}");
    }

    #[test]
    fn implausible_values_are_refused_naming_the_record_and_field() {
        let mut attempt = attempt(1, 7, true);
        attempt.fence = Fence(0);
        let bytes = {
            let mut out = vec![codec::FORMAT_VERSION];
            codec::to_bincode(
                "attempt",
                &super::super::records::v2::Attempt::from(&attempt),
                &mut out,
            )
            .expect("encodes");
            out
        };
        let error = codec::decode::<Attempt>(&bytes).expect_err("fence 0");
        assert!(error.to_string().contains("attempt.fence"), "{error}");
        assert!(codec::encode(&attempt).is_err(), "and it is never written");
    }
}

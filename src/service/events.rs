//! The live stream of run and step changes behind `GET /v1/events`.
//!
//! What is streamed is exactly what the history keeps: every history record the driver
//! commits, published after its transaction committed, in commit order (the driver is the
//! only writer, so that order is total). Each gets a sequence number of this process and an
//! event id `BOOT-SEQ`, where `BOOT` names this start of the service: an id from an earlier
//! start cannot be resumed from, because what happened between is not kept here (the history
//! of each run is).
//!
//! The newest `limits::EVENTS_BUFFER` events are kept in memory. A client resuming with
//! `Last-Event-ID` gets every event after it, none twice, as long as that id is still in the
//! buffer; otherwise (it fell behind, or the service restarted) it is told to read the state
//! again ([`Resume::Reset`]) and continues live. Streams do not buffer per client: each keeps
//! only its position, so a slow client costs nothing but its connection.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::engine::RunId;
use crate::limits;
use crate::store::records::HistoryRecord;

/// One published history record.
#[derive(Debug)]
pub struct Published {
    /// Position in this process's stream, from 1.
    pub seq: u64,
    pub run: RunId,
    /// Its sequence number in the run's history (`GET /v1/runs/{id}/history`).
    pub history_seq: u32,
    pub record: HistoryRecord,
}

/// Where a client's stream starts.
#[derive(Debug, PartialEq, Eq)]
pub enum Resume {
    /// After this event of this process's stream.
    After(u64),
    /// Events were missed that are no longer kept: the client must read the state again;
    /// the stream goes on after `latest`.
    Reset { reason: String, latest: u64 },
}

pub struct Events {
    boot: u64,
    ring: Mutex<Ring>,
    /// The newest event's `seq` (0 before the first); changes wake the streams.
    latest: watch::Sender<u64>,
    closed: AtomicBool,
    streams: Arc<Semaphore>,
}

struct Ring {
    capacity: usize,
    items: VecDeque<Arc<Published>>,
}

impl Default for Events {
    fn default() -> Events {
        Events::new(limits::EVENTS_BUFFER, limits::EVENT_STREAMS_MAX)
    }
}

impl Events {
    pub fn new(capacity: usize, streams: usize) -> Events {
        // Names this start: the wall clock in nanoseconds, which two starts never share.
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Events {
            boot,
            ring: Mutex::new(Ring {
                capacity: capacity.max(1),
                items: VecDeque::new(),
            }),
            latest: watch::channel(0).0,
            closed: AtomicBool::new(false),
            streams: Arc::new(Semaphore::new(streams)),
        }
    }

    /// Publishes records that have just been committed, in commit order.
    pub fn publish(&self, records: Vec<(RunId, u32, HistoryRecord)>) {
        if records.is_empty() {
            return;
        }
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let mut seq = *self.latest.borrow();
        for (run, history_seq, record) in records {
            seq += 1;
            ring.items.push_back(Arc::new(Published {
                seq,
                run,
                history_seq,
                record,
            }));
        }
        let excess = ring.items.len().saturating_sub(ring.capacity);
        ring.items.drain(..excess);
        drop(ring);
        self.latest.send_replace(seq);
    }

    /// The newest event's number (0 before the first).
    pub fn latest(&self) -> u64 {
        *self.latest.borrow()
    }

    /// The id a client sees for event `seq`.
    pub fn id(&self, seq: u64) -> String {
        format!("{:x}-{seq}", self.boot)
    }

    /// Where a stream resuming from `last_event_id` starts; `None` starts live. An id that
    /// is not one of Scarab's, or names an event never sent, is an error for the client.
    pub fn resume(&self, last_event_id: Option<&str>) -> Result<Resume, String> {
        let latest = self.latest();
        let Some(id) = last_event_id else {
            return Ok(Resume::After(latest));
        };
        let malformed = || format!("{id:?} is not an event id of this service (BOOT-SEQ)");
        let (boot, seq) = id.split_once('-').ok_or_else(malformed)?;
        let boot = u64::from_str_radix(boot, 16).map_err(|_| malformed())?;
        let seq: u64 = seq.parse().map_err(|_| malformed())?;
        if boot != self.boot {
            return Ok(Resume::Reset {
                reason: "the service restarted since that event: read the state again".into(),
                latest,
            });
        }
        if seq > latest {
            return Err(format!("event {id} was never sent"));
        }
        let oldest = self.oldest();
        if seq + 1 < oldest {
            return Ok(Resume::Reset {
                reason: format!(
                    "events after {id} are no longer kept (the newest {} are): read the state again",
                    limits::EVENTS_BUFFER
                ),
                latest,
            });
        }
        Ok(Resume::After(seq))
    }

    fn oldest(&self) -> u64 {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.items.front().map_or(self.latest() + 1, |e| e.seq)
    }

    /// Up to `max` events after `after`, and the position to continue from (past events
    /// that `filter` skipped). `Err(latest)` if some of them are no longer kept.
    pub fn after(
        &self,
        after: u64,
        filter: Option<RunId>,
        max: usize,
    ) -> Result<(Vec<Arc<Published>>, u64), u64> {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let Some(first) = ring.items.front().map(|e| e.seq) else {
            return Ok((Vec::new(), after));
        };
        if after + 1 < first {
            return Err(ring.items.back().map_or(after, |e| e.seq));
        }
        let start = usize::try_from(after + 1 - first)
            .map_or(ring.items.len(), |start| start.min(ring.items.len()));
        let mut position = after;
        let mut found = Vec::new();
        for event in ring.items.range(start..) {
            if found.len() == max {
                break;
            }
            position = event.seq;
            if filter.is_none_or(|run| run == event.run) {
                found.push(event.clone());
            }
        }
        Ok((found, position))
    }

    /// Changes of the newest event's number.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    /// A place for one more stream, if there is one (`limits::EVENT_STREAMS_MAX`).
    pub fn admit_stream(&self) -> Option<OwnedSemaphorePermit> {
        self.streams.clone().try_acquire_owned().ok()
    }

    /// Ends every stream (the service is stopping: open streams would hold it up).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.latest.send_modify(|_| {});
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Timestamp;

    fn record(kind: &str) -> HistoryRecord {
        HistoryRecord {
            at: Timestamp(1),
            kind: kind.into(),
            detail: "{}".into(),
        }
    }

    fn publish(events: &Events, run: u128, n: u32) {
        events.publish(
            (0..n)
                .map(|i| (RunId(run), i, record("step_state")))
                .collect(),
        );
    }

    #[test]
    fn a_resumed_stream_gets_every_later_event_once_and_a_filter_skips_the_others() {
        let events = Events::new(100, 4);
        publish(&events, 1, 3);
        publish(&events, 2, 2);
        publish(&events, 1, 1);
        assert_eq!(events.latest(), 6);
        let id = events.id(2);
        assert_eq!(events.resume(Some(&id)), Ok(Resume::After(2)));
        let (all, position) = events.after(2, None, 100).expect("kept");
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4, 5, 6]);
        assert_eq!(position, 6);
        let (one, position) = events.after(2, Some(RunId(1)), 100).expect("kept");
        assert_eq!(one.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 6]);
        assert_eq!(position, 6);
        // In chunks: the position stops at the last event handed out.
        let (first, position) = events.after(0, None, 2).expect("kept");
        assert_eq!(first.len(), 2);
        assert_eq!(position, 2);
        assert_eq!(events.resume(None), Ok(Resume::After(6)));
    }

    #[test]
    fn a_client_behind_the_buffer_or_from_another_start_is_told_to_read_again() {
        let events = Events::new(4, 4);
        publish(&events, 1, 10);
        // Events 1..=6 are gone: resuming after 5 would miss 6.
        assert!(matches!(
            events.resume(Some(&events.id(5))),
            Ok(Resume::Reset { latest: 10, .. })
        ));
        assert_eq!(events.resume(Some(&events.id(6))), Ok(Resume::After(6)));
        assert_eq!(events.after(5, None, 10).unwrap_err(), 10);
        let other = Events::new(4, 4);
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(matches!(
            Events::new(4, 4).resume(Some(&other.id(1))),
            Ok(Resume::Reset { .. })
        ));
        assert!(events.resume(Some("nonsense")).is_err());
        assert!(events.resume(Some("zz-1")).is_err());
        assert!(events.resume(Some(&events.id(11))).is_err());
    }

    #[test]
    fn streams_are_bounded_and_closing_wakes_them() {
        let events = Events::new(4, 2);
        let a = events.admit_stream();
        let b = events.admit_stream();
        assert!(a.is_some() && b.is_some());
        assert!(events.admit_stream().is_none());
        drop(a);
        assert!(events.admit_stream().is_some());
        let mut changes = events.subscribe();
        changes.mark_unchanged();
        events.close();
        assert!(changes.has_changed().expect("open"));
        assert!(events.is_closed());
    }
}

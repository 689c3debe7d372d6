//! The engine's backstop timers, kept in memory rather than in the store's timer table.
//!
//! A backstop is due at its running attempt's `backstop_due`, which the attempt's own
//! record already holds durably: storing the timer as well wrote two more B-tree entries
//! per attempt (one at the launch's confirmation, one removed at its verdict) for nothing
//! the store did not know. The set is rebuilt from the loaded runs at every load (start-up
//! and after a failed commit), so it always matches what the store holds.

use std::collections::BTreeSet;

use crate::engine::{AttemptState, Fence, Run, RunId, Timestamp};

#[derive(Default)]
pub(super) struct Backstops(BTreeSet<(Timestamp, RunId, usize, Fence)>);

impl Backstops {
    /// The backstop of every running attempt of `runs`.
    pub(super) fn of<'a>(runs: impl IntoIterator<Item = &'a Run>) -> Backstops {
        let mut set = BTreeSet::new();
        for run in runs {
            for (step, progress) in run.steps.iter().enumerate() {
                if let Some(attempt) = progress.in_flight()
                    && let AttemptState::Running { backstop_due, .. } = attempt.state
                {
                    set.insert((backstop_due, run.id(), step, attempt.fence));
                }
            }
        }
        Backstops(set)
    }

    pub(super) fn schedule(&mut self, due: Timestamp, run: RunId, step: usize, fence: Fence) {
        self.0.insert((due, run, step, fence));
    }

    pub(super) fn cancel(&mut self, due: Timestamp, run: RunId, step: usize, fence: Fence) {
        self.0.remove(&(due, run, step, fence));
    }

    /// The earliest due time, if any backstop is set.
    pub(super) fn next_due(&self) -> Option<Timestamp> {
        self.0.first().map(|&(due, ..)| due)
    }

    /// Removes and returns up to `limit` backstops due at or before `now`, earliest first.
    /// A commit that fails after this reloads the runs, and with them the set.
    pub(super) fn take_due(&mut self, now: Timestamp, limit: usize) -> Vec<(RunId, usize, Fence)> {
        let mut due = Vec::new();
        while due.len() < limit {
            match self.0.first() {
                Some(&(at, run, step, fence)) if at <= now => {
                    self.0.pop_first();
                    due.push((run, step, fence));
                }
                _ => break,
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_backstops_come_out_earliest_first_up_to_the_limit() {
        let mut set = Backstops::default();
        set.schedule(Timestamp(30), RunId(1), 0, Fence(3));
        set.schedule(Timestamp(10), RunId(2), 1, Fence(1));
        set.schedule(Timestamp(20), RunId(3), 0, Fence(2));
        set.cancel(Timestamp(20), RunId(3), 0, Fence(2));
        assert_eq!(set.next_due(), Some(Timestamp(10)));
        assert_eq!(set.take_due(Timestamp(5), 10), vec![]);
        assert_eq!(
            set.take_due(Timestamp(40), 1),
            vec![(RunId(2), 1, Fence(1))]
        );
        assert_eq!(
            set.take_due(Timestamp(40), 10),
            vec![(RunId(1), 0, Fence(3))]
        );
        assert_eq!(set.next_due(), None);
    }
}

//! The forward-progress check over the store: every non-terminal run must wait on a
//! durable timer that exists (a running attempt's backstop is its own record), a launch
//! that is in the outbox, or an open gate (`engine::waits`). The engine says what each
//! run waits on; this checks that the store holds it. A stuck run is a bug, logged at
//! error.

use crate::engine::{Stuck, Wait, waits};
use crate::store::{Store, StoreError};

use super::driver::{rebuild, timer_key};

/// The result of one check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgressReport {
    /// Non-terminal runs checked.
    pub runs: usize,
    pub stuck: Vec<Stuck>,
    /// Non-terminal runs whose stored records cannot be read back (a record that does not
    /// decode, or a pipeline that no longer validates): named, never silently stuck.
    pub unreadable: Vec<Stuck>,
}

/// Checks every non-terminal run against one consistent snapshot of the store.
pub fn check(store: &Store) -> Result<ProgressReport, StoreError> {
    let read = store.read()?;
    let launches = read.outbox_launch_fences()?;
    let mut report = ProgressReport::default();
    for id in read.active_run_ids()? {
        let stored = match read.run(id) {
            Ok(Some(stored)) => Ok(stored),
            Ok(None) => continue,
            Err(error) => Err(error.to_string()),
        };
        report.runs += 1;
        let run = match stored.and_then(rebuild) {
            Ok(run) => run,
            Err(problem) => {
                tracing::error!(run = %id, %problem, "a stored run cannot be read back");
                report.unreadable.push(Stuck { run: id, problem });
                continue;
            }
        };
        let problem = match waits(&run) {
            Err(stuck) => Some(stuck.problem),
            Ok(found) => missing(&read, &launches, id, &found)?,
        };
        if let Some(problem) = problem {
            tracing::error!(run = %id, %problem, "bug: a run makes no forward progress");
            report.stuck.push(Stuck { run: id, problem });
        }
    }
    Ok(report)
}

/// The first wait the store does not back, if any.
fn missing(
    read: &crate::store::ReadTx,
    launches: &std::collections::HashSet<crate::engine::Fence>,
    id: crate::engine::RunId,
    found: &[Wait],
) -> Result<Option<String>, StoreError> {
    for wait in found {
        match *wait {
            // A backstop is its running attempt's `backstop_due`: the attempt's record is
            // what the store holds of it (the driver keeps the timer in memory).
            Wait::Timer {
                timer: crate::engine::Timer::Backstop { .. },
                ..
            } => {}
            Wait::Timer { due, timer } => {
                if !read.timer_exists(timer_key(id, due, timer)?)? {
                    return Ok(Some(format!(
                        "waits on a {timer:?} timer due {due:?} that is not stored"
                    )));
                }
            }
            Wait::Launch { step, fence } => {
                if !launches.contains(&fence) {
                    return Ok(Some(format!(
                        "step #{step} attempt fence {} is launching but its launch is not in the outbox",
                        fence.0
                    )));
                }
            }
            // Admission control holds what waits for a slot (engine::admission).
            Wait::Gate { .. } | Wait::Admission { .. } => {}
        }
    }
    Ok(None)
}

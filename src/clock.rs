//! Scarab's clock, read only outside the engine.
//!
//! Durable timers, backoffs, gates and budgets are stored as wall-clock times, so a wall
//! clock that steps (an NTP correction after a power cut, an operator's `date -s`) would
//! fire them early or stall them for hours. So Scarab's time is the wall clock read once,
//! at start, and then advanced by the monotonic clock: a step of the wall clock while
//! Scarab runs moves nothing. It never goes back across restarts either: at start it is
//! at least the last time the previous process committed (`anchor_at_least`). A step is
//! noticed, logged and shown as `scarab_clock_skew_seconds`; the next start takes the
//! wall clock again. docs/operations.md#the-clock is the operator's side.

use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::engine::Timestamp;

/// A clock anchored on a wall-clock reading and advanced by a monotonic one.
pub struct Clock {
    state: Mutex<Anchor>,
    wall: fn() -> u64,
}

struct Anchor {
    at_ms: u64,
    since: Instant,
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Clock {
    /// A clock anchored on `wall` now.
    pub fn new(wall: fn() -> u64) -> Clock {
        Clock {
            state: Mutex::new(Anchor {
                at_ms: wall(),
                since: Instant::now(),
            }),
            wall,
        }
    }

    pub fn now(&self) -> Timestamp {
        let Ok(anchor) = self.state.lock() else {
            return Timestamp((self.wall)());
        };
        let elapsed = u64::try_from(anchor.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        Timestamp(anchor.at_ms.saturating_add(elapsed))
    }

    /// Never earlier than `at` (the last time a previous process recorded): a wall clock
    /// that went back while Scarab was down does not make it go back.
    pub fn anchor_at_least(&self, at: Timestamp) {
        let now = self.now();
        if at <= now {
            return;
        }
        if let Ok(mut anchor) = self.state.lock() {
            anchor.at_ms = at.0;
            anchor.since = Instant::now();
        }
        tracing::warn!(
            behind_ms = at.0 - now.0,
            "the wall clock is behind the last time recorded; Scarab's time goes on from that"
        );
    }

    /// How far the wall clock is from Scarab's time now, in milliseconds (positive: the
    /// wall clock is ahead).
    pub fn skew_ms(&self) -> i64 {
        let wall = i128::from((self.wall)());
        let own = i128::from(self.now().0);
        i64::try_from(wall - own).unwrap_or(i64::MAX)
    }
}

static CLOCK: std::sync::OnceLock<Clock> = std::sync::OnceLock::new();

fn clock() -> &'static Clock {
    CLOCK.get_or_init(|| Clock::new(wall_ms))
}

/// Scarab's time now.
pub fn now() -> Timestamp {
    clock().now()
}

/// See [`Clock::anchor_at_least`].
pub fn anchor_at_least(at: Timestamp) {
    clock().anchor_at_least(at)
}

/// See [`Clock::skew_ms`].
pub fn skew_ms() -> i64 {
    clock().skew_ms()
}

/// RFC 3339 with milliseconds, UTC.
pub fn rfc3339(at: Timestamp) -> String {
    let time = UNIX_EPOCH + std::time::Duration::from_millis(at.0);
    humantime::format_rfc3339_millis(time).to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::time::Duration;

    use super::*;

    /// An injected wall clock: the real one moved by `JUMP` milliseconds.
    static JUMP: AtomicI64 = AtomicI64::new(0);

    fn jumpy() -> u64 {
        let real = i128::from(wall_ms());
        u64::try_from(real + i128::from(JUMP.load(Ordering::SeqCst))).unwrap_or(0)
    }

    #[test]
    fn steps_of_the_wall_clock_move_nothing_and_time_never_goes_back() {
        let clock = Clock::new(jumpy);
        let start = clock.now();
        // Two hours forward: Scarab's time does not follow; the skew says so.
        JUMP.store(2 * 3600 * 1000, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        let after_forward = clock.now();
        assert!(after_forward >= start);
        assert!(
            after_forward.0 - start.0 < 1000,
            "moved by {}",
            after_forward.0 - start.0
        );
        assert!(clock.skew_ms() > 2 * 3600 * 1000 - 1000);
        // Three hours back: still only the monotonic time has passed.
        JUMP.store(-3600 * 1000, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        let after_back = clock.now();
        assert!(after_back >= after_forward, "went back");
        assert!(after_back.0 - start.0 < 1000);
        assert!(clock.skew_ms() < -3600 * 1000 + 1000);
        // A new process whose wall clock is behind the last recorded time starts from that.
        let restarted = Clock::new(jumpy);
        restarted.anchor_at_least(after_back);
        assert!(restarted.now() >= after_back);
        // And one whose clock is ahead keeps its own reading.
        let ahead = Clock::new(wall_ms);
        ahead.anchor_at_least(Timestamp(1));
        assert!(ahead.now().0 > 1);
        JUMP.store(0, Ordering::SeqCst);
    }
}

//! Identifiers and time as the engine sees them: plain newtypes, no clock reads.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A run's identity: a ULID (time-ordered, so keys sort by creation), shown as `r` + the
/// ULID in lower case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RunId(pub u128);

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ulid = ulid::Ulid(self.0).to_string().to_ascii_lowercase();
        write!(f, "r{ulid}")
    }
}

impl FromStr for RunId {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let body = text
            .strip_prefix('r')
            .ok_or_else(|| format!("run id {text:?} must start with 'r'"))?;
        let ulid = ulid::Ulid::from_string(&body.to_ascii_uppercase())
            .map_err(|_| format!("run id {text:?} is not a valid run id"))?;
        Ok(RunId(ulid.0))
    }
}

/// An attempt's fence: minted from one durable, strictly increasing counter. A retry always
/// gets a new one; re-adoption keeps the old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Fence(pub u64);

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The durable fence counter's value as the engine sees it: the next fence to mint.
/// The driver loads it from and stores it into the same transaction as the attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceCounter {
    next: u64,
}

impl FenceCounter {
    /// Fence 0 is never minted, so `next` starts at 1.
    pub fn starting_at(next: u64) -> Self {
        FenceCounter { next: next.max(1) }
    }

    pub fn next_value(&self) -> u64 {
        self.next
    }

    pub fn mint(&mut self) -> Fence {
        let fence = Fence(self.next);
        // u64 fences at a million per second last half a million years. Should the counter
        // ever run out, minting stops loudly rather than wrap and reuse a fence.
        self.next = self
            .next
            .checked_add(1)
            .expect("fence counter exhausted: refusing to reuse a fence");
        fence
    }

    /// Raises the counter above a fence seen elsewhere (an executor, a restored backup).
    pub fn raise_above(&mut self, seen: Fence) {
        self.next = self.next.max(seen.0.saturating_add(1));
    }
}

/// Milliseconds since the Unix epoch. Time only ever enters the engine as a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub fn plus(self, duration: Duration) -> Timestamp {
        let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(ms))
    }

    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

//! Identifiers and time as the engine sees them: plain newtypes, no clock reads.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A run's identity: a ULID (time-ordered, so keys sort by creation), shown as `r` + the
/// ULID in lower case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
        let id = RunId(ulid.0);
        // One spelling per run: `r` and the lower-case ULID, as Scarab writes it.
        if id.to_string() != text {
            return Err(format!(
                "run id {text:?} is not in its canonical spelling {id} (lower case)"
            ));
        }
        Ok(id)
    }
}

/// An attempt's fence: minted from one durable, strictly increasing counter. A retry always
/// gets a new one; re-adoption keeps the old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

    /// The next fence, or an error once the counter reached `limits::FENCE_MAX` (at a
    /// million fences per second that is 146,000 years away): minting stops rather than
    /// wrap and reuse a fence.
    pub fn mint(&mut self) -> Result<Fence, FencesExhausted> {
        if self.next >= crate::limits::FENCE_MAX {
            return Err(FencesExhausted);
        }
        let fence = Fence(self.next);
        self.next += 1;
        Ok(fence)
    }

    /// Raises the counter above a fence seen elsewhere (an executor, a restored backup),
    /// if that fence is plausible; returns whether it was.
    pub fn raise_above(&mut self, seen: Fence) -> bool {
        if !seen.is_plausible(Fence(self.next)) {
            return false;
        }
        self.next = self.next.max(seen.0 + 1);
        true
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the fence counter is exhausted")]
pub struct FencesExhausted;

impl Fence {
    /// Could this store's lineage have minted this fence, given that it mints
    /// `minted_below` next? A store restored from an older backup meets the attempts
    /// minted after that backup, so fences somewhat above the counter are plausible; one
    /// `limits::FENCE_LEAD_MAX` above it, at or past `limits::FENCE_MAX`, or 0 is not: it
    /// comes from something that is not Scarab's (a forged label, a stray directory) and
    /// must neither be adopted nor raise the counter.
    pub fn is_plausible(self, minted_below: Fence) -> bool {
        self.0 >= 1
            && self.0 < crate::limits::FENCE_MAX
            && self.0 - minted_below.0.min(self.0) < crate::limits::FENCE_LEAD_MAX
    }
}

/// Milliseconds since the Unix epoch. Time only ever enters the engine as a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

//! The wall clock, read only outside the engine.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::engine::Timestamp;

pub fn now() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    Timestamp(ms)
}

/// RFC 3339 with milliseconds, UTC.
pub fn rfc3339(at: Timestamp) -> String {
    let time = UNIX_EPOCH + std::time::Duration::from_millis(at.0);
    humantime::format_rfc3339_millis(time).to_string()
}

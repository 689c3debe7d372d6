//! Scarab: a single-node pipeline runner. See ARCHITECTURE.md for the map.

pub mod engine;
pub mod limits;
pub mod pipeline;
pub mod store;

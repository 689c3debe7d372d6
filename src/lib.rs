//! Scarab: a single-node pipeline runner. See ARCHITECTURE.md for the map.

pub mod api;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod engine;
pub mod executor;
#[cfg(test)]
mod fuzz_tests;
pub mod limits;
pub mod metrics;
pub mod pipeline;
pub mod secrets;
pub mod service;
pub mod store;
pub mod text;
pub mod tls;

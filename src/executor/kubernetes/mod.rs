//! The Kubernetes executor: each attempt is one Pod named by its run, step and fence.
//! [`classify::judge`] is the one classifier both the executor and `scarab explain-pod`
//! call.

pub mod classify;
mod executor;
pub mod pod;

pub use executor::{KubeExecutor, KubeSettings};

//! The Kubernetes executor: each attempt is one Pod. For now only the Pod classifier
//! ([`classify::judge`]), which the executor and `scarab explain-pod` share.

pub mod classify;

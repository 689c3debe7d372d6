//! The integration tests, as one test binary: the kube and axum stacks are linked once.
//! Each module drives real things: the real `scarab` binary on real state dirs, real
//! HTTP on loopback, and the real kube client against the Kubernetes API test server
//! in `k8s_api/`.

mod common;
mod k8s_api;

mod admission;
mod api;
mod appliance;
mod cli;
mod connections;
mod crash;
mod dashboard;
mod edge;
mod events;
mod explain_pod;
mod fixture_stores;
mod gates;
mod isolation;
mod k8s_api_server;
mod kubernetes;
mod local_executor;
mod openapi;
mod operations;
mod outputs;
mod retry_matrix;
mod schedules;
mod schema;
mod secrets;
mod tls;
mod torture;
mod upgrade;
mod webhooks;
mod zombies;

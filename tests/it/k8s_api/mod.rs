//! A fake Kubernetes API server for core/v1 Pods, speaking the real wire protocol
//! over plain HTTP to the real `kube::Client`, with a scripted kubelet.
//!
//! ```ignore
//! mod k8s_api;
//! let cluster = k8s_api::FakeCluster::start().await;
//! let pods: kube::Api<Pod> = kube::Api::namespaced(cluster.client(), "default");
//! cluster.kubelet().auto(true);
//! ```
//!
//! Layout: `http` (HTTP/1.1 framing), `routes` (the REST surface), `store`
//! (objects, resourceVersions, history, logs, request log), `watch` (watch and
//! log streaming), `admission` (create-time validation and defaults),
//! `selector` (label/field selectors), `status` (metav1.Status bodies),
//! `kubelet` (scripted status transitions, graceful deletion, auto mode).

#![allow(dead_code, unused_imports)]
// A Status body is what the apiserver answers with; returning it by value keeps the
// routes close to the wire format, and this is test code.
#![allow(clippy::result_large_err)]

mod admission;
mod http;
pub mod kubelet;
mod routes;
mod selector;
pub mod status;
mod store;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use axum::http::Method;
pub use k8s_openapi::api::core::v1::Pod;
#[allow(unused_imports)]
pub use kubelet::{Kubelet, Plan, plan_for};
pub use store::{EndOrder, Termination};

use store::Shared;

/// A fault the API server exhibits until cleared with `Fault::None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// Connections are accepted and dropped without a response; open streams are cut.
    Unreachable,
    /// Every Pod request gets 403 Forbidden (RBAC wording).
    Forbidden,
    /// The namespace does not exist: create gets 404 `namespaces "x" not found`,
    /// reads see nothing (get/delete 404 `pods "x" not found`, empty lists).
    NamespaceMissing,
    /// Pod Security admission refuses every create (403, "violates PodSecurity").
    PodSecurity,
    /// A ResourceQuota is used up: every create gets 403 "exceeded quota".
    QuotaExceeded,
}

pub struct FakeCluster {
    shared: Arc<Shared>,
    addr: std::net::SocketAddr,
    accept: tokio::task::JoinHandle<()>,
}

impl FakeCluster {
    /// Binds 127.0.0.1:0 and serves on the current tokio runtime.
    pub async fn start() -> FakeCluster {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local_addr");
        let shared = Shared::new(tokio::runtime::Handle::current());
        let accept_shared = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                if accept_shared.fault() == Fault::Unreachable {
                    drop(sock);
                    continue;
                }
                tokio::spawn(http::serve_connection(accept_shared.clone(), sock));
            }
        });
        FakeCluster {
            shared,
            addr,
            accept,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A real `kube::Client` for this server (default namespace "default").
    pub fn client(&self) -> kube::Client {
        let uri = self.url().parse().expect("cluster url");
        let mut config = kube::Config::new(uri);
        config.connect_timeout = Some(Duration::from_secs(5));
        config.read_timeout = Some(Duration::from_secs(60));
        config.write_timeout = Some(Duration::from_secs(10));
        kube::Client::try_from(config).expect("kube client")
    }

    /// Writes `dir/kubeconfig` pointing at this server, namespace "default".
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        self.kubeconfig_with_namespace(dir, "default")
    }

    pub fn kubeconfig_with_namespace(&self, dir: &Path, namespace: &str) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {url}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\ncurrent-context: fake\nusers:\n- name: fake\n  user:\n    token: fake-token\n",
            url = self.url()
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    pub fn kubelet(&self) -> Kubelet {
        Kubelet {
            shared: self.shared.clone(),
        }
    }

    pub fn set_fault(&self, fault: Fault) {
        self.shared.write(|st| st.fault = fault);
    }

    pub fn fault(&self) -> Fault {
        self.shared.fault()
    }

    /// All Pods, ordered by (namespace, name).
    pub fn pods(&self) -> Vec<Pod> {
        self.shared.lock().pods.values().cloned().collect()
    }

    /// One Pod by "name" (namespace "default" first) or "ns/name".
    pub fn pod(&self, name: &str) -> Option<Pod> {
        let st = self.shared.lock();
        let key = st.resolve(name)?;
        st.pods.get(&key).cloned()
    }

    /// The watch history still retained: (ADDED | MODIFIED | DELETED, Pod name), oldest
    /// first.
    pub fn events(&self) -> Vec<(&'static str, String)> {
        self.shared
            .lock()
            .history
            .iter()
            .map(|e| {
                (
                    e.kind.as_str(),
                    e.pod.metadata.name.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Every request served (method, path?query as sent), oldest first, bounded.
    pub fn request_log(&self) -> Vec<(Method, String)> {
        self.shared.lock().requests.iter().cloned().collect()
    }

    pub fn clear_request_log(&self) {
        self.shared.lock().requests.clear();
    }

    /// Requests whose method matches and whose path (without query) satisfies `path`.
    pub fn count_requests(&self, method: &Method, path: impl Fn(&str) -> bool) -> usize {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|(m, t)| m == method && path(t.split('?').next().unwrap_or(t)))
            .count()
    }

    /// Drops the watch history (old resourceVersions now get 410 Expired) and ends
    /// open watches, as an apiserver restart would; clients re-watch from their
    /// last resourceVersion and must relist.
    pub fn compact(&self) {
        self.shared.write(|st| st.compact());
    }

    /// Watch history length (default 1000 events); older events fall off.
    pub fn set_history_limit(&self, n: usize) {
        self.shared.write(|st| {
            st.history_cap = n.max(1);
            while st.history.len() > st.history_cap {
                if let Some(old) = st.history.pop_front() {
                    st.floor = old.rv;
                }
            }
        });
    }

    /// How often open watches get a BOOKMARK (default 2s).
    pub fn set_bookmark_interval(&self, d: Duration) {
        self.shared.lock().bookmark_interval = d;
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.write(|st| st.closed = true);
    }
}

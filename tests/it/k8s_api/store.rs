//! The fake cluster's storage: Pods keyed by (namespace, name), one global
//! resourceVersion counter, a bounded watch history, per-Pod log buffers and
//! the bounded request log.
//!
//! Every write bumps the counter, stamps the object's metadata.resourceVersion
//! and appends exactly one watch event, as etcd plus the watch cache do.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::http::Method;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use super::Fault;
use super::http::Request;

pub type Key = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub pod: Pod,
}

/// A Pod's log, keyed by Pod uid so a re-created Pod of the same name starts empty.
#[derive(Debug, Default, Clone)]
pub struct LogBuf {
    pub data: Vec<u8>,
    /// Bytes dropped from the front to stay within `LOG_CAP`.
    pub dropped: usize,
}

pub const LOG_CAP: usize = 1024 * 1024;

/// How the scripted kubelet terminates a Pod that was deleted gracefully.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Termination {
    /// The process ends `after` SIGTERM with `exit_code` (143 for a plain SIGTERM
    /// death, 0 for a process that traps it). If `after` exceeds the grace period
    /// the kubelet SIGKILLs at the deadline: exit 137.
    Graceful { after: Duration, exit_code: i32 },
    /// Leave the Pod terminating until `Kubelet::finish_deletion`.
    Hold,
}

#[derive(Debug, Clone)]
pub struct KubeletConfig {
    pub auto: bool,
    pub node: String,
    pub step_delay: Duration,
    pub exit_delay: Duration,
    pub termination: Termination,
    /// Images (as written in the Pod) the registry does not have: auto mode leaves such
    /// Pods in ErrImagePull / ImagePullBackOff.
    pub unpullable: std::collections::BTreeSet<String>,
    /// How the kubelet writes a Pod's end it decides itself (a deadline, an eviction, a
    /// node shutdown): in one status, or in two with either half first.
    pub end_order: EndOrder,
}

/// Kubelets of different versions write a Pod's end in different orders.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EndOrder {
    /// Phase, reason and the containers' end in one status.
    #[default]
    Together,
    /// The terminal phase with its reason while the containers still say running; their
    /// end follows in a second status.
    PhaseFirst,
    /// The containers' end first, the phase still Running; the phase and reason follow.
    ContainersFirst,
}

pub struct State {
    pub pods: BTreeMap<Key, Pod>,
    pub rv: u64,
    pub history: VecDeque<Event>,
    /// Events with rv > floor are retained; a watch from rv < floor gets 410.
    pub floor: u64,
    pub history_cap: usize,
    pub logs: HashMap<String, LogBuf>,
    pub requests: VecDeque<(Method, String)>,
    pub request_cap: usize,
    pub fault: Fault,
    /// Bumped by `compact()`: open watches end, as after an apiserver restart.
    pub epoch: u64,
    pub bookmark_interval: Duration,
    pub kubelet: KubeletConfig,
    pub closed: bool,
    pub seq: u64,
}

pub struct Shared {
    state: Mutex<State>,
    changes: watch::Sender<u64>,
    pub runtime: tokio::runtime::Handle,
}

impl Shared {
    pub fn new(runtime: tokio::runtime::Handle) -> Arc<Shared> {
        let (changes, _) = watch::channel(0u64);
        Arc::new(Shared {
            state: Mutex::new(State {
                pods: BTreeMap::new(),
                rv: 1000,
                history: VecDeque::new(),
                floor: 1000,
                history_cap: 1000,
                logs: HashMap::new(),
                requests: VecDeque::new(),
                request_cap: 20_000,
                fault: Fault::None,
                epoch: 0,
                bookmark_interval: Duration::from_secs(2),
                kubelet: KubeletConfig {
                    auto: false,
                    node: "node-1".into(),
                    step_delay: Duration::from_millis(30),
                    exit_delay: Duration::from_millis(150),
                    termination: Termination::Graceful {
                        after: Duration::from_millis(50),
                        exit_code: 143,
                    },
                    unpullable: Default::default(),
                    end_order: EndOrder::Together,
                },
                closed: false,
                seq: 0,
            }),
            changes,
            runtime,
        })
    }

    /// Locks the state; a poisoned lock (a panicking test thread) is recovered.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Wakes every open watch and log stream.
    pub fn notify(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Runs `f` under the lock, then notifies.
    pub fn write<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = f(&mut self.lock());
        self.notify();
        out
    }

    pub fn fault(&self) -> Fault {
        self.lock().fault
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    pub fn log_request(&self, req: &Request) {
        let method = Method::from_bytes(req.method.as_bytes()).unwrap_or(Method::GET);
        let mut st = self.lock();
        st.requests.push_back((method, req.target()));
        while st.requests.len() > st.request_cap {
            st.requests.pop_front();
        }
    }
}

fn set_rv(pod: &mut Pod, rv: u64) {
    pod.metadata.resource_version = Some(rv.to_string());
}

impl State {
    fn record(&mut self, kind: EventType, pod: Pod) {
        self.history.push_back(Event {
            rv: self.rv,
            kind,
            pod,
        });
        while self.history.len() > self.history_cap {
            if let Some(old) = self.history.pop_front() {
                self.floor = old.rv;
            }
        }
    }

    /// A fresh sequence number for names, uids, container ids.
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Stores a new Pod (already defaulted and validated).
    pub fn insert(&mut self, key: Key, mut pod: Pod) -> Pod {
        self.rv += 1;
        set_rv(&mut pod, self.rv);
        self.pods.insert(key, pod.clone());
        self.record(EventType::Added, pod.clone());
        pod
    }

    /// Applies `f` to a stored Pod and records MODIFIED; None if absent.
    pub fn modify(&mut self, key: &Key, f: impl FnOnce(&mut Pod)) -> Option<Pod> {
        let pod = self.pods.get_mut(key)?;
        f(pod);
        self.rv += 1;
        set_rv(pod, self.rv);
        let pod = pod.clone();
        self.record(EventType::Modified, pod.clone());
        Some(pod)
    }

    /// Removes a Pod and records DELETED with the final state.
    pub fn remove(&mut self, key: &Key) -> Option<Pod> {
        let mut pod = self.pods.remove(key)?;
        self.rv += 1;
        set_rv(&mut pod, self.rv);
        if let Some(uid) = &pod.metadata.uid {
            self.logs.remove(uid);
        }
        self.record(EventType::Deleted, pod.clone());
        Some(pod)
    }

    /// Finds a Pod by "name" (any namespace, "default" first) or "ns/name".
    pub fn resolve(&self, name: &str) -> Option<Key> {
        if let Some((ns, n)) = name.split_once('/') {
            let key = (ns.to_string(), n.to_string());
            return self.pods.contains_key(&key).then_some(key);
        }
        let default = ("default".to_string(), name.to_string());
        if self.pods.contains_key(&default) {
            return Some(default);
        }
        self.pods.keys().find(|(_, n)| n == name).cloned()
    }

    pub fn append_log(&mut self, uid: &str, text: &[u8]) {
        let buf = self.logs.entry(uid.to_string()).or_default();
        buf.data.extend_from_slice(text);
        if buf.data.len() > LOG_CAP {
            let cut = buf.data.len() - LOG_CAP;
            buf.data.drain(..cut);
            buf.dropped += cut;
        }
    }

    pub fn compact(&mut self) {
        self.history.clear();
        self.floor = self.rv;
        self.epoch += 1;
    }
}

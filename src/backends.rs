//! Several backends: the nodes of a cluster, which node a client connection gets,
//! and the health checker that marks nodes up or down.
//!
//! - `--backend a,b,c` lists the nodes. Each client connection gets one healthy node:
//!   the one with the fewest client connections ([`BackendPolicy::LeastConnections`],
//!   for multi-primary clusters), or the first healthy one in the list
//!   ([`BackendPolicy::First`], single-primary use with failover). When no node is
//!   healthy every node is tried in list order anyway (the checker may be behind).
//! - A node that refuses a connection is marked down at once, and the session tries
//!   the next candidate: new connections reach the healthy nodes without waiting for
//!   the checker.
//! - The checker ([`health_loop`]) looks at every node each `health_interval`: it must
//!   accept a TCP connection and send a greeting within `health_timeout`; with
//!   `health_user` it also logs in, and a Galera node (`wsrep_on = ON`) is up only when
//!   `wsrep_ready = ON` and `wsrep_local_state_comment = Synced` (a donor or joining
//!   node takes no new connections). A node that is back and Synced is marked up and
//!   gets new connections again.
//! - Sessions on a node that dies find out on their next command (the relay answers it
//!   with "Lost connection to MySQL server during query" and closes), as with the
//!   server itself; their open transactions are lost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tracing::{info, warn};

use crate::config::{parse_list, BackendPolicy, Config};
use crate::rewrite::ClusterInfo;

/// One backend node and what the proxy knows of it.
#[derive(Debug)]
pub struct Node {
    /// `host:port`.
    pub addr: String,
    /// New client connections may go here (the last check or connection attempt
    /// succeeded).
    up: AtomicBool,
    /// Why the node is up or down, as the last check saw it (`Synced`,
    /// `unreachable: …`, `Donor/Desynced`, …).
    detail: Mutex<String>,
    /// Client connections relayed to this node now.
    active: AtomicU64,
    /// Client connections relayed to this node since start.
    total: AtomicU64,
    /// Failed connection attempts and failed health checks.
    errors: AtomicU64,
    /// What a session last learned of the node's place in a cluster, and when:
    /// sessions reuse it for [`CLUSTER_INFO_TTL`] instead of asking the server
    /// (the status lookup costs ≈ 0.4 ms a session).
    cluster: Mutex<Option<(Instant, ClusterInfo)>>,
}

/// How long a node's [`ClusterInfo`] is reused before a session asks again.
pub const CLUSTER_INFO_TTL: Duration = Duration::from_secs(10);

/// What `SHOW BACKENDS`, `/metrics` and `/readyz` show of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// `host:port`.
    pub addr: String,
    /// Takes new connections.
    pub up: bool,
    /// The last check's finding.
    pub detail: String,
    /// Client connections now.
    pub connections: u64,
    /// Client connections since start.
    pub connections_total: u64,
    /// Failed connection attempts and health checks.
    pub errors: u64,
}

impl Node {
    fn new(addr: String) -> Node {
        Node {
            addr,
            up: AtomicBool::new(true),
            detail: Mutex::new("not checked yet".into()),
            active: AtomicU64::new(0),
            total: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            cluster: Mutex::new(None),
        }
    }

    /// Whether the node takes new connections.
    pub fn is_up(&self) -> bool {
        self.up.load(Relaxed)
    }

    fn set(&self, up: bool, detail: String) {
        let was = self.up.swap(up, Relaxed);
        if was != up {
            if up {
                info!(backend = %self.addr, state = %detail, "backend up");
            } else {
                warn!(backend = %self.addr, reason = %detail, "backend down");
            }
        }
        if let Ok(mut d) = self.detail.lock() {
            *d = detail;
        }
    }

    fn view(&self) -> NodeView {
        NodeView {
            addr: self.addr.clone(),
            up: self.is_up(),
            detail: self.detail.lock().map(|d| d.clone()).unwrap_or_default(),
            connections: self.active.load(Relaxed),
            connections_total: self.total.load(Relaxed),
            errors: self.errors.load(Relaxed),
        }
    }
}

/// The backend nodes of one proxy.
#[derive(Debug)]
pub struct Backends {
    /// In the order of the `backend` setting.
    nodes: Vec<Node>,
    /// How a connection's node is chosen.
    policy: BackendPolicy,
}

/// A client connection's claim on a node: counted in its connections until dropped.
#[derive(Debug)]
pub struct Lease {
    backends: Arc<Backends>,
    index: usize,
}

impl Lease {
    /// What a session learned of this node's place in a cluster within
    /// [`CLUSTER_INFO_TTL`], if anything.
    pub fn cluster_info(&self) -> Option<ClusterInfo> {
        let node = self.backends.nodes.get(self.index)?;
        let cached = *node.cluster.lock().ok()?;
        cached
            .filter(|(at, _)| at.elapsed() < CLUSTER_INFO_TTL)
            .map(|(_, info)| info)
    }

    /// Records what a session learned of this node's place in a cluster.
    pub fn set_cluster_info(&self, info: ClusterInfo) {
        if let Some(mut c) = self
            .backends
            .nodes
            .get(self.index)
            .and_then(|n| n.cluster.lock().ok())
        {
            *c = Some((Instant::now(), info));
        }
    }

    /// The node's address.
    pub fn addr(&self) -> &str {
        self.backends
            .nodes
            .get(self.index)
            .map_or("", |n| n.addr.as_str())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(n) = self.backends.nodes.get(self.index) {
            n.active.fetch_sub(1, Relaxed);
        }
    }
}

impl Backends {
    /// The nodes of `config.backend` with `config.backend_policy`.
    pub fn from_config(config: &Config) -> Backends {
        Backends::new(&config.backend, config.backend_policy)
    }

    /// The nodes of a `backend` list.
    pub fn new(list: &str, policy: BackendPolicy) -> Backends {
        Backends {
            nodes: parse_list(list).into_iter().map(Node::new).collect(),
            policy,
        }
    }

    /// Every node, in list order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// What each node looks like now.
    pub fn views(&self) -> Vec<NodeView> {
        self.nodes.iter().map(Node::view).collect()
    }

    /// At least one node takes new connections.
    pub fn any_up(&self) -> bool {
        self.nodes.iter().any(Node::is_up)
    }

    /// The nodes to try for a new connection, best first: the healthy ones in policy
    /// order, then the others in list order (a last resort when none is healthy).
    pub fn candidates(&self) -> Vec<usize> {
        let mut up: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_up())
            .collect();
        if self.policy == BackendPolicy::LeastConnections {
            up.sort_by_key(|&i| self.nodes[i].active.load(Relaxed));
        }
        let down = (0..self.nodes.len()).filter(|&i| !self.nodes[i].is_up());
        up.into_iter().chain(down).collect()
    }

    /// Counts a client connection on node `index`.
    pub fn lease(self: &Arc<Self>, index: usize) -> Lease {
        if let Some(n) = self.nodes.get(index) {
            n.active.fetch_add(1, Relaxed);
            n.total.fetch_add(1, Relaxed);
        }
        Lease {
            backends: Arc::clone(self),
            index,
        }
    }

    /// A connection to node `index` failed: it is down until a check finds it up.
    pub fn connect_failed(&self, index: usize, why: &str) {
        if let Some(n) = self.nodes.get(index) {
            n.errors.fetch_add(1, Relaxed);
            n.set(false, format!("connect failed: {why}"));
        }
    }
}

/// Checks every node each `config.health_interval`, for ever (the task is aborted
/// with the server). The first round runs after one interval: the server runs
/// [`check_all`] itself before it listens.
pub async fn health_loop(backends: Arc<Backends>, config: Arc<Config>) {
    let mut tick = tokio::time::interval(config.health_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        check_all(&backends, &config).await;
    }
}

/// Checks every node once, all at once, and records what was found.
pub async fn check_all(backends: &Arc<Backends>, config: &Arc<Config>) {
    let mut checks = tokio::task::JoinSet::new();
    for index in 0..backends.nodes.len() {
        let (backends, config) = (Arc::clone(backends), Arc::clone(config));
        checks.spawn(async move {
            let Some(n) = backends.nodes.get(index) else {
                return;
            };
            let (up, detail) =
                match tokio::time::timeout(config.health_timeout, check(&n.addr, &config)).await {
                    Ok(r) => r,
                    Err(_) => (false, "health check timed out".to_string()),
                };
            if !up {
                n.errors.fetch_add(1, Relaxed);
            }
            n.set(up, detail);
        });
    }
    while checks.join_next().await.is_some() {}
}

/// The socket path of a backend address written `unix:PATH` (a server on this host,
/// reached without TCP); `None` for `host:port`.
pub fn unix_path(addr: &str) -> Option<&str> {
    addr.strip_prefix("unix:").filter(|p| !p.is_empty())
}

/// The first five bytes a server sends on `addr` (TCP or `unix:PATH`).
async fn greeting_head(addr: &str) -> Result<[u8; 5], String> {
    let mut head = [0u8; 5];
    let read = match unix_path(addr) {
        Some(path) => match tokio::net::UnixStream::connect(path).await {
            Ok(mut s) => s.read_exact(&mut head).await,
            Err(e) => return Err(format!("unreachable: {e}")),
        },
        None => match TcpStream::connect(addr).await {
            Ok(mut s) => s.read_exact(&mut head).await,
            Err(e) => return Err(format!("unreachable: {e}")),
        },
    };
    read.map(|_| head).map_err(|e| format!("no greeting: {e}"))
}

/// One check of `addr`: (up, what was found).
async fn check(addr: &str, config: &Config) -> (bool, String) {
    // A greeting: 4-byte header, then protocol version 10 (an ERR, 0xFF, when the
    // server refuses connections, e.g. too many).
    let head = match greeting_head(addr).await {
        Ok(h) => h,
        Err(why) => return (false, why),
    };
    if head[4] != 10 {
        return (false, "refuses connections".into());
    }
    let Some(user) = &config.health_user else {
        return (true, "answering".into());
    };
    match galera_state(addr, user, &config.health_password.0).await {
        Ok(None) => (true, "answering".into()),
        Ok(Some((ready, state))) => {
            let up = ready.eq_ignore_ascii_case("ON") && state == "Synced";
            (up, format!("wsrep_ready={ready}, {state}"))
        }
        Err(e) => (false, format!("status query failed: {e}")),
    }
}

/// A Galera node's (`wsrep_ready`, `wsrep_local_state_comment`); `None` for a server
/// that is not a node (`wsrep_on` missing or OFF).
async fn galera_state(
    addr: &str,
    user: &str,
    password: &str,
) -> Result<Option<(String, String)>, mysql_async::Error> {
    use mysql_async::prelude::Queryable;
    let (host, port) = match addr.rsplit_once(':') {
        Some((h, p)) => (h.trim_matches(['[', ']']), p.parse().unwrap_or(3306)),
        None => (addr, 3306),
    };
    let opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname(host.to_string())
        .tcp_port(port)
        .socket(unix_path(addr))
        .user(Some(user))
        .pass(Some(password))
        .prefer_socket(false)
        .stmt_cache_size(0);
    let mut conn = mysql_async::Conn::new(opts).await?;
    let on: Option<(String, String)> = conn
        .query_first("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'")
        .await?;
    let result = if on.is_some_and(|(_, v)| v.eq_ignore_ascii_case("ON")) {
        let rows: Vec<(String, String)> = conn
            .query(
                "SHOW GLOBAL STATUS WHERE Variable_name IN \
                 ('wsrep_ready', 'wsrep_local_state_comment')",
            )
            .await?;
        let get = |name: &str| {
            rows.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        Some((get("wsrep_ready"), get("wsrep_local_state_comment")))
    } else {
        None
    };
    let _ = conn.disconnect().await;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_split_and_trimmed() {
        assert_eq!(
            parse_list(" 10.0.0.1:3306, 10.0.0.2:3306 ,,"),
            vec!["10.0.0.1:3306", "10.0.0.2:3306"]
        );
        assert!(parse_list(" , ").is_empty());
    }

    #[test]
    fn least_connections_then_the_nodes_that_are_down() {
        let b = Arc::new(Backends::new(
            "a:1,b:1,c:1",
            BackendPolicy::LeastConnections,
        ));
        let l0 = b.lease(0);
        let _l0b = b.lease(0);
        let _l2 = b.lease(2);
        assert_eq!(b.candidates(), vec![1, 2, 0]);
        b.connect_failed(1, "refused");
        assert_eq!(b.candidates(), vec![2, 0, 1]);
        drop(l0);
        assert_eq!(b.views()[0].connections, 1);
        assert_eq!(b.views()[1].errors, 1);
        assert!(!b.views()[1].up);
    }

    #[test]
    fn first_keeps_list_order() {
        let b = Arc::new(Backends::new("a:1,b:1,c:1", BackendPolicy::First));
        let _l = b.lease(0);
        assert_eq!(b.candidates(), vec![0, 1, 2]);
        b.connect_failed(0, "refused");
        assert_eq!(b.candidates(), vec![1, 2, 0]);
    }
}

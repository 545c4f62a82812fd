//! A private 3-node Galera cluster per test binary, on loopback ports.
//!
//! Built like [`super::mariadb`]: each node's data directory is a copy of the same
//! template, and each `mariadbd` runs under the `sh` watchdog that stops it by pid (and
//! removes its directory) when the test process exits, however it exits. The first
//! node bootstraps the cluster (`--wsrep-new-cluster`), gets the test database and
//! users, and the other two join it by state transfer (rsync). SST by rsync fails when
//! `mariadbd` runs as root, so the nodes run as the `mysql` user (`--user=mysql`, the
//! server drops privileges itself and its pid stays the one the watchdog holds), with
//! directories that user owns.
//!
//! ```ignore
//! let cluster = galera();                      // starts once, waits for 3 × Synced
//! let url = cluster.node(1).url(TEST_DB);      // mysql_async URL of node 2
//! cluster.node(2).kill9(); cluster.node(2).restart(); // rejoins, waits until Synced
//! ```
//!
//! A cluster that cannot start fails the test with each node's error log.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::free_port;
use super::mariadb::{
    ensure_template, process_alive, read_pid_line, run_blocking, url_for, INNODB_OPTS, WATCHDOG,
};
use super::{ADMIN_USER, ED_PASSWORD, ED_USER, PASSWORD, TEST_DB, USER};

/// Nodes in the test cluster.
pub const NODES: usize = 3;
/// How long a node may take to become Synced (bootstrap or join by SST).
const SYNC_LIMIT: Duration = Duration::from_secs(120);
/// The Galera provider of Debian's `galera-4`.
const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// The running cluster; see [`galera()`].
pub struct Galera {
    /// The nodes, in the order they were started (node 0 bootstrapped the cluster).
    nodes: Vec<GaleraNode>,
}

/// One node of the cluster.
pub struct GaleraNode {
    /// 0-based position in [`Galera::nodes`].
    index: usize,
    /// Client port on 127.0.0.1.
    port: u16,
    /// Group communication port (gmcast), also the node's `wsrep_node_address` port.
    gport: u16,
    /// Incremental state transfer receive port.
    ist_port: u16,
    /// State snapshot transfer (rsync) receive port.
    sst_port: u16,
    /// Directory holding `data/`, `sock`, `error.log`; owned by `mysql`.
    dir: PathBuf,
    /// The cluster's directory (holding every node's): the watchdogs remove it when
    /// the test process exits.
    root: PathBuf,
    /// The running mariadbd's pid (changes on [`GaleraNode::restart`]).
    pid: Mutex<u32>,
    /// Every watchdog started for this node (one per start), held open for the life of
    /// the process: closing a pipe stops that start's server and removes the cluster's
    /// directory, which must outlive a restart.
    watchdogs: Mutex<Vec<(ChildStdin, Child)>>,
}

static GALERA: OnceLock<Galera> = OnceLock::new();

/// The test binary's cluster, started on first use: 3 nodes, all Synced, the database
/// [`TEST_DB`] and the users of [`super::mariadb()`] on every node.
pub fn galera() -> &'static Galera {
    GALERA.get_or_init(Galera::start)
}

impl Galera {
    /// The nodes.
    pub fn nodes(&self) -> &[GaleraNode] {
        &self.nodes
    }

    /// Node `i` (0-based).
    pub fn node(&self, i: usize) -> &GaleraNode {
        &self.nodes[i]
    }

    /// The nodes' client addresses, comma-separated (heatsink's `--backend` list).
    pub fn backend_list(&self) -> String {
        let addrs: Vec<String> = self.nodes.iter().map(|n| n.addr().to_string()).collect();
        addrs.join(",")
    }

    /// `gcomm://` address of every node (for a node that joins).
    fn gcomm(&self) -> String {
        gcomm_of(self.nodes.iter().map(|n| n.gport))
    }

    /// A node that is up and Synced (for setup and checks after a node was killed).
    pub fn any_synced(&self) -> &GaleraNode {
        self.nodes
            .iter()
            .find(|n| n.state().as_deref() == Some("Synced"))
            .unwrap_or_else(|| panic!("no node of the cluster is Synced"))
    }

    /// Waits until every node is Synced in a cluster of [`NODES`].
    pub fn wait_all_synced(&self) {
        for n in &self.nodes {
            n.wait_synced(NODES)
                .unwrap_or_else(|e| panic!("galera node {} not synced: {e}", n.index + 1));
        }
    }

    fn start() -> Galera {
        let template = ensure_template();
        let mut last = String::new();
        for _attempt in 0..3 {
            match Self::try_start(&template) {
                Ok(g) => return g,
                Err(e) => last = e,
            }
        }
        panic!("the Galera test cluster did not start:\n{last}");
    }

    fn try_start(template: &Path) -> Result<Galera, String> {
        let root = tempfile::Builder::new()
            .prefix("heatsink-galera-")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?
            .keep();
        set_mode(&root, 0o755)?;
        let mut nodes = Vec::new();
        for index in 0..NODES {
            let dir = root.join(format!("node{}", index + 1));
            fs::create_dir(&dir).map_err(|e| format!("mkdir {dir:?}: {e}"))?;
            let ok = Command::new("cp")
                .arg("-a")
                .arg(template)
                .arg(dir.join("data"))
                .status()
                .map_err(|e| format!("cp: {e}"))?
                .success();
            if !ok {
                return Err(format!("cp -a {template:?} failed"));
            }
            // A private temp dir: temporary table files of other servers in /tmp can
            // collide.
            fs::create_dir(dir.join("tmp")).map_err(|e| format!("mkdir tmp: {e}"))?;
            chown_mysql(&dir)?;
            nodes.push(GaleraNode {
                index,
                port: free_port(),
                gport: free_port(),
                ist_port: free_port(),
                sst_port: free_port(),
                dir,
                root: root.clone(),
                pid: Mutex::new(0),
                watchdogs: Mutex::new(Vec::new()),
            });
        }
        let g = Galera { nodes };
        // Bootstrap node 1, give it the database and users, then join the others (their
        // state transfer copies both).
        g.nodes[0].spawn("gcomm://", true)?;
        g.nodes[0].wait_synced(1)?;
        g.nodes[0].exec(&format!(
            "CREATE DATABASE IF NOT EXISTS {TEST_DB};
             CREATE USER '{USER}'@'%' IDENTIFIED VIA mysql_native_password USING PASSWORD('{PASSWORD}');
             GRANT ALL ON *.* TO '{USER}'@'%';
             CREATE USER '{ED_USER}'@'%' IDENTIFIED VIA ed25519 USING PASSWORD('{ED_PASSWORD}');
             GRANT ALL ON *.* TO '{ED_USER}'@'%';"
        ));
        let gcomm = g.gcomm();
        for n in &g.nodes[1..] {
            n.spawn(&gcomm, false)?;
        }
        for n in &g.nodes {
            n.wait_synced(NODES)?;
        }
        Ok(g)
    }
}

fn gcomm_of(ports: impl Iterator<Item = u16>) -> String {
    let hosts: Vec<String> = ports.map(|p| format!("127.0.0.1:{p}")).collect();
    format!("gcomm://{}", hosts.join(","))
}

impl GaleraNode {
    /// 0-based index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Client port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// mysql_async URL for [`USER`] on database `db`.
    pub fn url(&self, db: &str) -> String {
        url_for(self.addr(), USER, PASSWORD, db)
    }

    /// mysql_async URL for the superuser.
    pub fn admin_url(&self, db: &str) -> String {
        url_for(self.addr(), ADMIN_USER, "", db)
    }

    /// The running server's pid.
    pub fn pid(&self) -> u32 {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node's error log so far.
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }

    /// Runs `;`-separated statements as root on this node. Panics on failure.
    pub fn exec(&self, sql: &str) {
        let url = self.admin_url("");
        let owned = sql.to_string();
        let result = run_blocking(async move {
            use mysql_async::prelude::Queryable;
            let mut conn = mysql_async::Conn::from_url(url.as_str()).await?;
            conn.query_drop(owned.as_str()).await?;
            conn.disconnect().await
        });
        if let Err(e) = result {
            panic!(
                "SQL on galera node {} failed: {e}\nSQL: {sql}",
                self.index + 1
            );
        }
    }

    /// Rows of `sql` run as root on this node after every earlier write of the cluster
    /// is applied here (`wsrep_sync_wait = 15`), cells as text.
    pub fn query_strings(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        self.try_query(sql, true)
            .unwrap_or_else(|e| panic!("query on galera node {} failed: {e}", self.index + 1))
    }

    fn try_query(&self, sql: &str, sync: bool) -> Result<Vec<Vec<Option<String>>>, String> {
        let url = self.admin_url("");
        let owned = sql.to_string();
        run_blocking(async move {
            use mysql_async::prelude::Queryable;
            let opts = mysql_async::OptsBuilder::from_opts(
                mysql_async::Opts::from_url(&url).map_err(|e| e.to_string())?,
            )
            .conn_ttl(None);
            let mut conn =
                tokio::time::timeout(Duration::from_secs(5), mysql_async::Conn::new(opts))
                    .await
                    .map_err(|_| "connect timed out".to_string())?
                    .map_err(|e| e.to_string())?;
            if sync {
                conn.query_drop("SET SESSION wsrep_sync_wait = 15")
                    .await
                    .map_err(|e| e.to_string())?;
            }
            let rows: Vec<mysql_async::Row> = conn
                .query(owned.as_str())
                .await
                .map_err(|e| e.to_string())?;
            let _ = conn.disconnect().await;
            Ok(rows
                .into_iter()
                .map(|row| {
                    row.unwrap()
                        .into_iter()
                        .map(|v| match v {
                            mysql_async::Value::NULL => None,
                            mysql_async::Value::Bytes(b) => {
                                Some(String::from_utf8_lossy(&b).into_owned())
                            }
                            other => Some(other.as_sql(true)),
                        })
                        .collect()
                })
                .collect())
        })
    }

    /// A global status variable (`None` when the node does not answer).
    pub fn status(&self, name: &str) -> Option<String> {
        self.try_query(&format!("SHOW GLOBAL STATUS LIKE '{name}'"), false)
            .ok()?
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().nth(1).flatten())
    }

    /// `wsrep_local_state_comment` (`Synced`, `Donor/Desynced`, `Joining`, …).
    pub fn state(&self) -> Option<String> {
        self.status("wsrep_local_state_comment")
    }

    /// Waits until this node is Synced in a cluster of `size` nodes.
    pub fn wait_synced(&self, size: usize) -> Result<(), String> {
        let deadline = Instant::now() + SYNC_LIMIT;
        loop {
            let state = self.state();
            let cluster = self.status("wsrep_cluster_size");
            if state.as_deref() == Some("Synced")
                && cluster.as_deref() == Some(size.to_string().as_str())
            {
                return Ok(());
            }
            if !process_alive(self.pid()) {
                return Err(format!(
                    "galera node {} exited:\n{}",
                    self.index + 1,
                    tail(&self.error_log(), 40)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "galera node {} not Synced in a cluster of {size} after {SYNC_LIMIT:?} \
                     (state {state:?}, size {cluster:?}):\n{}",
                    self.index + 1,
                    tail(&self.error_log(), 40)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the server with SIGKILL and waits until it is gone.
    pub fn kill9(&self) {
        let pid = self.pid();
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the node again on its data directory (after [`GaleraNode::kill9`]): it
    /// rejoins the cluster, and this waits until it is Synced in a cluster of
    /// [`NODES`].
    pub fn restart(&self) {
        let cluster = galera();
        self.spawn(&cluster.gcomm(), false)
            .and_then(|()| self.wait_synced(NODES))
            .unwrap_or_else(|e| panic!("galera node {} did not rejoin: {e}", self.index + 1));
    }

    /// Starts mariadbd for this node under a new watchdog.
    fn spawn(&self, cluster_address: &str, bootstrap: bool) -> Result<(), String> {
        let data = self.dir.join("data");
        let mut server: Vec<String> = vec![
            "mariadbd".into(),
            "--no-defaults".into(),
            "--user=mysql".into(),
            format!("--datadir={}", data.display()),
            format!("--tmpdir={}", self.dir.join("tmp").display()),
            format!("--socket={}", self.dir.join("sock").display()),
            format!("--pid-file={}", self.dir.join("mariadbd.pid").display()),
            format!("--log-error={}", self.dir.join("error.log").display()),
            format!("--port={}", self.port),
            "--bind-address=127.0.0.1".into(),
            "--skip-log-bin".into(),
            "--binlog-format=ROW".into(),
            "--innodb-autoinc-lock-mode=2".into(),
            "--innodb-flush-log-at-trx-commit=2".into(),
            "--max-connections=500".into(),
            "--plugin-load-add=auth_ed25519".into(),
            "--max-allowed-packet=64M".into(),
            "--wsrep-on=ON".into(),
            format!("--wsrep-provider={PROVIDER}"),
            "--wsrep-cluster-name=heatsink_test".into(),
            format!("--wsrep-node-name=node{}", self.index + 1),
            format!("--wsrep-node-address=127.0.0.1:{}", self.gport),
            format!(
                "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{};\
                 ist.recv_addr=127.0.0.1:{};gcache.size=64M",
                self.gport, self.ist_port
            ),
            format!("--wsrep-sst-receive-address=127.0.0.1:{}", self.sst_port),
            "--wsrep-sst-method=rsync".into(),
            format!("--wsrep-cluster-address={cluster_address}"),
        ];
        server.extend(INNODB_OPTS.iter().map(|s| s.to_string()));
        if bootstrap {
            server.push("--wsrep-new-cluster".into());
        }
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("heatsink-galera-watchdog")
            .arg(&self.root)
            .args(&server)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn sh watchdog: {e}"))?;
        let stdin = watchdog.stdin.take().ok_or("watchdog stdin")?;
        let mut stdout = watchdog.stdout.take().ok_or("watchdog stdout")?;
        let pid = read_pid_line(&mut stdout);
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = pid;
        self.watchdogs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((stdin, watchdog));
        Ok(())
    }
}

fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {path:?}: {e}"))
}

fn chown_mysql(path: &Path) -> Result<(), String> {
    let ok = Command::new("chown")
        .arg("-R")
        .arg("mysql:mysql")
        .arg(path)
        .status()
        .map_err(|e| format!("chown: {e}"))?
        .success();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "chown -R mysql:mysql {path:?} failed (the Galera tests need root and a `mysql` user)"
        ))
    }
}

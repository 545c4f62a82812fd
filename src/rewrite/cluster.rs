//! What a session learns of its backend node: whether it is a Galera node
//! ([`ClusterInfo`]) and its share of a rule's proxy-chosen values ([`NodeShare`]).

/// Which share of a rule's proxy-chosen values (a counter's slots) a session writes:
/// on a Galera cluster each node its own share, so that writes through different
/// nodes never touch the same slot row and never fail certification against each
/// other. Only a performance matter: any slot is correct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeShare {
    /// The backend node's `wsrep_local_index` (0-based).
    pub index: u32,
    /// `wsrep_cluster_size` when the session learned it.
    pub nodes: u32,
}

/// What a session learns of its backend node with the settings query: whether it is
/// a node of a running Galera cluster, and its share of proxy-chosen values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterInfo {
    /// A Galera provider runs on the node (`wsrep_cluster_size` ≥ 1). A server built
    /// with Galera support but without a provider reports the status variables with
    /// a cluster size of 0.
    pub galera: bool,
    /// The node's share, in a cluster of several nodes.
    pub share: Option<NodeShare>,
}

impl ClusterInfo {
    /// Reads the third column of [`SESSION_STATE_QUERY`](super::SESSION_STATE_QUERY) (`index/size`, NULL on a
    /// server without the status variables).
    pub fn from_server(cell: Option<&[u8]>) -> ClusterInfo {
        let size = cell
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|t| t.split_once('/'))
            .and_then(|(_, n)| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
        ClusterInfo {
            galera: size >= 1,
            share: cell.and_then(NodeShare::from_server),
        }
    }
}

impl NodeShare {
    /// Reads `index/nodes` (the third column of [`SESSION_STATE_QUERY`](super::SESSION_STATE_QUERY)); `None` for a
    /// server that is not in a cluster of several nodes, or an index out of range (a
    /// node outside the primary component reports 2^64 − 1).
    pub fn from_server(cell: &[u8]) -> Option<NodeShare> {
        let text = std::str::from_utf8(cell).ok()?;
        let (i, n) = text.split_once('/')?;
        let index: u32 = i.trim().parse().ok()?;
        let nodes: u32 = n.trim().parse().ok()?;
        (nodes > 1 && index < nodes).then_some(NodeShare { index, nodes })
    }

    /// A value below `n`: uniform over this share's part of `0..n` (the
    /// `index`-th of `nodes` consecutive ranges), or over all of it without a share
    /// or when there are fewer values than nodes.
    pub fn pick_below(share: Option<NodeShare>, n: u32) -> u32 {
        let n = n.max(1);
        let (lo, hi) = match share {
            Some(s) if s.nodes <= n => {
                let (i, k, n64) = (u64::from(s.index), u64::from(s.nodes), u64::from(n));
                ((n64 * i / k) as u32, (n64 * (i + 1) / k) as u32)
            }
            _ => (0, n),
        };
        rand::random_range(lo..hi.max(lo + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::NodeShare;

    #[test]
    fn reads_index_and_cluster_size() {
        assert_eq!(
            NodeShare::from_server(b"1/3"),
            Some(NodeShare { index: 1, nodes: 3 })
        );
        // Not a cluster, a cluster of one, a node outside the primary component.
        assert_eq!(NodeShare::from_server(b""), None);
        assert_eq!(NodeShare::from_server(b"0/1"), None);
        assert_eq!(NodeShare::from_server(b"18446744073709551615/3"), None);
        assert_eq!(NodeShare::from_server(b"3/3"), None);
    }

    #[test]
    fn a_server_without_a_provider_is_not_a_node() {
        use super::ClusterInfo;
        // Debian's MariaDB without wsrep on: the status exists, the cluster is empty.
        let plain = ClusterInfo::from_server(Some(b"18446744073709551615/0"));
        assert_eq!(plain, ClusterInfo::default());
        assert_eq!(ClusterInfo::from_server(None), ClusterInfo::default());
        let single = ClusterInfo::from_server(Some(b"0/1"));
        assert!(single.galera && single.share.is_none());
        let three = ClusterInfo::from_server(Some(b"2/3"));
        assert!(three.galera);
        assert_eq!(three.share, Some(NodeShare { index: 2, nodes: 3 }));
    }

    #[test]
    fn each_node_picks_from_its_own_range_of_slots() {
        for nodes in 2..=5u32 {
            let mut seen = vec![None; 16];
            for index in 0..nodes {
                let share = Some(NodeShare { index, nodes });
                for _ in 0..400 {
                    let v = NodeShare::pick_below(share, 16) as usize;
                    assert!(v < 16);
                    assert!(
                        seen[v].is_none_or(|owner| owner == index),
                        "slot {v} picked by nodes {seen:?} and {index}"
                    );
                    seen[v] = Some(index);
                }
            }
            // Every slot belongs to some node.
            assert!(seen.iter().all(Option::is_some), "{nodes} nodes: {seen:?}");
        }
        // More nodes than slots, or no share: any slot.
        let many = Some(NodeShare { index: 7, nodes: 8 });
        assert!((0..100).all(|_| NodeShare::pick_below(many, 4) < 4));
        assert!((0..100).all(|_| NodeShare::pick_below(None, 4) < 4));
    }
}

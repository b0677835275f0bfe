//! A network namespace's conntrack table as the kernel shows it: its size
//! (`net.netfilter.nf_conntrack_count`, per namespace), the limit
//! (`net.netfilter.nf_conntrack_max`, global: every namespace compares its own count
//! with it) and the per-CPU statistics of `/proc/net/stat/nf_conntrack`, summed. All of
//! them are read in the calling thread's namespace (`/proc/sys/net` and
//! `/proc/thread-self/net` follow the thread), so [`read_netns`] reads another namespace
//! from a thread that entered it.

use std::{collections::BTreeSet, fs, path::Path};

pub(crate) use super::namespaces::NetnsFile;
use super::namespaces::{in_each_netns, in_netns, namespace_files, netns_inode};

/// One reading of a namespace's conntrack table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ConntrackStats {
    /// Entries in this namespace's table.
    pub(crate) count: u64,
    /// The limit every namespace's count is held to (0: none).
    pub(crate) max: u64,
    /// Packets conntrack itself dropped: no entry could be made (the table full and
    /// nothing evictable, or out of memory) or the protocol tracker refused the packet.
    pub(crate) drop: u64,
    /// Unassured entries evicted to make room for new ones (the table was full, and a
    /// packet got its entry anyway).
    pub(crate) early_drop: u64,
    /// Entries that could not be inserted (a clash at confirmation).
    pub(crate) insert_failed: u64,
    /// Packets that were not a valid part of any connection (conntrack state INVALID).
    /// Conntrack accepts them; a `ct state invalid drop` rule is what drops them.
    pub(crate) invalid: u64,
}

impl ConntrackStats {
    /// Whether a new connection finds no room: the kernel allocates an entry only while
    /// the count stays at or below the limit after its own increment.
    pub(crate) fn is_full(&self) -> bool {
        self.max != 0 && self.count >= self.max
    }
}

/// The counters of `/proc/net/stat/nf_conntrack`: a header naming the columns, then one
/// line of hexadecimal values per CPU. Columns are found by name (their set changed
/// across kernels); `entries` repeats the table's size on every line and is not summed.
/// `None` when a needed column is missing.
pub(crate) fn parse_stat(text: &str) -> Option<ConntrackStats> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let column = |name: &str| header.iter().position(|h| *h == name);
    let (drop, early_drop, insert_failed, invalid) = (
        column("drop")?,
        column("early_drop")?,
        column("insert_failed")?,
        column("invalid")?,
    );
    let mut stats = ConntrackStats::default();
    for line in lines {
        let values: Vec<u64> = line
            .split_whitespace()
            .map(|v| u64::from_str_radix(v, 16))
            .collect::<Result<_, _>>()
            .ok()?;
        if values.len() < header.len() {
            return None;
        }
        stats.drop += values[drop];
        stats.early_drop += values[early_drop];
        stats.insert_failed += values[insert_failed];
        stats.invalid += values[invalid];
    }
    Some(stats)
}

fn read_u64(path: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The calling thread's namespace's table; `None` without conntrack (the module is not
/// loaded, so nothing is tracked).
pub(crate) fn read_here() -> Option<ConntrackStats> {
    read_here_with(read_u64(MAX)?)
}

/// The limit is global: read once for every namespace of a refresh.
const MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

/// [`read_here`] with the limit already read.
fn read_here_with(max: u64) -> Option<ConntrackStats> {
    let count = read_u64("/proc/sys/net/netfilter/nf_conntrack_count")?;
    let stat = fs::read_to_string("/proc/thread-self/net/stat/nf_conntrack").ok()?;
    Some(ConntrackStats {
        count,
        max,
        ..parse_stat(&stat)?
    })
}

/// The agent's own namespace (inode).
pub(crate) fn own_netns() -> u32 {
    netns_inode(Path::new("/proc/self/ns/net")).unwrap_or(0)
}

/// Reads namespace `file`'s table (the agent's own without entering it).
pub(crate) fn read_netns(file: &NetnsFile) -> Option<ConntrackStats> {
    if file.inode == own_netns() {
        return read_here();
    }
    in_netns(file, read_here).ok().flatten()
}

/// The tables of the namespaces of `files` (the agent's own read without entering it,
/// the others from one thread that enters each in turn), in `files`' order.
pub(crate) fn read_each(files: &[NetnsFile]) -> Vec<Option<ConntrackStats>> {
    if files.is_empty() {
        return Vec::new();
    }
    // No limit to read: conntrack is not loaded, and no namespace has a table.
    let Some(max) = read_u64(MAX) else {
        return vec![None; files.len()];
    };
    let own = own_netns();
    let others: Vec<NetnsFile> = files.iter().filter(|f| f.inode != own).cloned().collect();
    let mut read = in_each_netns(&others, || read_here_with(max)).into_iter();
    files
        .iter()
        .map(|f| {
            if f.inode == own {
                read_here_with(max)
            } else {
                read.next().and_then(|r| r.ok().flatten())
            }
        })
        .collect()
}

/// The files pinning the namespaces of `scope` (inodes; every namespace when `None`),
/// the agent's own included.
pub(crate) fn scope_files(scope: Option<&BTreeSet<u32>>) -> Vec<NetnsFile> {
    let own = own_netns();
    let wanted = |inode: u32| scope.is_none_or(|s| s.contains(&inode));
    let mut files: Vec<NetnsFile> = namespace_files()
        .into_iter()
        .filter(|f| f.inode != own && wanted(f.inode))
        .collect();
    if wanted(own) {
        files.push(NetnsFile {
            inode: own,
            path: "/proc/self/ns/net".into(),
            name: "self".into(),
        });
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_6_18: &str = "\
entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart
00000005  00000000 00000000 00000000 00000003 00000000 00000000 00000000 00000000 00000001 0000000a 00000002 00000000  00000000 00000000 00000000 00000000
00000005  00000000 00000000 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000006 00000000 00000000  00000000 00000000 00000000 00000000
";

    #[test]
    fn stat_columns_are_found_by_name_and_summed_over_cpus() {
        let s = parse_stat(STAT_6_18).unwrap();
        assert_eq!(
            (s.drop, s.early_drop, s.insert_failed, s.invalid),
            (16, 2, 1, 4)
        );
        assert_eq!(s.count, 0, "entries is not summed");
        assert!(parse_stat("entries searched found\n00000001 00000002 00000003\n").is_none());
        assert!(parse_stat("").is_none());
    }

    #[test]
    fn full_means_no_room_for_one_more() {
        let s = |count, max| ConntrackStats {
            count,
            max,
            ..Default::default()
        };
        assert!(s(10, 10).is_full());
        assert!(!s(9, 10).is_full());
        assert!(!s(10, 0).is_full(), "no limit");
    }

    #[test]
    fn reads_this_namespace_when_conntrack_is_loaded() {
        // Without the module nothing is tracked and there is nothing to read.
        if Path::new("/proc/sys/net/netfilter/nf_conntrack_count").exists() {
            let s = read_here().expect("conntrack readable");
            assert!(s.max > 0);
        } else {
            assert_eq!(read_here(), None);
        }
    }
}

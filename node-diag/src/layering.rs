//! The borders between modules, checked rather than described. Two rules, read from
//! the sources' paths (`crate::`, `super::`, `self::`; test modules and comments
//! excluded):
//!
//! - In this crate a top-level module imports only the modules below it in
//!   [`LAYERS`]: data flows one way, from the kernel and the node to the agent and the
//!   output, so no lower layer imports `agent` or `output`.
//! - In every crate of the workspace no two sibling modules import each other, directly
//!   or around a loop (a child using its parent's items is not a loop).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// This crate's top-level modules, lowest first.
const LAYERS: &[&str] = &[
    "host_network",
    "services",
    "pods",
    "kernel",
    "findings",
    "mtu",
    "probe",
    "output",
    "doctor",
    "client",
    "agent",
];

/// One source file: its module path (`["findings", "correlate"]`) and its text.
struct Source {
    module: Vec<String>,
    text: String,
}

/// The module path a file under `src` defines (`a/b.rs` and `a/b/mod.rs` are `a::b`;
/// the crate root is empty).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "main" | "lib")
    ) {
        parts.pop();
    }
    parts
}

/// The code of a file that counts: up to its test module, without comments.
fn code(text: &str) -> String {
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module paths `text` names, each as far as it goes (`crate::a::b::{c, d}` names
/// `a::b::c` and `a::b::d`), resolved from `module`.
fn references(module: &[String], text: &str) -> Vec<Vec<String>> {
    let code = code(text);
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if !code.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let rest = &code[i..];
        let start = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|p| rest.starts_with(p));
        let boundary = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let (Some(_), true) = (start, boundary) else {
            i += 1;
            continue;
        };
        let (path, used) = path_at(rest);
        i += used.max(1);
        for p in path {
            if let Some(resolved) = resolve(module, &p) {
                out.push(resolved);
            }
        }
    }
    out
}

/// The paths written at the start of `s` (expanding one level of `{...}` groups), and
/// how many bytes they took.
fn path_at(s: &str) -> (Vec<Vec<String>>, usize) {
    let ident_end = |s: &str| {
        s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(s.len())
    };
    let end = ident_end(s);
    let head: Vec<String> = s[..end]
        .split("::")
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    if s[end..].starts_with('{') {
        let close = s[end..].find('}').map_or(s.len(), |c| end + c);
        let inner = &s[end + 1..close.min(s.len())];
        let paths = inner
            .split(',')
            .map(|item| {
                let item = item.trim();
                let mut p = head.clone();
                p.extend(
                    item[..ident_end(item)]
                        .split("::")
                        .filter(|x| !x.is_empty())
                        .map(str::to_string),
                );
                p
            })
            .collect();
        return (paths, close);
    }
    (vec![head], end)
}

/// A path relative to `module` as an absolute one; `None` for a path that leaves the
/// crate.
fn resolve(module: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String> = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("self") => {
            base = module.to_vec();
            rest = &path[1..];
        }
        Some("super") => {
            base = module.to_vec();
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Every pair of sibling modules where the first imports (something inside) the
/// second, as (parent, from, to).
fn sibling_edges(sources: &[Source]) -> BTreeSet<(Vec<String>, String, String)> {
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|s| s.module.clone()).collect();
    let mut edges = BTreeSet::new();
    for s in sources {
        for target in references(&s.module, &s.text) {
            // The longest module the path names (an item's path goes past it).
            let Some(target) = (0..=target.len())
                .rev()
                .map(|n| target[..n].to_vec())
                .find(|m| modules.contains(m))
            else {
                continue;
            };
            let common = s
                .module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            // A module using its own ancestors or descendants is no edge between siblings.
            if common == s.module.len() || common == target.len() {
                continue;
            }
            edges.insert((
                s.module[..common].to_vec(),
                s.module[common].clone(),
                target[common].clone(),
            ));
        }
    }
    edges
}

/// The loops among sibling modules, each as `parent: a -> b -> a`.
fn cycles(sources: &[Source]) -> Vec<String> {
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (parent, from, to) in sibling_edges(sources) {
        graphs
            .entry(parent)
            .or_default()
            .entry(from)
            .or_default()
            .insert(to);
    }
    let mut found = Vec::new();
    for (parent, graph) in &graphs {
        for start in graph.keys() {
            // A path back to `start` from any module it imports.
            let mut stack: Vec<Vec<&String>> = vec![vec![start]];
            let mut seen = BTreeSet::new();
            while let Some(path) = stack.pop() {
                let last = *path.last().unwrap_or(&start);
                for next in graph.get(last).into_iter().flatten() {
                    if next == start {
                        let names: Vec<&str> = path.iter().map(|s| s.as_str()).collect();
                        found.push(format!(
                            "{}: {} -> {start}",
                            parent.join("::"),
                            names.join(" -> ")
                        ));
                    } else if seen.insert(next) {
                        let mut longer = path.clone();
                        longer.push(next);
                        stack.push(longer);
                    }
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// Imports of this crate's top-level modules against [`LAYERS`], as
/// `from imports to`.
fn layer_violations(sources: &[Source]) -> Vec<String> {
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut found = BTreeSet::new();
    for (parent, from, to) in sibling_edges(sources) {
        if !parent.is_empty() {
            continue;
        }
        if let (Some(a), Some(b)) = (rank(&from), rank(&to))
            && b >= a
        {
            found.insert(format!("{from} imports {to}"));
        }
    }
    found.into_iter().collect()
}

/// Every `.rs` file under `dir`, with its module path.
fn sources(dir: &Path) -> Vec<Source> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
        .into_iter()
        .filter_map(|path| {
            let rel = path.strip_prefix(dir).ok()?;
            Some(Source {
                module: module_of(rel),
                text: std::fs::read_to_string(&path).ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(module: &str, text: &str) -> Source {
        Source {
            module: module
                .split("::")
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .collect(),
            text: text.to_string(),
        }
    }

    /// The workspace's crates, beside this one.
    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn this_crate_keeps_its_layers() {
        let found = layer_violations(&sources(&workspace().join("node-diag/src")));
        assert!(found.is_empty(), "layering broken: {found:#?}");
    }

    #[test]
    fn no_crate_has_an_import_cycle() {
        for krate in [
            "node-diag",
            "node-diag-common",
            "node-diag-ebpf",
            "xtask",
            "testbed",
            "tests",
        ] {
            let found = cycles(&sources(&workspace().join(krate).join("src")));
            assert!(found.is_empty(), "{krate} has import cycles: {found:#?}");
        }
    }

    #[test]
    fn a_lower_layer_importing_the_agent_or_the_output_is_caught() {
        let tree = [
            src("kernel::maps", "use crate::agent::metrics::Metrics;\n"),
            src(
                "findings",
                "pub fn f() { crate::output::print_finding(); }\n",
            ),
            src("agent", "use crate::{findings::Finding, kernel::maps};\n"),
            src("agent::metrics", ""),
            src("output", "use crate::findings::Finding;\n"),
        ];
        assert_eq!(
            layer_violations(&tree),
            ["findings imports output", "kernel imports agent"]
        );
    }

    #[test]
    fn a_loop_between_siblings_is_caught_and_a_child_using_its_parent_is_not() {
        let tree = [
            src("vm", "mod arm64; mod qemu; use self::arm64::Arch;\n"),
            src("vm::arm64", "use super::qemu::boot;\n"),
            src("vm::qemu", "use super::{super::suite::Suite, Guest};\n"),
            src("suite", "use crate::vm::run;\n"),
        ];
        assert_eq!(
            cycles(&tree),
            [": suite -> vm -> suite", ": vm -> suite -> vm"]
        );
        let fixed = [
            src("vm", "use self::arm64::Arch;\n"),
            src("vm::arm64", "use super::{qemu::boot, Guest};\n"),
            src("vm::qemu", "// use crate::suite::Suite;\n"),
            src("suite", "use crate::vm::run;\n"),
        ];
        assert!(cycles(&fixed).is_empty());
    }

    #[test]
    fn test_modules_and_comments_do_not_count() {
        let tree = [
            src(
                "pods",
                "//! Named for `crate::findings`.\nfn a() {}\n#[cfg(test)]\nmod tests { use crate::findings::x; }\n",
            ),
            src("findings", "use crate::pods::PodRef;\n"),
        ];
        assert!(cycles(&tree).is_empty());
        assert!(layer_violations(&tree).is_empty());
    }
}

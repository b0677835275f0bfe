//! The borders between modules, checked rather than described. Every file is parsed
//! (`syn`), and every path it names counts: `use` trees however nested, paths in code and
//! types, and `crate::`/`super::`/`self::` paths inside macro calls; test code
//! (`#[cfg(test)]` items, and the files of `#[cfg(test)] mod x;`) does not. Three rules:
//!
//! - In this crate every top-level module has its place in [`LAYERS`], and imports only
//!   the modules below it: data flows one way, from the kernel and the node to the agent
//!   and the output, so no lower layer imports `agent` or `output`.
//! - In every crate of the workspace no two sibling modules import each other, directly
//!   or around a loop (a child using its parent's items is not a loop).
//! - A check that read no file, or could not parse one, fails.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// This crate's top-level modules, lowest first.
const LAYERS: &[&str] = &[
    "cli_reference",
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

/// One source file, parsed: its module path (`["findings", "correlate"]`) and the module
/// paths it names, resolved, each with the module it was written in (the file's, or an
/// inline module's inside it); test code left out.
struct Source {
    module: Vec<String>,
    references: Vec<(Vec<String>, Vec<String>)>,
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

/// Whether `attrs` hold `#[cfg(test)]` (alone or inside `all(...)`).
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.clone().into_iter().any(|t| is_ident(&t, "test")))
    })
}

fn is_ident(t: &TokenTree, name: &str) -> bool {
    matches!(t, TokenTree::Ident(i) if i == name)
}

fn is_colon(t: Option<&TokenTree>) -> bool {
    matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == ':')
}

/// Collects the paths a file names, in the module it is in (inline `mod x { .. }`
/// blocks move it), skipping test code.
struct Collector {
    module: Vec<String>,
    /// Raw paths, each with the module it was written in.
    paths: Vec<(Vec<String>, Vec<String>)>,
    /// `#[cfg(test)] mod x;` declarations: modules whose files are test code.
    test_modules: Vec<Vec<String>>,
}

impl Collector {
    fn add(&mut self, path: Vec<String>) {
        if !path.is_empty() {
            self.paths.push((self.module.clone(), path));
        }
    }

    fn use_tree(&mut self, prefix: &[String], tree: &syn::UseTree) {
        let mut path = prefix.to_vec();
        match tree {
            syn::UseTree::Path(p) => {
                path.push(p.ident.to_string());
                self.use_tree(&path, &p.tree);
            }
            syn::UseTree::Name(n) if n.ident == "self" => self.add(path),
            syn::UseTree::Name(n) => {
                path.push(n.ident.to_string());
                self.add(path);
            }
            syn::UseTree::Rename(r) => {
                path.push(r.ident.to_string());
                self.add(path);
            }
            syn::UseTree::Glob(_) => self.add(path),
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    self.use_tree(prefix, item);
                }
            }
        }
    }

    /// `crate::a::b`, `super::a`, `self::a` sequences in a macro's tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            if let TokenTree::Group(g) = &tokens[i] {
                self.tokens(g.stream());
                i += 1;
                continue;
            }
            if !["crate", "super", "self"]
                .iter()
                .any(|k| is_ident(&tokens[i], k))
            {
                i += 1;
                continue;
            }
            let mut path = vec![tokens[i].to_string()];
            i += 1;
            // `::` is two `:` puncts, then an identifier.
            while is_colon(tokens.get(i)) && is_colon(tokens.get(i + 1)) {
                match tokens.get(i + 2) {
                    Some(TokenTree::Ident(id)) => {
                        path.push(id.to_string());
                        i += 3;
                    }
                    _ => break,
                }
            }
            if path.len() > 1 {
                self.add(path);
            }
        }
    }
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => return visit::visit_item(self, item),
        };
        if is_test(attrs) {
            if let syn::Item::Mod(m) = item
                && m.content.is_none()
            {
                let mut module = self.module.clone();
                module.push(m.ident.to_string());
                self.test_modules.push(module);
            }
            return;
        }
        visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        if let syn::ImplItem::Fn(f) = item
            && is_test(&f.attrs)
        {
            return;
        }
        visit::visit_impl_item(self, item);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.module.push(m.ident.to_string());
        visit::visit_item_mod(self, m);
        self.module.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&[], &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.add(p.segments.iter().map(|s| s.ident.to_string()).collect());
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        visit::visit_macro(self, m);
    }
}

/// A path written in `module` as an absolute module path; `None` for a path that does
/// not start with `crate`, `super` or `self` (other crates, the standard library, local
/// names, and the module's own children, which are no sibling's).
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

/// Every `.rs` file under `dir`, parsed, its test files left out. Fails when there is
/// none or one does not parse.
fn sources(dir: &Path) -> Result<Vec<Source>, String> {
    let mut texts = Vec::new();
    for path in rust_files(dir) {
        let rel = path.strip_prefix(dir).map_err(|e| e.to_string())?;
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        texts.push((module_of(rel), text));
    }
    parse(texts).map_err(|e| format!("{}: {e}", dir.display()))
}

/// Every `.rs` file under `dir`, at any depth.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
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
}

/// [`Source`]s from `(module, text)` pairs; the files of test modules left out.
fn parse(texts: Vec<(Vec<String>, String)>) -> Result<Vec<Source>, String> {
    if texts.is_empty() {
        return Err("no source file read".into());
    }
    let mut collected = Vec::new();
    let mut test_modules = Vec::new();
    for (module, text) in texts {
        let file = syn::parse_file(&text)
            .map_err(|e| format!("cannot parse module `{}`: {e}", module.join("::")))?;
        let mut c = Collector {
            module: module.clone(),
            paths: Vec::new(),
            test_modules: Vec::new(),
        };
        c.visit_file(&file);
        test_modules.extend(c.test_modules);
        collected.push((module, c.paths));
    }
    Ok(collected
        .into_iter()
        .filter(|(module, _)| !test_modules.iter().any(|t| module.starts_with(t)))
        .map(|(module, paths)| Source {
            references: paths
                .into_iter()
                .filter_map(|(written_in, p)| Some((resolve(&written_in, &p)?, written_in)))
                .map(|(target, from)| (from, target))
                .collect(),
            module,
        })
        .collect())
}

/// Every pair of sibling modules where the first imports (something inside) the
/// second, as (parent, from, to).
fn sibling_edges(sources: &[Source]) -> BTreeSet<(Vec<String>, String, String)> {
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|s| s.module.clone()).collect();
    let mut edges = BTreeSet::new();
    for (from, target) in sources.iter().flat_map(|s| &s.references) {
        // The longest module the path names (an item's path goes past it).
        let Some(target) = (0..=target.len())
            .rev()
            .map(|n| target[..n].to_vec())
            .find(|m| modules.contains(m))
        else {
            continue;
        };
        let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
        // A module using its own ancestors or descendants is no edge between siblings.
        if common == from.len() || common == target.len() {
            continue;
        }
        edges.insert((
            from[..common].to_vec(),
            from[common].clone(),
            target[common].clone(),
        ));
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

/// This crate's top-level modules against [`LAYERS`]: an import of a module not below,
/// as `from imports to`, and a module [`LAYERS`] does not place, as `from is unlisted`.
fn layer_violations(sources: &[Source]) -> Vec<String> {
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut found = BTreeSet::new();
    for s in sources {
        if let Some(top) = s.module.first()
            && rank(top).is_none()
        {
            found.insert(format!("{top} is unlisted"));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> Vec<Source> {
        parse(
            files
                .iter()
                .map(|(module, text)| {
                    (
                        module
                            .split("::")
                            .filter(|m| !m.is_empty())
                            .map(str::to_string)
                            .collect(),
                        (*text).to_string(),
                    )
                })
                .collect(),
        )
        .unwrap()
    }

    /// The workspace's crates, beside this one.
    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn this_crate_keeps_its_layers() {
        let sources = sources(&workspace().join("node-diag/src")).unwrap();
        assert!(sources.len() > 100, "{} files", sources.len());
        let found = layer_violations(&sources);
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
            let found = cycles(&sources(&workspace().join(krate).join("src")).unwrap());
            assert!(found.is_empty(), "{krate} has import cycles: {found:#?}");
        }
    }

    /// Lines of a file that count: not blank, and before its test module (a
    /// `#[cfg(test)]` followed by `mod`). Files that are test modules themselves
    /// (`tests.rs`, `fixtures.rs`) do not count.
    fn code_lines(text: &str) -> usize {
        let lines: Vec<&str> = text.lines().collect();
        let end = (0..lines.len())
            .find(|&i| {
                lines[i].trim() == "#[cfg(test)]"
                    && lines
                        .get(i + 1)
                        .is_some_and(|next| next.trim_start().starts_with("mod "))
            })
            .unwrap_or(lines.len());
        lines[..end].iter().filter(|l| !l.trim().is_empty()).count()
    }

    #[test]
    fn no_file_is_over_600_lines_of_code() {
        let files: Vec<PathBuf> = rust_files(&workspace().join("node-diag/src"))
            .into_iter()
            .filter(|f| !["tests.rs", "fixtures.rs"].iter().any(|t| f.ends_with(t)))
            .collect();
        assert!(files.len() > 100);
        let over: Vec<String> = files
            .iter()
            .map(|f| (code_lines(&std::fs::read_to_string(f).unwrap()), f))
            .filter(|(n, _)| *n > 600)
            .map(|(n, f)| format!("{}: {n}", f.display()))
            .collect();
        assert!(over.is_empty(), "split these: {over:#?}");
        assert_eq!(
            code_lines("fn a() {}\n\n// b\n#[cfg(test)]\nmod tests {\n}\n"),
            2
        );
    }

    #[test]
    fn reading_nothing_or_what_does_not_parse_fails() {
        assert!(sources(&workspace().join("no-such-crate/src")).is_err());
        assert!(parse(Vec::new()).is_err());
        assert!(parse(vec![(vec!["kernel".into()], "fn f( {".into())]).is_err());
    }

    #[test]
    fn a_lower_layer_importing_the_agent_or_the_output_is_caught() {
        let sources = tree(&[
            ("kernel::maps", "use crate::agent::metrics::Metrics;\n"),
            (
                "findings",
                "pub fn f() { crate::output::print_finding(); }\n",
            ),
            ("agent", "use crate::{findings::Finding, kernel::maps};\n"),
            ("agent::metrics", ""),
            ("kernel", ""),
            ("output", "use crate::findings::Finding;\n"),
        ]);
        assert_eq!(
            layer_violations(&sources),
            ["findings imports output", "kernel imports agent"]
        );
    }

    /// What the text scanner this replaced let through: imports after a nested group,
    /// and code after a `#[cfg(test)] mod x;` declaration (whose file is test code and
    /// does not count).
    #[test]
    fn nested_groups_and_code_after_a_test_module_declaration_are_read() {
        let sources = tree(&[
            (
                "findings::store",
                "use crate::{kernel::{maps::KernelMaps, ring}, output::print, agent::Agent};\n",
            ),
            ("findings", "mod store;\n"),
            ("kernel", ""),
            ("kernel::maps", ""),
            ("output", ""),
            ("agent", ""),
        ]);
        assert_eq!(
            layer_violations(&sources),
            ["findings imports agent", "findings imports output"]
        );
        let sources = tree(&[
            (
                "pods",
                "#[cfg(test)]\nmod fixtures;\nfn a() { tracing::info!(\"{}\", crate::agent::NAME); }\n",
            ),
            ("pods::fixtures", "use crate::agent::Agent;\n"),
            ("agent", ""),
        ]);
        assert_eq!(layer_violations(&sources), ["pods imports agent"]);
    }

    #[test]
    fn a_module_without_a_layer_is_caught() {
        let sources = tree(&[("kernel", ""), ("gadgets", "use crate::kernel::X;\n")]);
        assert_eq!(layer_violations(&sources), ["gadgets is unlisted"]);
    }

    #[test]
    fn a_loop_between_siblings_is_caught_and_a_child_using_its_parent_is_not() {
        let sources = tree(&[
            ("vm", "mod arm64; mod qemu; use self::arm64::Arch;\n"),
            ("vm::arm64", "use super::qemu::boot;\n"),
            ("vm::qemu", "use super::{super::suite::Suite, Guest};\n"),
            ("suite", "use crate::vm::run;\n"),
        ]);
        assert_eq!(
            cycles(&sources),
            [": suite -> vm -> suite", ": vm -> suite -> vm"]
        );
        let fixed = tree(&[
            ("vm", "use self::arm64::Arch;\n"),
            ("vm::arm64", "use super::{qemu::boot, Guest};\n"),
            ("vm::qemu", "// use crate::suite::Suite;\n"),
            ("suite", "use crate::vm::run;\n"),
        ]);
        assert!(cycles(&fixed).is_empty());
    }

    /// The cycle the text scanner missed: a function called through a path in code.
    #[test]
    fn a_loop_through_a_call_in_code_is_caught() {
        let sources = tree(&[
            ("net", "mod a; mod b;\n"),
            ("net::a", "pub fn f() { super::b::g() }\n"),
            (
                "net::b",
                "pub fn g(s: &S) { super::a::helper(s).unwrap() }\n",
            ),
        ]);
        assert_eq!(cycles(&sources), ["net: a -> b -> a", "net: b -> a -> b"]);
    }

    #[test]
    fn test_modules_and_comments_do_not_count() {
        let sources = tree(&[
            (
                "pods",
                "//! Named for `crate::findings`.\nfn a() {}\n#[cfg(test)]\nmod tests { use crate::findings::x; }\n",
            ),
            ("findings", "use crate::pods::PodRef;\n"),
        ]);
        assert!(cycles(&sources).is_empty());
        assert!(layer_violations(&sources).is_empty());
    }
}

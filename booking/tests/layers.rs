//! Booking's dependency direction, checked from the source (docs/code-map.md):
//!
//! - `platform` imports no domain and not `app`;
//! - no domain imports `app` (handlers take their domain's state through `FromRef`);
//! - the domains' imports form no cycle.
//!
//! It reads `src/` and collects every `crate::<module>` path per top-level module, so a `use`,
//! a qualified call and a doc link all count. No database needed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const PLATFORM: &str = "platform";
const APP: &str = "app";
const DOMAINS: [&str; 8] = [
    "inventory",
    "tickets",
    "checkin",
    "orders",
    "outbox",
    "payments",
    "auctions",
    "ops",
];

/// `module -> (imported module -> first place seen)`.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`src/orders/cart.rs` -> `orders`).
fn owner(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "bin").then(|| name.to_owned())
}

/// Every `crate::<ident>` in `text`, with its line number.
fn crate_refs(text: &str) -> Vec<(usize, String)> {
    let mut refs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let ident: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !ident.is_empty() {
                refs.push((n + 1, ident));
            }
            rest = after;
        }
    }
    refs
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut g = Graph::new();
    for file in files {
        let Some(from) = owner(&src, &file) else {
            continue;
        };
        let text = fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let edges = g.entry(from.clone()).or_default();
        for (line, to) in crate_refs(&text) {
            if to != from {
                let at = format!(
                    "{}:{line}",
                    file.strip_prefix(&src).unwrap_or(&file).display()
                );
                edges.entry(to).or_insert(at);
            }
        }
    }
    g
}

/// A cycle among `nodes` in `g`, as a path, if there is one.
fn find_cycle(g: &Graph, nodes: &[&str]) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        nodes: &BTreeSet<&str>,
        n: &str,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(n.to_owned());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_owned());
        for to in g.get(n).into_iter().flat_map(|e| e.keys()) {
            if nodes.contains(to.as_str())
                && let Some(c) = visit(g, nodes, to, stack, done)
            {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_owned());
        None
    }
    let set: BTreeSet<&str> = nodes.iter().copied().collect();
    let mut done = BTreeSet::new();
    nodes
        .iter()
        .find_map(|n| visit(g, &set, n, &mut Vec::new(), &mut done))
}

#[test]
fn the_platform_imports_no_domain_and_not_the_app() {
    let g = graph();
    let bad: Vec<String> = g
        .get(PLATFORM)
        .into_iter()
        .flatten()
        .filter(|(to, _)| DOMAINS.contains(&to.as_str()) || to.as_str() == APP)
        .map(|(to, at)| format!("platform -> {to} at {at}"))
        .collect();
    assert!(
        bad.is_empty(),
        "the platform must not depend on these:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_domain_imports_the_app() {
    let g = graph();
    let bad: Vec<String> = DOMAINS
        .iter()
        .filter_map(|d| {
            g.get(*d)
                .and_then(|e| e.get(APP))
                .map(|at| format!("{d} -> app at {at}"))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "domains take their own state through FromRef, never AppState:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_domains_depend_one_way() {
    let g = graph();
    let mut nodes: Vec<&str> = DOMAINS.to_vec();
    nodes.push(PLATFORM);
    if let Some(cycle) = find_cycle(&g, &nodes) {
        let hops: Vec<String> = cycle
            .windows(2)
            .map(|w| {
                let at = g
                    .get(&w[0])
                    .and_then(|e| e.get(&w[1]))
                    .cloned()
                    .unwrap_or_default();
                format!("{} -> {} at {at}", w[0], w[1])
            })
            .collect();
        panic!(
            "import cycle between booking's modules:\n{}",
            hops.join("\n")
        );
    }
}

#[test]
fn the_checker_sees_a_cycle_and_the_path_of_an_import() {
    // The checker itself: a graph with a cycle is caught, one without is not.
    let mut g = Graph::new();
    g.entry("a".into())
        .or_default()
        .insert("b".into(), "a.rs:1".into());
    g.entry("b".into())
        .or_default()
        .insert("c".into(), "b.rs:1".into());
    assert_eq!(find_cycle(&g, &["a", "b", "c"]), None);
    g.entry("c".into())
        .or_default()
        .insert("a".into(), "c.rs:1".into());
    assert_eq!(
        find_cycle(&g, &["a", "b", "c"]),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(
        crate_refs("use crate::orders::cart;\n// see [`crate::platform::db`] and crate::app"),
        vec![
            (1, "orders".into()),
            (2, "platform".into()),
            (2, "app".into())
        ]
    );
}

//! The crates' module graph (CPU only, read from the sources): data flows one way, so no two
//! modules of the same folder (the crate root's included) depend on each other through any
//! chain. `cudnn-backend` and `cudnn-backend-core` are read as one module tree, as
//! `cudnn-backend` re-exports the engine's modules at its root (its `crate::ops` is the
//! engine's `ops`). Read from `use` declarations and paths (`crate::`, `super::`, `self::`)
//! outside comments and `#[cfg(test)]` modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use integration_tests::sources::{backend_dir, rust_files, BACKEND_SRCS};

/// A module path inside the crate, e.g. `["burn", "ops", "float"]`.
type ModPath = Vec<String>;

/// Every `.rs` file under `root` with its module path.
fn modules(root: &Path) -> Vec<(ModPath, String)> {
    rust_files(root)
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(root).unwrap().with_extension("");
            let mut path: ModPath = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
                path.pop();
            }
            (path, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// The source without comments, string literals' contents and `#[cfg(test)] mod` bodies.
fn code_of(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut lines = src.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            if let Some(next) = lines.peek() {
                if next.trim_start().starts_with("mod ") && next.trim_end().ends_with('{') {
                    // Skip the module: count braces until it closes.
                    let mut depth = 0i32;
                    for l in lines.by_ref() {
                        depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
                        if depth <= 0 && l.contains('}') {
                            break;
                        }
                    }
                    continue;
                }
            }
        }
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The module paths named by `use` trees and `crate::` / `super::` paths in `code`, resolved
/// from `here` (the longest prefix that is a module of the crate).
fn references(code: &str, here: &ModPath, known: &BTreeSet<ModPath>) -> BTreeSet<ModPath> {
    let mut paths = Vec::new();
    // `use a::{b, c::{d}}` trees, flattened.
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().last();
        rest = &rest[i + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest.find(';').unwrap_or(rest.len());
        flatten("", &rest[..end], &mut paths);
        rest = &rest[end..];
    }
    // Inline paths.
    for start in ["crate::", "super::", "self::"] {
        let mut rest = code;
        while let Some(i) = rest.find(start) {
            let before = rest[..i].chars().last();
            let tail = &rest[i..];
            let len = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                paths.push(tail[..len].to_string());
            }
            rest = &rest[i + start.len()..];
        }
    }
    let mut out = BTreeSet::new();
    for p in paths {
        let segs: Vec<&str> = p.split("::").map(str::trim).filter(|s| !s.is_empty()).collect();
        let (mut base, mut segs) = match segs.first() {
            Some(&"crate") => (Vec::new(), &segs[1..]),
            Some(&"super") => (here[..here.len().saturating_sub(1)].to_vec(), &segs[1..]),
            Some(&"self") => (here.clone(), &segs[1..]),
            _ => continue,
        };
        while segs.first() == Some(&"super") {
            base.pop();
            segs = &segs[1..];
        }
        for s in segs {
            let mut next = base.clone();
            next.push(s.to_string());
            if !known.contains(&next) {
                break;
            }
            base = next;
        }
        out.insert(base);
    }
    out
}

/// `prefix` + every path of a `use` tree body.
fn flatten(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    let mut depth = 0;
    let mut start = 0;
    let mut parts = Vec::new();
    for (i, c) in tree.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&tree[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&tree[start..]);
    for part in parts {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        match part.find('{') {
            Some(b) if part.ends_with('}') => {
                let head = part[..b].trim_end_matches("::");
                flatten(&format!("{prefix}{head}::"), &part[b + 1..part.len() - 1], out);
            }
            _ => out.push(format!("{prefix}{part}")),
        }
    }
}

/// Edges between the children of `parent`: child a → child b when code in a (or below)
/// names b (or something below it).
fn child_edges(
    parent: &[&str],
    mods: &[(ModPath, String)],
    known: &BTreeSet<ModPath>,
) -> BTreeMap<String, BTreeSet<String>> {
    let parent: ModPath = parent.iter().map(|s| s.to_string()).collect();
    let child = |p: &ModPath| (p.len() > parent.len() && p.starts_with(&parent)).then(|| p[parent.len()].clone());
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, src) in mods {
        let Some(from) = child(path) else {
            continue;
        };
        edges.entry(from.clone()).or_default();
        for r in references(&code_of(src), path, known) {
            if let Some(to) = child(&r).filter(|to| *to != from) {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// The strongly connected components with more than one module (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let lw = s.low[w.as_str()];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w.as_str()) {
                let iw = s.index[w.as_str()];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn the_checker_sees_a_cycle() {
    let src = [
        (vec!["a".to_string()], "use crate::b::X;".to_string()),
        (vec!["b".to_string()], "fn f() { super::a::g(); }".to_string()),
        (vec!["c".to_string()], "use crate::{a, b::Y};".to_string()),
    ];
    let known: BTreeSet<ModPath> = src.iter().map(|(p, _)| p.clone()).collect();
    let found = cycles(&child_edges(&[], &src, &known));
    assert_eq!(found, vec![vec!["a".to_string(), "b".to_string()]]);
}

#[test]
fn every_folder_s_modules_depend_on_each_other_one_way() {
    let mods: Vec<(ModPath, String)> = BACKEND_SRCS
        .iter()
        .flat_map(|src| modules(&backend_dir().join(src)))
        .collect();
    let known: BTreeSet<ModPath> = mods.iter().map(|(p, _)| p.clone()).collect();
    // Every module with children: the crate root's folders and theirs, at any depth.
    let parents: BTreeSet<ModPath> = known
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| p[..p.len() - 1].to_vec())
        .collect();
    assert!(parents.len() > 8, "found the crate's folders: {parents:?}");
    let mut found = Vec::new();
    for parent in &parents {
        let name = parent.join("::");
        let parent: Vec<&str> = parent.iter().map(String::as_str).collect();
        for cycle in cycles(&child_edges(&parent, &mods, &known)) {
            found.push(format!("{name}: {cycle:?}"));
        }
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

#[test]
fn adapters_reach_the_engine_through_ops() {
    // The Burn 0.21 and Candle adapters (`cudnn-backend`'s `src`) and the Burn 0.22 adapter
    // (`cudnn-burn`) call the engine's `ops`, which alone chooses a cuDNN graph or a kernel
    // (and holds the kernel-only families); they name no `kernels::` module directly.
    let adapters = [backend_dir().join("src"), backend_dir().join("cudnn-burn/src")];
    let mut found = Vec::new();
    for dir in &adapters {
        for file in rust_files(dir) {
            let code = code_of(&std::fs::read_to_string(&file).unwrap());
            for (i, line) in code.lines().enumerate() {
                if line.contains("crate::kernels") || line.contains("cudnn_backend_core::kernels") {
                    found.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(rust_files(&adapters[1]).len() > 3, "found cudnn-burn's sources");
    assert!(
        found.is_empty(),
        "adapters naming kernels:: directly:\n{}",
        found.join("\n")
    );
}

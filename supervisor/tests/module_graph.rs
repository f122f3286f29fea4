//! The supervisor's module import graph, read from its sources: no module may import from a module
//! that imports it (directly or around a circle), and no file may pass 500 lines unless
//! docs/architecture.md names it and says why.
//!
//! `cargo test -p layad --test module_graph -- --nocapture` prints the graph (module → what it uses).
//! An edge is any `crate::…`, `super::…` or `self::…` path, and any `use` of a child module by its
//! bare name; it points at the module the path names (the longest prefix that is a file of its own).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest a file under `supervisor/src` may be without a word in docs/architecture.md.
const MAX_LINES: usize = 500;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every library source file with its module path (`http::routes::health`); `crate` is lib.rs.
/// main.rs is a crate of its own (the binary) and is left out.
fn modules() -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<String, PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("read src dir")
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("utf-8 name")
                .to_owned();
            if path.is_dir() {
                let mut inner = prefix.to_vec();
                inner.push(name);
                walk(&path, &inner, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let mut module = prefix.to_vec();
                match (prefix.is_empty(), name.as_str()) {
                    (true, "main") => continue,
                    (true, "lib") | (false, "mod") => {}
                    _ => module.push(name),
                }
                let key = if module.is_empty() {
                    "crate".to_owned()
                } else {
                    module.join("::")
                };
                out.insert(key, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&src_dir(), &[], &mut out);
    out
}

/// The source without comments and string literals, so that paths in docs and messages do not count.
fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'/', Some(b'/')) => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            (b'/', Some(b'*')) => {
                i += 2;
                while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            (b'r', Some(b'"' | b'#')) if i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') => {
                // A raw string: r"…", r#"…"#, …
                let hashes = bytes[i + 1..].iter().take_while(|&&b| b == b'#').count();
                if bytes.get(i + 1 + hashes) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let body = i + 2 + hashes;
                i = text[body..]
                    .find(&close)
                    .map_or(bytes.len(), |e| body + e + close.len());
                out.push_str("\"\"");
            }
            (b'"', _) => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            (b'\'', Some(_)) if bytes.get(i + 2) == Some(&b'\'') || bytes.get(i + 1) == Some(&b'\\') => {
                // A char literal ('x' or '\n'); lifetimes ('a) are left alone.
                let end = text[i + 1..].find('\'').map_or(bytes.len(), |e| i + 2 + e);
                i = end;
                out.push_str("' '");
            }
            (c, _) => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

/// Every path that starts at `start` (just after `crate::`, `super::`, …): `a::b::{c, d::e}` gives
/// `a::b::c` and `a::b::d::e`.
fn path_tree(code: &str, start: usize) -> Vec<Vec<String>> {
    fn ident(code: &[u8], mut i: usize) -> (String, usize) {
        let from = i;
        while i < code.len() && (code[i].is_ascii_alphanumeric() || code[i] == b'_') {
            i += 1;
        }
        (String::from_utf8_lossy(&code[from..i]).into_owned(), i)
    }
    fn skip_ws(code: &[u8], mut i: usize) -> usize {
        while i < code.len() && code[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    }
    fn tree(code: &[u8], i: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
        let i = skip_ws(code, i);
        if code.get(i) == Some(&b'{') {
            let mut i = i + 1;
            loop {
                i = skip_ws(code, i);
                match code.get(i) {
                    Some(b'}') => return i + 1,
                    Some(b',') => i += 1,
                    Some(_) => i = tree(code, i, prefix.clone(), out),
                    None => return i,
                }
            }
        }
        let (name, mut i) = ident(code, i);
        if name.is_empty() {
            if !prefix.is_empty() {
                out.push(prefix);
            }
            return i;
        }
        let mut path = prefix;
        path.push(name);
        if code.get(i) == Some(&b':') && code.get(i + 1) == Some(&b':') {
            i += 2;
            return tree(code, i, path, out);
        }
        out.push(path);
        i
    }
    let mut out = Vec::new();
    tree(code.as_bytes(), start, Vec::new(), &mut out);
    out
}

/// The module a path from `base` names: the longest prefix that is a module.
fn resolve(base: &[String], path: &[String], known: &BTreeMap<String, PathBuf>) -> Option<String> {
    let mut full = base.to_vec();
    full.extend(path.iter().filter(|s| s.as_str() != "self").cloned());
    (0..=full.len()).rev().find_map(|n| {
        let key = if n == 0 {
            "crate".to_owned()
        } else {
            full[..n].join("::")
        };
        known.contains_key(&key).then_some(key)
    })
}

fn segments(module: &str) -> Vec<String> {
    if module == "crate" {
        Vec::new()
    } else {
        module.split("::").map(str::to_owned).collect()
    }
}

/// What each module uses, self-edges left out.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let known = modules();
    let mut graph = BTreeMap::new();
    for (module, file) in &known {
        let text = std::fs::read_to_string(file).expect("read source");
        let code = code_only(&text);
        let own = segments(module);
        let parent = own[..own.len().saturating_sub(1)].to_vec();
        // Inline test modules sit at the bottom of a file; inside one, `super` is the file's module.
        let tests_from = code.find("#[cfg(test)]\nmod ").unwrap_or(code.len());
        let mut uses = BTreeSet::new();
        let mut add = |base: &[String], path: Vec<String>| {
            if let Some(target) = resolve(base, &path, &known)
                && target != *module
            {
                uses.insert(target);
            }
        };
        for (at, _) in code.match_indices("crate::") {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            for path in path_tree(&code, at + "crate::".len()) {
                add(&[], path);
            }
        }
        for (at, _) in code.match_indices("super::") {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let base = if at >= tests_from { own.clone() } else { parent.clone() };
            for path in path_tree(&code, at + "super::".len()) {
                let mut base = base.clone();
                let mut path = path.as_slice();
                while path.first().is_some_and(|s| s == "super") {
                    base.pop();
                    path = &path[1..];
                }
                add(&base, path.to_vec());
            }
        }
        for (at, _) in code.match_indices("self::") {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            for path in path_tree(&code, at + "self::".len()) {
                add(&own, path);
            }
        }
        // A child module named without `self::`: `use child::Item;`, `child::function()`.
        let prefix = if own.is_empty() {
            String::new()
        } else {
            format!("{module}::")
        };
        let children: Vec<&str> = known
            .keys()
            .filter_map(|k| k.strip_prefix(prefix.as_str()).filter(|_| k != module))
            .filter(|rest| !rest.contains("::") && *rest != "crate")
            .collect();
        for child in children {
            let needle = format!("{child}::");
            for (at, _) in code.match_indices(&needle) {
                let before = code[..at].chars().next_back();
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                for path in path_tree(&code, at) {
                    add(&own, path);
                }
            }
        }
        graph.insert(module.clone(), uses);
    }
    graph
}

/// Strongly connected components with more than one module (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Search<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !search.index.contains_key(v.as_str()) {
            search.visit(v);
        }
    }
    search.found
}

fn render(graph: &BTreeMap<String, BTreeSet<String>>) -> String {
    graph
        .iter()
        .map(|(module, uses)| {
            let uses: Vec<&str> = uses.iter().map(String::as_str).collect();
            format!("{module} → {}\n", uses.join(", "))
        })
        .collect()
}

#[test]
fn no_module_imports_from_a_module_that_imports_it() {
    let graph = module_graph();
    println!("{}", render(&graph));
    assert!(graph.contains_key("http::routes::systemone"), "{graph:?}");
    let found = circles(&graph);
    assert!(found.is_empty(), "import circles: {found:?}\n\n{}", render(&graph));
}

#[test]
fn the_checker_sees_circles_and_grouped_paths() {
    let known: BTreeMap<String, PathBuf> = ["crate", "a", "a::b", "c"]
        .into_iter()
        .map(|m| (m.to_owned(), PathBuf::new()))
        .collect();
    let code = code_only("use crate::{a::b::Thing, c};\n// crate::nowhere\nlet s = \"crate::c\"; r#\"crate::x\"#");
    let at = code.find("crate::").expect("a path") + "crate::".len();
    let resolved: Vec<Option<String>> = path_tree(&code, at).iter().map(|p| resolve(&[], p, &known)).collect();
    assert_eq!(resolved, [Some("a::b".to_owned()), Some("c".to_owned())]);
    assert!(!code.contains("nowhere") && !code.contains("crate::x"));
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    graph.entry("c".into()).or_default().insert("a".into());
    graph.entry("d".into()).or_default().insert("a".into());
    assert_eq!(circles(&graph), [["a", "b", "c"]]);
}

#[test]
fn long_files_are_explained_in_the_architecture_doc() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap_or_default();
    // Only the "Long files" section counts: a file named elsewhere has not been explained.
    let doc = doc.split_once("## Long files").map_or("", |(_, section)| section);
    let src = src_dir();
    let mut unexplained = Vec::new();
    for file in modules().values().chain([&src.join("main.rs")]) {
        let lines = std::fs::read_to_string(file).expect("read source").lines().count();
        let relative = file.strip_prefix(&src).expect("under src").display().to_string();
        if lines > MAX_LINES && !doc.contains(&format!("supervisor/src/{relative}")) {
            unexplained.push(format!("{relative} ({lines} lines)"));
        }
    }
    assert!(
        unexplained.is_empty(),
        "over {MAX_LINES} lines and not explained in docs/architecture.md: {unexplained:?}"
    );
}

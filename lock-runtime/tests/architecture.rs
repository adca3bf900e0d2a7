//! Keeps `ARCHITECTURE.md` true: every module of `lock-runtime/src` uses only modules below it
//! in [`LAYERS`], and only the Redis stores speak Redis.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every module, bottom to top. A module may use the ones before it, never itself through its
/// parent nor any after it.
const LAYERS: &[&str] = &[
    // Documentation only: it uses nothing.
    "guide",
    "error",
    "options",
    "deployment",
    "token",
    "key",
    "names",
    "timeouts",
    "backoff",
    "io",
    "report",
    "metrics",
    "spans",
    "fenced",
    "waiting",
    "backend::contract",
    "backend::notification",
    "backend::tls",
    "backend::redis::errors",
    "backend::redis::scripts::call",
    "backend::redis::scripts::marks",
    "backend::redis::scripts::acquire",
    "backend::redis::scripts::acquire_all",
    "backend::redis::scripts::release",
    "backend::redis::scripts::undo",
    "backend::redis::scripts::renew",
    "backend::redis::scripts::inspect",
    "backend::redis::scripts::force_unlock",
    "backend::redis::scripts",
    "backend::redis::native",
    "backend::redis::manager",
    "backend::redis::stall",
    "backend::redis::sentinel",
    "backend::redis::config",
    "backend::redis::connection",
    "backend::redis::coalesce",
    "backend::redis::renewal",
    "backend::redis::confirm",
    "backend::redis::cluster_nodes",
    "backend::redis::subscriber",
    "backend::redis",
    "backend::memory::model",
    "backend::memory",
    "backend::redlock::turns",
    "backend::redlock",
    "backend::postgres::tls",
    "backend::postgres::link",
    "backend::postgres::listener",
    "backend::postgres",
    "backend",
    "lease",
    "transaction",
    "keeper::leases",
    "keeper",
    "state",
    "acquisition",
    "current",
    "guard",
    "lock",
    "election",
    "registry::handle",
    "registry::builder",
    "registry::env",
    "registry::globals",
    "registry",
    "protocol",
    "__private",
];

/// Files outside the Redis stores that may name the `redis` crate, and why.
const REDIS_OUTSIDE_BACKEND: &[&str] = &[
    // `FencedKey` runs its one script on the application's own connection: it is the
    // application's data, not the library's.
    "fenced.rs",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, as (module path, file).
fn modules(dir: &Path, prefix: &str, out: &mut Vec<(String, PathBuf)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("lock-runtime/src is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let module = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}::{name}")
        };
        if path.is_dir() {
            modules(&path, &module, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let module = match name.as_str() {
                "mod" => prefix.to_owned(),
                _ => module,
            };
            out.push((module, path));
        }
    }
}

/// The code of a file without its comments and its unit tests.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("a source file is readable");
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(tests) => &text[..tests],
        None => &text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(comment) => &line[..comment],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segments of every path that follows `anchor` (`crate::` or `super::`), with
/// `{..}` groups opened: `crate::{a, b::c}` gives `a` and `b::c`.
fn paths_after(code: &str, anchor: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(anchor) {
        let before = rest[..at].chars().last();
        rest = &rest[at + anchor.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut item) = (0, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            found.push(item);
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            found.push(rest[..end].to_owned());
        }
    }
    found
        .into_iter()
        .map(|p| p.trim().trim_end_matches("::").to_owned())
        .filter(|p| !p.is_empty() && p != "self")
        .collect()
}

/// The most specific module in `LAYERS` that `path` (absolute, from the crate root) names;
/// `None` for a name the crate root re-exports, which says nothing of where it is defined.
fn target(path: &str) -> Option<&'static str> {
    LAYERS
        .iter()
        .filter(|m| path == **m || path.starts_with(&format!("{m}::")))
        .max_by_key(|m| m.len())
        .copied()
}

fn rank(module: &str) -> usize {
    LAYERS.iter().position(|m| *m == module).unwrap_or_else(|| {
        panic!("module `{module}` is missing from LAYERS: add it where it belongs")
    })
}

#[test]
fn every_module_uses_only_modules_below_it() {
    let mut files = Vec::new();
    modules(&src(), "", &mut files);
    let (mut upward, mut unplaced) = (BTreeSet::new(), BTreeSet::new());
    for (module, path) in &files {
        if module == "lib" {
            continue;
        }
        let code = code(path);
        let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
        let used = paths_after(&code, "crate::").into_iter().chain(
            paths_after(&code, "super::").into_iter().map(|p| {
                if parent.is_empty() {
                    p
                } else {
                    format!("{parent}::{p}")
                }
            }),
        );
        for path in used {
            let Some(target) = target(&path) else {
                unplaced.insert(format!("{module} uses crate::{path}"));
                continue;
            };
            if target != module && rank(target) >= rank(module) {
                upward.insert(format!("{module} uses {path} ({target} is not below it)"));
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "name the module that defines each item (crate::error::LockError, not crate::LockError), \
         so its layer can be checked:\n{}",
        unplaced.into_iter().collect::<Vec<_>>().join("\n")
    );
    assert!(
        upward.is_empty(),
        "dependencies must point down (see ARCHITECTURE.md):\n{}",
        upward.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn only_the_redis_stores_speak_redis() {
    let mut files = Vec::new();
    modules(&src(), "", &mut files);
    // The seam (`backend::contract`), the other stores and everything above speak no engine;
    // `backend` itself names its stores (`redis::` there is its own module).
    let redis_store = |module: &str| {
        module == "backend"
            || module == "backend::redlock"
            || module == "backend::redis"
            || module.starts_with("backend::redis::")
    };
    let speaking: Vec<&str> = files
        .iter()
        .filter(|(module, _)| !redis_store(module))
        .filter(|(_, path)| {
            let name = path
                .strip_prefix(src())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            !REDIS_OUTSIDE_BACKEND.contains(&name.as_str())
        })
        .filter(|(_, path)| {
            let code = code(path);
            code.match_indices("redis::").any(|(at, _)| {
                !code[..at]
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            })
        })
        .map(|(module, _)| module.as_str())
        .collect();
    assert!(
        speaking.is_empty(),
        "only the Redis stores (backend/redis, backend/redlock) may use the redis crate; move \
         this there: {speaking:?}"
    );
}

#[test]
fn the_checker_reads_grouped_imports_and_nested_modules() {
    // The checks above could pass vacuously if parsing missed imports: these must be found.
    assert_eq!(
        paths_after("use crate::{a, b::{c, d}, E};\nuse super::x::y;", "crate::"),
        ["a", "b::{c, d}", "E"]
    );
    assert_eq!(
        target("backend::redis::config::Tls"),
        Some("backend::redis::config")
    );
    assert_eq!(target("LockError"), None, "a crate-root name is not placed");
    assert_eq!(target("error::LockError"), Some("error"));
    assert!(rank("lock") > rank("state") && rank("state") > rank("keeper"));
}

//! `GUARANTEES.md` names the test behind every claim. A claim whose test was renamed, moved or
//! deleted would go on asserting what nothing checks: this fails then.

use std::path::{Path, PathBuf};

/// Rust paths in the section that are not test paths.
const NOT_TESTS: &[&str] = &["lock_runtime", "lock_macros", "lock_tests"];

/// `path::to::test_fn` spans: lowercase segments, at least two, nothing else in the span.
fn test_paths(section: &str) -> Vec<&str> {
    section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            span.contains("::")
                && span.split("::").all(|seg| {
                    !seg.is_empty()
                        && seg
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                })
        })
        .filter(|span| {
            !NOT_TESTS
                .iter()
                .any(|c| span.starts_with(&format!("{c}::")))
        })
        .collect()
}

/// The file that defines test `path` (`binary::module::name`), as this crate lays them out:
/// `tests/<binary>.rs` for `binary::name`, `tests/<binary>/<module>.rs` for deeper paths, where
/// the last modules may be inline ones of the file (`faults::model::places::name` is in
/// `tests/faults/model.rs`).
fn file_of(tests: &Path, path: &str) -> PathBuf {
    let segments: Vec<&str> = path.split("::").collect();
    let modules = &segments[..segments.len() - 1];
    let file = |modules: &[&str]| match modules {
        [binary] => tests.join(format!("{binary}.rs")),
        [binary, rest @ ..] => tests.join(binary).join(format!("{}.rs", rest.join("/"))),
        [] => unreachable!("at least two segments"),
    };
    (1..=modules.len())
        .rev()
        .map(|len| file(&modules[..len]))
        .find(|candidate| candidate.exists())
        .unwrap_or_else(|| file(modules))
}

#[test]
fn every_test_named_in_the_guarantees_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guarantees = std::fs::read_to_string(root.join("../GUARANTEES.md")).expect("GUARANTEES.md");
    let section = guarantees
        .split("<!-- guarantees:start -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- guarantees:end -->").next())
        .expect("GUARANTEES.md marks its claims");
    let paths = test_paths(section);
    assert!(
        paths.len() >= 30,
        "only {} test paths found in the guarantees section: {paths:?}",
        paths.len()
    );
    let tests = root.join("tests");
    let missing: Vec<String> = paths
        .iter()
        .filter_map(|path| {
            let file = file_of(&tests, path);
            let name = path.rsplit("::").next().expect("a name");
            let source = std::fs::read_to_string(&file).unwrap_or_default();
            (!source.contains(&format!("fn {name}(")))
                .then(|| format!("{path} (looked in {})", file.display()))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "GUARANTEES.md names tests that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_path_check_finds_test_paths_and_leaves_other_code_alone() {
    let section =
        "shown by `faults::workload::a_run`, `bad_input::a_case`; not `LockError::Lost`, \
                   `CurrentLock::is_lost()`, `lock_runtime::protocol` or `redis-server`";
    assert_eq!(
        test_paths(section),
        ["faults::workload::a_run", "bad_input::a_case"]
    );
    let tests = Path::new("/t");
    assert_eq!(
        file_of(tests, "faults::workload::a_run"),
        Path::new("/t/faults/workload.rs")
    );
    assert_eq!(
        file_of(tests, "bad_input::a_case"),
        Path::new("/t/bad_input.rs")
    );
}

//! The README's quickstart, as a user meets it: a project of its own, outside this workspace,
//! with the README's `[dependencies]` and `src/main.rs` verbatim, built (lock-runtime with its
//! features off, without a warning) and run against a throwaway redis-server.

use std::path::{Path, PathBuf};
use std::process::Command;

use lock_tests::RedisServer;

/// The fenced block after `<!-- quickstart:{name} -->` in the README.
fn quickstart_block(readme: &str, name: &str) -> String {
    let marker = format!("<!-- quickstart:{name} -->");
    let after = readme
        .split(&marker)
        .nth(1)
        .unwrap_or_else(|| panic!("the README marks its quickstart's {name} block with {marker}"));
    let body = after
        .split_once("```")
        .and_then(|(_, rest)| rest.split_once('\n'))
        .map(|(_, rest)| rest)
        .expect("a fenced block after the marker");
    body.split("```").next().expect("the block ends").to_owned()
}

/// `[dependencies]` with the README's path to lock-runtime pointed at this checkout.
fn dependencies(block: &str, lock_runtime: &Path) -> String {
    block
        .lines()
        .map(|line| match line.strip_prefix("lock-runtime = ") {
            Some(_) => format!("lock-runtime = {{ path = {:?} }}", lock_runtime.display()),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_readme_quickstart_builds_and_runs_in_a_project_outside_the_workspace() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = root.canonicalize().expect("the workspace root");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let cargo_block = quickstart_block(&readme, "cargo");
    assert!(
        cargo_block.contains("lock-runtime = "),
        "the quickstart depends on lock-runtime:\n{cargo_block}"
    );
    let main_rs = quickstart_block(&readme, "main");

    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let project = scratch.join("quickstart");
    let _ = std::fs::remove_dir_all(&project);
    std::fs::create_dir_all(project.join("src")).unwrap();
    // An empty `[workspace]`: the project is its own workspace even when the scratch directory
    // lies inside this one (`target/` under the checkout).
    let manifest = format!(
        "[package]\nname = \"quickstart\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n[workspace]\n\n{}\n",
        dependencies(&cargo_block, &root.join("lock-runtime"))
    );
    std::fs::write(project.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(project.join("src/main.rs"), &main_rs).unwrap();
    // The workspace's versions, so the build needs nothing this checkout has not resolved.
    std::fs::copy(root.join("Cargo.lock"), project.join("Cargo.lock")).unwrap();

    let server = RedisServer::start();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["run", "--quiet", "--manifest-path"])
        .arg(project.join("Cargo.toml"))
        // Its own target directory: this test's cargo holds the lock on the workspace's.
        .arg("--target-dir")
        .arg(scratch.join("quickstart-target"))
        .env_remove("REDIS_URL")
        // Built as a user's project is: without the Clippy that `scripts/test` wraps the
        // workspace's builds in.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        // lock-runtime as crates.io users build it (its features off) shows no warning.
        .env("RUSTFLAGS", "-D warnings")
        .env("LOCK_REDIS_URL", server.url())
        .output()
        .expect("run cargo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the quickstart failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout, "deployed 42\n");
    let mut con = server.connection();
    let left: bool = redis::cmd("EXISTS")
        .arg("lock:deploy:42")
        .query(&mut con)
        .unwrap();
    assert!(
        !left,
        "the quickstart's lock was released when deploy returned"
    );
}

/// `major.minor[.patch]` as numbers, for comparing Rust versions.
fn rust_version(text: &str) -> (u64, u64, u64) {
    let mut parts = text.split('.').map(|p| p.parse::<u64>().expect("a number"));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

/// The minimum supported Rust version the published crates declare holds for what they pull
/// in: every crate `lock-runtime` and `lock-macros` depend on (to build, with every feature the
/// workspace turns on) declares a `rust-version` no newer than theirs, or none. The machine has
/// one toolchain, so the crates' own code is held to it by clippy's `incompatible_msrv` (on in
/// `./scripts/test`), which reads the same `rust-version`.
#[test]
fn every_dependency_of_the_published_crates_builds_on_their_declared_minimum_rust() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(&root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let by_id = |id: &str| {
        packages
            .iter()
            .find(|p| p["id"] == id)
            .unwrap_or_else(|| panic!("package {id}"))
    };
    let ours = |name: &str| {
        packages
            .iter()
            .find(|p| p["name"] == name && p["source"].is_null())
            .unwrap_or_else(|| panic!("workspace member {name}"))
    };
    let declared = ours("lock-runtime")["rust_version"]
        .as_str()
        .expect("lock-runtime declares a rust-version");
    assert_eq!(
        ours("lock-macros")["rust_version"].as_str(),
        Some(declared),
        "both published crates declare one minimum"
    );
    let nodes = metadata["resolve"]["nodes"].as_array().expect("resolve");
    let mut todo: Vec<String> = ["lock-runtime", "lock-macros"]
        .iter()
        .map(|name| ours(name)["id"].as_str().unwrap().to_owned())
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut newer = Vec::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        let package = by_id(&id);
        if let Some(needs) = package["rust_version"].as_str() {
            if rust_version(needs) > rust_version(declared) {
                newer.push(format!(
                    "{} {} needs {needs}",
                    package["name"], package["version"]
                ));
            }
        }
        let node = nodes.iter().find(|n| n["id"] == id.as_str()).expect("node");
        for dep in node["deps"].as_array().expect("deps") {
            let built = dep["dep_kinds"]
                .as_array()
                .expect("dep_kinds")
                .iter()
                .any(|kind| kind["kind"].is_null() || kind["kind"] == "build");
            if built {
                todo.push(dep["pkg"].as_str().expect("pkg").to_owned());
            }
        }
    }
    assert!(
        seen.len() > 20,
        "the walk found the dependency tree: {seen:?}"
    );
    assert!(
        newer.is_empty(),
        "dependencies newer than the declared rust-version {declared} (lower them in Cargo.lock, \
         or raise rust-version in Cargo.toml):\n{}",
        newer.join("\n")
    );
}

//! Compile errors of `#[distributed_lock]`, one `.stderr` snapshot per case, grouped by
//! category under `ui/`. Regenerate with `TRYBUILD=overwrite` and review every diff.

#[test]
fn compile_errors_of_the_attribute_match_their_snapshots() {
    // The snapshots are rustc's errors: without the lints `scripts/test` has Clippy add to the
    // workspace's builds, which the cases' project would inherit.
    std::env::remove_var("RUSTC_WORKSPACE_WRAPPER");
    std::env::remove_var("CLIPPY_ARGS");
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/*/*.rs");
}

//! Compile errors of `#[distributed_lock]`, one `.stderr` snapshot per case, grouped by
//! category under `ui/`. Regenerate with `TRYBUILD=overwrite` and review every diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/*/*.rs");
}

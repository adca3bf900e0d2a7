//! Compile errors of `#[distributed_lock]`, one `.stderr` snapshot per case, grouped by
//! category under `ui/`. Regenerate with `TRYBUILD=overwrite` and review every diff.

#[test]
fn compile_errors_of_the_attribute_match_their_snapshots() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/*/*.rs");
}

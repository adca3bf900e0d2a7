//! Strict parsing of the attribute's options (`key = "...", ttl = "60s", ...`).
//!
//! Every value is checked on its own here and reported on its own token; checks that need
//! several options or the fn signature live in `validate.rs`.

use proc_macro2::TokenStream;
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::{Expr, ExprLit, Lit, LitBool, LitInt, LitStr, Path};

use crate::ctxt::Errors;
use crate::duration;

/// Every option, in the order the docs list them.
pub(crate) const OPTIONS: &[&str] = &[
    "key", "keys", "ttl", "wait", "renew", "on_lost", "min_hold", "max_hold", "fencing", "mode",
    "permits", "leader", "registry", "crate",
];

/// The options as written. `None` means "not given": defaults are the runtime's business.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) key: Option<LitStr>,
    /// `keys = ["..", ".."]`: the templates, and the option's name for errors about it.
    pub(crate) keys: Option<(Vec<LitStr>, Path)>,
    pub(crate) ttl: Option<DurationArg>,
    pub(crate) wait: Option<DurationArg>,
    pub(crate) renew: Option<LitBool>,
    pub(crate) on_lost: Option<(OnLost, LitStr)>,
    pub(crate) min_hold: Option<DurationArg>,
    pub(crate) max_hold: Option<DurationArg>,
    pub(crate) fencing: Option<LitBool>,
    pub(crate) mode: Option<(Mode, LitStr)>,
    pub(crate) permits: Option<LitInt>,
    /// `leader = true`: the fn is a leader's loop (see `validate::check_leader`).
    pub(crate) leader: Option<LitBool>,
    pub(crate) registry: Option<LitStr>,
    pub(crate) krate: Option<Path>,
    /// False when a syntax error stopped parsing: "missing `key`" would then be noise.
    pub(crate) complete: bool,
    /// Whether `key` was written at all, valid or not.
    pub(crate) key_given: bool,
}

/// A duration option, already converted to milliseconds, with its literal for later errors.
pub(crate) struct DurationArg {
    pub(crate) millis: u64,
    pub(crate) lit: LitStr,
}

/// A read-write lock's side.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Read,
    Write,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Cancel,
    Continue,
}

/// Parses the attribute's arguments, recording every problem in `errors`.
pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Args {
    let mut args = Args::default();
    let result = syn::meta::parser(|meta| parse_option(&meta, &mut args, errors)).parse2(tokens);
    match result {
        Ok(()) => args.complete = true,
        Err(error) => errors.push(error),
    }
    args
}

fn parse_option(
    meta: &ParseNestedMeta<'_>,
    args: &mut Args,
    errors: &mut Errors,
) -> syn::Result<()> {
    let name = meta.path.get_ident().map(ToString::to_string);
    let known = name
        .as_deref()
        .and_then(|name| OPTIONS.iter().copied().find(|option| *option == name));

    args.key_given |= matches!(known, Some("key" | "keys"));
    let Some(value) = option_value(meta, known, errors)? else {
        return Ok(());
    };
    let Some(option) = known else {
        errors.spanned(&meta.path, unknown_option_message(name.as_deref()));
        return Ok(());
    };

    let duplicate = match option {
        "key" => set(&mut args.key, string(&value, option, errors)),
        "keys" => set(
            &mut args.keys,
            templates(&value, errors).map(|t| (t, meta.path.clone())),
        ),
        "ttl" => set(&mut args.ttl, duration_arg(&value, option, errors)),
        "wait" => set(&mut args.wait, duration_arg(&value, option, errors)),
        "min_hold" => set(&mut args.min_hold, duration_arg(&value, option, errors)),
        "max_hold" => set(&mut args.max_hold, duration_arg(&value, option, errors)),
        "renew" => set(&mut args.renew, boolean(&value, option, errors)),
        "fencing" => set(&mut args.fencing, boolean(&value, option, errors)),
        "leader" => set(&mut args.leader, boolean(&value, option, errors)),
        "mode" => set(&mut args.mode, mode(&value, errors)),
        "permits" => set(&mut args.permits, permits(&value, errors)),
        "on_lost" => set(&mut args.on_lost, on_lost(&value, errors)),
        "registry" => set(&mut args.registry, registry(&value, errors)),
        "crate" => set(&mut args.krate, crate_path(&value, errors)),
        _ => unreachable!("every name in OPTIONS has a branch"),
    };
    if duplicate {
        errors.spanned(
            &meta.path,
            format!("duplicated option `{option}`; give it once"),
        );
    }
    Ok(())
}

/// Reads `= <expr>` after an option name. Returns `None` (after recording an error) for a
/// name without a value, so parsing can go on with the next option.
fn option_value(
    meta: &ParseNestedMeta<'_>,
    known: Option<&str>,
    errors: &mut Errors,
) -> syn::Result<Option<Expr>> {
    if meta.input.peek(syn::Token![=]) {
        return meta.value()?.parse().map(Some);
    }
    if meta.input.peek(syn::token::Paren) {
        // `ttl("60s")`: skip the group so the remaining options are still checked.
        let _: proc_macro2::Group = meta.input.parse()?;
    } else if !meta.input.is_empty() && !meta.input.peek(syn::Token![,]) {
        // `key "job"`: nothing after this can be parsed reliably.
        let option = known.unwrap_or("option");
        return Err(meta.input.error(format!(
            "expected `=` after `{option}`, as in `{option} = {}`",
            example(option)
        )));
    }
    match known {
        Some(option) => errors.spanned(
            &meta.path,
            format!("`{option}` needs a value: `{option} = {}`", example(option)),
        ),
        None => errors.spanned(
            &meta.path,
            unknown_option_message(meta.path.get_ident().map(ToString::to_string).as_deref()),
        ),
    }
    Ok(None)
}

/// Stores the first value of an option; reports whether the option was already given.
fn set<T>(slot: &mut Option<T>, value: Option<T>) -> bool {
    let duplicate = slot.is_some();
    if !duplicate {
        *slot = value;
    }
    duplicate
}

fn unknown_option_message(name: Option<&str>) -> String {
    let valid: Vec<String> = OPTIONS.iter().map(|option| format!("`{option}`")).collect();
    let valid = valid.join(", ");
    match name.and_then(closest_option) {
        Some(suggestion) => format!(
            "unknown option `{}`; did you mean `{suggestion}`? valid options: {valid}",
            name.unwrap_or_default()
        ),
        None => match name {
            Some(name) => format!("unknown option `{name}`; valid options: {valid}"),
            None => format!("unknown option; valid options: {valid}"),
        },
    }
}

/// The option within two edits of `name`, for typos like `tll` or `min_hold_for`.
fn closest_option(name: &str) -> Option<&'static str> {
    OPTIONS
        .iter()
        .copied()
        .map(|option| (edit_distance(name, option), option))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, option)| option)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// How each option is written, for "needs a value" and "expected a string" messages.
fn example(option: &str) -> &'static str {
    match option {
        "key" => "\"job:<id>\"",
        "keys" => "[\"account:<from>\", \"account:<to>\"]",
        "ttl" => "\"30s\"",
        "wait" => "\"5s\"",
        "min_hold" => "\"12h\"",
        "max_hold" => "\"10m\"",
        "renew" => "false",
        "fencing" | "leader" => "true",
        "mode" => "\"read\"",
        "permits" => "4",
        "on_lost" => "\"continue\"",
        "registry" => "\"payments\"",
        _ => "\"::lock_runtime\"",
    }
}

fn string(value: &Expr, option: &str, errors: &mut Errors) -> Option<LitStr> {
    if let Expr::Lit(ExprLit {
        lit: Lit::Str(lit), ..
    }) = value
    {
        return Some(lit.clone());
    }
    errors.spanned(
        value,
        format!(
            "expected a string literal: `{option} = {}`",
            example(option)
        ),
    );
    None
}

fn duration_arg(value: &Expr, option: &str, errors: &mut Errors) -> Option<DurationArg> {
    let lit = string(value, option, errors)?;
    match duration::parse_millis(&lit.value()) {
        Ok(0) if option != "wait" => {
            errors.spanned(
                &lit,
                format!(
                    "`{option}` must be longer than zero, e.g. `{option} = {}`",
                    example(option)
                ),
            );
            None
        }
        Ok(millis) if option == "ttl" && millis < duration::MIN_TTL_MILLIS => {
            errors.spanned(
                &lit,
                format!(
                    "`ttl` must be at least {}ms: a lease's local deadline is its ttl minus a \
                     clock-drift margin (ttl/100 + 2 ms), so a shorter lease would be lost at once",
                    duration::MIN_TTL_MILLIS
                ),
            );
            None
        }
        Ok(millis) => Some(DurationArg { millis, lit }),
        Err(error) => {
            errors.spanned(&lit, format!("invalid `{option}`: {error}"));
            None
        }
    }
}

/// A multi-key lock's key templates: an array of string literals, at least one.
fn templates(value: &Expr, errors: &mut Errors) -> Option<Vec<LitStr>> {
    let Expr::Array(array) = value else {
        errors.spanned(
            value,
            "expected an array of key templates: `keys = [\"account:<from>\", \"account:<to>\"]`",
        );
        return None;
    };
    if array.elems.is_empty() {
        errors.spanned(
            array,
            "`keys = []` names no lock; give the keys to take together, or use `key = \"..\"`",
        );
        return None;
    }
    let mut templates = Vec::new();
    for elem in &array.elems {
        match elem {
            Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) => templates.push(lit.clone()),
            other => errors.spanned(other, "each key must be a string literal template"),
        }
    }
    (templates.len() == array.elems.len()).then_some(templates)
}

/// A semaphore's size: a whole number from 1 to `u32::MAX`.
fn permits(value: &Expr, errors: &mut Errors) -> Option<LitInt> {
    let Expr::Lit(ExprLit {
        lit: Lit::Int(lit), ..
    }) = value
    else {
        errors.spanned(
            value,
            "expected a whole number of permits: `permits = 4` (a literal, checked at compile \
             time; for a size known only at run time, use `registry.lock(key).permits(n)`)",
        );
        return None;
    };
    match lit.base10_parse::<u32>() {
        Ok(0) => errors.spanned(
            lit,
            "`permits = 0` could never be taken; a semaphore needs at least 1 permit",
        ),
        Ok(_) => return Some(lit.clone()),
        Err(_) => errors.spanned(
            lit,
            format!("`permits` must be a whole number from 1 to {}", u32::MAX),
        ),
    }
    None
}

fn boolean(value: &Expr, option: &str, errors: &mut Errors) -> Option<LitBool> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(lit),
            ..
        }) => Some(lit.clone()),
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) if matches!(lit.value().as_str(), "true" | "false") => {
            errors.spanned(
                lit,
                format!(
                    "`{option}` takes a bool, not a string: `{option} = {}`",
                    lit.value()
                ),
            );
            None
        }
        _ => {
            errors.spanned(
                value,
                format!(
                    "expected `true` or `false`: `{option} = {}`",
                    example(option)
                ),
            );
            None
        }
    }
}

fn on_lost(value: &Expr, errors: &mut Errors) -> Option<(OnLost, LitStr)> {
    let lit = string(value, "on_lost", errors)?;
    match lit.value().as_str() {
        "cancel" => Some((OnLost::Cancel, lit)),
        "continue" => Some((OnLost::Continue, lit)),
        other => {
            errors.spanned(
                &lit,
                format!(
                    "unknown `on_lost` value \"{}\"; use \"cancel\" (drop the body and return \
                     `LockError::Lost`) or \"continue\" (let the body finish)",
                    other.escape_debug()
                ),
            );
            None
        }
    }
}

fn mode(value: &Expr, errors: &mut Errors) -> Option<(Mode, LitStr)> {
    let lit = string(value, "mode", errors)?;
    match lit.value().as_str() {
        "read" => Some((Mode::Read, lit)),
        "write" => Some((Mode::Write, lit)),
        other => {
            errors.spanned(
                &lit,
                format!(
                    "unknown `mode` value \"{}\"; use \"read\" (beside other readers) or \"write\" \
                     (alone, the default)",
                    other.escape_debug()
                ),
            );
            None
        }
    }
}

fn registry(value: &Expr, errors: &mut Errors) -> Option<LitStr> {
    let lit = string(value, "registry", errors)?;
    if lit.value().is_empty() {
        errors.spanned(
            &lit,
            "the registry name is empty; name a registry installed with \
             `Registry::install_as(\"name\")`, or remove `registry` to use the default one",
        );
        return None;
    }
    Some(lit)
}

fn crate_path(value: &Expr, errors: &mut Errors) -> Option<Path> {
    let lit = string(value, "crate", errors)?;
    // Parsed with the literal's span, so an unresolvable path is reported on the literal.
    match lit.parse_with(Path::parse_mod_style) {
        Ok(path) => Some(path),
        Err(_) => {
            errors.spanned(
                &lit,
                format!(
                    "`crate` must be a path to lock_runtime, e.g. `crate = {}`, not \"{}\"",
                    example("crate"),
                    lit.value().escape_debug()
                ),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse_ok(tokens: TokenStream) -> Args {
        let mut errors = Errors::default();
        let args = parse(tokens, &mut errors);
        assert!(errors.finish().is_ok());
        args
    }

    fn parse_err(tokens: TokenStream) -> String {
        let mut errors = Errors::default();
        parse(tokens, &mut errors);
        let error = errors.finish().expect_err("expected an error");
        error
            .into_iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn every_option_parses_into_typed_values() {
        let args = parse_ok(quote!(
            key = "job:<id>",
            ttl = "60s",
            wait = "0s",
            renew = false,
            on_lost = "continue",
            min_hold = "1m",
            max_hold = "10m",
            fencing = true,
            registry = "jobs",
            crate = "my::lock_runtime"
        ));
        assert!(args.complete);
        assert_eq!(args.key.unwrap().value(), "job:<id>");
        assert_eq!(args.ttl.unwrap().millis, 60_000);
        assert_eq!(args.wait.unwrap().millis, 0);
        assert!(!args.renew.unwrap().value);
        assert!(args.on_lost.as_ref().map(|(o, _)| *o) == Some(OnLost::Continue));
        assert_eq!(args.min_hold.unwrap().millis, 60_000);
        assert_eq!(args.max_hold.unwrap().millis, 600_000);
        assert!(args.fencing.unwrap().value);
        assert_eq!(args.registry.unwrap().value(), "jobs");
        let krate = args.krate.unwrap();
        assert_eq!(quote!(#krate).to_string(), "my :: lock_runtime");
    }

    #[test]
    fn all_value_errors_are_collected() {
        let message = parse_err(quote!(
            key = 1,
            ttl = "0s",
            wait = "5x",
            renew = "false",
            tll = "1s"
        ));
        let lines: Vec<&str> = message.lines().collect();
        assert_eq!(lines.len(), 5, "{message}");
        assert!(lines[0].starts_with("expected a string literal"));
        assert!(lines[1].starts_with("`ttl` must be longer than zero"));
        assert!(lines[2].starts_with("invalid `wait`: unknown unit `x`"));
        assert!(lines[3].starts_with("`renew` takes a bool, not a string"));
        assert!(lines[4].starts_with("unknown option `tll`; did you mean `ttl`?"));
    }

    #[test]
    fn duplicates_keep_the_first_value() {
        let mut errors = Errors::default();
        let args = parse(quote!(key = "a", key = "b"), &mut errors);
        assert_eq!(args.key.unwrap().value(), "a");
        let message = errors.finish().unwrap_err().to_string();
        assert_eq!(message, "duplicated option `key`; give it once");
    }

    #[test]
    fn a_syntax_error_marks_the_arguments_incomplete() {
        let mut errors = Errors::default();
        let args = parse(quote!(key "a"), &mut errors);
        assert!(!args.complete);
        assert!(!errors.is_empty());
    }

    #[test]
    fn an_option_without_value_is_reported_and_parsing_continues() {
        let message = parse_err(quote!(fencing, ttl = 5));
        assert!(
            message.starts_with("`fencing` needs a value: `fencing = true`"),
            "{message}"
        );
        assert!(
            message.contains("expected a string literal: `ttl = \"30s\"`"),
            "{message}"
        );
    }

    #[test]
    fn suggestions_only_for_near_misses() {
        assert_eq!(closest_option("tll"), Some("ttl"));
        assert_eq!(closest_option("minhold"), Some("min_hold"));
        assert_eq!(closest_option("timeout"), None);
    }
}

//! Checks the options against each other and against the annotated fn, and resolves the
//! key template's placeholders to the fn's parameters. The result, [`Lock`], is everything
//! `expand.rs` quotes: nothing there can fail any more.

use std::collections::BTreeMap;

use proc_macro2::{Span, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::{
    AttrStyle, Attribute, Block, Expr, FnArg, Ident, ItemFn, LitStr, Member, Pat, Path, ReturnType,
    Signature, Stmt, Type, Visibility,
};

use crate::args::{Args, Mode, OnLost};
use crate::boxed;
use crate::ctxt::Errors;
use crate::template::{self, Field, Part, Root};

/// A validated annotated fn.
pub(crate) struct Lock {
    pub(crate) krate: Path,
    pub(crate) registry: Option<LitStr>,
    /// One key, or a multi-key lock's keys.
    pub(crate) keys: Vec<Key>,
    pub(crate) options: Options,
    /// The fn's `Result<T, E>` type, for the `LockResult` assertion; `None` when it cannot be
    /// named inside the body (it contains `impl Trait`).
    pub(crate) output: Option<Type>,
    pub(crate) outer_attrs: Vec<Attribute>,
    pub(crate) inner_attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) body: Body,
    /// With `leader = true`: the parameters' bindings, cloned for each term the body runs in.
    pub(crate) leader: Option<Vec<Ident>>,
}

/// The key template resolved against the signature.
pub(crate) struct Key {
    pub(crate) parts: Vec<KeyPart>,
    /// The key literal's span: type errors in an interpolation are reported there.
    pub(crate) span: Span,
    /// The template as written (`deploy:<id>`): what metrics are labeled with, never the
    /// rendered key.
    pub(crate) template: String,
}

pub(crate) enum KeyPart {
    Literal(String),
    /// `root.field.field`: `root` is the parameter's (or `self`'s) own identifier, so it
    /// resolves to the binding whatever the macro hygiene around it.
    Value {
        root: Ident,
        fields: Vec<Member>,
    },
}

/// The options that were given; `None` leaves the runtime's default.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) ttl: Option<u64>,
    pub(crate) wait: Option<u64>,
    pub(crate) renew: Option<bool>,
    pub(crate) on_lost: Option<OnLost>,
    pub(crate) min_hold: Option<u64>,
    pub(crate) max_hold: Option<u64>,
    pub(crate) fencing: Option<bool>,
    pub(crate) permits: Option<u32>,
    pub(crate) mode: Option<Mode>,
}

pub(crate) enum Body {
    /// An `async fn`: its block becomes the body future.
    Async(Box<Block>),
    /// A fn returning `Pin<Box<dyn Future>>` with a tail `Box::pin(future)` (`#[async_trait]`).
    Boxed {
        leading: Vec<Stmt>,
        box_pin: Box<Expr>,
        future: Box<Expr>,
        /// The user's body, taken out of `future` (which holds a hole for it), when found;
        /// otherwise the whole `future` is the body and the key is rendered before it.
        inner: Option<Box<Expr>>,
    },
}

/// The runtime's default lease length, for the hold checks when `ttl` is not given.
pub(crate) const DEFAULT_TTL_MILLIS: u64 = 30_000;

pub(crate) fn validate(args: Args, item: ItemFn, errors: &mut Errors) -> Option<Lock> {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = item;
    let (inner_attrs, outer_attrs) = attrs
        .into_iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Inner(_)));

    let (body, scope, boxed_output) = shape(&sig, *block, errors);
    let output = output_type(&sig, boxed_output, errors);
    check_holds(&args, errors);
    check_permits(&args, errors);
    let leader = args.leader.as_ref().is_some_and(|l| l.value);
    if leader {
        check_leader(&args, body.as_ref(), errors);
    }

    let keys = match (&args.key, &args.keys) {
        (Some(_), Some((_, keys))) => {
            errors.spanned(
                keys,
                "give `key` (one lock) or `keys` (one lock over several keys), not both",
            );
            None
        }
        (Some(lit), None) => resolve_key(lit, &sig.ident, &scope, errors).map(|key| vec![key]),
        (None, Some((lits, _))) => {
            let keys: Vec<_> = lits
                .iter()
                .filter_map(|lit| resolve_key(lit, &sig.ident, &scope, errors))
                .collect();
            (keys.len() == lits.len()).then_some(keys)
        }
        (None, None) => {
            if args.complete && !args.key_given {
                errors.at(
                    Span::call_site(),
                    "missing `key`; name the lock, e.g. `#[distributed_lock(key = \"job:<id>\")]`",
                );
            }
            None
        }
    };

    let (Some(body), Some(output), Some(keys)) = (body, output, keys) else {
        return None;
    };
    let leader = leader.then(|| scope.names.values().cloned().collect());
    if !errors.is_empty() {
        return None;
    }
    Some(Lock {
        krate: args
            .krate
            .unwrap_or_else(|| syn::parse_quote!(::lock_runtime)),
        registry: args.registry,
        keys,
        options: Options {
            ttl: args.ttl.map(|d| d.millis),
            wait: args.wait.map(|d| d.millis),
            renew: args.renew.map(|b| b.value),
            on_lost: args.on_lost.as_ref().map(|(on_lost, _)| *on_lost),
            min_hold: args.min_hold.map(|d| d.millis),
            max_hold: args.max_hold.map(|d| d.millis),
            fencing: args.fencing.map(|b| b.value),
            permits: args.permits.as_ref().and_then(|p| p.base10_parse().ok()),
            mode: args.mode.as_ref().map(|(mode, _)| *mode),
        },
        output,
        outer_attrs,
        inner_attrs,
        vis,
        sig,
        body,
        leader,
    })
}

/// `leader = true` makes the fn a leader's loop: it campaigns in the election on its key and
/// runs the body for each term won, until the registry shuts down. The options of a lock's
/// tenure do not apply to a term: the candidate waits as long as it takes, renews, is stopped
/// when its term is lost, and its term is numbered by a fencing token.
fn check_leader(args: &Args, body: Option<&Body>, errors: &mut Errors) {
    let lease = "a leader's lease is renewed until its term ends";
    let alone = "a leader leads alone";
    let given: [(&str, Option<&dyn ToTokens>, &str); 9] = [
        (
            "keys",
            args.keys.as_ref().map(|(_, path)| path as _),
            "an election is on one key",
        ),
        (
            "wait",
            args.wait.as_ref().map(|d| &d.lit as _),
            "a candidate campaigns until elected",
        ),
        ("renew", args.renew.as_ref().map(|b| b as _), lease),
        (
            "max_hold",
            args.max_hold.as_ref().map(|d| &d.lit as _),
            lease,
        ),
        (
            "min_hold",
            args.min_hold.as_ref().map(|d| &d.lit as _),
            "a term ends when its body returns, and the next candidate leads at once",
        ),
        (
            "on_lost",
            args.on_lost.as_ref().map(|(_, lit)| lit as _),
            "a term that is lost stops the body before its lease can expire",
        ),
        (
            "fencing",
            args.fencing.as_ref().map(|b| b as _),
            "every term is numbered by a fencing token already",
        ),
        ("mode", args.mode.as_ref().map(|(_, lit)| lit as _), alone),
        ("permits", args.permits.as_ref().map(|p| p as _), alone),
    ];
    for (option, at, why) in given {
        if let Some(at) = at {
            errors.spanned(
                at,
                format!("`{option}` does not go with `leader = true`: {why}; drop `{option}`"),
            );
        }
    }
    if let (Some(Body::Boxed { .. }), Some(leader)) = (body, &args.leader) {
        errors.spanned(
            leader,
            "`leader = true` needs an `async fn`: a boxed future (`#[async_trait]`) cannot be \
             started again for each term; call a leader's `async fn` from the trait method",
        );
    }
}

/// What a placeholder can name: bindings by unraw name, and what `self` is.
struct Scope {
    names: BTreeMap<String, Ident>,
    receiver: Option<Ident>,
    /// Under `#[async_trait]`, when its rebinding of the parameters was not found.
    boxed_without_locals: bool,
}

/// Recognises the body, and collects the names the key may use where it is rendered.
fn shape(
    sig: &Signature,
    block: Block,
    errors: &mut Errors,
) -> (Option<Body>, Scope, Option<Type>) {
    let mut scope = Scope {
        names: BTreeMap::new(),
        receiver: sig
            .receiver()
            .map(|receiver| Ident::new("self", receiver.self_token.span)),
        boxed_without_locals: false,
    };
    for input in &sig.inputs {
        if let FnArg::Typed(typed) = input {
            bindings(&typed.pat, &mut scope.names);
        }
    }
    if sig.asyncness.is_some() {
        return (Some(Body::Async(Box::new(block))), scope, None);
    }
    match boxed::recognise(sig, block) {
        Ok(boxed) => {
            let inner = boxed.inner.map(|inner| {
                // async-trait rebinds the parameters (`let id = id;`, `let __self = self;`,
                // `let (a, b) = __arg1;`): the key uses those, the ones the body sees.
                for local in &inner.locals {
                    bindings(local, &mut scope.names);
                }
                if let Some(this) = scope.names.remove("__self") {
                    scope.receiver = Some(this);
                }
                inner.body
            });
            scope.boxed_without_locals = inner.is_none();
            // async-trait's stand-ins for destructured parameters are not the user's names.
            scope.names.retain(|name, _| {
                !name
                    .strip_prefix("__arg")
                    .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            });
            let body = Body::Boxed {
                leading: boxed.leading,
                box_pin: boxed.box_pin,
                future: boxed.future,
                inner,
            };
            (Some(body), scope, Some(boxed.output))
        }
        Err(_) => {
            errors.spanned(
                sig.fn_token,
                "`#[distributed_lock]` needs an `async fn`, because the lock is held while its \
                 future runs; make it `async fn`",
            );
            (None, scope, None)
        }
    }
}

/// The fn's result type, or an error when it has none. A type that is not a `Result` is
/// left to the `LockResult` assertion, whose message names the fix.
fn output_type(
    sig: &Signature,
    boxed_output: Option<Type>,
    errors: &mut Errors,
) -> Option<Option<Type>> {
    let ty = match (boxed_output, &sig.output) {
        (Some(output), _) => output,
        (None, ReturnType::Type(_, ty)) => (**ty).clone(),
        (None, ReturnType::Default) => {
            errors.at(
                sig.paren_token.span.close(),
                "`#[distributed_lock]` needs a fn returning `Result<T, E>` where \
                 `E: From<lock_runtime::LockError>`, so lock failures can reach the caller; \
                 add a return type, e.g. `-> Result<(), MyError>`",
            );
            return None;
        }
    };
    Some((!contains_impl_trait(&ty)).then_some(ty))
}

fn contains_impl_trait(ty: &Type) -> bool {
    fn walk(tokens: proc_macro2::TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => ident == "impl",
            TokenTree::Group(group) => walk(group.stream()),
            _ => false,
        })
    }
    walk(ty.to_token_stream())
}

/// `fencing` orders holders one after another; permits and readers are held side by side, and
/// a semaphore has no readers and writers. Several keys are locked exclusively only.
fn check_permits(args: &Args, errors: &mut Errors) {
    if let Some((_, keys)) = &args.keys {
        let shared = match (&args.permits, &args.mode) {
            (Some(_), _) => Some("`permits`"),
            (None, Some((Mode::Read, _))) => Some("`mode = \"read\"`"),
            _ => None,
        };
        if let Some(shared) = shared {
            errors.spanned(
                keys,
                format!(
                    "`keys` takes several keys exclusively; {shared} over several keys is not \
                     offered: lock them one by one, or use `key`"
                ),
            );
        }
    }
    if let (Some((_, mode)), Some(permits)) = (&args.mode, &args.permits) {
        errors.spanned(
            mode,
            format!(
                "`mode` does not go with `permits = {permits}`: a semaphore has permits, not \
                 readers and writers; drop one of them"
            ),
        );
    }
    if let (Some((Mode::Read, _)), Some(fencing)) = (&args.mode, &args.fencing) {
        if fencing.value {
            errors.spanned(
                fencing,
                "`fencing = true` does not go with `mode = \"read\"`: readers hold side by side, \
                 so a fencing token would order nothing; fence the writes",
            );
        }
    }
    if let (Some(permits), Some(fencing)) = (&args.permits, &args.fencing) {
        if fencing.value {
            errors.spanned(
                fencing,
                format!(
                    "`fencing = true` does not go with `permits = {permits}`: permits are held \
                     side by side, so a fencing token would order nothing; drop one of them"
                ),
            );
        }
    }
}

/// `min_hold` / `max_hold` combinations that cannot do what they say.
fn check_holds(args: &Args, errors: &mut Errors) {
    let ttl = args.ttl.as_ref().map_or(DEFAULT_TTL_MILLIS, |d| d.millis);
    let ttl_text = args.ttl.as_ref().map_or_else(
        || format!("the default \"{}s\"", DEFAULT_TTL_MILLIS / 1000),
        |d| format!("\"{}\"", d.lit.value()),
    );
    let renew = args.renew.as_ref().is_none_or(|b| b.value);

    if let Some(max_hold) = &args.max_hold {
        if !renew {
            errors.spanned(
                &max_hold.lit,
                "`max_hold` limits renewal, but `renew = false` turns renewal off, so the lock \
                 already ends after `ttl`; remove `max_hold`, or remove `renew = false`",
            );
        } else if max_hold.millis < ttl {
            errors.spanned(
                &max_hold.lit,
                format!(
                    "`max_hold` is shorter than `ttl` ({ttl_text}): the first lease already lasts \
                     `ttl`, so it could never take effect; make `max_hold` at least `ttl`, or \
                     shorten `ttl`"
                ),
            );
        }
    }
    if let Some(min_hold) = &args.min_hold {
        if !renew && min_hold.millis > ttl {
            errors.spanned(
                &min_hold.lit,
                format!(
                    "`min_hold` is longer than `ttl` ({ttl_text}) while `renew = false`: the lock \
                     expires after `ttl` whatever happens; make `ttl` at least `min_hold`, or \
                     remove `renew = false`"
                ),
            );
        }
        if let Some(max_hold) = args
            .max_hold
            .as_ref()
            .filter(|max| max.millis < min_hold.millis)
        {
            errors.spanned(
                &min_hold.lit,
                format!(
                    "`min_hold` is longer than `max_hold` (\"{}\"): the lock cannot be kept at \
                     least longer than it may be held at most; make `min_hold` at most `max_hold`",
                    max_hold.lit.value()
                ),
            );
        }
    }
}

fn resolve_key(lit: &LitStr, fn_name: &Ident, scope: &Scope, errors: &mut Errors) -> Option<Key> {
    let template = match template::parse(&lit.value()) {
        Ok(template) => template,
        Err(messages) => {
            for message in messages {
                errors.spanned(lit, format!("invalid key: {message}"));
            }
            return None;
        }
    };
    let span = lit.span();
    let mut parts = Vec::new();
    let mut ok = true;
    for part in template.parts {
        let placeholder = match part {
            Part::Literal(text) => {
                parts.push(KeyPart::Literal(text));
                continue;
            }
            Part::Placeholder(placeholder) => placeholder,
        };
        let root = match &placeholder.root {
            Root::SelfValue => scope.receiver.as_ref(),
            Root::Param(name) => scope.names.get(name),
        };
        let Some(root) = root else {
            let message = match &placeholder.root {
                Root::SelfValue => format!(
                    "`{}` needs a method: `{fn_name}` has no `self` parameter",
                    placeholder.source
                ),
                Root::Param(_) => unknown_param_message(&placeholder.source, fn_name, scope),
            };
            errors.spanned(lit, message);
            ok = false;
            continue;
        };
        // Resolved like the binding, reported at the key: a missing field or a value that is
        // not `Display` is an error on the key literal.
        let mut root = root.clone();
        root.set_span(root.span().located_at(span));
        let fields = placeholder
            .fields
            .into_iter()
            .map(|field| match field {
                Field::Named(name) => Member::Named(field_ident(&name, span)),
                Field::Index(index) => Member::Unnamed(syn::Index { index, span }),
            })
            .collect();
        parts.push(KeyPart::Value { root, fields });
    }
    ok.then_some(Key {
        parts,
        span,
        template: lit.value(),
    })
}

/// A field name as an identifier, raw when it is a keyword (`<req.r#type>`).
fn field_ident(name: &str, span: Span) -> Ident {
    if syn::parse_str::<Ident>(name).is_ok() {
        Ident::new(name, span)
    } else {
        Ident::new_raw(name, span)
    }
}

/// Every name a pattern binds, by unraw name (later bindings shadow earlier ones).
fn bindings(pat: &Pat, names: &mut BTreeMap<String, Ident>) {
    match pat {
        Pat::Ident(binding) => {
            names.insert(binding.ident.unraw().to_string(), binding.ident.clone());
            if let Some((_, sub)) = &binding.subpat {
                bindings(sub, names);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| bindings(p, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| bindings(p, names)),
        Pat::Struct(strukt) => strukt.fields.iter().for_each(|f| bindings(&f.pat, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| bindings(p, names)),
        Pat::Reference(reference) => bindings(&reference.pat, names),
        Pat::Paren(paren) => bindings(&paren.pat, names),
        Pat::Type(typed) => bindings(&typed.pat, names),
        // Every alternative binds the same names.
        Pat::Or(or) => or.cases.iter().take(1).for_each(|p| bindings(p, names)),
        _ => {}
    }
}

fn unknown_param_message(source: &str, fn_name: &Ident, scope: &Scope) -> String {
    let mut available: Vec<String> = scope
        .names
        .keys()
        .map(|name| format!("`<{name}>`"))
        .collect();
    if scope.receiver.is_some() {
        available.insert(0, "`<self.field>`".to_owned());
    }
    let mut message = if available.is_empty() {
        format!(
            "`{source}` names no parameter: `{fn_name}` has none; remove the placeholder or add \
             the parameter"
        )
    } else {
        format!(
            "`{source}` names no parameter of `{fn_name}`; available: {}",
            available.join(", ")
        )
    };
    if scope.boxed_without_locals {
        message.push_str(
            "; this boxed-future fn hides destructured parameters, so bind the parameter to a \
             name to use it in the key",
        );
    }
    message
}

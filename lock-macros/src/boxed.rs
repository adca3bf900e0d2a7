//! Fns that return a boxed future instead of being `async fn`, as `#[async_trait]` writes
//! them. Attributes on a method run after the attribute on its impl, so under
//! `#[async_trait]` this macro sees:
//!
//! ```text
//! fn run<'life0, 'async_trait>(&'life0 self, id: u64)
//!     -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'async_trait>>
//! {
//!     Box::pin(async move {
//!         let __self = self;
//!         let id = id;
//!         let __ret: Result<T, E> = { /* the user's body */ };
//!         __ret
//!     })
//! }
//! ```
//!
//! The user's body is found as the init of `let __ret` (possibly nested in futures that
//! `#[tracing::instrument]` wrapped around it) and replaced by a hole that `expand.rs` fills
//! with the locked body. The key is rendered right there, after async-trait rebound the
//! parameters: destructured names are in scope, `self` is `__self`, and the rebindings count
//! as used. When no `let __ret` is found, the whole future is locked instead.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::quote;
use syn::visit_mut::{self, VisitMut};
use syn::{
    Block, Expr, ExprCall, GenericArgument, Ident, Item, Pat, PathArguments, ReturnType, Signature,
    Stmt, Type, TypeParamBound,
};

/// Where the locked body goes inside a [`Boxed::future`] whose [`Boxed::inner`] was taken.
const HOLE: &str = "__distributed_lock_body";

pub(crate) struct Boxed {
    /// Statements before the tail `Box::pin(..)`.
    pub(crate) leading: Vec<Stmt>,
    /// The path of the `Box::pin` call, kept as written.
    pub(crate) box_pin: Box<Expr>,
    /// The future passed to `Box::pin`, with a hole where `inner` was.
    pub(crate) future: Box<Expr>,
    /// `R` of `dyn Future<Output = R>`.
    pub(crate) output: Type,
    pub(crate) inner: Option<Inner>,
}

/// The user's body inside async-trait's future.
pub(crate) struct Inner {
    pub(crate) body: Box<Expr>,
    /// Names bound before the body: async-trait's rebindings of the parameters.
    pub(crate) locals: Vec<Pat>,
}

/// Recognises a boxed-future fn; gives the block back when `sig`/`block` are not one.
pub(crate) fn recognise(sig: &Signature, block: Block) -> Result<Boxed, Block> {
    let Some(output) = boxed_future_output(&sig.output) else {
        return Err(block);
    };
    let is_tail_box_pin = matches!(
        block.stmts.last(),
        Some(Stmt::Expr(Expr::Call(call), None)) if is_box_pin(call)
    );
    if !is_tail_box_pin {
        return Err(block);
    }
    let mut leading = block.stmts;
    let Some(Stmt::Expr(Expr::Call(ExprCall { func, args, .. }), None)) = leading.pop() else {
        unreachable!("checked above")
    };
    let mut future = args.into_iter().next().expect("checked by is_box_pin");
    let mut finder = FindBody { inner: None };
    finder.visit_expr_mut(&mut future);
    Ok(Boxed {
        leading,
        box_pin: func,
        future: Box::new(future),
        output,
        inner: finder.inner,
    })
}

/// `future` as tokens with its hole replaced by `body`.
pub(crate) fn fill_hole(future: TokenStream, body: &TokenStream) -> TokenStream {
    future
        .into_iter()
        .map(|token| match token {
            TokenTree::Ident(ident) if ident == HOLE => {
                TokenTree::Group(Group::new(proc_macro2::Delimiter::None, body.clone()))
            }
            TokenTree::Group(group) => {
                let mut filled = Group::new(group.delimiter(), fill_hole(group.stream(), body));
                filled.set_span(group.span());
                TokenTree::Group(filled)
            }
            other => other,
        })
        .collect()
}

/// `Box::pin(x)` with exactly one argument, whatever the path to `Box`.
fn is_box_pin(call: &ExprCall) -> bool {
    let Expr::Path(path) = &*call.func else {
        return false;
    };
    let mut segments = path.path.segments.iter().rev();
    let pin = segments
        .next()
        .is_some_and(|segment| segment.ident == "pin");
    let boxed = segments
        .next()
        .is_some_and(|segment| segment.ident == "Box");
    call.args.len() == 1 && pin && boxed
}

/// `R` in `Pin<Box<dyn Future<Output = R> + ..>>`.
fn boxed_future_output(output: &ReturnType) -> Option<Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let pin = single_type_argument(ty, "Pin")?;
    let boxed = single_type_argument(pin, "Box")?;
    let Type::TraitObject(object) = boxed else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let future = bound.path.segments.last()?;
        if future.ident != "Future" {
            return None;
        }
        let PathArguments::AngleBracketed(args) = &future.arguments else {
            return None;
        };
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(assoc.ty.clone()),
            _ => None,
        })
    })
}

/// The first type argument of a path type whose last segment is `name`.
fn single_type_argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let segment = path.path.segments.last()?;
    if segment.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &segment.arguments else {
        return None;
    };
    match args.args.first()? {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    }
}

/// Takes the init of the first `let __ret: R = ..;` out of the future, leaving the hole.
struct FindBody {
    inner: Option<Inner>,
}

impl VisitMut for FindBody {
    fn visit_block_mut(&mut self, block: &mut Block) {
        if self.inner.is_some() {
            return;
        }
        for index in 0..block.stmts.len() {
            let (before, rest) = block.stmts.split_at_mut(index);
            let Stmt::Local(local) = &mut rest[0] else {
                continue;
            };
            if !is_ret_binding(&local.pat) {
                continue;
            }
            let Some(init) = local.init.as_mut().filter(|init| init.diverge.is_none()) else {
                continue;
            };
            let marker = Ident::new(HOLE, Span::mixed_site());
            let hole = Expr::Verbatim(quote!(#marker));
            let body = std::mem::replace(&mut *init.expr, hole);
            let locals = before
                .iter()
                .filter_map(|stmt| match stmt {
                    Stmt::Local(local) => Some(local.pat.clone()),
                    _ => None,
                })
                .collect();
            self.inner = Some(Inner {
                body: Box::new(body),
                locals,
            });
            return;
        }
        visit_mut::visit_block_mut(self, block);
    }

    // A `let __ret` in a nested fn or impl is not async-trait's.
    fn visit_item_mut(&mut self, _: &mut Item) {}
}

fn is_ret_binding(pat: &Pat) -> bool {
    let Pat::Type(typed) = pat else {
        return false;
    };
    matches!(&*typed.pat, Pat::Ident(ident) if ident.ident == "__ret" && ident.subpat.is_none())
}

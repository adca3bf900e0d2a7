//! Error collection in the style of serde_derive's `Ctxt`: every stage records what it
//! finds wrong and carries on, so one build reports every mistake in the attribute.

use std::fmt::Display;

use proc_macro2::Span;
use quote::ToTokens;

#[derive(Default)]
pub(crate) struct Errors {
    errors: Vec<syn::Error>,
}

impl Errors {
    /// Records an error on the tokens that caused it.
    pub(crate) fn spanned<T: ToTokens, M: Display>(&mut self, tokens: T, message: M) {
        self.errors.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error at a span (for places without tokens, e.g. the attribute itself).
    pub(crate) fn at<M: Display>(&mut self, span: Span, message: M) {
        self.errors.push(syn::Error::new(span, message));
    }

    pub(crate) fn push(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// All recorded errors as one, or `Ok` when there were none.
    pub(crate) fn finish(self) -> syn::Result<()> {
        let mut errors = self.errors.into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for error in errors {
            combined.combine(error);
        }
        Err(combined)
    }
}

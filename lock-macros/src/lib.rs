//! The `#[distributed_lock]` attribute. Use it through `lock_runtime::distributed_lock`:
//! the expansion calls into `lock_runtime`, which re-exports this crate at an exact version.

mod args;
mod boxed;
mod ctxt;
mod duration;
mod expand;
mod template;
mod validate;

use proc_macro::TokenStream;

/// The default ttl and the bounds the attribute checks durations against, in milliseconds:
/// `(default ttl, shortest ttl, longest duration)`. For lock-runtime's test that they are its
/// own (a proc-macro crate cannot depend on the runtime to compare them itself).
#[doc(hidden)]
#[proc_macro]
pub fn __limits(_: TokenStream) -> TokenStream {
    let (default, min, max) = (
        validate::DEFAULT_TTL_MILLIS,
        duration::MIN_TTL_MILLIS,
        duration::MAX_MILLIS,
    );
    quote::quote!((#default, #min, #max)).into()
}

/// Runs an `async fn` while holding a lock. Use it as `lock_runtime::distributed_lock`: the
/// expansion calls into `lock_runtime`, whose documentation of the attribute has its options
/// and examples (tested there, against the runtime).
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    match distributed_lock_impl(args.into(), item.clone()) {
        Ok(expanded) => expanded.into(),
        Err(error) => {
            // Keep the fn as written next to the errors, so rust-analyzer and the rest of the
            // crate still see it and only the attribute's own errors are reported.
            let mut output = item;
            output.extend(error.to_compile_error());
            output.into()
        }
    }
}

fn distributed_lock_impl(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let mut errors = ctxt::Errors::default();
    let args = args::parse(args, &mut errors);
    let item = match syn::parse2::<syn::ItemFn>(item.clone()) {
        Ok(item) => item,
        Err(parse_error) => {
            errors.push(not_a_fn(item, parse_error));
            return errors
                .finish()
                .map(|()| unreachable!("an error was just recorded"));
        }
    };
    let lock = validate::validate(args, item, &mut errors);
    errors.finish()?;
    Ok(expand::expand(
        lock.expect("validation without errors yields a lock"),
    ))
}

/// The error for an item that is not a fn with a body: a trait's fn declaration, another kind
/// of item, or a fn syn cannot read (then syn's own error, on the token it stopped at).
fn not_a_fn(item: proc_macro2::TokenStream, parse_error: syn::Error) -> syn::Error {
    if let Ok(method) = syn::parse2::<syn::TraitItemFn>(item.clone()) {
        return syn::Error::new_spanned(
            method.sig.ident,
            "`#[distributed_lock]` needs a fn body to run under the lock; put the attribute \
             on the fn in each `impl` of the trait instead of on its declaration",
        );
    }
    match syn::parse2::<syn::Item>(item) {
        Ok(syn::Item::Fn(_) | syn::Item::Verbatim(_)) | Err(_) => parse_error,
        Ok(_) => syn::Error::new(
            proc_macro2::Span::call_site(),
            "`#[distributed_lock]` applies to an `async fn` that returns `Result<T, E>`",
        ),
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    fn expand(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        super::distributed_lock_impl(args, item)
            .expect("valid")
            .to_string()
    }

    #[test]
    fn the_signature_is_kept_and_the_body_quoted_once() {
        let expanded = expand(
            quote!(key = "deploy:<id>", ttl = "60s", registry = "jobs"),
            quote! {
                #[doc = "deploys"]
                pub async fn deploy<'a>(&self, id: u64, env: &'a str) -> Result<(), E>
                where
                    E: Send,
                {
                    #![allow(unused)]
                    unique_body_marker(env)
                }
            },
        );
        assert!(expanded.starts_with(
            "# [doc = \"deploys\"] pub async fn deploy < 'a > (& self , id : u64 , env : & 'a str) \
             -> Result < () , E > where E : Send , { # ! [allow (unused)]"
        ));
        assert_eq!(expanded.matches("unique_body_marker").count(), 1);
        assert!(expanded.contains("async move { unique_body_marker (env) }"));
        assert!(expanded.contains(
            ":: lock_runtime :: __private :: run (:: core :: option :: Option :: Some (\"jobs\")"
        ));
        assert!(expanded
            .contains(". ttl (:: lock_runtime :: __private :: Duration :: from_millis (60000))"));
        assert!(expanded.contains("assert_lock_result :: < Result < () , E > > ()"));
    }

    #[test]
    fn only_given_options_are_emitted() {
        let expanded = expand(
            quote!(key = "static", crate = "my::rt"),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        // The template is always given: it labels the lock's metrics.
        assert!(expanded
            .contains("my :: rt :: __private :: LockOptions :: new () . template (\"static\") ,"));
        assert!(!expanded.contains(":: lock_runtime"));
    }

    #[test]
    fn the_key_templates_as_written_label_the_lock() {
        let expanded = expand(
            quote!(keys = ["account:<from>", "account:<to>"]),
            quote!(
                async fn f(from: u64, to: u64) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(expanded.contains(". template (\"account:<from> + account:<to>\")"));
    }

    /// A fn syn cannot read gets syn's own error, which names the token it stopped at, rather
    /// than "applies to an async fn"; another kind of item gets that.
    #[test]
    fn a_fn_syn_cannot_read_keeps_syns_error() {
        let error = |item: proc_macro2::TokenStream| {
            super::distributed_lock_impl(quote!(key = "job"), item)
                .expect_err("refused")
                .to_string()
        };
        let unreadable = quote!(async fn f(id: u64, ->) -> Result<(), E> {});
        let Err(expected) = syn::parse2::<syn::ItemFn>(unreadable.clone()) else {
            panic!("not a fn syn reads");
        };
        let expected = expected.to_string();
        assert_eq!(error(unreadable), expected);
        assert!(!expected.contains("applies to"), "{expected}");
        assert!(error(quote!(
            struct Job;
        ))
        .contains("applies to an `async fn`"));
    }

    #[test]
    fn errors_are_collected_across_arguments_and_signature() {
        let error = super::distributed_lock_impl(
            quote!(key = "<nope>", ttl = "0s"),
            quote!(
                fn f() {}
            ),
        )
        .expect_err("invalid");
        let messages: Vec<String> = error.into_iter().map(|e| e.to_string()).collect();
        assert_eq!(messages.len(), 4, "{messages:#?}");
        assert!(messages[0].starts_with("`ttl` must be longer than zero"));
        assert!(messages[1].contains("needs an `async fn`"));
        assert!(messages[2].contains("add a return type"));
        assert!(messages[3].starts_with("`<nope>` names no parameter"));
    }
}

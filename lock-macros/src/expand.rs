//! Quotes a validated [`Lock`]: the fn keeps its attributes, visibility and signature; only
//! its body is replaced by "render the key, then run the original body under the lock".

use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::Expr;

use crate::args::{Mode, OnLost};
use crate::boxed;
use crate::validate::{Body, Key, KeyPart, Lock, Options};

pub(crate) fn expand(lock: Lock) -> TokenStream {
    let Lock {
        krate,
        registry,
        keys,
        options,
        output,
        outer_attrs,
        inner_attrs,
        vis,
        sig,
        body,
        leader,
    } = lock;
    let private = quote!(#krate::__private);
    // Mixed-site: a parameter called `lock_key` (or `key`, `guard`, ...) can never clash.
    let lock_key = Ident::new("lock_key", Span::mixed_site());

    // Named at the return type, so a wrong return type is reported there first, with the
    // `#[diagnostic::on_unimplemented]` message of `LockResult`. (`run`'s own `R: LockResult`
    // bound repeats it at the attribute: rustc places that one at the fn body.)
    let assertion = output.map(|ty| {
        quote_spanned! {ty.span()=>
            #private::assert_lock_result::<#ty>();
        }
    });
    let renders: Vec<TokenStream> = keys.iter().map(|key| render_key(&private, key)).collect();
    let registry = match registry {
        Some(name) => quote!(::core::option::Option::Some(#name)),
        None => quote!(::core::option::Option::None),
    };
    let options_ttl = options.ttl;
    let mut options = options_chain(&private, &options);
    let template = keys
        .iter()
        .map(|key| key.template.as_str())
        .collect::<Vec<_>>()
        .join(" + ");
    options.extend(quote!(.template(#template)));

    let locked = |body: TokenStream| {
        quote! {
            let #lock_key: ::std::vec::Vec<::std::string::String> =
                ::std::vec![#(#renders),*];
            #private::run(#registry, #lock_key, #options, #body)
        }
    };
    let body = match (body, leader) {
        (Body::Async(block), Some(bindings)) => {
            // Each term runs the body afresh, on clones of the arguments.
            let clones = bindings.iter().map(|binding| {
                quote_spanned! {binding.span()=>
                    #[allow(unused_mut, unused_variables)]
                    let mut #binding = ::core::clone::Clone::clone(&#binding);
                }
            });
            let ttl = match options_ttl {
                Some(ttl) => {
                    let ttl = Literal::u64_unsuffixed(ttl);
                    quote!(::core::option::Option::Some(#private::Duration::from_millis(#ttl)))
                }
                None => quote!(::core::option::Option::None),
            };
            let render = &renders[0];
            quote! {
                let #lock_key: ::std::string::String = #render;
                #private::lead(#registry, #lock_key, #ttl, move || {
                    #(#clones)*
                    async move #block
                })
                .await
            }
        }
        (Body::Async(block), None) => {
            let run = locked(quote!(async move #block));
            quote!(#run.await)
        }
        // async-trait: the key is rendered inside its future, where the body's names live.
        (
            Body::Boxed {
                leading,
                box_pin,
                future,
                inner: Some(inner),
            },
            _,
        ) => {
            let run = locked(async_block(*inner));
            let future = boxed::fill_hole(future.into_token_stream(), &quote!({ #run.await }));
            quote! {
                #(#leading)*
                #box_pin(#future)
            }
        }
        (
            Body::Boxed {
                leading,
                box_pin,
                future,
                inner: None,
            },
            _,
        ) => {
            let run = locked(future.into_token_stream());
            quote! {
                #(#leading)*
                #box_pin({ #run })
            }
        }
    };

    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #assertion
            #body
        }
    }
}

/// `async move { .. }` around a body expression, quoting a plain block as is.
fn async_block(body: Expr) -> TokenStream {
    match body {
        Expr::Block(block) if block.attrs.is_empty() && block.label.is_none() => {
            quote!(async move #block)
        }
        other => quote!(async move { #other }),
    }
}

/// `{ let mut b = KeyBuilder::new(n); b.literal(".."); b.value(&param.field); b.finish() }`
fn render_key(private: &TokenStream, key: &Key) -> TokenStream {
    let builder = Ident::new("key_builder", Span::mixed_site());
    let mut capacity = 0;
    let steps: Vec<TokenStream> = key
        .parts
        .iter()
        .map(|part| match part {
            KeyPart::Literal(text) => {
                capacity += text.len();
                quote!(#builder.literal(#text);)
            }
            KeyPart::Value { root, fields } => {
                capacity += 16;
                // Located at the key literal: a field that does not exist or a value that is
                // not `Display` is reported on the key, not somewhere in the expansion.
                quote_spanned!(key.span=> #builder.value(&#root #(.#fields)*);)
            }
        })
        .collect();
    let capacity = Literal::usize_unsuffixed(capacity);
    quote! {{
        let mut #builder = #private::KeyBuilder::new(#capacity);
        #(#steps)*
        #builder.finish()
    }}
}

/// `LockOptions::new().ttl(..)...` with the options that were given, in the docs' order.
fn options_chain(private: &TokenStream, options: &Options) -> TokenStream {
    let millis = |value: u64| {
        let value = Literal::u64_unsuffixed(value);
        quote!(#private::Duration::from_millis(#value))
    };
    let mut chain = quote!(#private::LockOptions::new());
    if let Some(ttl) = options.ttl {
        let ttl = millis(ttl);
        chain.extend(quote!(.ttl(#ttl)));
    }
    if let Some(wait) = options.wait {
        let wait = millis(wait);
        chain.extend(quote!(.wait(#wait)));
    }
    if let Some(renew) = options.renew {
        chain.extend(quote!(.renew(#renew)));
    }
    if let Some(on_lost) = options.on_lost {
        let variant = match on_lost {
            OnLost::Cancel => quote!(Cancel),
            OnLost::Continue => quote!(Continue),
        };
        chain.extend(quote!(.on_lost(#private::OnLost::#variant)));
    }
    if let Some(min_hold) = options.min_hold {
        let min_hold = millis(min_hold);
        chain.extend(quote!(.min_hold(#min_hold)));
    }
    if let Some(max_hold) = options.max_hold {
        let max_hold = millis(max_hold);
        chain.extend(quote!(.max_hold(#max_hold)));
    }
    if let Some(fencing) = options.fencing {
        chain.extend(quote!(.fencing(#fencing)));
    }
    if let Some(Mode::Read) = options.mode {
        chain.extend(quote!(.mode(#private::Mode::Read)));
    }
    if let Some(permits) = options.permits {
        chain.extend(quote!(.permits(#permits)));
    }
    chain.into_token_stream()
}

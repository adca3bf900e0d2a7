//! Key templates: `"deploy:<id>"`, `"{tenant:<t>}:job"`, `"user:<req.user.id>"`.
//!
//! Syntax only: which names exist is checked against the signature in `validate.rs`.
//!
//! - `<path>` interpolates a parameter (`<id>`), a field path (`<req.user.id>`, `<pair.0>`)
//!   or a field of the receiver (`<self.tenant>`);
//! - `<<` is a literal `<`; every other character, braces included, is literal text, so
//!   Redis Cluster hash tags (`{tenant:<t>}`) need no escaping.
//!
//! Interpolated values are percent-escaped by the runtime so they never contain `:`, `/`,
//! `{` or `}`. Rendering is therefore injective as long as every two placeholders are
//! separated by literal text containing one of those characters: the first separator after
//! a placeholder then fixes where its value ends. Templates that break this are rejected.

/// Characters that never occur in an escaped value.
const SEPARATORS: &[char] = &[':', '/', '{', '}'];

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Template {
    pub(crate) parts: Vec<Part>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Literal(String),
    Placeholder(Placeholder),
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Placeholder {
    pub(crate) root: Root,
    pub(crate) fields: Vec<Field>,
    /// As written, e.g. `<req.user.id>`, for error messages.
    pub(crate) source: String,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Root {
    SelfValue,
    /// A parameter name, without any `r#` prefix.
    Param(String),
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Field {
    /// A named field, without any `r#` prefix.
    Named(String),
    Index(u32),
}

/// Parses a template; the errors are messages for the key literal, all of them.
pub(crate) fn parse(text: &str) -> Result<Template, Vec<String>> {
    let mut errors = Vec::new();
    if text.is_empty() {
        errors.push("the key is empty; write a template such as \"job:<id>\"".to_owned());
        return Err(errors);
    }
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('<') {
        literal.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        if let Some(after_escape) = after.strip_prefix('<') {
            literal.push('<');
            rest = after_escape;
            continue;
        }
        let Some(close) = after.find('>') else {
            errors.push(format!(
                "unclosed `<` in `<{after}`; close the placeholder with `>`, or write `<<` for a literal `<`"
            ));
            rest = "";
            break;
        };
        let inner = &after[..close];
        rest = &after[close + 1..];
        if !literal.is_empty() {
            parts.push(Part::Literal(std::mem::take(&mut literal)));
        }
        match placeholder(inner) {
            Ok(placeholder) => parts.push(Part::Placeholder(placeholder)),
            Err(message) => errors.push(message),
        }
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        parts.push(Part::Literal(literal));
    }
    check_separated(&parts, &mut errors);
    if errors.is_empty() {
        Ok(Template { parts })
    } else {
        Err(errors)
    }
}

fn placeholder(inner: &str) -> Result<Placeholder, String> {
    let source = format!("<{inner}>");
    if inner.is_empty() {
        return Err(
            "empty placeholder `<>`; name a parameter, e.g. `<id>`, or write `<<>` for a literal `<>`"
                .to_owned(),
        );
    }
    if inner.contains('<') {
        return Err(format!(
            "`<` inside the placeholder `{source}`; write `<<` for a literal `<` before it"
        ));
    }
    let mut segments = inner.split('.');
    let first = segments.next().unwrap_or_default();
    let root = if first == "self" {
        Root::SelfValue
    } else {
        Root::Param(identifier(first).ok_or_else(|| invalid(&source, first))?)
    };
    let mut fields = Vec::new();
    for segment in segments {
        let field = if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            segment
                .parse()
                .map(Field::Index)
                .map_err(|_| invalid(&source, segment))?
        } else {
            Field::Named(identifier(segment).ok_or_else(|| invalid(&source, segment))?)
        };
        fields.push(field);
    }
    Ok(Placeholder {
        root,
        fields,
        source,
    })
}

fn invalid(source: &str, segment: &str) -> String {
    if segment.is_empty() {
        return format!(
            "invalid placeholder `{source}`: empty name around a `.`; write a path such as `<req.user.id>`"
        );
    }
    format!(
        "invalid placeholder `{source}`: `{segment}` is not a parameter or field name; \
         write a path such as `<id>`, `<req.user.id>`, `<pair.0>` or `<self.tenant>`"
    )
}

/// A Rust identifier (raw ones allowed), returned without its `r#` prefix.
fn identifier(segment: &str) -> Option<String> {
    let (raw, name) = match segment.strip_prefix("r#") {
        Some(name) => (true, name),
        None => (false, segment),
    };
    let mut chars = name.chars();
    let first = chars.next()?;
    let valid = (first == '_' || first.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && name != "_";
    if !valid {
        return None;
    }
    // Keywords are only names when written raw (`<r#type>`).
    if !raw && syn::parse_str::<syn::Ident>(name).is_err() {
        return None;
    }
    Some(name.to_owned())
}

fn check_separated(parts: &[Part], errors: &mut Vec<String>) {
    let mut previous: Option<&Placeholder> = None;
    let mut separated = true;
    for part in parts {
        match part {
            Part::Literal(text) => separated |= text.contains(SEPARATORS),
            Part::Placeholder(placeholder) => {
                if let Some(previous) = previous.filter(|_| !separated) {
                    errors.push(format!(
                        "`{}` and `{}` are not separated by `:`, `/`, `{{` or `}}`, so different \
                         arguments could render the same key (\"1\",\"23\" and \"12\",\"3\"); \
                         put a separator between them, e.g. `{}:{}`",
                        previous.source, placeholder.source, previous.source, placeholder.source
                    ));
                }
                previous = Some(placeholder);
                separated = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(name: &str, fields: Vec<Field>) -> Part {
        let mut source = format!("<{name}");
        for field in &fields {
            match field {
                Field::Named(name) => source.push_str(&format!(".{name}")),
                Field::Index(index) => source.push_str(&format!(".{index}")),
            }
        }
        source.push('>');
        Part::Placeholder(Placeholder {
            root: Root::Param(name.to_owned()),
            fields,
            source,
        })
    }

    fn literal(text: &str) -> Part {
        Part::Literal(text.to_owned())
    }

    #[test]
    fn literals_and_placeholders_alternate() {
        let template = parse("deploy:<id>:<env>").unwrap();
        assert_eq!(
            template.parts,
            vec![
                literal("deploy:"),
                param("id", vec![]),
                literal(":"),
                param("env", vec![])
            ]
        );
    }

    #[test]
    fn field_paths_and_tuple_indices() {
        let template = parse("u:<req.user.id>/<pair.0>").unwrap();
        assert_eq!(
            template.parts,
            vec![
                literal("u:"),
                param(
                    "req",
                    vec![Field::Named("user".into()), Field::Named("id".into())]
                ),
                literal("/"),
                param("pair", vec![Field::Index(0)]),
            ]
        );
    }

    #[test]
    fn self_fields_and_raw_identifiers() {
        let template = parse("<self.tenant>:<r#type>").unwrap();
        let Part::Placeholder(first) = &template.parts[0] else {
            panic!("expected a placeholder");
        };
        assert_eq!(first.root, Root::SelfValue);
        assert_eq!(first.fields, vec![Field::Named("tenant".into())]);
        assert_eq!(template.parts[2], {
            let Part::Placeholder(mut p) = param("type", vec![]) else {
                unreachable!()
            };
            p.source = "<r#type>".into();
            Part::Placeholder(p)
        });
    }

    #[test]
    fn double_angle_is_a_literal_angle_and_braces_stay_literal() {
        let template = parse("a<<b>:{tenant:<t>}:job").unwrap();
        assert_eq!(
            template.parts,
            vec![
                literal("a<b>:{tenant:"),
                param("t", vec![]),
                literal("}:job")
            ]
        );
        assert_eq!(parse("<<>").unwrap().parts, vec![literal("<>")]);
    }

    #[test]
    fn static_keys_have_no_placeholders() {
        assert_eq!(
            parse("nightly-report").unwrap().parts,
            vec![literal("nightly-report")]
        );
    }

    #[test]
    fn malformed_placeholders_are_all_reported() {
        let errors = parse("<>:<a b>:<x.>:<fn>:<1>:<id").unwrap_err();
        assert_eq!(errors.len(), 6, "{errors:#?}");
        assert!(errors[0].starts_with("empty placeholder `<>`"));
        assert!(errors[1].contains("`a b` is not a parameter or field name"));
        assert!(errors[2].contains("empty name around a `.`"));
        assert!(errors[3].contains("`fn` is not a parameter"));
        assert!(errors[4].contains("`1` is not a parameter"));
        assert!(errors[5].starts_with("unclosed `<` in `<id`"));
    }

    #[test]
    fn nested_angle_is_an_error() {
        let errors = parse("<a<b>").unwrap_err();
        assert!(
            errors[0].starts_with("`<` inside the placeholder `<a<b>`"),
            "{errors:?}"
        );
    }

    #[test]
    fn empty_key_is_an_error() {
        assert!(parse("").unwrap_err()[0].starts_with("the key is empty"));
    }

    #[test]
    fn placeholders_need_a_separator_between_them() {
        for template in ["<a><b>", "<a>-<b>", "<a><<<b>", "x:<a>.<b>:y"] {
            let errors = parse(template).unwrap_err();
            assert_eq!(errors.len(), 1, "{template}");
            assert!(errors[0].contains("are not separated"), "{template}");
        }
        for template in ["<a>:<b>", "<a>/<b>", "{<a>}<b>", "<a>-x:y-<b>", "<a>}{<b>"] {
            assert!(parse(template).is_ok(), "{template}");
        }
    }
}

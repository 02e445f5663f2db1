//! The event's name as fans read it on the waiting page (the room config's optional `name`):
//! one name, or one per language. The page shows the fan's language, then English (its
//! default), then the event's slug; always as text, never as markup.
//!
//! Guarantee: a stored name has passed [`EventName::problems`]: 1 to [`MAX_NAME_CHARS`]
//! characters, not blank, no control characters; at most [`MAX_NAME_LANGUAGES`] languages,
//! each keyed by a language tag of the shape `en`, `ja`, `pt-BR`, `zh-Hant`. It travels in
//! every join answer, so its size is bounded here.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};

/// Longest name, in characters (Unicode scalar values, as JSON Schema counts them).
pub const MAX_NAME_CHARS: usize = 100;
/// Most languages one name is given in.
pub const MAX_NAME_LANGUAGES: usize = 10;
/// A language tag's shape: a 2–3 letter lowercase language, then subtags of 2–8 letters or
/// digits (`pt-BR`, `zh-Hant`, `es-419`).
pub const LANGUAGE_TAG_PATTERN: &str = "^[a-z]{2,3}(-[A-Za-z0-9]{2,8})*$";
/// Not blank, no control characters (C0, DEL, C1).
const TEXT_PATTERN: &str =
    "^[^\\x00-\\x1F\\x7F-\\x9F]*[^\\s\\x00-\\x1F\\x7F-\\x9F][^\\x00-\\x1F\\x7F-\\x9F]*$";

/// `"Stadium Tour"`, or `{"en": "Stadium Tour", "ja": "スタジアムツアー"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EventName {
    /// The same name in every language.
    One(String),
    /// By language tag.
    PerLanguage(BTreeMap<String, String>),
}

impl EventName {
    /// Every problem with this name, as `422` text (empty when it is valid).
    pub fn problems(&self) -> Vec<String> {
        match self {
            EventName::One(text) => text_problem(text).into_iter().collect(),
            EventName::PerLanguage(by_lang) => {
                let mut out = Vec::new();
                if by_lang.is_empty() || by_lang.len() > MAX_NAME_LANGUAGES {
                    out.push(format!(
                        "must name the event in 1 to {MAX_NAME_LANGUAGES} languages"
                    ));
                }
                for (lang, text) in by_lang {
                    if !is_language_tag(lang) {
                        out.push(format!(
                            "{lang:?} is not a language tag (like \"en\", \"ja\", \"pt-BR\")"
                        ));
                    }
                    if let Some(p) = text_problem(text) {
                        out.push(format!("{lang}: {p}"));
                    }
                }
                out
            }
        }
    }
}

fn text_problem(text: &str) -> Option<String> {
    let chars = text.chars().count();
    if text.trim().is_empty() || chars > MAX_NAME_CHARS {
        return Some(format!(
            "must be 1 to {MAX_NAME_CHARS} characters, not blank"
        ));
    }
    text.chars()
        .any(char::is_control)
        .then(|| "must not contain control characters".to_owned())
}

/// [`LANGUAGE_TAG_PATTERN`], without a regex engine.
fn is_language_tag(tag: &str) -> bool {
    let mut parts = tag.split('-');
    let lang = parts.next().unwrap_or("");
    (2..=3).contains(&lang.len())
        && lang.bytes().all(|b| b.is_ascii_lowercase())
        && parts.all(|p| (2..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric()))
}

impl utoipa::PartialSchema for EventName {
    fn schema() -> RefOr<Schema> {
        let text = || {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(MAX_NAME_CHARS))
                .pattern(Some(TEXT_PATTERN))
        };
        OneOfBuilder::new()
            .item(text().description(Some("The same name in every language")))
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .property_names(Some(
                        ObjectBuilder::new()
                            .schema_type(Type::String)
                            .pattern(Some(LANGUAGE_TAG_PATTERN))
                            .build(),
                    ))
                    .additional_properties(Some(text()))
                    .min_properties(Some(1))
                    .max_properties(Some(MAX_NAME_LANGUAGES))
                    .description(Some(
                        "By language tag (`en`, `ja`, `pt-BR`): the waiting page shows the \
                         fan's language, then English, then the event's id",
                    )),
            )
            .description(Some(
                "The event's name on the waiting page, once or per language (shown as text)",
            ))
            .into()
    }
}

impl utoipa::ToSchema for EventName {}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(json: &str) -> EventName {
        serde_json::from_str(json).expect("a name")
    }

    #[test]
    fn one_name_or_one_per_language() {
        assert_eq!(name(r#""Stadium Tour""#).problems(), Vec::<String>::new());
        let both = name(r#"{"en": "Stadium Tour", "ja": "スタジアムツアー", "pt-BR": "Turnê"}"#);
        assert_eq!(both.problems(), Vec::<String>::new());
        // Stored as given, read back the same.
        let text = serde_json::to_string(&both).expect("json");
        assert_eq!(
            serde_json::from_str::<EventName>(&text).expect("back"),
            both
        );
        assert_eq!(
            name(&format!("\"{}\"", "ツ".repeat(MAX_NAME_CHARS))).problems(),
            Vec::<String>::new(),
            "the limit counts characters, not bytes"
        );
    }

    #[test]
    fn bad_names_are_refused_with_the_reason() {
        for bad in [
            r#""""#,
            r#""   ""#,
            r#""tab\there""#,
            r#""line\u0085break""#,
            r#"{}"#,
            r#"{"english": "x"}"#,
            r#"{"EN": "x"}"#,
            r#"{"en-": "x"}"#,
            r#"{"en": ""}"#,
        ] {
            assert!(!name(bad).problems().is_empty(), "{bad} was accepted");
        }
        let long = format!("\"{}\"", "a".repeat(MAX_NAME_CHARS + 1));
        assert!(!name(&long).problems().is_empty());
        let many: BTreeMap<String, String> = (0..=MAX_NAME_LANGUAGES)
            .map(|i| (format!("l{}", char::from(b'a' + i as u8)), "x".into()))
            .collect();
        assert!(!EventName::PerLanguage(many).problems().is_empty());
        assert!(
            serde_json::from_str::<EventName>("42").is_err(),
            "neither a string nor an object"
        );
    }
}

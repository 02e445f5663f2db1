//! Stripe's request encoding: `application/x-www-form-urlencoded` bodies whose nested
//! parameters are spelt with brackets (`metadata[order_id]=o1`, `payment_method_types[0]=card`
//! or `payment_method_types[]=card`), booleans as `true`/`false`, integers in decimal.
//!
//! A handler takes the parameters it knows one by one; [`Form::finish`] then refuses whatever
//! is left (`parameter_unknown`, naming it), as Stripe does, so a misspelt parameter is never
//! silently ignored. Every refusal is a Stripe error object with `param` set.

use crate::api::ApiErr;
use std::collections::BTreeMap;

/// Stripe's metadata limits: 50 keys, keys up to 40 characters, values up to 500.
const MAX_METADATA_KEYS: usize = 50;
const MAX_METADATA_KEY_LEN: usize = 40;
const MAX_METADATA_VALUE_LEN: usize = 500;

#[derive(Debug, Clone, Default)]
pub struct Form {
    pairs: Vec<(String, String)>,
    /// The decoded pairs, sorted: the idempotency fingerprint of the request.
    fingerprint: String,
}

impl Form {
    /// Decodes a body. A JSON body is refused with Stripe's error: Stripe's API reads forms
    /// only, and a client that sends JSON would be talking to something that is not Stripe.
    pub fn parse(content_type: Option<&str>, body: &[u8]) -> Result<Self, ApiErr> {
        let ct = content_type.unwrap_or("").to_ascii_lowercase();
        if ct.starts_with("application/json") {
            return Err(ApiErr::invalid(
                "parameter_invalid",
                None,
                "Request bodies must be form-encoded (application/x-www-form-urlencoded), as \
                 Stripe's API takes them; JSON bodies are not accepted.",
            ));
        }
        if !body.is_empty()
            && !ct.is_empty()
            && !ct.starts_with("application/x-www-form-urlencoded")
        {
            return Err(ApiErr::invalid(
                "parameter_invalid",
                None,
                "Content-Type must be application/x-www-form-urlencoded.",
            ));
        }
        if std::str::from_utf8(body).is_err() {
            return Err(ApiErr::invalid(
                "parameter_invalid",
                None,
                "Request body is not valid UTF-8.",
            ));
        }
        let pairs: Vec<(String, String)> = form_urlencoded::parse(body)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let mut sorted = pairs.clone();
        sorted.sort();
        let fingerprint = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(sorted)
            .finish();
        Ok(Self { pairs, fingerprint })
    }

    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// A scalar parameter (`name=value`), at most once.
    pub fn take(&mut self, name: &str) -> Result<Option<String>, ApiErr> {
        let mut found = None;
        let mut error = None;
        self.pairs.retain(|(k, v)| {
            if k != name {
                return true;
            }
            if found.is_some() {
                error = Some(ApiErr::invalid(
                    "parameter_invalid",
                    Some(name),
                    &format!("Parameter '{name}' was given more than once."),
                ));
            }
            found = Some(v.clone());
            false
        });
        match error {
            Some(e) => Err(e),
            None => Ok(found),
        }
    }

    pub fn take_i64(&mut self, name: &str) -> Result<Option<i64>, ApiErr> {
        match self.take(name)? {
            None => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
                ApiErr::invalid(
                    "parameter_invalid_integer",
                    Some(name),
                    &format!("Invalid integer: {v}"),
                )
            }),
        }
    }

    pub fn take_bool(&mut self, name: &str) -> Result<Option<bool>, ApiErr> {
        match self.take(name)?.as_deref() {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(v) => Err(ApiErr::invalid(
                "parameter_invalid_boolean",
                Some(name),
                &format!("Invalid boolean: {v}"),
            )),
        }
    }

    /// A hash parameter: `name[key]=value` pairs (one level; deeper nesting is unknown).
    pub fn take_map(&mut self, name: &str) -> Result<BTreeMap<String, String>, ApiErr> {
        let prefix = format!("{name}[");
        let mut map = BTreeMap::new();
        let mut error = None;
        self.pairs.retain(|(k, v)| {
            let Some(key) = k.strip_prefix(&prefix).and_then(|r| r.strip_suffix(']')) else {
                return true;
            };
            if key.is_empty() || key.contains('[') || key.contains(']') {
                error.get_or_insert_with(|| {
                    ApiErr::invalid("parameter_invalid", Some(k), &format!("Invalid hash: {k}"))
                });
            } else if map.insert(key.to_owned(), v.clone()).is_some() {
                error.get_or_insert_with(|| {
                    ApiErr::invalid(
                        "parameter_invalid",
                        Some(k),
                        &format!("Parameter '{k}' was given more than once."),
                    )
                });
            }
            false
        });
        match error {
            Some(e) => Err(e),
            None => Ok(map),
        }
    }

    /// `metadata[...]` with Stripe's limits.
    pub fn take_metadata(&mut self) -> Result<BTreeMap<String, String>, ApiErr> {
        let map = self.take_map("metadata")?;
        if map.len() > MAX_METADATA_KEYS {
            return Err(ApiErr::invalid(
                "parameter_invalid",
                Some("metadata"),
                "Metadata can have at most 50 keys.",
            ));
        }
        for (k, v) in &map {
            if k.chars().count() > MAX_METADATA_KEY_LEN
                || v.chars().count() > MAX_METADATA_VALUE_LEN
            {
                return Err(ApiErr::invalid(
                    "parameter_invalid",
                    Some(&format!("metadata[{k}]")),
                    "Metadata keys are at most 40 characters and values at most 500.",
                ));
            }
        }
        Ok(map)
    }

    /// An array parameter: `name[]=v` or `name[0]=v` pairs, in order of appearance.
    pub fn take_list(&mut self, name: &str) -> Vec<String> {
        let prefix = format!("{name}[");
        let mut out = Vec::new();
        self.pairs.retain(|(k, v)| {
            let index = k.strip_prefix(&prefix).and_then(|r| r.strip_suffix(']'));
            match index {
                Some(i) if i.is_empty() || i.bytes().all(|b| b.is_ascii_digit()) => {
                    out.push(v.clone());
                    false
                }
                _ => true,
            }
        });
        out
    }

    /// Refuses the first parameter nobody took.
    pub fn finish(self) -> Result<(), ApiErr> {
        match self.pairs.first() {
            None => Ok(()),
            Some((k, _)) => Err(ApiErr::invalid(
                "parameter_unknown",
                Some(k),
                &format!("Received unknown parameter: {k}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORM: Option<&str> = Some("application/x-www-form-urlencoded");

    #[test]
    fn nested_parameters_and_types() {
        let body = b"amount=1000&currency=jpy&confirm=true&metadata%5Border_id%5D=o1\
                     &metadata[attempt]=2&payment_method_types[0]=card&expand[]=latest_charge";
        let mut f = Form::parse(FORM, body).expect("parses");
        assert_eq!(f.take_i64("amount").expect("int"), Some(1000));
        assert_eq!(f.take("currency").expect("str").as_deref(), Some("jpy"));
        assert_eq!(f.take_bool("confirm").expect("bool"), Some(true));
        let meta = f.take_metadata().expect("metadata");
        assert_eq!(meta.get("order_id").map(String::as_str), Some("o1"));
        assert_eq!(meta.get("attempt").map(String::as_str), Some("2"));
        assert_eq!(f.take_list("payment_method_types"), ["card"]);
        let left = f.finish().expect_err("expand is unknown here");
        assert_eq!(left.body["error"]["code"], "parameter_unknown");
        assert_eq!(left.body["error"]["param"], "expand[]");
    }

    #[test]
    fn bad_input_is_refused_with_the_parameter_named() {
        let json = Form::parse(Some("application/json"), b"{}").expect_err("json refused");
        assert_eq!(json.status.as_u16(), 400);
        let mut f = Form::parse(FORM, b"amount=ten&confirm=yes&a=1&a=2").expect("parses");
        let e = f.take_i64("amount").expect_err("not an integer");
        assert_eq!(e.body["error"]["param"], "amount");
        assert_eq!(e.body["error"]["type"], "invalid_request_error");
        assert!(f.take_bool("confirm").is_err());
        assert!(f.take("a").is_err(), "a scalar given twice");
        let long = format!("metadata[{}]=v", "k".repeat(41));
        let mut f = Form::parse(FORM, long.as_bytes()).expect("parses");
        assert!(f.take_metadata().is_err());
        let mut f = Form::parse(FORM, b"metadata[a][b]=v").expect("parses");
        assert!(f.take_metadata().is_err(), "one level of nesting only");
    }

    #[test]
    fn fingerprint_ignores_pair_order() {
        let a = Form::parse(FORM, b"amount=1&currency=jpy").expect("parses");
        let b = Form::parse(None, b"currency=jpy&amount=1").expect("parses");
        assert_eq!(a.fingerprint(), b.fingerprint());
        let c = Form::parse(FORM, b"currency=jpy&amount=2").expect("parses");
        assert_ne!(a.fingerprint(), c.fingerprint());
    }
}

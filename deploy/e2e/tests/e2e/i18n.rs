//! Every page's strings exist in English and Japanese: the same keys in both dictionaries,
//! no empty text, and every key the page names in its HTML (`data-i18n`,
//! `data-i18n-label`) or as a literal in its script (`t("key"`) is in the dictionary. Pure
//! text checks over `static/` (no browser, no stack): the dictionaries are plain data,
//! `"key": "text",` one per line inside `en: {` / `ja: {`.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn static_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../static"))
}

fn read(rel: &str) -> String {
    let path = static_dir().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The keys of one language's block (`  en: {` … `  }`), with their texts.
fn dictionary(js: &str, lang: &str) -> Vec<(String, String)> {
    let start = js
        .find(&format!("\n  {lang}: {{"))
        .unwrap_or_else(|| panic!("no `{lang}:` block"));
    let block = &js[start..];
    let block = &block[..block.find("\n  }").expect("end of the language block")];
    block
        .lines()
        .skip(1)
        .filter_map(|line| {
            let line = line.trim();
            let rest = line.strip_prefix('"')?;
            let (key, rest) = rest.split_once("\":")?;
            let text = rest.trim().trim_end_matches(',').trim();
            let text = text.strip_prefix('"')?.strip_suffix('"')?;
            Some((key.to_owned(), text.to_owned()))
        })
        .collect()
}

/// Values of `attr="..."` in the HTML.
fn attribute_values(html: &str, attr: &str) -> BTreeSet<String> {
    let needle = format!("{attr}=\"");
    html.split(&needle)
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// Keys passed whole as a literal to the page's `t(` helper: `t("key")` or `t("key", vars)`,
/// not `get("x"`, `s.t("x"` or a prefix completed at run time (`t("status." + s)`).
fn literal_keys(js: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut rest = js;
    while let Some(at) = rest.find("t(\"") {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + 3..];
        if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '$' || c == '.'))
            && let Some((key, tail)) = after.split_once('"')
            && (tail.starts_with(')') || tail.starts_with(','))
        {
            keys.insert(key.to_owned());
        }
        rest = after;
    }
    keys
}

/// Checks one page: `dict` is its strings file, `html` and `js` the files that use them.
fn check_page(dict: &str, html: &str, js: &str) {
    let text = read(dict);
    let en = dictionary(&text, "en");
    let ja = dictionary(&text, "ja");
    assert!(
        en.len() > 20,
        "{dict}: too few English strings parsed ({})",
        en.len()
    );
    let en_keys: BTreeSet<_> = en.iter().map(|(k, _)| k.clone()).collect();
    let ja_keys: BTreeSet<_> = ja.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(
        en_keys.len(),
        en.len(),
        "{dict}: a key appears twice in English"
    );
    assert_eq!(
        ja_keys.len(),
        ja.len(),
        "{dict}: a key appears twice in Japanese"
    );
    let only_en: Vec<_> = en_keys.difference(&ja_keys).collect();
    let only_ja: Vec<_> = ja_keys.difference(&en_keys).collect();
    assert!(only_en.is_empty(), "{dict}: no Japanese for {only_en:?}");
    assert!(only_ja.is_empty(), "{dict}: no English for {only_ja:?}");
    for (lang, strings) in [("en", &en), ("ja", &ja)] {
        for (k, v) in strings.iter() {
            assert!(!v.trim().is_empty(), "{dict}: empty {lang} text for {k}");
        }
    }
    let mut used = attribute_values(&read(html), "data-i18n");
    used.extend(attribute_values(&read(html), "data-i18n-label"));
    used.extend(literal_keys(&read(js)));
    assert!(
        used.len() > 10,
        "{html}/{js}: too few keys found in use ({})",
        used.len()
    );
    let missing: Vec<_> = used.difference(&en_keys).collect();
    assert!(
        missing.is_empty(),
        "{html}/{js} use keys {dict} lacks: {missing:?}"
    );
}

#[test]
fn the_ops_page_has_every_string_in_english_and_japanese() {
    check_page("ops/ops-i18n.js", "ops/ops.html", "ops/ops.js");
    // Texts chosen at run time from a stable code or status have both languages too.
    let text = read("ops/ops-i18n.js");
    let en: BTreeSet<_> = dictionary(&text, "en")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    for code in [
        "UNAUTHORIZED",
        "ACTOR_REQUIRED",
        "ORDER_NOT_REFUNDABLE",
        "UNKNOWN_ORDER_LINES",
        "LINES_ALREADY_REFUNDED",
        "PAYMENT_PROVIDER_ERROR",
        "REFUND_REFUSED",
        "IDEMPOTENCY_IN_FLIGHT",
        "VALIDATION_FAILED",
        "NOT_FOUND",
    ] {
        assert!(en.contains(&format!("err.{code}")), "no text for {code}");
    }
    for status in [
        "PENDING_PAYMENT",
        "PAID",
        "EXPIRED",
        "CANCELLED",
        "REFUNDED",
        "DISPUTED",
    ] {
        assert!(
            en.contains(&format!("status.{status}")),
            "no text for {status}"
        );
    }
}

#[test]
fn the_waiting_page_has_every_string_in_english_and_japanese() {
    check_page("waiting-i18n.js", "waiting.html", "waiting.js");
}

#[test]
fn the_shop_page_has_every_string_in_english_and_japanese() {
    check_page("shop-i18n.js", "shop.html", "shop.js");
}

#[test]
fn the_ticket_page_has_every_string_in_english_and_japanese() {
    check_page("tickets-i18n.js", "tickets.html", "tickets.js");
    // The cards, drawn by tickets-render.js for the ticket page and the shop, name their keys
    // as `tr(lang, "key"`; the void reasons booking sends are looked up as `tk.reason.<reason>`.
    let text = read("tickets-i18n.js");
    let en: BTreeSet<_> = dictionary(&text, "en")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let used: BTreeSet<String> = read("tickets-render.js")
        .split("tr(lang, \"")
        .skip(1)
        .filter_map(|rest| rest.split_once('"'))
        .filter(|(_, tail)| tail.starts_with(')') || tail.starts_with(','))
        .map(|(key, _)| key.to_owned())
        .collect();
    assert!(used.len() >= 8, "too few card keys found: {used:?}");
    let missing: Vec<_> = used.difference(&en).collect();
    assert!(missing.is_empty(), "tickets-render.js uses {missing:?}");
    for reason in ["refunded", "disputed"] {
        assert!(en.contains(&format!("tk.reason.{reason}")), "{reason}");
    }
}

#[test]
fn the_checks_catch_a_missing_translation() {
    let js = "x = {\n  en: {\n    \"a\": \"A\",\n    \"b\": \"B\"\n  },\n  ja: {\n    \"a\": \"エー\"\n  }\n};";
    let en: BTreeSet<_> = dictionary(js, "en").into_iter().map(|(k, _)| k).collect();
    let ja: BTreeSet<_> = dictionary(js, "ja").into_iter().map(|(k, _)| k).collect();
    assert_eq!(en.difference(&ja).collect::<Vec<_>>(), vec!["b"]);
    assert_eq!(
        literal_keys("t(\"a\") + get(\"no\") + s.t(\"no\") + (t(\"b\", 1)) + t(\"pre.\" + x)"),
        BTreeSet::from(["a".to_owned(), "b".to_owned()])
    );
}

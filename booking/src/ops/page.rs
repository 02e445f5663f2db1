//! The ops page (issue 18): `GET /ops/` and its script, strings and styles, on booking's own
//! (internal) listener. The gateway never serves or forwards `/ops` (`gateway::routes`).
//!
//! The files (`static/ops/`) are compiled into the binary, so the page always matches the
//! admin API of the same build, needs no setting or deployed directory, and no request
//! touches the file system (docs/decisions.md "ops page"). Every answer forbids framing
//! and inline script (the page's CSP allows only its own files and same-origin calls,
//! and `form-action 'none'` so no form can ever put the secret into a URL), and is never
//! stored by caches: the page handles an admin secret.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One embedded file.
struct Asset {
    body: &'static [u8],
    content_type: &'static str,
}

const HTML: Asset = Asset {
    body: include_bytes!("../../../static/ops/ops.html"),
    content_type: "text/html; charset=utf-8",
};
const SCRIPT: Asset = Asset {
    body: include_bytes!("../../../static/ops/ops.js"),
    content_type: "text/javascript; charset=utf-8",
};
const STRINGS: Asset = Asset {
    body: include_bytes!("../../../static/ops/ops-i18n.js"),
    content_type: "text/javascript; charset=utf-8",
};
const STYLES: Asset = Asset {
    body: include_bytes!("../../../static/ops/ops.css"),
    content_type: "text/css; charset=utf-8",
};
/// The fans' pages' icon: without one the browser asks for `/favicon.ico` and gets a 404.
const ICON: Asset = Asset {
    body: include_bytes!("../../../static/favicon.svg"),
    content_type: "image/svg+xml",
};

/// Exact paths only; any state (the page needs none).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ops", get(|| async { Redirect::permanent("/ops/") }))
        .route("/ops/", get(|| async { serve(&HTML) }))
        .route("/ops/ops.js", get(|| async { serve(&SCRIPT) }))
        .route("/ops/ops-i18n.js", get(|| async { serve(&STRINGS) }))
        .route("/ops/ops.css", get(|| async { serve(&STYLES) }))
        .route("/ops/favicon.svg", get(|| async { serve(&ICON) }))
}

fn serve(asset: &Asset) -> Response {
    let mut resp = asset.body.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // A few kilobytes on an internal listener: never kept, so a new build shows at once.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page loads only its own files: no inline script or style for the CSP to refuse,
    /// and every file it names is one this router serves.
    #[test]
    fn the_page_has_no_inline_script_and_names_only_served_files() {
        let html = std::str::from_utf8(HTML.body).expect("utf-8 html");
        assert!(!html.contains("<script>"), "inline script in ops.html");
        assert!(!html.contains(" style="), "inline style in ops.html");
        let handler = html.split(" on").skip(1).any(|rest| {
            let name: String = rest.chars().take_while(char::is_ascii_lowercase).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert!(!handler, "inline event handler (on...=) in ops.html");
        for src in [
            "/ops/ops.js",
            "/ops/ops-i18n.js",
            "/ops/ops.css",
            "/ops/favicon.svg",
        ] {
            assert!(html.contains(src), "ops.html does not load {src}");
        }
        let script = std::str::from_utf8(SCRIPT.body).expect("utf-8 script");
        assert!(
            !script.contains("localStorage.") && !script.contains("document.cookie"),
            "ops.js must keep nothing in localStorage or cookies"
        );
        assert!(
            !script.contains("innerHTML"),
            "ops.js must not parse API text as HTML"
        );
    }
}

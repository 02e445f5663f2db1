//! Static files (waiting page, storefront page, ticket page, scripts, styles, translations),
//! loaded into memory at start-up and served by exact path. No file-system access happens per
//! request, so no request path can reach outside `static_dir`.
//!
//! The one per-deployment value a page needs, where to read tickets from (`[gateway]
//! tickets_api_url`), is written into the pages' `<meta name="floodgate-tickets-api">` once
//! at start-up, and the ticket page's Content-Security-Policy allows exactly that origin.

use bytes::Bytes;
use std::collections::HashMap;
use std::path::Path;

pub struct StaticFile {
    pub body: Bytes,
    pub content_type: &'static str,
}

#[derive(Default)]
pub struct Pages {
    files: HashMap<String, StaticFile>,
    tickets_csp: String,
}

/// The pages that read tickets and carry the meta tag to fill.
const TICKETS_API_PAGES: [&str; 2] = ["/tickets.html", "/shop.html"];
/// The meta tag as the files hold it (empty: same origin).
const TICKETS_API_META: &str = r#"<meta name="floodgate-tickets-api" content="">"#;

/// A `[gateway] tickets_api_url` that is not an absolute http(s) URL of an origin.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not an http(s) base URL like https://booking.example (no query, no fragment)")]
pub struct BadTicketsApi(String);

/// The ticket page's policy: its own scripts, styles and worker only; calls to its own origin
/// and the tickets origin; no framing (a framed ticket page could be overlaid to harvest a
/// screenshot of a code), no forms, no base-URI games.
fn tickets_csp(api_origin: &str) -> String {
    let connect = if api_origin.is_empty() {
        "'self'".to_owned()
    } else {
        format!("'self' {api_origin}")
    };
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
         connect-src {connect}; worker-src 'self'; manifest-src 'self'; base-uri 'none'; \
         form-action 'none'; frame-ancestors 'none'"
    )
}

/// The origin (`scheme://host[:port]`) of a tickets base URL, or why it is refused. Paths are
/// allowed (booking behind a prefix); anything that could break out of an HTML attribute or
/// a CSP source expression is not.
fn tickets_origin(url: &str) -> Result<String, BadTicketsApi> {
    let bad = || BadTicketsApi(url.to_owned());
    if url
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || b"\"'<>;,`\\".contains(&b))
    {
        return Err(bad());
    }
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    let scheme = uri.scheme_str().ok_or_else(bad)?;
    if !matches!(scheme, "http" | "https") || url.contains('?') || url.contains('#') {
        return Err(bad());
    }
    let authority = uri.authority().ok_or_else(bad)?;
    if authority.as_str().contains('@') {
        return Err(bad());
    }
    Ok(format!("{scheme}://{authority}"))
}

static DEFAULT_TICKETS_CSP: std::sync::OnceLock<String> = std::sync::OnceLock::new();

const MAX_FILE: u64 = 4 * 1024 * 1024;
const MAX_DEPTH: usize = 3;
/// Top-level folders of `static/` that belong to booking, not to the public listener: the
/// ops page (served by booking itself; `routes::is_booking_only`).
const NOT_PUBLIC: [&str; 1] = ["ops"];

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "webp" => "image/webp",
        "txt" => "text/plain; charset=utf-8",
        "woff2" => "font/woff2",
        _ => "application/octet-stream",
    }
}

impl Pages {
    /// Loads every file under `dir` (a missing directory serves nothing, with a warning).
    pub fn load(dir: &Path) -> Pages {
        let mut pages = Pages::default();
        if !dir.is_dir() {
            tracing::warn!(dir = %dir.display(), "static directory not found; serving no pages");
            return pages;
        }
        pages.walk(dir, dir, 0);
        tracing::info!(files = pages.files.len(), dir = %dir.display(), "static files loaded");
        pages
    }

    fn walk(&mut self, root: &Path, dir: &Path, depth: usize) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            if hidden {
                continue;
            }
            if depth == 0
                && meta.is_dir()
                && NOT_PUBLIC.contains(&entry.file_name().to_string_lossy().as_ref())
            {
                continue;
            }
            if meta.is_dir() && depth < MAX_DEPTH {
                self.walk(root, &path, depth + 1);
            } else if meta.is_file() && meta.len() <= MAX_FILE {
                let Ok(rel) = path.strip_prefix(root) else {
                    continue;
                };
                let key = format!("/{}", rel.to_string_lossy().replace('\\', "/"));
                if let Ok(body) = std::fs::read(&path) {
                    self.files.insert(
                        key,
                        StaticFile {
                            body: Bytes::from(body),
                            content_type: content_type(&path),
                        },
                    );
                }
            }
        }
    }

    pub fn get(&self, path: &str) -> Option<&StaticFile> {
        self.files.get(path)
    }

    /// Writes the tickets base URL into the pages that read tickets, and sets the ticket
    /// page's CSP to allow its origin. Called once at start-up; a bad URL stops the start.
    pub fn set_tickets_api(&mut self, url: &str) -> Result<(), BadTicketsApi> {
        let url = url.trim_end_matches('/');
        let origin = if url.is_empty() {
            String::new()
        } else {
            tickets_origin(url)?
        };
        self.tickets_csp = tickets_csp(&origin);
        let meta = format!(r#"<meta name="floodgate-tickets-api" content="{url}">"#);
        for key in TICKETS_API_PAGES {
            if let Some(file) = self.files.get_mut(key) {
                let html = String::from_utf8_lossy(&file.body);
                if html.contains(TICKETS_API_META) {
                    file.body = Bytes::from(html.replacen(TICKETS_API_META, &meta, 1));
                } else {
                    tracing::warn!(page = key, "page has no floodgate-tickets-api meta tag");
                }
            }
        }
        Ok(())
    }

    /// The ticket page's Content-Security-Policy.
    pub fn tickets_csp(&self) -> &str {
        if self.tickets_csp.is_empty() {
            // Not configured (tests building `Pages` by hand): same origin only.
            return DEFAULT_TICKETS_CSP.get_or_init(|| tickets_csp(""));
        }
        &self.tickets_csp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_pages() -> Pages {
        Pages::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../static"))
    }

    fn body(pages: &Pages, key: &str) -> String {
        String::from_utf8_lossy(&pages.get(key).expect(key).body).into_owned()
    }

    #[test]
    fn the_tickets_api_url_goes_into_both_pages_and_the_csp_allows_its_origin_only() {
        let mut pages = repo_pages();
        pages
            .set_tickets_api("http://127.0.0.1:8090/")
            .expect("a valid URL");
        for key in TICKETS_API_PAGES {
            assert!(
                body(&pages, key).contains(
                    r#"<meta name="floodgate-tickets-api" content="http://127.0.0.1:8090">"#
                ),
                "{key}"
            );
        }
        let csp = pages.tickets_csp();
        assert!(
            csp.contains("connect-src 'self' http://127.0.0.1:8090;"),
            "{csp}"
        );
        assert!(
            csp.starts_with("default-src 'none'; script-src 'self';"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");

        let mut pages = repo_pages();
        pages
            .set_tickets_api("https://tickets.example/booking")
            .expect("a prefix is allowed");
        assert!(
            body(&pages, "/tickets.html").contains(r#"content="https://tickets.example/booking""#)
        );
        assert!(
            pages
                .tickets_csp()
                .contains("connect-src 'self' https://tickets.example;")
        );

        let mut pages = repo_pages();
        pages.set_tickets_api("").expect("empty is same origin");
        assert!(body(&pages, "/tickets.html").contains(TICKETS_API_META));
        assert!(pages.tickets_csp().contains("connect-src 'self';"));
    }

    #[test]
    fn a_tickets_api_url_that_could_break_out_is_refused() {
        for bad in [
            "booking.example",
            "ftp://booking.example",
            "javascript:alert(1)",
            "https://booking.example/\"><script>",
            "https://booking.example; script-src *",
            "https://a b.example",
            "https://user@booking.example",
            "https://booking.example/?x=1",
            "//booking.example",
        ] {
            assert!(repo_pages().set_tickets_api(bad).is_err(), "{bad}");
        }
    }

    /// The repository's `static/`: the fans' pages load, the ops page's files do not.
    #[test]
    fn the_ops_page_is_not_loaded_for_the_public_listener() {
        let pages = Pages::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../static"));
        assert!(pages.get("/waiting.html").is_some());
        assert!(pages.get("/shop.js").is_some());
        assert!(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../static/ops/ops.html")
                .is_file()
        );
        assert!(
            pages.files.keys().all(|k| !k.starts_with("/ops/")),
            "{:?}",
            pages.files.keys()
        );
    }
}

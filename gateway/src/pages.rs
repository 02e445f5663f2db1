//! Static files (waiting page, storefront page, scripts, styles, translations), loaded into
//! memory at start-up and served by exact path. No file-system access happens per request,
//! so no request path can reach outside `static_dir`.

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
}

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
}

#[cfg(test)]
mod tests {
    use super::*;

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

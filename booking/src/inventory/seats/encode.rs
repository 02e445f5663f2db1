//! Pure helpers of the seat map's wire forms: the 2-bit availability packing, the encoded
//! body with its content-derived `ETag` and its gzip twin (compressed once per build, never
//! per request), and the `If-None-Match` / `Accept-Encoding` checks. Unit-tested below.

use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine;
use bytes::Bytes;
use std::io::Write;

/// A seat's status as the map shows it (the 2-bit code of the compact availability).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Shown {
    Available = 0,
    Held = 1,
    /// Sold, or held back after a refund: to a fan it is simply not for sale.
    Sold = 2,
}

impl Shown {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Shown::Available => "available",
            Shown::Held => "held",
            Shown::Sold => "sold",
        }
    }
}

/// Packs statuses 2 bits each, four seats per byte, seat `i` in bits `2*(i%4)..2*(i%4)+2` of
/// byte `i/4` (the first seat in the lowest bits), then base64 (standard alphabet, padded).
pub(crate) fn pack_statuses(statuses: &[Shown]) -> String {
    let mut bytes = vec![0u8; statuses.len().div_ceil(4)];
    for (i, s) in statuses.iter().enumerate() {
        bytes[i / 4] |= (*s as u8) << ((i % 4) * 2);
    }
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A rendered body with its `ETag` and, when worth it, its gzip form.
pub(crate) struct Encoded {
    pub body: Bytes,
    pub gzip: Option<Bytes>,
    pub etag: HeaderValue,
}

/// Bodies smaller than this are sent as they are (gzip would save next to nothing).
const GZIP_FROM: usize = 1024;

impl Encoded {
    /// `tag` is the opaque `ETag` content (without quotes): letters, digits and `-` only.
    pub(crate) fn new(body: Vec<u8>, tag: &str) -> Self {
        let gzip = if body.len() >= GZIP_FROM {
            gzip(&body)
        } else {
            None
        };
        let etag = HeaderValue::from_str(&format!("\"{tag}\""))
            .unwrap_or(HeaderValue::from_static("\"invalid\""));
        Self {
            body: Bytes::from(body),
            gzip,
            etag,
        }
    }
}

/// A short content hash (hex), used as the opaque part of `ETag`s: equal bodies get equal tags
/// in every process, so a fan moving between booking instances still gets `304`s.
pub(crate) fn content_tag(prefix: &str, body: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, body);
    format!("{prefix}{}", hex::encode(&digest.as_ref()[..12]))
}

/// gzip at the fastest level: built once per change, the size matters more than the last
/// few percent. `None` if compression failed (the plain body is served instead).
pub(crate) fn gzip(body: &[u8]) -> Option<Bytes> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    enc.write_all(body).ok()?;
    enc.finish().ok().map(Bytes::from)
}

/// True when `If-None-Match` names `etag` (weak or strong) or is `*`.
pub(crate) fn not_modified(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Ok(ours) = etag.to_str() else {
        return false;
    };
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == ours)
}

/// True when `Accept-Encoding` accepts gzip (`gzip` or `*`, with a non-zero `q`).
pub(crate) fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let accepted = name.eq_ignore_ascii_case("gzip") || name == "*";
            let zero_q = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            accepted && !zero_q
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: header::HeaderName, v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn statuses_pack_two_bits_each_first_seat_lowest() {
        use Shown::*;
        let packed = pack_statuses(&[Available, Held, Sold, Available, Sold]);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(packed)
            .unwrap();
        // 0 | 1<<2 | 2<<4 | 0<<6 = 0b0010_0100; then seat 4 = 2 in the next byte.
        assert_eq!(bytes, vec![0b0010_0100, 0b0000_0010]);
        assert_eq!(pack_statuses(&[]), "");
        // The worked example in docs/api.md ("Compact seat map").
        assert_eq!(
            pack_statuses(&[Available, Held, Available, Sold, Available]),
            "hAA="
        );
    }

    #[test]
    fn sixty_thousand_seats_are_twenty_thousand_base64_characters() {
        assert_eq!(pack_statuses(&vec![Shown::Held; 60_000]).len(), 20_000);
    }

    #[test]
    fn if_none_match_accepts_lists_weak_tags_and_star() {
        let ours = HeaderValue::from_static("\"a-1\"");
        assert!(not_modified(
            &headers(header::IF_NONE_MATCH, "\"x\", W/\"a-1\""),
            &ours
        ));
        assert!(not_modified(&headers(header::IF_NONE_MATCH, "*"), &ours));
        assert!(!not_modified(
            &headers(header::IF_NONE_MATCH, "\"a-2\""),
            &ours
        ));
        assert!(!not_modified(&HeaderMap::new(), &ours));
    }

    #[test]
    fn gzip_is_used_only_when_accepted() {
        assert!(accepts_gzip(&headers(header::ACCEPT_ENCODING, "br, gzip")));
        assert!(accepts_gzip(&headers(
            header::ACCEPT_ENCODING,
            "GZIP;q=0.5"
        )));
        assert!(accepts_gzip(&headers(header::ACCEPT_ENCODING, "*")));
        assert!(!accepts_gzip(&headers(header::ACCEPT_ENCODING, "gzip;q=0")));
        assert!(!accepts_gzip(&headers(header::ACCEPT_ENCODING, "br")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn a_large_body_gets_a_gzip_twin_and_a_stable_tag() {
        let body = vec![b'a'; 10_000];
        let e = Encoded::new(body.clone(), &content_tag("v-", &body));
        assert!(e.gzip.as_ref().unwrap().len() < 200);
        assert_eq!(
            e.etag,
            Encoded::new(body.clone(), &content_tag("v-", &body)).etag
        );
        assert!(Encoded::new(b"{}".to_vec(), "t").gzip.is_none());
    }
}

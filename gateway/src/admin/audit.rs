//! `GET /admin/events/{event}/audit`: the config audit log, newest first, paged.

use super::AdminApp;
use crate::queue::unavailable;
use crate::respond::Reply;
use pingora_proxy::Session;
use serde_json::json;
use shared::error::codes;

/// Entries per page unless `limit` says otherwise, and the most `limit` may ask for.
const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 500;

/// `limit` and `before` from the query string; a bad value is a `422` naming it.
fn page(query: Option<&str>) -> Result<(usize, Option<String>), Reply> {
    let mut limit = DEFAULT_LIMIT;
    let mut before = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "limit" => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => limit = n,
                _ => {
                    return Err(Reply::error(
                        422,
                        codes::VALIDATION_FAILED,
                        &format!("limit must be between 1 and {MAX_LIMIT}"),
                    ));
                }
            },
            "before" if is_stream_id(v) => before = Some(v.to_owned()),
            "before" => {
                return Err(Reply::error(
                    422,
                    codes::VALIDATION_FAILED,
                    "before must be an entry id from an earlier page (`next_before`)",
                ));
            }
            _ => {
                return Err(Reply::error(
                    422,
                    codes::VALIDATION_FAILED,
                    "unknown query parameter (limit, before)",
                ));
            }
        }
    }
    Ok((limit, before))
}

/// A Redis stream id: `ms-seq`, each part a u64 (Redis refuses larger ones: a `503` before).
fn is_stream_id(s: &str) -> bool {
    s.split_once('-').is_some_and(|(a, b)| {
        [a, b]
            .iter()
            .all(|p| p.bytes().all(|c| c.is_ascii_digit()) && p.parse::<u64>().is_ok())
    })
}

impl AdminApp {
    pub(super) async fn audit(&self, session: &Session, event: &str) -> Reply {
        let (limit, before) = match page(session.req_header().uri.query()) {
            Ok(p) => p,
            Err(r) => return r,
        };
        match self.store.load_event(event).await {
            Err(e) => return unavailable(&self.shared, &e),
            Ok(None) => return Reply::error(404, codes::UNKNOWN_EVENT, "no config for this event"),
            Ok(Some(_)) => {}
        }
        match self.store.audit(event, before.as_deref(), limit).await {
            Err(e) => unavailable(&self.shared, &e),
            Ok(entries) => {
                let next = (entries.len() == limit)
                    .then(|| entries.last().map(|e| e.id.clone()))
                    .flatten();
                Reply::json(
                    200,
                    &json!({"event": event, "entries": entries, "next_before": next}),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paging_parameters() {
        assert_eq!(page(None).unwrap(), (DEFAULT_LIMIT, None));
        assert_eq!(
            page(Some("limit=2&before=1700000000000-3")).unwrap(),
            (2, Some("1700000000000-3".into()))
        );
        for bad in [
            "limit=0",
            "limit=501",
            "limit=x",
            "before=+",
            "before=1-",
            "before=18446744073709551616-0",
            "x=1",
        ] {
            assert!(page(Some(bad)).is_err(), "{bad}");
        }
    }
}

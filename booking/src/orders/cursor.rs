//! The opaque keyset cursor of order lists (a fan's `GET /api/orders`, ops'
//! `GET /admin/orders`): the last order of a page, as (created_at, id). Lists run newest first
//! on `ORDER BY created_at DESC, id DESC`, and the next page is every order strictly before
//! the cursor, so a page never repeats or skips an order however many are created meanwhile.
//! Opaque (URL-safe base64) so clients do not build them; a cursor that does not decode is a
//! `422`, never a silent first page.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};

/// Longest cursor accepted (an order id is at most 64 characters).
const MAX_CURSOR: usize = 200;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderCursor {
    pub created_at: DateTime<Utc>,
    pub id: String,
}

impl OrderCursor {
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!(
            "o1.{}.{}",
            self.created_at.timestamp_micros(),
            self.id
        ))
    }

    /// `None` for anything [`OrderCursor::encode`] did not produce.
    pub fn decode(raw: &str) -> Option<Self> {
        if raw.is_empty() || raw.len() > MAX_CURSOR {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(raw).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let rest = text.strip_prefix("o1.")?;
        let (micros, id) = rest.split_once('.')?;
        let created_at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
        (!id.is_empty() && id.len() <= 64).then(|| OrderCursor {
            created_at,
            id: id.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_garbage_is_refused() {
        let c = OrderCursor {
            created_at: DateTime::from_timestamp_micros(1_764_000_000_123_456).expect("time"),
            id: "ord.with.dots".into(),
        };
        assert_eq!(OrderCursor::decode(&c.encode()), Some(c));
        for bad in ["", "!!!", "bzEu", "o1.x.y", &"A".repeat(201)] {
            assert_eq!(OrderCursor::decode(bad), None, "{bad}");
        }
        let no_id = URL_SAFE_NO_PAD.encode("o1.12.");
        assert_eq!(OrderCursor::decode(&no_id), None);
    }
}

/// Default and largest page of an order list.
pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 200;

/// The page size asked for: `1..=200`, 50 when not given.
pub fn page_limit(asked: Option<i64>) -> Result<i64, String> {
    match asked {
        None => Ok(DEFAULT_LIMIT),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        Some(n) => Err(format!("limit must be between 1 and {MAX_LIMIT}, not {n}")),
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn limits_are_bounded() {
        assert_eq!(page_limit(None), Ok(50));
        assert_eq!(page_limit(Some(1)), Ok(1));
        assert_eq!(page_limit(Some(200)), Ok(200));
        assert!(page_limit(Some(0)).is_err());
        assert!(page_limit(Some(-3)).is_err());
        assert!(page_limit(Some(201)).is_err());
    }
}

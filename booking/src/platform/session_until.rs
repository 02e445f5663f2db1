//! The `x-floodgate-session-until` answer of a checkout write, when the write's own statement
//! already read it (`app/session.rs` explains the header; it queries Postgres itself only
//! for writes that do not set it).

use axum::http::HeaderValue;
use axum::response::{IntoResponseParts, ResponseParts};
use shared::headers::SESSION_UNTIL;
use std::convert::Infallible;

/// The latest end (unix ms, rounded up) of the caller's live holds and `PENDING_PAYMENT` orders
/// in the admission's event, 0 when none is left; `None` leaves it to the middleware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionUntil(pub Option<i64>);

impl IntoResponseParts for SessionUntil {
    type Error = Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Infallible> {
        if let Some(ms) = self.0 {
            res.headers_mut()
                .insert(SESSION_UNTIL, HeaderValue::from(ms));
        }
        Ok(res)
    }
}

/// The SQL of that answer as one scalar (`bigint`, never NULL), for the statement that made
/// the write: `$account` and `$event` are the statement's parameters (for example `$2`, `$1`),
/// `$new` the end of a hold or order the statement itself wrote (its snapshot does not show
/// it; `NULL` when none), `$skip_hold` a hold the statement ended (its snapshot still shows it
/// active; `NULL` when none). Holds and orders that other transactions commit after the
/// statement began are not seen; the same fan's concurrent writes each answer their own view.
#[macro_export]
macro_rules! live_until_ms_sql {
    ($account:literal, $event:literal, $new:literal, $skip_hold:literal) => {
        $crate::live_until_ms_sql!($account, $event, $new, $skip_hold, "NULL")
    };
    // `$skip_order`: an order the statement paid (its snapshot still shows it pending).
    ($account:literal, $event:literal, $new:literal, $skip_hold:literal, $skip_order:literal) => {
        concat!(
            "COALESCE(ceil(extract(epoch FROM GREATEST(",
            $new,
            // The fan's rows are found by account (`holds_account`, `orders_account`); the
            // live ones are picked by `FILTER`, which also keeps the planner from answering
            // `max` by walking the expiry index backwards through every other fan's row (what
            // it chose with a launch's stale statistics: 3,000 rows read per fan in the test
            // `session::the_session_end_reads_only_the_fans_own_rows`).
            ", (SELECT max(expires_at) FILTER (WHERE status = 'active' AND expires_at > clock_timestamp()",
            " AND id IS DISTINCT FROM ",
            $skip_hold,
            ") FROM holds WHERE account_id = ",
            $account,
            " AND event_id = ",
            $event,
            "), (SELECT max(expires_at) FILTER (WHERE status = 'PENDING_PAYMENT'",
            " AND expires_at > clock_timestamp() AND id IS DISTINCT FROM ",
            $skip_order,
            ") FROM orders WHERE account_id = ",
            $account,
            " AND (event_id = ",
            $event,
            " OR event_id IS NULL)",
            "))) * 1000)::bigint, 0)"
        )
    };
}

/// The latest end (unix ms, rounded up) of `account`'s live holds and `PENDING_PAYMENT`
/// orders in `event`; 0 when there is none. Cart orders made before orders carried an event
/// count for every event.
pub async fn live_until_ms(
    pool: &sqlx::PgPool,
    account: &str,
    event: &str,
) -> Result<i64, sqlx::Error> {
    let ms: Option<i64> = sqlx::query_scalar(
        "SELECT ceil(extract(epoch FROM GREATEST(
             (SELECT max(expires_at) FROM holds
               WHERE account_id = $1 AND event_id = $2 AND status = 'active'
                 AND expires_at > now()),
             (SELECT max(expires_at) FROM orders
               WHERE account_id = $1 AND (event_id = $2 OR event_id IS NULL)
                 AND status = 'PENDING_PAYMENT' AND expires_at > now())
         )) * 1000)::bigint",
    )
    .bind(account)
    .bind(event)
    .fetch_one(pool)
    .await?;
    Ok(ms.unwrap_or(0))
}

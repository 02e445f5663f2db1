//! SQL on the `auctions` and `bids` tables (the cold bid statement lives with the bid
//! decision in [`super::bids`], the closer's statements in [`super::closer`]). Every failure
//! names its statement.

use super::error::{AuctionError, StatementContext};
use super::model::{AUCTION_COLUMNS, AuctionRow, Meta, NewAuction, Recorded, StreamBid};
use sqlx::{PgConnection, PgPool};

const RECORDED_COLUMNS: &str = "current_price, leader_id, bid_count, extensions";

/// Inserts an auction for `seller`, or nothing when the end is not in the future or more
/// than `max_days` away (by the database clock, in the statement itself).
pub async fn insert(
    conn: &mut PgConnection,
    seller: &str,
    new: &NewAuction,
    max_days: i32,
) -> Result<Option<AuctionRow>, AuctionError> {
    let sql = format!(
        "INSERT INTO auctions (id, seller_id, title, start_price, min_increment, current_price, \
                               hot, end_time, max_extensions, event_id)
         SELECT $1, $2, $3, $4, $5, $4, $6, $7, $8, $10
          WHERE $7 > clock_timestamp() AND $7 <= clock_timestamp() + make_interval(days => $9)
         RETURNING {AUCTION_COLUMNS}"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(shared::ids::new_id())
        .bind(seller)
        .bind(&new.title)
        .bind(new.start_price)
        .bind(new.min_increment)
        .bind(new.hot)
        .bind(new.end_time)
        .bind(new.max_extensions)
        .bind(max_days)
        .bind(&new.event)
        .fetch_optional(conn)
        .await
        .stmt("insert the auction")
}

/// One auction row.
pub async fn load(pool: &PgPool, id: &str) -> Result<Option<AuctionRow>, AuctionError> {
    let sql = format!("SELECT {AUCTION_COLUMNS} FROM auctions WHERE id = $1");
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_optional(pool)
        .await
        .stmt("load the auction")
}

/// An auction's immutable facts.
pub async fn load_meta(pool: &PgPool, id: &str) -> Result<Option<Meta>, AuctionError> {
    let row: Option<(bool, String, Option<String>)> =
        sqlx::query_as("SELECT hot, seller_id, event_id FROM auctions WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await
            .stmt("load the auction's facts")?;
    Ok(row.map(|(hot, seller, event)| Meta { hot, seller, event }))
}

/// What Postgres has recorded of an auction's bidding.
pub async fn load_recorded(pool: &PgPool, id: &str) -> Result<Option<Recorded>, AuctionError> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {RECORDED_COLUMNS} FROM auctions WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(pool)
    .await
    .stmt("load the recorded bidding state")
}

/// Every open hot auction with what Postgres has recorded of it.
pub async fn open_hot(pool: &PgPool) -> Result<Vec<(String, Recorded)>, AuctionError> {
    #[derive(sqlx::FromRow)]
    struct Open {
        id: String,
        #[sqlx(flatten)]
        recorded: Recorded,
    }
    let open: Vec<Open> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, {RECORDED_COLUMNS} FROM auctions WHERE hot AND status = 'OPEN' ORDER BY id"
    )))
    .fetch_all(pool)
    .await
    .stmt("list the open hot auctions")?;
    Ok(open.into_iter().map(|o| (o.id, o.recorded)).collect())
}

/// Writes a batch of one hot auction's accepted bids, in one statement: the bid rows
/// (idempotent: `ON CONFLICT DO NOTHING` on the request id) and the auction row moved forward,
/// never backward. Returns the auction's record after the write (`None`: no such auction).
pub async fn record_hot_bids(
    pool: &PgPool,
    id: &str,
    batch: &[StreamBid],
) -> Result<Option<Recorded>, AuctionError> {
    let Some(top) = batch.iter().max_by_key(|b| b.amount) else {
        return Ok(None);
    };
    sqlx::query_as(
        r#"
WITH b AS (
    SELECT * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::bigint[], $6::timestamptz[],
                         $7::timestamptz[], $8::bool[])
             AS b(id, bidder_id, request_id, amount, placed_at, end_time, extended)
), ins AS (
    INSERT INTO bids (id, auction_id, bidder_id, request_id, amount, placed_at, end_time,
                      extended, path)
    SELECT b.id, $1, b.bidder_id, b.request_id, b.amount, b.placed_at, b.end_time, b.extended,
           'hot'
      FROM b
    ON CONFLICT (auction_id, request_id) DO NOTHING
    RETURNING 1
)
-- A data-modifying CTE runs exactly once whether or not it is referenced.
UPDATE auctions a
   SET current_price = CASE WHEN $9 > a.current_price OR a.leader_id IS NULL THEN $9
                            ELSE a.current_price END,
       leader_id     = CASE WHEN $9 > a.current_price OR a.leader_id IS NULL THEN $10
                            ELSE a.leader_id END,
       end_time      = GREATEST(a.end_time, $11),
       extensions    = GREATEST(a.extensions, $12),
       bid_count     = GREATEST(a.bid_count, $13),
       last_bid_at   = GREATEST(a.last_bid_at, $14)
 WHERE a.id = $1
RETURNING a.current_price, a.leader_id, a.bid_count, a.extensions
"#,
    )
    .bind(id)
    .bind(batch.iter().map(|b| b.bid_id.clone()).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.bidder.clone()).collect::<Vec<_>>())
    .bind(
        batch
            .iter()
            .map(|b| b.request_id.clone())
            .collect::<Vec<_>>(),
    )
    .bind(batch.iter().map(|b| b.amount).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.placed_at).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.end_time).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.extended).collect::<Vec<_>>())
    .bind(top.amount)
    .bind(&top.bidder)
    .bind(
        batch
            .iter()
            .map(|b| b.end_time)
            .max()
            .unwrap_or(top.end_time),
    )
    .bind(batch.iter().map(|b| b.extensions).max().unwrap_or(0))
    .bind(batch.iter().map(|b| b.bids).max().unwrap_or(0))
    .bind(
        batch
            .iter()
            .map(|b| b.placed_at)
            .max()
            .unwrap_or(top.placed_at),
    )
    .fetch_optional(pool)
    .await
    .stmt("record hot bids")
}

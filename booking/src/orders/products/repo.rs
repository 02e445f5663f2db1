//! Products and their stock in Postgres. Every change is one conditional statement on the
//! rows, computed by the database on the locked rows, never read-then-write in Rust (the
//! stock's shard rows: [`super::super::stock`]).

use crate::orders::products::{NewProduct, ProductUpdate, ProductView};
use crate::orders::repo::{During, OrderError};
use crate::orders::stock;
use sqlx::{PgConnection, PgPool};

/// True when booking has event `event`.
pub async fn event_known<'c>(
    conn: impl sqlx::PgExecutor<'c>,
    event: &str,
) -> Result<bool, OrderError> {
    if !shared::ids::is_valid_slug(event) {
        return Ok(false);
    }
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM events WHERE id = $1")
        .bind(event)
        .fetch_optional(conn)
        .await
        .during("look the event up")?;
    Ok(found.is_some())
}

/// Creates the product and its stock row in the caller's transaction (the product's event
/// must exist; a product with this SKU must not).
pub async fn create_tx(conn: &mut PgConnection, p: &NewProduct) -> Result<(), OrderError> {
    // Events are never deleted while a product refers to them (foreign key), so the check
    // cannot go stale before the insert.
    if !event_known(&mut *conn, &p.event).await? {
        return Err(OrderError::UnknownEvent(p.event.clone()));
    }
    let inserted = sqlx::query(
        "INSERT INTO products (sku, name, price, hot, event_id, stock_shards)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (sku) DO NOTHING",
    )
    .bind(&p.sku)
    .bind(p.name.trim())
    .bind(p.price)
    .bind(p.hot)
    .bind(&p.event)
    .bind(p.stock_shards)
    .execute(&mut *conn)
    .await
    .during("insert the product")?
    .rows_affected();
    if inserted == 0 {
        return Err(OrderError::ProductExists(p.sku.clone()));
    }
    stock::create_rows_tx(conn, &p.sku, p.stock, p.stock_shards).await?;
    Ok(())
}

/// Applies an update in the caller's transaction: only the given fields change, each to its
/// absolute value.
pub async fn update_tx(
    conn: &mut PgConnection,
    sku: &str,
    u: &ProductUpdate,
) -> Result<(), OrderError> {
    if let Some(event) = &u.event {
        if !event_known(&mut *conn, event).await? {
            return Err(OrderError::UnknownEvent(event.clone()));
        }
        // Set once: a product moved to another event would let carts and orders of the old
        // event keep buying it.
        let assigned: Option<Option<String>> = sqlx::query_scalar(
            "UPDATE products SET event_id = COALESCE(event_id, $2) WHERE sku = $1
             RETURNING event_id",
        )
        .bind(sku)
        .bind(event)
        .fetch_optional(&mut *conn)
        .await
        .during("assign the product's event")?;
        match assigned {
            None => return Err(OrderError::UnknownSku(sku.to_owned())),
            Some(Some(current)) if current != *event => {
                return Err(OrderError::EventLocked { current });
            }
            Some(_) => {}
        }
    }
    // Catalogue fields: one statement, only the given fields change.
    let found = sqlx::query(
        "UPDATE products
            SET name = COALESCE($2, name), price = COALESCE($3, price),
                hot = COALESCE($4, hot), stock_shards = COALESCE($5, stock_shards),
                updated_at = clock_timestamp()
          WHERE sku = $1",
    )
    .bind(sku)
    .bind(u.name.as_deref().map(str::trim))
    .bind(u.price)
    .bind(u.hot)
    .bind(u.stock_shards)
    .execute(&mut *conn)
    .await
    .during("update the product")?
    .rows_affected();
    if found == 0 {
        return Err(OrderError::UnknownSku(sku.to_owned()));
    }
    if u.stock.is_some() || u.stock_shards.is_some() {
        // Absolute total and/or shard count, applied on the locked rows; a total that would
        // undercut units already promised (reserved) or sold is refused.
        stock::reshape_tx(conn, sku, u.stock, u.stock_shards).await?;
    }
    Ok(())
}

const VIEW_SQL: &str = "SELECT p.sku, p.event_id AS event, p.name, p.price, p.hot, p.stock_shards,
        i.available + i.reserved + i.sold AS stock, i.available, i.reserved, i.sold
   FROM products p
   CROSS JOIN LATERAL (
       SELECT sum(available)::bigint AS available, sum(reserved)::bigint AS reserved,
              sum(sold)::bigint AS sold
         FROM inventory WHERE sku = p.sku) i
  WHERE p.sku = $1 AND i.available IS NOT NULL";

/// A product with its stock, as the admin API shows it.
pub async fn load(pool: &PgPool, sku: &str) -> Result<Option<ProductView>, OrderError> {
    sqlx::query_as(VIEW_SQL)
        .bind(sku)
        .fetch_optional(pool)
        .await
        .during("read the product")
}

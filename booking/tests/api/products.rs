//! Admin product API, plus the helpers the cart/order/flash tests share.

use crate::helpers::{ADMIN_TOKEN, TestApp, create_product, json};
use serde_json::{Value, json};

pub async fn admin_put(app: &TestApp, path: &str, body: &Value) -> reqwest::Response {
    app.client
        .put(app.url(path))
        .bearer_auth(ADMIN_TOKEN)
        .json(body)
        .send()
        .await
        .expect("request")
}

/// `(available, reserved, sold)` straight from the database, summed over the stock's rows.
pub async fn stock(app: &TestApp, sku: &str) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT sum(available)::bigint, sum(reserved)::bigint, sum(sold)::bigint
           FROM inventory WHERE sku = $1 GROUP BY sku",
    )
    .bind(sku)
    .fetch_one(&app.pool)
    .await
    .expect("inventory row")
}

/// `PUT /api/cart/items/{sku}`.
pub async fn put_line(app: &TestApp, token: &str, sku: &str, quantity: Value) -> reqwest::Response {
    app.client
        .put(app.url(&format!("/api/cart/items/{sku}")))
        .bearer_auth(token)
        .json(&json!({ "quantity": quantity }))
        .send()
        .await
        .expect("request")
}

/// `POST /api/orders` with an Idempotency-Key.
pub async fn post_order(app: &TestApp, token: &str, key: &str, body: &Value) -> reqwest::Response {
    app.client
        .post(app.url("/api/orders"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("request")
}

#[tokio::test]
async fn create_get_and_update_products() {
    let app = TestApp::spawn().await;
    create_product(&app, "shop", "TSHIRT-L", 3500, 10, false).await;
    let (status, v) = json(app.admin_get("/admin/products/TSHIRT-L").await).await;
    assert_eq!(status, 200);
    assert_eq!(
        (
            v["price"].as_i64(),
            v["available"].as_i64(),
            v["reserved"].as_i64()
        ),
        (Some(3500), Some(10), Some(0))
    );
    assert_eq!(v["sold"], 0);

    // Duplicate SKU.
    let (status, v) = json(
        app.admin_post(
            "/admin/products",
            &json!({"sku": "TSHIRT-L", "event": "shop", "name": "x", "price": 1, "stock": 1}),
        )
        .await,
    )
    .await;
    assert_eq!((status, v["code"].as_str()), (409, Some("PRODUCT_EXISTS")));

    // Absolute stock and price: applying the same PUT twice gives the same state.
    for _ in 0..2 {
        let (status, v) = json(
            admin_put(
                &app,
                "/admin/products/TSHIRT-L",
                &json!({"price": 3900, "stock": 25}),
            )
            .await,
        )
        .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(
            (v["price"].as_i64(), v["available"].as_i64()),
            (Some(3900), Some(25))
        );
    }
    // Stock below what is already reserved/sold is refused and changes nothing.
    sqlx::query("UPDATE inventory SET available = 20, reserved = 5 WHERE sku = 'TSHIRT-L'")
        .execute(&app.pool)
        .await
        .expect("reserve");
    let (status, v) =
        json(admin_put(&app, "/admin/products/TSHIRT-L", &json!({"stock": 4})).await).await;
    assert_eq!((status, v["code"].as_str()), (409, Some("CONFLICT")));
    assert_eq!(stock(&app, "TSHIRT-L").await, (20, 5, 0));

    // Unknown product, bad input, no admin secret.
    let (status, v) =
        json(admin_put(&app, "/admin/products/NOPE", &json!({"price": 1})).await).await;
    assert_eq!((status, v["code"].as_str()), (404, Some("UNKNOWN_SKU")));
    for bad in [
        json!({"event": "shop", "sku": "bad sku", "name": "x", "price": 1, "stock": 1}),
        json!({"event": "shop", "sku": "OK", "name": "", "price": 1, "stock": 1}),
        json!({"event": "shop", "sku": "OK", "name": "x", "price": -1, "stock": 1}),
        json!({"event": "shop", "sku": "OK", "name": "x", "price": 1, "stock": -5}),
        json!({"event": "shop", "sku": "OK", "name": "x", "price": 1.5, "stock": 1}),
        json!({"event": "shop", "sku": "OK", "name": "x", "price": 1, "stock": 1, "colour": "red"}),
    ] {
        let (status, v) = json(app.admin_post("/admin/products", &bad).await).await;
        assert_eq!(status, 422, "{bad} -> {v}");
    }
    let status = app
        .client
        .get(app.url("/admin/products/TSHIRT-L"))
        .send()
        .await
        .expect("request")
        .status();
    assert_eq!(status, 401);
    let missing: Option<i32> = sqlx::query_scalar("SELECT 1 FROM products WHERE sku = 'OK'")
        .fetch_optional(&app.pool)
        .await
        .expect("query");
    assert!(missing.is_none());
    app.stop().await;
}

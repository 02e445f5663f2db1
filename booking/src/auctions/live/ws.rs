//! `GET /ws/auctions/{id}`: one client's live prices (see [`super`] for the fan-out).
//!
//! Auth: the admission token as Bearer header or cookie, or (for browsers, which cannot set
//! headers on a WebSocket) as a `?token=` query parameter; the token must open the auction's
//! event, checked before the upgrade. A client gets a snapshot on connect, then updates, then
//! a final `closed` message; a revocation of its admission closes the socket, and so does
//! the admission's end: at the token's `exp`, unless the fan's checkout (a live hold or a
//! pending order in the event) extended the admission, in which case at that checkout's end.
//! Both are close code [`ADMISSION_ENDED`]: the client reconnects with its current token (a
//! refreshed one is accepted) and goes back to the waiting room when it has none.

use super::Topic;
use super::message::LiveState;
use crate::auctions::AuctionsState;
use crate::auctions::error::AuctionError;
use crate::auctions::model::{AuctionRow, AuctionStatus, rfc3339};
use crate::platform::error::{ApiError, ApiResult};
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::response::Response;
use serde::Deserialize;
use shared::headers::ADMISSION_COOKIE;
use shared::token::{AdmissionClaims, bearer, cookie};
use std::time::Duration;
use tokio::sync::broadcast;

/// Close code (the application range 4000–4999) of a socket whose admission ended:
/// reconnect with the current token; a `401`/`403` on the reconnect means back to the
/// waiting room.
pub const ADMISSION_ENDED: u16 = 4001;

/// Asked once the token's `exp` (or an earlier answer) has passed: until when (unix s) the
/// fan's live holds or pending orders in its event still extend the admission (the gateway
/// refreshes the token until then). `None` when it has ended.
async fn admission_end(state: &AuctionsState, claims: &AdmissionClaims) -> Option<i64> {
    let now = chrono::Utc::now().timestamp();
    match crate::platform::session_until::live_until_ms(&state.pool, &claims.sub, &claims.evt).await
    {
        Ok(ms) => {
            let until = ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) > 0);
            (until > now).then_some(until)
        }
        // Unknown: the client reconnects, and the token it holds decides.
        Err(e) => {
            tracing::warn!(error = %e, "reading a socket's admission end failed");
            None
        }
    }
}

/// The topic's last snapshot if its read started after `subscribed`, else a fresh read that
/// later subscribers may share: 1,000 viewers connecting at once cost one read, not 1,000
/// (and none of them can miss an update published after its own subscription).
async fn snapshot(
    topic: &Topic,
    state: &AuctionsState,
    id: &str,
    subscribed: tokio::time::Instant,
) -> Result<Option<AuctionRow>, AuctionError> {
    let mut cached = topic.snapshot.lock().await;
    if let Some((started, row)) = cached.as_ref()
        && *started >= subscribed
    {
        return Ok(Some(row.clone()));
    }
    let started = tokio::time::Instant::now();
    let row = crate::auctions::current(state, id).await?;
    *cached = row.clone().map(|r| (started, r));
    Ok(row)
}

#[derive(Debug, Deserialize)]
pub struct WsQuery {
    pub token: Option<String>,
}

fn token<'a>(headers: &'a HeaderMap, query: &'a WsQuery) -> Option<&'a str> {
    if let Some(t) = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
    {
        return Some(t);
    }
    if let Some(t) = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| cookie(v, ADMISSION_COOKIE))
    {
        return Some(t);
    }
    query.token.as_deref()
}

/// `GET /ws/auctions/{id}`.
pub async fn upgrade(
    State(state): State<AuctionsState>,
    Path(id): Path<String>,
    Query(query): Query<WsQuery>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let Some(tok) = token(&headers, &query) else {
        return Err(state.auth.refuse("missing"));
    };
    let claims = state.auth.admit(tok)?;
    let ws = ws.map_err(|_| {
        ApiError::bad_request(
            shared::error::codes::INVALID_REQUEST,
            "this endpoint needs a WebSocket upgrade",
        )
    })?;
    let meta = crate::auctions::meta(&state, &id)
        .await?
        .ok_or(AuctionError::NotFound)?;
    // One admission, one event: refused before the upgrade, so no socket is opened.
    let admitted = crate::platform::auth::Admitted(claims);
    admitted.opens(meta.event.as_deref())?;
    let claims = admitted.0;
    Ok(ws
        .max_message_size(4096)
        .on_upgrade(move |socket| session(state, id, claims, socket)))
}

/// One client. `claims` are its admission: the account tells it when it is the leader (never
/// sent), and a revocation of the account or session closes the socket.
async fn session(state: AuctionsState, id: String, claims: AdmissionClaims, mut socket: WebSocket) {
    let viewer = claims.sub.clone();
    // A revocation closes the socket within one refresh of the list (`revocation.rs`).
    let mut revocations = state.auth.revocations().subscribe();
    // Subscribe (and wait until Redis confirmed it) before reading the snapshot, so no update
    // can fall between the two. If Redis is unreachable the snapshot still comes from the
    // source of truth; updates resume once the dispatcher reconnects.
    let Some((mut rx, topic)) = state.live.subscribe(&id) else {
        let _ = socket.send(close_frame(1011, "internal error")).await;
        return;
    };
    let send_timeout = Duration::from_millis(state.settings.live_send_timeout_ms.max(1));
    let mut ready = topic.ready.subscribe();
    let _ = tokio::time::timeout(send_timeout, ready.wait_for(|r| *r)).await;
    let subscribed = tokio::time::Instant::now();
    let row: AuctionRow = match snapshot(&topic, &state, &id, subscribed).await {
        Ok(Some(row)) => row,
        _ => {
            let _ = socket.send(close_frame(1011, "auction unavailable")).await;
            return;
        }
    };
    // Only the receiver is needed from here on, so the topic lives exactly as long as the
    // hub keeps it.
    drop((ready, topic));
    let mut first = row.view_for(&state.handles, &viewer);
    first["type"] = "snapshot".into();
    if !send(
        &mut socket,
        Utf8Bytes::from(first.to_string()),
        send_timeout,
    )
    .await
    {
        return;
    }
    if row.status == AuctionStatus::Closed {
        let closed = LiveState {
            auction_id: row.id.clone(),
            current_price: row.current_price,
            leader: row.leader_id.clone(),
            end_time: rfc3339(&row.end_time),
            closed: true,
        };
        let _ = send(
            &mut socket,
            closed.text_for(&state.handles, &viewer),
            send_timeout,
        )
        .await;
        let _ = socket.send(close_frame(1000, "auction closed")).await;
        return;
    }
    let mut last_price = row.current_price;
    // One timer for the socket's life, moved when the admission turns out to last longer.
    let until = |end: i64| {
        let left = end.saturating_sub(chrono::Utc::now().timestamp());
        // Whole seconds from a truncated clock: it fires at or after `end`, never before.
        tokio::time::Instant::now() + Duration::from_secs(u64::try_from(left).unwrap_or(0))
    };
    let mut ends_at = claims.exp;
    let ends = tokio::time::sleep_until(until(ends_at));
    tokio::pin!(ends);
    loop {
        if ends_at <= chrono::Utc::now().timestamp() {
            let Some(end) = admission_end(&state, &claims).await else {
                let _ = tokio::time::timeout(
                    send_timeout,
                    socket.send(close_frame(ADMISSION_ENDED, "admission ended; reconnect")),
                )
                .await;
                return;
            };
            ends_at = end;
            ends.as_mut().reset(until(ends_at));
        }
        if state.auth.revocations().refuses(&claims) {
            let _ = tokio::time::timeout(
                send_timeout,
                socket.send(close_frame(1008, "admission revoked")),
            )
            .await;
            return;
        }
        tokio::select! {
            // The admission's end is re-checked at the top of the loop.
            () = &mut ends => {}
            // Re-checked at the top of the loop; a closed channel (never: the list lives as
            // long as the state) just disables this branch.
            Ok(()) = revocations.changed() => {}
            m = rx.recv() => match m {
                Ok(msg) => {
                    // The snapshot may be newer than an update that was already queued.
                    if !msg.closed && msg.price < last_price {
                        continue;
                    }
                    last_price = msg.price;
                    if !send(&mut socket, msg.text_for(&viewer).clone(), send_timeout).await {
                        return;
                    }
                    if msg.closed {
                        let _ = socket.send(close_frame(1000, "auction closed")).await;
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Too slow to keep up: drop it rather than slow anyone else down.
                    let _ = tokio::time::timeout(
                        send_timeout,
                        socket.send(close_frame(1013, "too slow; reconnect")),
                    )
                    .await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => {
                    let _ = socket.send(close_frame(1001, "going away")).await;
                    return;
                }
            },
            incoming = socket.recv() => match incoming {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                // Pings are answered by the protocol layer; other input is ignored.
                Some(Ok(_)) => {}
            },
        }
    }
}

async fn send(socket: &mut WebSocket, text: Utf8Bytes, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, socket.send(Message::Text(text))).await,
        Ok(Ok(()))
    )
}

fn close_frame(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    }))
}

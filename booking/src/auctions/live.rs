//! Live prices: `GET /ws/auctions/{id}` (WebSocket).
//!
//! - Accepted bids and closes are published to Redis pub/sub (`auction:{id}:live`) after the
//!   commit or the script, never inside a transaction, best effort (a lost message is healed
//!   by the next one; the snapshot on connect is read from the source of truth).
//! - Each node holds ONE Redis pub/sub connection and one channel subscription per auction
//!   that has local viewers. Messages go into a per-auction `watch` (latest state wins; prices
//!   only rise, so merging keeps the highest), and a per-auction task turns it into at most one
//!   broadcast per `live_coalesce_ms`, fanned out to every local client via `tokio::broadcast`.
//! - A client gets a snapshot on connect, then updates, then a final `closed` message. A
//!   client that lags behind the broadcast buffer, or whose socket does not take a message
//!   within `live_send_timeout_ms`, is dropped; the broadcast never waits for anyone.
//! - Auth: the admission token as Bearer header or cookie, or (for browsers, which cannot set
//!   headers on a WebSocket) as a `?token=` query parameter.
//! - Fans see each other only as handles ([`super::handles`]): pub/sub carries the leader's
//!   account (it is internal), each update is serialised twice (for the leader, with
//!   `you_lead`/`you_won` true, and for everyone else), and each client gets the one for it.

use super::closer::Closed;
use super::handles::Handles;
use super::{AuctionRow, rfc3339};
use crate::app::state::AppState;
use crate::platform::error::{ApiError, ApiResult};
use anyhow::Context;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::response::Response;
use futures::StreamExt;
use redis::aio::PubSubSink;
use secrecy::ExposeSecret;
use serde::Deserialize;
use shared::headers::ADMISSION_COOKIE;
use shared::token::{AdmissionClaims, bearer, cookie};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};

/// The latest known state of one auction, as carried on pub/sub and merged per node.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub struct LiveState {
    pub auction_id: String,
    pub current_price: i64,
    pub leader: Option<String>,
    pub end_time: String,
    pub closed: bool,
}

impl LiveState {
    /// Merges a newer message: closed is final; otherwise the higher price (or the first
    /// leader) wins, so out-of-order publishes can never move a viewer's price backwards.
    fn merge(&mut self, new: LiveState) -> bool {
        if self.closed {
            return false;
        }
        if new.closed
            || new.current_price > self.current_price
            || (self.leader.is_none() && new.leader.is_some())
            || (new.current_price == self.current_price && new.end_time > self.end_time)
        {
            *self = new;
            return true;
        }
        false
    }

    /// The client message; `you` says whether it goes to the leader.
    fn message(&self, handles: &Handles, you: bool) -> serde_json::Value {
        let leader = self
            .leader
            .as_deref()
            .map(|l| handles.bidder(&self.auction_id, l));
        if self.closed {
            serde_json::json!({
                "type": "closed",
                "auction_id": self.auction_id,
                "final_price": self.current_price,
                "winner": leader,
                "you_won": you,
                "end_time": self.end_time,
            })
        } else {
            serde_json::json!({
                "type": "price",
                "auction_id": self.auction_id,
                "current_price": self.current_price,
                "leader": leader,
                "you_lead": you,
                "end_time": self.end_time,
            })
        }
    }

    /// The text for the client of account `viewer`.
    fn text_for(&self, handles: &Handles, viewer: &str) -> Utf8Bytes {
        let you = self.leader.as_deref() == Some(viewer);
        Utf8Bytes::from(self.message(handles, you).to_string())
    }
}

/// One coalesced update, serialised once for the leader and once for every other client.
#[derive(Debug)]
pub struct LiveMsg {
    pub price: i64,
    pub closed: bool,
    /// The leader's account (never sent; picks the text).
    pub leader: Option<String>,
    pub text: Utf8Bytes,
    pub text_for_leader: Utf8Bytes,
}

impl LiveMsg {
    fn text_for(&self, viewer: &str) -> &Utf8Bytes {
        if self.leader.as_deref() == Some(viewer) {
            &self.text_for_leader
        } else {
            &self.text
        }
    }
}

struct Topic {
    tx: broadcast::Sender<Arc<LiveMsg>>,
    latest: watch::Sender<Option<LiveState>>,
    /// True once Redis confirmed the channel subscription.
    ready: watch::Sender<bool>,
    /// The last snapshot read and when that read started: viewers who subscribed before a
    /// read started may share it, so 1,000 viewers connecting at once cost one read, not
    /// 1,000 (and none of them can miss an update published after its own subscription).
    snapshot: tokio::sync::Mutex<Option<(tokio::time::Instant, AuctionRow)>>,
}

impl Topic {
    async fn snapshot(
        &self,
        state: &AppState,
        id: &str,
        subscribed: tokio::time::Instant,
    ) -> ApiResult<Option<AuctionRow>> {
        let mut cached = self.snapshot.lock().await;
        if let Some((started, row)) = cached.as_ref()
            && *started >= subscribed
        {
            return Ok(Some(row.clone()));
        }
        let started = tokio::time::Instant::now();
        let row = super::current(state, id).await?;
        *cached = row.clone().map(|r| (started, r));
        Ok(row)
    }
}

enum Cmd {
    Subscribe(String),
    Unsubscribe(String),
}

/// Per-node fan-out of live prices.
pub struct LiveHub {
    client: redis::Client,
    prefix: String,
    coalesce: Duration,
    buffer: usize,
    topics: Arc<Mutex<HashMap<String, Arc<Topic>>>>,
    cmds: OnceLock<mpsc::UnboundedSender<Cmd>>,
    handles: Handles,
}

impl LiveHub {
    pub fn new(
        config: &crate::app::config::BookingConfig,
        handles: Handles,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            client: redis::Client::open(config.redis.url.expose_secret())
                .context("invalid redis url")?,
            prefix: config.redis.key_prefix.clone(),
            coalesce: Duration::from_millis(config.auctions.live_coalesce_ms.max(1)),
            buffer: config.auctions.live_client_buffer.max(1),
            topics: Arc::new(Mutex::new(HashMap::new())),
            cmds: OnceLock::new(),
            handles,
        })
    }

    pub fn channel(&self, id: &str) -> String {
        format!("{}auction:{{{id}}}:live", self.prefix)
    }

    fn auction_of<'a>(&self, channel: &'a str) -> Option<&'a str> {
        channel
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix("auction:{")?
            .strip_suffix("}:live")
    }

    /// Number of auctions with local viewers (for tests and metrics).
    pub fn topics(&self) -> usize {
        self.topics.lock().map(|t| t.len()).unwrap_or(0)
    }

    /// A receiver of coalesced updates for `id`, subscribing this node on first use.
    fn subscribe(
        self: &Arc<Self>,
        id: &str,
    ) -> Option<(broadcast::Receiver<Arc<LiveMsg>>, Arc<Topic>)> {
        let cmds = self.cmds.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(dispatch(self.clone(), rx));
            tx
        });
        // A poisoned lock means a panic elsewhere; the caller drops the client.
        let mut topics = self.topics.lock().ok()?;
        if let Some(t) = topics.get(id) {
            return Some((t.tx.subscribe(), t.clone()));
        }
        let (tx, rx) = broadcast::channel(self.buffer);
        let (latest, latest_rx) = watch::channel(None);
        let topic = Arc::new(Topic {
            tx,
            latest,
            ready: watch::channel(false).0,
            snapshot: tokio::sync::Mutex::new(None),
        });
        topics.insert(id.to_owned(), topic.clone());
        drop(topics);
        let _ = cmds.send(Cmd::Subscribe(self.channel(id)));
        tokio::spawn(coalesce(
            self.clone(),
            id.to_owned(),
            topic.clone(),
            latest_rx,
        ));
        Some((rx, topic))
    }

    fn mark_ready(&self, channel: &str) {
        let topic = self
            .auction_of(channel)
            .and_then(|id| self.topics.lock().ok()?.get(id).cloned());
        if let Some(t) = topic {
            t.ready.send_replace(true);
        }
    }

    fn deliver(&self, id: &str, state: LiveState) {
        let topic = self.topics.lock().ok().and_then(|t| t.get(id).cloned());
        if let Some(topic) = topic {
            topic.latest.send_if_modified(|cur| match cur {
                Some(c) => c.merge(state),
                None => {
                    *cur = Some(state);
                    true
                }
            });
        }
    }

    /// Removes the topic if nobody listens any more (checked under the lock, so a client
    /// subscribing concurrently either keeps it alive or gets a fresh one).
    fn release_if_idle(&self, id: &str, topic: &Arc<Topic>, force: bool) -> bool {
        let Ok(mut topics) = self.topics.lock() else {
            return true;
        };
        let same = topics.get(id).is_some_and(|t| Arc::ptr_eq(t, topic));
        if same && (force || topic.tx.receiver_count() == 0) {
            topics.remove(id);
            drop(topics);
            if let Some(c) = self.cmds.get() {
                let _ = c.send(Cmd::Unsubscribe(self.channel(id)));
            }
            return true;
        }
        !same
    }
}

/// Turns the per-auction `watch` into at most one broadcast per coalescing interval; ends
/// after the closed message or when the last local viewer has gone.
async fn coalesce(
    hub: Arc<LiveHub>,
    id: String,
    topic: Arc<Topic>,
    mut latest: watch::Receiver<Option<LiveState>>,
) {
    loop {
        tokio::select! {
            changed = latest.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            _ = tokio::time::sleep(Duration::from_secs(2)) => {
                if hub.release_if_idle(&id, &topic, false) {
                    return;
                }
                continue;
            }
        }
        let Some(state) = latest.borrow_and_update().clone() else {
            continue;
        };
        let msg = Arc::new(LiveMsg {
            price: state.current_price,
            closed: state.closed,
            leader: state.leader.clone(),
            text: Utf8Bytes::from(state.message(&hub.handles, false).to_string()),
            text_for_leader: Utf8Bytes::from(state.message(&hub.handles, true).to_string()),
        });
        // Never blocks: a receiver that falls `buffer` messages behind gets `Lagged`.
        let _ = topic.tx.send(msg);
        if state.closed {
            break;
        }
        tokio::time::sleep(hub.coalesce).await;
    }
    hub.release_if_idle(&id, &topic, true);
}

/// The node's single pub/sub connection: applies (un)subscribe commands in order and routes
/// messages to topics. Reconnects (and resubscribes) if the connection drops.
async fn dispatch(hub: Arc<LiveHub>, mut cmds: mpsc::UnboundedReceiver<Cmd>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let pubsub = match hub.client.get_async_pubsub().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = ?e, "live prices: cannot connect to Redis pub/sub");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        let (mut sink, mut stream) = pubsub.split();
        let wanted: Vec<String> = hub
            .topics
            .lock()
            .map(|t| t.keys().map(|id| hub.channel(id)).collect())
            .unwrap_or_default();
        let mut ok = true;
        for ch in wanted {
            ok &= sink.subscribe(&ch).await.is_ok();
            if ok {
                hub.mark_ready(&ch);
            }
        }
        while ok {
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    None => return,
                    Some(cmd) => ok = apply(&hub, &mut sink, cmd).await,
                },
                msg = stream.next() => match msg {
                    None => ok = false,
                    Some(msg) => {
                        let channel = msg.get_channel_name().to_owned();
                        let Some(id) = hub.auction_of(&channel) else { continue };
                        match msg.get_payload::<String>().ok()
                            .and_then(|p| serde_json::from_str::<LiveState>(&p).ok())
                        {
                            Some(state) => hub.deliver(id, state),
                            None => tracing::debug!(channel, "ignored malformed live message"),
                        }
                    }
                },
            }
        }
        tracing::warn!("live prices: Redis pub/sub connection lost; reconnecting");
    }
}

async fn apply(hub: &LiveHub, sink: &mut PubSubSink, cmd: Cmd) -> bool {
    match cmd {
        Cmd::Subscribe(ch) => {
            let ok = sink.subscribe(&ch).await.is_ok();
            if ok {
                hub.mark_ready(&ch);
            }
            ok
        }
        Cmd::Unsubscribe(ch) => {
            // Skip if a new topic for this auction appeared after the release was queued.
            let still_wanted = hub
                .auction_of(&ch)
                .and_then(|id| hub.topics.lock().ok().map(|t| t.contains_key(id)))
                .unwrap_or(false);
            still_wanted || sink.unsubscribe(&ch).await.is_ok()
        }
    }
}

fn publish(state: &AppState, live: LiveState) {
    let state = state.clone();
    tokio::spawn(async move {
        let channel = state.auctions.live.channel(&live.auction_id);
        let payload = match serde_json::to_string(&live) {
            Ok(p) => p,
            Err(_) => return,
        };
        let res = async {
            let mut conn = state.redis().await?;
            let _: i64 = redis::cmd("PUBLISH")
                .arg(&channel)
                .arg(payload)
                .query_async(&mut conn)
                .await?;
            Ok::<_, ApiError>(())
        }
        .await;
        if let Err(e) = res {
            tracing::debug!(error = ?e, "live price publish failed");
        }
    });
}

/// Announces an accepted bid (after commit / after the script).
pub fn publish_bid(state: &AppState, bid: &super::bids::AcceptedBid) {
    publish(
        state,
        LiveState {
            auction_id: bid.auction_id.clone(),
            current_price: bid.amount,
            leader: Some(bid.bidder.clone()),
            end_time: rfc3339(&bid.end_time),
            closed: false,
        },
    );
}

/// Announces a close (after the closer's commit).
pub fn publish_closed(state: &AppState, c: &Closed) {
    publish(
        state,
        LiveState {
            auction_id: c.id.clone(),
            current_price: c.current_price,
            leader: c.leader_id.clone(),
            end_time: rfc3339(&c.end_time),
            closed: true,
        },
    );
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
    State(state): State<AppState>,
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
    let meta = super::meta(&state, &id)
        .await?
        .ok_or_else(super::unknown_auction)?;
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
async fn session(state: AppState, id: String, claims: AdmissionClaims, mut socket: WebSocket) {
    let viewer = claims.sub.clone();
    let hub = state.auctions.live.clone();
    // A revocation closes the socket within one refresh of the list (`revocation.rs`).
    let mut revocations = state.revocations().subscribe();
    // Subscribe (and wait until Redis confirmed it) before reading the snapshot, so no update
    // can fall between the two. If Redis is unreachable the snapshot still comes from the
    // source of truth; updates resume once the dispatcher reconnects.
    let Some((mut rx, topic)) = hub.subscribe(&id) else {
        let _ = socket.send(close_frame(1011, "internal error")).await;
        return;
    };
    let send_timeout = Duration::from_millis(state.config.auctions.live_send_timeout_ms.max(1));
    let mut ready = topic.ready.subscribe();
    let _ = tokio::time::timeout(send_timeout, ready.wait_for(|r| *r)).await;
    let subscribed = tokio::time::Instant::now();
    let row: AuctionRow = match topic.snapshot(&state, &id, subscribed).await {
        Ok(Some(row)) => row,
        _ => {
            let _ = socket.send(close_frame(1011, "auction unavailable")).await;
            return;
        }
    };
    let mut snapshot = row.view_for(&state.auctions.handles, &viewer);
    snapshot["type"] = "snapshot".into();
    if !send(
        &mut socket,
        Utf8Bytes::from(snapshot.to_string()),
        send_timeout,
    )
    .await
    {
        return;
    }
    if row.status == "CLOSED" {
        let closed = LiveState {
            auction_id: row.id.clone(),
            current_price: row.current_price,
            leader: row.leader_id.clone(),
            end_time: rfc3339(&row.end_time),
            closed: true,
        };
        let _ = send(
            &mut socket,
            closed.text_for(&state.auctions.handles, &viewer),
            send_timeout,
        )
        .await;
        let _ = socket.send(close_frame(1000, "auction closed")).await;
        return;
    }
    let mut last_price = row.current_price;
    loop {
        if state.revocations().refuses(&claims) {
            let _ = tokio::time::timeout(
                send_timeout,
                socket.send(close_frame(1008, "admission revoked")),
            )
            .await;
            return;
        }
        tokio::select! {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn st(price: i64, leader: Option<&str>, closed: bool) -> LiveState {
        LiveState {
            auction_id: "a".into(),
            current_price: price,
            leader: leader.map(str::to_owned),
            end_time: "2030-01-01T00:00:00Z".into(),
            closed,
        }
    }

    #[test]
    fn merge_keeps_the_highest_price_and_close_is_final() {
        let mut cur = st(1000, None, false);
        assert!(
            cur.merge(st(1000, Some("a"), false)),
            "first leader at the start price"
        );
        assert!(cur.merge(st(1200, Some("b"), false)));
        assert!(
            !cur.merge(st(1100, Some("c"), false)),
            "a late, lower publish is ignored"
        );
        assert_eq!(cur.current_price, 1200);
        assert!(cur.merge(st(1200, Some("b"), true)));
        assert!(
            !cur.merge(st(5000, Some("d"), false)),
            "nothing after the close"
        );
        assert!(cur.closed);
        let handles = Handles::new(b"test");
        let msg = cur.message(&handles, false);
        assert_eq!(msg["type"], "closed");
        assert_eq!(msg["final_price"], 1200);
        assert_eq!(msg["winner"], handles.bidder("a", "b"));
        assert_eq!(msg["you_won"], false);
        assert_eq!(cur.message(&handles, true)["you_won"], true);
    }

    #[tokio::test]
    async fn a_receiver_that_falls_behind_lags_instead_of_blocking_the_sender() {
        let (tx, mut slow) = broadcast::channel::<Arc<LiveMsg>>(2);
        let mut fast = tx.subscribe();
        for p in 0..10 {
            let msg = Arc::new(LiveMsg {
                price: p,
                closed: false,
                leader: None,
                text: Utf8Bytes::from_static("x"),
                text_for_leader: Utf8Bytes::from_static("y"),
            });
            // Never waits for anyone.
            let _ = tx.send(msg);
            assert_eq!(fast.recv().await.map(|m| m.price).ok(), Some(p));
        }
        assert!(matches!(
            slow.recv().await,
            Err(broadcast::error::RecvError::Lagged(_))
        ));
    }
}

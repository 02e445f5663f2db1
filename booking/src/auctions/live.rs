//! Live prices: `GET /ws/auctions/{id}` (WebSocket, [`ws`]).
//!
//! - Accepted bids and closes are published to Redis pub/sub (`auction:{id}:live`) after the
//!   commit or the script, never inside a transaction, best effort (a lost message is healed
//!   by the next one; the snapshot on connect is read from the source of truth).
//! - Each node holds ONE Redis pub/sub connection and one channel subscription per auction
//!   that has local viewers. Messages go into a per-auction `watch` (latest state wins; prices
//!   only rise, so merging keeps the highest, [`message::LiveState::merge`]), and a
//!   per-auction task turns it into at most one broadcast per `live_coalesce_ms`, fanned out
//!   to every local client via `tokio::broadcast`.
//! - A client gets a snapshot on connect, then updates, then a final `closed` message. A
//!   client that lags behind the broadcast buffer, or whose socket does not take a message
//!   within `live_send_timeout_ms`, is dropped; the broadcast never waits for anyone.
//! - Fans see each other only as handles ([`super::handles`]): pub/sub carries the leader's
//!   account (it is internal), each update is serialised twice (for the leader, with
//!   `you_lead`/`you_won` true, and for everyone else), and each client gets the one for it.
//! - The hub's tasks end with it: the pub/sub dispatcher owns the only receiver of the hub's
//!   command channel and none of the hub, so it returns once the hub (the sender) is dropped;
//!   the per-auction tasks hold the hub weakly and end when it is gone or idle.

pub mod message;
pub mod ws;

use super::AuctionSettings;
use super::AuctionsState;
use super::bids::AcceptedBid;
use super::closer::Closed;
use super::handles::Handles;
use super::model::{AuctionRow, rfc3339};
use anyhow::Context;
use futures::StreamExt;
use message::{LiveMsg, LiveState};
use redis::aio::PubSubSink;
use secrecy::ExposeSecret;
use shared::config::RedisSettings;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

struct Topic {
    tx: broadcast::Sender<Arc<LiveMsg>>,
    latest: watch::Sender<Option<LiveState>>,
    /// True once Redis confirmed the channel subscription.
    ready: watch::Sender<bool>,
    /// The last snapshot read and when that read started ([`ws`] shares it between viewers
    /// who subscribed before the read started).
    snapshot: tokio::sync::Mutex<Option<(tokio::time::Instant, AuctionRow)>>,
}

enum Cmd {
    Subscribe(String),
    Unsubscribe(String),
}

/// The auctions with local viewers, by id, and how their channels are named. Shared by the
/// hub and its dispatcher (which never holds the hub itself).
struct Routes {
    prefix: String,
    topics: Mutex<HashMap<String, Arc<Topic>>>,
}

impl Routes {
    fn channel(&self, id: &str) -> String {
        format!("{}auction:{{{id}}}:live", self.prefix)
    }

    fn auction_of<'a>(&self, channel: &'a str) -> Option<&'a str> {
        channel
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix("auction:{")?
            .strip_suffix("}:live")
    }

    fn topic(&self, id: &str) -> Option<Arc<Topic>> {
        self.topics.lock().ok()?.get(id).cloned()
    }

    fn mark_ready(&self, channel: &str) {
        if let Some(t) = self.auction_of(channel).and_then(|id| self.topic(id)) {
            t.ready.send_replace(true);
        }
    }

    fn deliver(&self, id: &str, state: LiveState) {
        if let Some(topic) = self.topic(id) {
            topic.latest.send_if_modified(|cur| match cur {
                Some(c) => c.merge(state),
                None => {
                    *cur = Some(state);
                    true
                }
            });
        }
    }

    /// Channels of every auction with local viewers.
    fn wanted(&self) -> Vec<String> {
        self.topics
            .lock()
            .map(|t| t.keys().map(|id| self.channel(id)).collect())
            .unwrap_or_default()
    }
}

/// Per-node fan-out of live prices.
pub struct LiveHub {
    client: redis::Client,
    coalesce: Duration,
    buffer: usize,
    routes: Arc<Routes>,
    /// The dispatcher's commands; started on first use (inside the runtime).
    cmds: OnceLock<mpsc::UnboundedSender<Cmd>>,
    /// The dispatcher task, kept so a test can await its end.
    dispatcher: Mutex<Option<JoinHandle<()>>>,
    handles: Handles,
}

impl LiveHub {
    pub fn new(
        settings: &AuctionSettings,
        redis: &RedisSettings,
        handles: Handles,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            client: redis::Client::open(redis.url.expose_secret()).context("invalid redis url")?,
            coalesce: Duration::from_millis(settings.live_coalesce_ms.max(1)),
            buffer: settings.live_client_buffer.max(1),
            routes: Arc::new(Routes {
                prefix: redis.key_prefix.clone(),
                topics: Mutex::new(HashMap::new()),
            }),
            cmds: OnceLock::new(),
            dispatcher: Mutex::new(None),
            handles,
        })
    }

    pub fn channel(&self, id: &str) -> String {
        self.routes.channel(id)
    }

    /// Number of auctions with local viewers (for tests and metrics).
    pub fn topics(&self) -> usize {
        self.routes.topics.lock().map(|t| t.len()).unwrap_or(0)
    }

    /// A receiver of coalesced updates for `id`, subscribing this node on first use.
    fn subscribe(
        self: &Arc<Self>,
        id: &str,
    ) -> Option<(broadcast::Receiver<Arc<LiveMsg>>, Arc<Topic>)> {
        let cmds = self.cmds.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let task = tokio::spawn(dispatch(self.client.clone(), self.routes.clone(), rx));
            if let Ok(mut d) = self.dispatcher.lock() {
                *d = Some(task);
            }
            tx
        });
        // A poisoned lock means a panic elsewhere; the caller drops the client.
        let mut topics = self.routes.topics.lock().ok()?;
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
            Arc::downgrade(self),
            self.handles.clone(),
            self.coalesce,
            id.to_owned(),
            topic.clone(),
            latest_rx,
        ));
        Some((rx, topic))
    }

    /// Removes the topic if nobody listens any more (checked under the lock, so a client
    /// subscribing concurrently either keeps it alive or gets a fresh one).
    fn release_if_idle(&self, id: &str, topic: &Arc<Topic>, force: bool) -> bool {
        let Ok(mut topics) = self.routes.topics.lock() else {
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

/// Whether the per-auction task should end: the hub is gone, or it let the topic go.
fn released(hub: &Weak<LiveHub>, id: &str, topic: &Arc<Topic>, force: bool) -> bool {
    hub.upgrade()
        .is_none_or(|hub| hub.release_if_idle(id, topic, force))
}

/// Turns the per-auction `watch` into at most one broadcast per coalescing interval; ends
/// after the closed message, when the last local viewer has gone, or with the hub.
async fn coalesce(
    hub: Weak<LiveHub>,
    handles: Handles,
    every: Duration,
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
                if released(&hub, &id, &topic, false) {
                    return;
                }
                continue;
            }
        }
        let Some(state) = latest.borrow_and_update().clone() else {
            continue;
        };
        // Never blocks: a receiver that falls `buffer` messages behind gets `Lagged`.
        let _ = topic.tx.send(Arc::new(LiveMsg::new(&state, &handles)));
        if state.closed {
            break;
        }
        tokio::time::sleep(every).await;
    }
    released(&hub, &id, &topic, true);
}

/// Drains commands until the hub drops its sender. Commands seen while no connection is up
/// need no action: a (re)connection subscribes to exactly the topics wanted by then.
async fn until_closed(cmds: &mut mpsc::UnboundedReceiver<Cmd>) {
    while cmds.recv().await.is_some() {}
}

/// The node's single pub/sub connection: applies (un)subscribe commands in order and routes
/// messages to topics. Reconnects (and resubscribes) if the connection drops. Returns once
/// the command channel closes, i.e. when the hub is dropped.
async fn dispatch(
    client: redis::Client,
    routes: Arc<Routes>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let connected = tokio::select! {
            p = client.get_async_pubsub() => p,
            () = until_closed(&mut cmds) => return,
        };
        let pubsub = match connected {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = ?e, "live prices: cannot connect to Redis pub/sub");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = until_closed(&mut cmds) => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        let (mut sink, mut stream) = pubsub.split();
        let mut ok = true;
        for ch in routes.wanted() {
            ok &= sink.subscribe(&ch).await.is_ok();
            if ok {
                routes.mark_ready(&ch);
            }
        }
        while ok {
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    None => return,
                    Some(cmd) => ok = apply(&routes, &mut sink, cmd).await,
                },
                msg = stream.next() => match msg {
                    None => ok = false,
                    Some(msg) => {
                        let channel = msg.get_channel_name().to_owned();
                        let Some(id) = routes.auction_of(&channel) else { continue };
                        match msg.get_payload::<String>().ok()
                            .and_then(|p| serde_json::from_str::<LiveState>(&p).ok())
                        {
                            Some(state) => routes.deliver(id, state),
                            None => tracing::debug!(channel, "ignored malformed live message"),
                        }
                    }
                },
            }
        }
        tracing::warn!("live prices: Redis pub/sub connection lost; reconnecting");
    }
}

async fn apply(routes: &Routes, sink: &mut PubSubSink, cmd: Cmd) -> bool {
    match cmd {
        Cmd::Subscribe(ch) => {
            let ok = sink.subscribe(&ch).await.is_ok();
            if ok {
                routes.mark_ready(&ch);
            }
            ok
        }
        Cmd::Unsubscribe(ch) => {
            // Skip if a new topic for this auction appeared after the release was queued.
            let still_wanted = routes
                .auction_of(&ch)
                .is_some_and(|id| routes.topic(id).is_some());
            still_wanted || sink.unsubscribe(&ch).await.is_ok()
        }
    }
}

/// Publishes on the auction's channel from a short task of its own (one `PUBLISH`, bounded
/// by the Redis timeout), so the caller never waits for it.
fn publish(state: &AuctionsState, live: LiveState) {
    let redis = state.redis.clone();
    let channel = state.live.channel(&live.auction_id);
    let Ok(payload) = serde_json::to_string(&live) else {
        return;
    };
    tokio::spawn(async move {
        let res = async {
            let mut conn = redis.conn().await?;
            let _: i64 = redis::cmd("PUBLISH")
                .arg(&channel)
                .arg(payload)
                .query_async(&mut conn)
                .await?;
            Ok::<_, crate::platform::error::ApiError>(())
        }
        .await;
        if let Err(e) = res {
            tracing::debug!(error = ?e, "live price publish failed");
        }
    });
}

/// Announces an accepted bid (after commit / after the script).
pub fn publish_bid(state: &AuctionsState, bid: &AcceptedBid) {
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
pub fn publish_closed(state: &AuctionsState, c: &Closed) {
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

#[cfg(test)]
mod tests {
    use super::*;

    impl LiveHub {
        fn take_dispatcher(&self) -> Option<JoinHandle<()>> {
            self.dispatcher.lock().ok()?.take()
        }
    }

    fn hub(url: &str) -> Arc<LiveHub> {
        let redis = RedisSettings {
            url: secrecy::SecretString::from(url.to_owned()),
            key_prefix: format!("t{}:", shared::ids::new_id()),
            ..Default::default()
        };
        let settings = AuctionSettings::default();
        Arc::new(LiveHub::new(&settings, &redis, Handles::new(b"test")).expect("hub"))
    }

    fn test_redis_url() -> String {
        std::env::var("FLOODGATE_TEST_STANDALONE_REDIS_URL")
            .or_else(|_| std::env::var("FLOODGATE_TEST_REDIS_URL"))
            .unwrap_or_else(|_| "redis://127.0.0.1:56379".into())
    }

    #[test]
    fn channels_name_their_auction_under_the_prefix() {
        let routes = Routes {
            prefix: "fg:".into(),
            topics: Mutex::new(HashMap::new()),
        };
        let ch = routes.channel("a1");
        assert_eq!(ch, "fg:auction:{a1}:live");
        assert_eq!(routes.auction_of(&ch), Some("a1"));
        assert_eq!(routes.auction_of("other:auction:{a1}:live"), None);
        assert_eq!(routes.auction_of("fg:auction:{a1}:bids"), None);
    }

    #[tokio::test]
    async fn the_dispatcher_ends_once_its_hub_is_dropped() {
        let hub = hub(&test_redis_url());
        let (rx, topic) = hub.subscribe("a").expect("subscribed");
        // Connected and subscribed: the dispatcher is in its steady state.
        let mut ready = topic.ready.subscribe();
        tokio::time::timeout(Duration::from_secs(10), ready.wait_for(|r| *r))
            .await
            .expect("Redis confirmed the subscription")
            .expect("ready");
        let dispatcher = hub.take_dispatcher().expect("dispatcher started");
        drop((rx, ready, topic));
        drop(hub);
        tokio::time::timeout(Duration::from_secs(10), dispatcher)
            .await
            .expect("the dispatcher ended with its hub")
            .expect("the dispatcher did not panic");
    }

    #[tokio::test]
    async fn a_dispatcher_that_cannot_reach_redis_still_ends_with_its_hub() {
        // Nothing listens on port 1: the dispatcher is connecting or backing off.
        let hub = hub("redis://127.0.0.1:1");
        let (rx, topic) = hub.subscribe("a").expect("subscribed");
        let dispatcher = hub.take_dispatcher().expect("dispatcher started");
        drop((rx, topic));
        drop(hub);
        tokio::time::timeout(Duration::from_secs(10), dispatcher)
            .await
            .expect("the dispatcher ended with its hub")
            .expect("the dispatcher did not panic");
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
                text: axum::extract::ws::Utf8Bytes::from_static("x"),
                text_for_leader: axum::extract::ws::Utf8Bytes::from_static("y"),
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

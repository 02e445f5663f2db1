//! What live prices carry: the state of one auction as published on pub/sub and merged per
//! node (prices only rise and a close is final, so merging out-of-order messages never moves
//! a viewer backwards), and the coalesced message each client gets.

use crate::auctions::handles::Handles;
use axum::extract::ws::Utf8Bytes;
use serde::Deserialize;

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
    pub fn merge(&mut self, new: LiveState) -> bool {
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
    pub fn message(&self, handles: &Handles, you: bool) -> serde_json::Value {
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
    pub fn text_for(&self, handles: &Handles, viewer: &str) -> Utf8Bytes {
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
    /// One coalesced state, serialised for the leader and for everyone else.
    pub fn new(state: &LiveState, handles: &Handles) -> Self {
        Self {
            price: state.current_price,
            closed: state.closed,
            leader: state.leader.clone(),
            text: Utf8Bytes::from(state.message(handles, false).to_string()),
            text_for_leader: Utf8Bytes::from(state.message(handles, true).to_string()),
        }
    }

    /// The text for the client of account `viewer`.
    pub fn text_for(&self, viewer: &str) -> &Utf8Bytes {
        if self.leader.as_deref() == Some(viewer) {
            &self.text_for_leader
        } else {
            &self.text
        }
    }
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

    #[test]
    fn each_client_gets_the_text_for_it() {
        let handles = Handles::new(b"test");
        let msg = LiveMsg::new(&st(1500, Some("lead"), false), &handles);
        let for_leader: serde_json::Value =
            serde_json::from_str(msg.text_for("lead").as_str()).expect("json");
        let for_other: serde_json::Value =
            serde_json::from_str(msg.text_for("other").as_str()).expect("json");
        assert_eq!(for_leader["type"], "price");
        assert_eq!(for_leader["you_lead"], true);
        assert_eq!(for_other["you_lead"], false);
        assert_eq!(for_other["leader"], handles.bidder("a", "lead"));
        assert_eq!(for_other["current_price"], 1500);
        assert!(
            !msg.text.as_str().contains("\"lead\""),
            "no account on the wire"
        );
    }
}

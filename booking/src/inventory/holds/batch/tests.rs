//! Unit tests of the batch queue and its ordering rules (no database).

use super::*;
use crate::platform::error::ApiError;

fn waiter(seq: u64) -> (Waiter, oneshot::Receiver<Answer>) {
    let (tx, rx) = oneshot::channel();
    let req: BestAvailable =
        serde_json::from_value(serde_json::json!({"quantity": 2})).expect("a request");
    let w = Waiter {
        seq,
        account: format!("fan-{seq}"),
        req,
        q: 2,
        rounds: 0,
        healed: false,
        tx,
    };
    (w, rx)
}

#[test]
fn batches_take_the_oldest_and_losers_go_back_ahead_of_newer_requests() {
    let queues = Queues::default();
    let mut rxs = Vec::new();
    for seq in 0..(MAX_BATCH as u64 + 3) {
        let (w, rx) = waiter(seq);
        rxs.push(rx);
        assert_eq!(
            queues.push("ev", w),
            seq == 0,
            "only the first starts a drain"
        );
    }
    let first = queues.next_batch("ev");
    assert_eq!(first.len(), MAX_BATCH);
    assert_eq!(first.first().map(|w| w.seq), Some(0));
    // Two losers of the batch, handed back out of order, go first, oldest first.
    let mut first = first.into_iter();
    let a = first.next().expect("a waiter");
    let b = first.next().expect("a waiter");
    queues.requeue("ev", vec![b, a]);
    let second: Vec<u64> = queues.next_batch("ev").iter().map(|w| w.seq).collect();
    let newer = MAX_BATCH as u64;
    assert_eq!(second, vec![0, 1, newer, newer + 1, newer + 2]);
    // Empty: the drain ends and the next request starts a new one.
    assert!(queues.next_batch("ev").is_empty());
    let (w, _rx) = waiter(99);
    assert!(queues.push("ev", w));
}

fn picked(rows: &[(&str, i32)]) -> Picked {
    Picked {
        seats: Vec::new(),
        rows: rows.iter().map(|(s, r)| ((*s).to_owned(), *r)).collect(),
    }
}

#[test]
fn picks_of_one_row_chain_in_pick_order_and_other_rows_run_apart() {
    let mut chains = Vec::new();
    for (seq, rows) in [
        vec![("S1", 1)],
        vec![("S2", 1)],
        vec![("S1", 1)],
        vec![("S3", 1)],
        // Not adjacent: one pick over two rows joins their chains.
        vec![("S2", 1), ("S3", 1)],
        vec![("S1", 2)],
    ]
    .into_iter()
    .enumerate()
    {
        chain(&mut chains, waiter(seq as u64).0, picked(&rows));
    }
    let mut order: Vec<Vec<u64>> = chains
        .iter()
        .map(|c| c.takes.iter().map(|(w, _)| w.seq).collect())
        .collect();
    order.sort();
    assert_eq!(order, vec![vec![0, 2], vec![1, 3, 4], vec![5]]);
}

#[test]
fn a_lost_round_goes_back_until_the_last_then_answers_503() {
    let (mut w, mut rx) = waiter(0);
    for _ in 1..ROUNDS {
        w = w.lost().expect("still has rounds");
    }
    assert!(w.lost().is_none());
    assert!(matches!(rx.try_recv(), Ok(Err(InventoryError::Contended))));
}

#[test]
fn a_failed_read_answers_each_request_with_the_same_kind_of_failure() {
    let cases = [
        (sqlx::Error::PoolTimedOut, 503),
        (
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "reset",
            )),
            503,
        ),
        (sqlx::Error::Protocol("eof".into()), 503),
        (sqlx::Error::RowNotFound, 500),
    ];
    for (source, status) in cases {
        let e = InventoryError::Db {
            statement: "read the best-available candidates",
            source,
        };
        let copy = same_failure(&e);
        assert!(matches!(
            copy,
            InventoryError::Db {
                statement: "read the best-available candidates",
                ..
            }
        ));
        let api = ApiError::from(copy);
        let got = match api {
            ApiError::Unavailable(_) => 503,
            ApiError::Unexpected(_) => 500,
            _ => 0,
        };
        assert_eq!(got, status, "{e:?}");
    }
}

//! The safety net of a split queue: what each sub-queue may let through until the next tick
//! (step 4 of a split tick, [`super`]), and the script that hands it over.

use super::ShardTicked;
use crate::store::{Store, StoreError};
use shared::redis_conn::LuaScript as Script;
use std::sync::LazyLock;

/// A sub-queue's safety-net budgets until the next tick (JOIN_LUA reads them): it lets a
/// join through while its own minute's arrivals stay within `arrivals_cap`, it has a
/// `max_active` slot left (`grant` more are added to what it holds), and no other sub-queue
/// has a backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Budget {
    pub(super) arrivals_cap: u64,
    /// Slots added to the sub-queue's unspent ones; `None`: it gives back all it holds.
    pub(super) grant: Option<u64>,
    pub(super) others_waiting: u64,
}

/// Splits what is left of the event's safety-net thresholds over its sub-queues, from the
/// counts of one round of sub-queue ticks, and says whether the net lets joins through at
/// all (the whole event calm: no backlog, arrivals within the threshold, room under
/// `max_active`).
///
/// `max_active` is exact: slots are granted, never assumed. Each sub-queue's admitted fans
/// plus its unspent slots were read together, a pass only moves one from the second to the
/// first, and only the slots no one holds are granted, so admitted fans and granted slots
/// never add up to more than `max_active` however joins race on the sub-queues (the leader's
/// admissions count the granted slots too). When the event is not calm every sub-queue gives
/// its slots back, so the ticker can use them for the backlog. The arrivals cap is a share of
/// what is left of the minute's threshold on top of each sub-queue's own count (exact up to
/// the joins racing the few milliseconds between a sub-queue's count and its new cap).
pub(super) fn budgets(
    counts: &[ShardTicked],
    threshold: u64,
    max_active: u64,
) -> (Vec<Budget>, bool) {
    let arrivals: u64 = counts.iter().map(|c| c.arrivals).sum();
    let waiting: u64 = counts.iter().map(|c| c.waiting).sum();
    let used: u64 = counts.iter().map(|c| c.used).sum();
    let held: u64 = counts.iter().map(|c| c.used + c.slots).sum();
    let calm = waiting == 0 && arrivals <= threshold && (max_active == 0 || used < max_active);
    let n = counts.len().max(1) as u64;
    let share = |left: u64, k: u64| left / n + u64::from(k < left % n);
    let arr_left = if calm {
        threshold.saturating_sub(arrivals)
    } else {
        0
    };
    let free = max_active.saturating_sub(held);
    let b = (0u64..)
        .zip(counts)
        .map(|(k, c)| Budget {
            arrivals_cap: c.arrivals + share(arr_left, k),
            grant: calm.then(|| share(free, k)),
            others_waiting: waiting - c.waiting,
        })
        .collect();
    (b, calm)
}

/// Writes one sub-queue's safety-net budgets. KEYS: cfg. ARGV: arrivals cap, others
/// waiting, config stamp, slots to grant ('' = give back all), state ('' = not the home).
/// Slots granted under an older config are dropped, not added to: no join has spent one
/// since that config changed (the stamp differs).
const BUDGET_LUA: &str = r#"
if ARGV[4] == '' or redis.call('HGET', KEYS[1], 'sn_stamp') ~= ARGV[3] then
  redis.call('HSET', KEYS[1], 'sn_slots', ARGV[4] == '' and '0' or ARGV[4])
else
  redis.call('HINCRBY', KEYS[1], 'sn_slots', ARGV[4])
end
redis.call('HSET', KEYS[1], 'sn_arr_cap', ARGV[1], 'sn_others_waiting', ARGV[2], 'sn_stamp', ARGV[3])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'sn_state', ARGV[5]) end
return 1
"#;

static BUDGET: LazyLock<Script> = LazyLock::new(|| Script::new(BUDGET_LUA));

impl Store {
    /// Hands each sub-queue its safety-net budgets, stamped with the config they were
    /// computed under, and records the event's state on the home.
    pub(super) async fn write_budgets(
        &self,
        event: &str,
        budgets: &[Budget],
        stamp: &str,
        calm: bool,
    ) -> Result<(), StoreError> {
        for (k, b) in (0u32..).zip(budgets) {
            let mut inv = BUDGET.prepare_invoke();
            inv.key(self.shard_key(event, k, "cfg"))
                .arg(b.arrivals_cap)
                .arg(b.others_waiting)
                .arg(stamp)
                .arg(b.grant.map(|g| g.to_string()).unwrap_or_default())
                .arg(match (k, calm) {
                    (0, true) => "pass",
                    (0, false) => "queueing",
                    _ => "",
                });
            self.with(|mut c| async move { inv.invoke_async::<i64>(&mut c).await })
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safety_net_budgets_grant_only_free_slots_and_share_the_arrivals_left() {
        let t = |arrivals, waiting, used, slots| ShardTicked {
            arrivals,
            waiting,
            used,
            slots,
            ..ShardTicked::default()
        };
        // Calm: 35 arrivals left (12/12/11 on top of each count); 100 − (3+7 + 4+1 + 0) = 85
        // slots free, granted 29/28/28 on top of what each holds.
        let (b, calm) = budgets(&[t(10, 0, 3, 7), t(5, 0, 4, 1), t(0, 0, 0, 0)], 50, 100);
        assert!(calm);
        let got: Vec<(u64, Option<u64>, u64)> = b
            .iter()
            .map(|b| (b.arrivals_cap, b.grant, b.others_waiting))
            .collect();
        assert_eq!(
            got,
            vec![(22, Some(29), 0), (17, Some(28), 0), (11, Some(28), 0)]
        );
        assert_eq!(b.iter().map(|b| b.arrivals_cap).sum::<u64>(), 50);
        // Admitted + held + granted is exactly max_active.
        assert_eq!(
            3 + 7 + 4 + 1 + b.iter().filter_map(|b| b.grant).sum::<u64>(),
            100
        );
        // A backlog on sub-queue 1: not calm, every slot given back, no arrivals room, and
        // the others see the backlog.
        let (b, calm) = budgets(&[t(10, 0, 3, 7), t(5, 2, 4, 1), t(0, 0, 0, 0)], 50, 100);
        assert!(!calm);
        assert!(b.iter().all(|b| b.grant.is_none()));
        assert_eq!(
            b.iter()
                .map(|b| (b.arrivals_cap, b.others_waiting))
                .collect::<Vec<_>>(),
            vec![(10, 2), (5, 0), (0, 2)]
        );
        // Over the arrivals threshold: each cap is its own count (the next join is over it).
        let (b, calm) = budgets(&[t(30, 0, 0, 0), t(30, 0, 0, 0)], 50, 0);
        assert_eq!(
            (b[0].arrivals_cap, b[1].arrivals_cap, calm),
            (30, 30, false)
        );
        // Every slot held or spent: calm while someone still holds one, nothing more granted.
        let (b, calm) = budgets(&[t(0, 0, 60, 10), t(0, 0, 30, 0)], 1000, 100);
        assert!(calm);
        assert_eq!((b[0].grant, b[1].grant), (Some(0), Some(0)));
        let (_, calm) = budgets(&[t(0, 0, 60, 0), t(0, 0, 40, 0)], 1000, 100);
        assert!(!calm, "max_active reached");
    }
}

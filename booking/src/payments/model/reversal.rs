//! Refunds and disputes made on the provider's side, as the model sees them: what a reversal
//! is, when a refund is full, and what a reversal may change given its attempt's status.

use super::AttemptStatus;

/// A refund or dispute made on the provider's side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reversal {
    /// `charge.refunded`; `full` when nothing of the charge is left.
    Refund { reference: String, full: bool },
    /// `charge.dispute.created`; `reference` is the dispute id.
    Dispute { reference: String },
}

impl Reversal {
    /// The refund of charge `charge_id` as its `charge.refunded` event describes it.
    pub fn refund_of_charge(
        charge_id: &str,
        refunded: Option<bool>,
        amount: Option<i64>,
        amount_refunded: Option<i64>,
    ) -> Self {
        Reversal::Refund {
            reference: format!("charge:{charge_id}"),
            full: is_full_refund(refunded, amount, amount_refunded),
        }
    }

    /// The status a paid order takes.
    pub fn order_status(&self) -> &'static str {
        match self {
            Reversal::Refund { .. } => "REFUNDED",
            Reversal::Dispute { .. } => "DISPUTED",
        }
    }

    /// `tickets.void_reason` of the order's tickets.
    pub fn void_reason(&self) -> &'static str {
        match self {
            Reversal::Refund { .. } => "refunded",
            Reversal::Dispute { .. } => "disputed",
        }
    }

    /// The outbox topic announcing it.
    pub fn topic(&self) -> &'static str {
        match self {
            Reversal::Refund { .. } => "order.refunded",
            Reversal::Dispute { .. } => "order.disputed",
        }
    }

    pub fn reference(&self) -> &str {
        match self {
            Reversal::Refund { reference, .. } | Reversal::Dispute { reference } => reference,
        }
    }
}

/// A charge is fully refunded when the provider says so, or when the refunded amount reaches
/// the charged amount. A partial refund reverses no order here.
pub fn is_full_refund(
    refunded: Option<bool>,
    amount: Option<i64>,
    amount_refunded: Option<i64>,
) -> bool {
    refunded == Some(true) || matches!((amount, amount_refunded), (Some(a), Some(r)) if r >= a)
}

/// What a reversal does to an attempt in `status` (after any overtaken success was applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReversalStep {
    /// Money the order never kept came back in full: record the refund (`refund_pending →
    /// refunded`). Only part of it (an operator's partial refund in the dashboard) closes
    /// nothing: the attempt stays `refund_pending` and booking's own refund gives back the rest
    /// ([`ReversalStep::Partial`]).
    RecordRefund,
    /// Money the order never kept is disputed: the bank takes it back itself, so our own
    /// refund is stopped (reconciliation skips disputed `refund_pending` attempts).
    StopRefund,
    /// A partial refund of the paying attempt, or of money owed back: nothing changes here.
    Partial,
    /// The paying attempt's money is reversed: the order is reversed once.
    ReverseOrder,
    /// Applied before, or nothing to reverse.
    Nothing,
}

pub fn reversal_step(status: AttemptStatus, reversal: &Reversal) -> ReversalStep {
    match (status, reversal) {
        (AttemptStatus::RefundPending, Reversal::Refund { full: false, .. }) => {
            ReversalStep::Partial
        }
        (AttemptStatus::RefundPending, Reversal::Refund { .. }) => ReversalStep::RecordRefund,
        (AttemptStatus::RefundPending, Reversal::Dispute { .. }) => ReversalStep::StopRefund,
        (AttemptStatus::Succeeded, Reversal::Refund { full: false, .. }) => ReversalStep::Partial,
        (AttemptStatus::Succeeded, _) => ReversalStep::ReverseOrder,
        _ => ReversalStep::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_refunds_by_flag_or_amount() {
        assert!(is_full_refund(Some(true), None, None));
        assert!(is_full_refund(None, Some(5000), Some(5000)));
        assert!(is_full_refund(Some(false), Some(5000), Some(6000)));
        assert!(!is_full_refund(Some(false), Some(5000), Some(4999)));
        assert!(!is_full_refund(None, Some(5000), None));
        assert!(!is_full_refund(None, None, None));
        assert_eq!(
            Reversal::refund_of_charge("ch_1", None, Some(10), Some(3)),
            Reversal::Refund {
                reference: "charge:ch_1".into(),
                full: false
            }
        );
    }

    #[test]
    fn reversals_name_their_order_status_tickets_and_topic() {
        let refund = Reversal::Refund {
            reference: "charge:ch_1".into(),
            full: true,
        };
        let dispute = Reversal::Dispute {
            reference: "dp_1".into(),
        };
        assert_eq!(
            (refund.order_status(), refund.void_reason(), refund.topic()),
            ("REFUNDED", "refunded", "order.refunded")
        );
        assert_eq!(
            (
                dispute.order_status(),
                dispute.void_reason(),
                dispute.topic()
            ),
            ("DISPUTED", "disputed", "order.disputed")
        );
        assert_eq!(refund.reference(), "charge:ch_1");
        assert_eq!(dispute.reference(), "dp_1");
    }

    #[test]
    fn a_reversal_changes_only_what_its_attempt_allows() {
        let full = Reversal::Refund {
            reference: "r".into(),
            full: true,
        };
        let partial = Reversal::Refund {
            reference: "r".into(),
            full: false,
        };
        let dispute = Reversal::Dispute {
            reference: "d".into(),
        };
        use AttemptStatus as S;
        use ReversalStep as R;
        assert_eq!(reversal_step(S::RefundPending, &full), R::RecordRefund);
        // Part of money owed back: the rest is still owed (booking refunds it).
        assert_eq!(reversal_step(S::RefundPending, &partial), R::Partial);
        assert_eq!(reversal_step(S::RefundPending, &dispute), R::StopRefund);
        assert_eq!(reversal_step(S::Succeeded, &full), R::ReverseOrder);
        assert_eq!(reversal_step(S::Succeeded, &dispute), R::ReverseOrder);
        assert_eq!(reversal_step(S::Succeeded, &partial), R::Partial);
        // Reversed or refunded before: every repeat is a no-op.
        for s in [S::Refunded, S::Pending, S::Declined, S::Failed] {
            for r in [&full, &partial, &dispute] {
                assert_eq!(reversal_step(s, r), R::Nothing, "{s:?} {r:?}");
            }
        }
    }
}

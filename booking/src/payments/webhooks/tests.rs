use super::*;

#[test]
fn payment_outcomes_name_their_attempt_and_intent() {
    let ok = json!({"id": "pi_1", "metadata": {"payment_id": "pay_1"}});
    assert_eq!(
        classify("payment_intent.succeeded", &ok),
        Incoming::Outcome {
            payment_id: "pay_1".into(),
            intent_id: "pi_1".into(),
            declined: None
        }
    );
    let failed = json!({"id": "pi_1", "metadata": {"payment_id": "pay_1"},
                        "last_payment_error": {"decline_code": "insufficient_funds"}});
    assert_eq!(
        classify("payment_intent.payment_failed", &failed),
        Incoming::Outcome {
            payment_id: "pay_1".into(),
            intent_id: "pi_1".into(),
            declined: Some("insufficient_funds".into())
        }
    );
    assert!(matches!(
        classify("payment_intent.payment_failed", &ok),
        Incoming::Outcome { declined: Some(code), .. } if code == "generic_decline"
    ));
    // Not ours (no payment_id) or no intent id: ignored.
    assert_eq!(
        classify("payment_intent.succeeded", &json!({"id": "pi_1"})),
        Incoming::Ignored
    );
    assert_eq!(
        classify(
            "payment_intent.succeeded",
            &json!({"metadata": {"payment_id": "pay_1"}})
        ),
        Incoming::Ignored
    );
}

#[test]
fn reversals_name_their_intent() {
    let full = json!({"id": "ch_1", "payment_intent": "pi_1", "amount": 100,
                      "amount_refunded": 100});
    assert_eq!(
        classify("charge.refunded", &full),
        Incoming::Reversal {
            intent_id: "pi_1".into(),
            reversal: Reversal::Refund {
                reference: "charge:ch_1".into(),
                full: true
            }
        }
    );
    let partial = json!({"id": "ch_1", "payment_intent": "pi_1", "amount": 100,
                         "amount_refunded": 40, "refunded": false});
    assert!(matches!(
        classify("charge.refunded", &partial),
        Incoming::Reversal {
            reversal: Reversal::Refund { full: false, .. },
            ..
        }
    ));
    let dispute = json!({"id": "dp_1", "payment_intent": "pi_1"});
    assert_eq!(
        classify("charge.dispute.created", &dispute),
        Incoming::Reversal {
            intent_id: "pi_1".into(),
            reversal: Reversal::Dispute {
                reference: "dp_1".into()
            }
        }
    );
    for object in [
        json!({"id": "dp_1"}),
        json!({"id": "dp_1", "payment_intent": ""}),
        json!({"id": "dp_1", "payment_intent": "p".repeat(256)}),
    ] {
        assert_eq!(
            classify("charge.dispute.created", &object),
            Incoming::Ignored
        );
    }
}

#[test]
fn other_event_types_are_ignored() {
    let object = json!({"id": "pi_1", "metadata": {"payment_id": "pay_1"}});
    for kind in [
        "payment_intent.created",
        "charge.succeeded",
        "customer.created",
        "",
    ] {
        assert_eq!(classify(kind, &object), Incoming::Ignored, "{kind}");
    }
}

#[test]
fn answers_keep_their_bodies_and_labels() {
    assert_eq!(Answer::Applied.body(), json!({"received": true}));
    assert_eq!(
        Answer::Duplicate.body(),
        json!({"received": true, "duplicate": true})
    );
    assert_eq!(
        Answer::Ignored.body(),
        json!({"received": true, "ignored": true})
    );
    assert_eq!(
        [Answer::Applied, Answer::Duplicate, Answer::Ignored].map(Answer::label),
        ["applied", "duplicate", "ignored"]
    );
}

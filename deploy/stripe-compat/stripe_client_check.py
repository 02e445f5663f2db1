"""Stripe's official Python library (stripe==16.1.0, pinned in requirements.txt) against the
sandbox: it must work unchanged, for the calls the sandbox serves, and what it does not serve
must be Stripe's JSON error. Run by deploy/sandbox-provider/tests/stripe_python.rs,
which starts the sandbox and passes SANDBOX_URL and SANDBOX_KEY. Exits non-zero on the
first failed check; prints one line per check and a closing "N passed, 0 failed"."""

import os
import sys
import uuid

import stripe

stripe.api_key = os.environ["SANDBOX_KEY"]
stripe.api_base = os.environ["SANDBOX_URL"]
stripe.max_network_retries = 0

passed = 0


def check(name, cond, detail=""):
    global passed
    if not cond:
        print(f"FAIL {name}: {detail}")
        print(f"{passed} passed, 1 failed")
        sys.exit(1)
    passed += 1
    print(f"ok {name}")


def raises(exc, fn):
    try:
        fn()
    except exc as e:
        return e
    except Exception as e:  # the wrong error class is a failure too
        return e
    return None


run = uuid.uuid4().hex[:8]
card = dict(amount=1000, currency="jpy", payment_method_types=["card"])

# The library pins its own API version and sends it; the sandbox accepts it.
check("api version", stripe.api_version == "2026-10-28.endive", stripe.api_version)

# Create and confirm in one call, with nested metadata and an idempotency key.
pi = stripe.PaymentIntent.create(
    payment_method="pm_card_visa", confirm=True,
    metadata={"order_id": f"py-{run}", "attempt": "1"},
    idempotency_key=f"py-{run}-1", **card)
check("create+confirm succeeds", pi.status == "succeeded", pi)
check("is a PaymentIntent", isinstance(pi, stripe.PaymentIntent) and pi.object == "payment_intent")
check("has its charge", (pi.latest_charge or "").startswith("ch_"), pi.latest_charge)
check("metadata round-trips", pi.metadata["order_id"] == f"py-{run}", pi.metadata)

# Create, then confirm separately.
pending = stripe.PaymentIntent.create(payment_method="pm_card_mastercard", **card)
check("create without confirm", pending.status == "requires_confirmation", pending.status)
confirmed = stripe.PaymentIntent.confirm(pending.id)
check("confirm succeeds", confirmed.status == "succeeded", confirmed.status)
again = raises(stripe.InvalidRequestError, lambda: stripe.PaymentIntent.confirm(pending.id))
check("second confirm refused", isinstance(again, stripe.InvalidRequestError)
      and again.code == "payment_intent_unexpected_state", repr(again))

# Retrieve.
got = stripe.PaymentIntent.retrieve(pi.id)
check("retrieve", got.id == pi.id and got.status == "succeeded" and got.amount == 1000, got)
missing = raises(stripe.InvalidRequestError, lambda: stripe.PaymentIntent.retrieve("pi_nope"))
check("retrieve unknown is 404", isinstance(missing, stripe.InvalidRequestError)
      and missing.http_status == 404 and missing.code == "resource_missing", repr(missing))

# Refund, once.
refund = stripe.Refund.create(payment_intent=pi.id, idempotency_key=f"py-{run}-r")
check("refund", isinstance(refund, stripe.Refund) and refund.status == "succeeded"
      and refund.amount == 1000 and refund.payment_intent == pi.id, refund)
replayed = stripe.Refund.create(payment_intent=pi.id, idempotency_key=f"py-{run}-r")
check("refund replay is the same refund", replayed.id == refund.id, replayed)
twice = raises(stripe.InvalidRequestError, lambda: stripe.Refund.create(payment_intent=pi.id))
check("second refund refused", isinstance(twice, stripe.InvalidRequestError)
      and twice.code == "charge_already_refunded", repr(twice))
check("intent shows the refund", stripe.PaymentIntent.retrieve(pi.id).amount_refunded == 1000)

# Partial refunds, as Stripe takes them: several per charge up to the captured amount.
part = stripe.PaymentIntent.create(payment_method="pm_card_visa", confirm=True, **card)
first_refund = stripe.Refund.create(payment_intent=part.id, amount=300,
                                    idempotency_key=f"py-{run}-p1")
check("partial refund", first_refund.status == "succeeded" and first_refund.amount == 300,
      first_refund)
again = stripe.Refund.create(payment_intent=part.id, amount=300, idempotency_key=f"py-{run}-p1")
check("partial refund replay is the same refund", again.id == first_refund.id, again)
second_refund = stripe.Refund.create(payment_intent=part.id, amount=500)
check("second partial refund", second_refund.amount == 500
      and second_refund.id != first_refund.id, second_refund)
check("intent sums its partial refunds",
      stripe.PaymentIntent.retrieve(part.id).amount_refunded == 800)
too_much = raises(stripe.InvalidRequestError,
                  lambda: stripe.Refund.create(payment_intent=part.id, amount=201))
check("more than is left refused on amount", isinstance(too_much, stripe.InvalidRequestError)
      and too_much.param == "amount", repr(too_much))
rest = stripe.Refund.create(payment_intent=part.id, amount=200)
check("the rest refunded", rest.amount == 200, rest)
nothing_left = raises(stripe.InvalidRequestError,
                      lambda: stripe.Refund.create(payment_intent=part.id, amount=1))
check("nothing left: charge_already_refunded", isinstance(nothing_left, stripe.InvalidRequestError)
      and nothing_left.code == "charge_already_refunded", repr(nothing_left))
check("intent fully refunded", stripe.PaymentIntent.retrieve(part.id).amount_refunded == 1000)

# Decline: a CardError with the decline code and the declined intent.
declined = raises(stripe.CardError, lambda: stripe.PaymentIntent.create(
    payment_method="pm_card_chargeDeclinedInsufficientFunds", confirm=True, **card))
check("decline raises CardError", isinstance(declined, stripe.CardError), repr(declined))
check("decline code", declined.code == "card_declined"
      and declined.error.decline_code == "insufficient_funds", declined.error)
check("402", declined.http_status == 402, declined.http_status)
check("declined intent carried", declined.error.payment_intent.status == "requires_payment_method",
      declined.error.payment_intent)

# 3-D Secure and processing: not paid.
action = stripe.PaymentIntent.create(payment_method="pm_card_authenticationRequired",
                                     confirm=True, **card)
check("3-D Secure requires action", action.status == "requires_action"
      and action.next_action.type == "use_stripe_sdk", action)
processing = stripe.PaymentIntent.create(payment_method="pm_card_sandbox_processing",
                                         confirm=True, **card)
check("processing", processing.status == "processing", processing.status)

# Idempotent replay: same key and parameters → the same object; other parameters → error.
key = f"py-{run}-idem"
first = stripe.PaymentIntent.create(payment_method="pm_card_visa", confirm=True,
                                    idempotency_key=key, **card)
second = stripe.PaymentIntent.create(payment_method="pm_card_visa", confirm=True,
                                     idempotency_key=key, **card)
check("replay returns the same intent", first.id == second.id, (first.id, second.id))
other = raises(stripe.IdempotencyError, lambda: stripe.PaymentIntent.create(
    payment_method="pm_card_visa", confirm=True, idempotency_key=key,
    amount=2000, currency="jpy", payment_method_types=["card"]))
check("same key, other params refused", isinstance(other, stripe.IdempotencyError), repr(other))

# Update (metadata merged, "" deletes), list with auto-paging, refund retrieve and list, and
# Stripe's JSON error for what the sandbox does not serve (the twin of the Node checks).
draft = stripe.PaymentIntent.create(payment_method="pm_card_visa",
                                    metadata={"keep": "k", "drop": "d"}, **card)
modified = stripe.PaymentIntent.modify(draft.id, amount=1200, metadata={"drop": "", "added": "a"})
check("modify", modified.amount == 1200
      and modified.metadata.to_dict() == {"keep": "k", "added": "a"}, modified)
listed = stripe.PaymentIntent.list(limit=2)
check("list newest first", listed.object == "list" and [i.id for i in listed.data][0] == draft.id
      and listed.has_more, listed)
every = [i.id for i in stripe.PaymentIntent.list(limit=3).auto_paging_iter()]
check("auto-paging visits each intent once", len(set(every)) == len(every)
      and {pi.id, part.id, draft.id} <= set(every), every)
check("refund retrieve", stripe.Refund.retrieve(refund.id).id == refund.id)
part_refunds = [r.id for r in stripe.Refund.list(payment_intent=part.id).data]
check("refund list of one intent, newest first", part_refunds == [rest.id, second_refund.id,
                                                                     first_refund.id], part_refunds)
customer = raises(stripe.InvalidRequestError, lambda: stripe.Customer.retrieve("cus_x"))
check("unknown resource: InvalidRequestError", isinstance(customer, stripe.InvalidRequestError)
      and customer.http_status == 404
      and str(customer.user_message).startswith("Unrecognized request URL"), repr(customer))

# Bad input and a bad key: Stripe's error classes.
unknown = raises(stripe.InvalidRequestError, lambda: stripe.PaymentIntent.create(
    payment_method="pm_card_visa", colour="red", **card))
check("unknown parameter named", isinstance(unknown, stripe.InvalidRequestError)
      and unknown.param == "colour", repr(unknown))
negative = raises(stripe.InvalidRequestError, lambda: stripe.PaymentIntent.create(
    amount=-5, currency="jpy", payment_method="pm_card_visa"))
check("negative amount refused", isinstance(negative, stripe.InvalidRequestError)
      and negative.param == "amount", repr(negative))
bad_key = raises(stripe.AuthenticationError,
                 lambda: stripe.PaymentIntent.retrieve(pi.id, api_key="sk_test_wrong"))
check("wrong key", isinstance(bad_key, stripe.AuthenticationError), repr(bad_key))

# The client-object API of the same library.
client = stripe.StripeClient(os.environ["SANDBOX_KEY"], base_addresses={"api": stripe.api_base},
                             max_network_retries=0)
via_client = client.v1.payment_intents.retrieve(pi.id)
check("StripeClient retrieve", via_client.id == pi.id, via_client)

print(f"{passed} passed, 0 failed")

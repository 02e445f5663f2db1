// Stripe's official Node library (npm `stripe` 23.2.0, pinned in deploy/node/package.json)
// against the sandbox: it must work unchanged, as the Python library does
// (stripe_client_check.py, the same checks), for every call the sandbox serves (PaymentIntents
// create/retrieve/update/confirm/cancel/list/search, Refunds create/retrieve/list), and what it
// does not serve must be Stripe's JSON error. Run with `node` by
// deploy/sandbox-provider/tests/stripe_node.rs, which starts the sandbox and passes SANDBOX_URL,
// SANDBOX_KEY and FLOODGATE_TEST_NODE_MODULES (the folder `deploy/node/install.sh` filled).
// Exits non-zero on the first failed check; prints one line per check and a closing
// "N passed, 0 failed".
import { createRequire } from "node:module";
import { randomUUID } from "node:crypto";
import { join } from "node:path";

// The tools live outside this folder (.stack/node/node_modules); an ES module import would not
// look there, so resolve from that folder explicitly.
const modules = process.env.FLOODGATE_TEST_NODE_MODULES;
if (!modules) {
  console.error("FLOODGATE_TEST_NODE_MODULES is not set (run deploy/node/install.sh)");
  process.exit(2);
}
const require = createRequire(join(modules, "..", "resolve-from-here.js"));
const Stripe = require("stripe");

const url = new URL(process.env.SANDBOX_URL);
const KEY = process.env.SANDBOX_KEY;
const stripe = new Stripe(KEY, {
  protocol: url.protocol.replace(":", ""),
  host: url.hostname,
  port: Number(url.port),
  maxNetworkRetries: 0,
  telemetry: false,
});

let passed = 0;

function check(name, cond, detail = "") {
  if (!cond) {
    console.log(`FAIL ${name}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
    console.log(`${passed} passed, 1 failed`);
    process.exit(1);
  }
  passed += 1;
  console.log(`ok ${name}`);
}

// The error a call rejects with, or null when it resolves (then the check fails).
async function raises(fn) {
  try {
    await fn();
  } catch (e) {
    return e;
  }
  return null;
}

const show = (e) => (e ? `${e.type} ${e.statusCode} ${e.code} ${e.param} ${e.message}` : "no error");

const run = randomUUID().slice(0, 8);
const card = { amount: 1000, currency: "jpy", payment_method_types: ["card"] };

check("library version", Stripe.PACKAGE_VERSION === "23.2.0", Stripe.PACKAGE_VERSION);
// The library sends its pinned API version; the sandbox accepts any well-formed one.
check("api version is sent", /^\d{4}-\d{2}-\d{2}\.[a-z]+$/.test(Stripe.API_VERSION), Stripe.API_VERSION);

// Create and confirm in one call, with nested metadata and an idempotency key.
const pi = await stripe.paymentIntents.create(
  { payment_method: "pm_card_visa", confirm: true, metadata: { order_id: `node-${run}`, attempt: "1" }, ...card },
  { idempotencyKey: `node-${run}-1` },
);
check("create+confirm succeeds", pi.status === "succeeded", pi);
check("is a PaymentIntent", pi.object === "payment_intent" && pi.id.startsWith("pi_"), pi);
check("has its charge", (pi.latest_charge || "").startsWith("ch_"), String(pi.latest_charge));
check("metadata round-trips", pi.metadata.order_id === `node-${run}` && pi.metadata.attempt === "1", pi.metadata);

// Create, then confirm separately.
const pending = await stripe.paymentIntents.create({ payment_method: "pm_card_mastercard", ...card });
check("create without confirm", pending.status === "requires_confirmation", pending.status);
const confirmed = await stripe.paymentIntents.confirm(pending.id);
check("confirm succeeds", confirmed.status === "succeeded", confirmed.status);
const again = await raises(() => stripe.paymentIntents.confirm(pending.id));
check("second confirm refused", again instanceof Stripe.errors.StripeInvalidRequestError
  && again.code === "payment_intent_unexpected_state", show(again));

// Retrieve.
const got = await stripe.paymentIntents.retrieve(pi.id);
check("retrieve", got.id === pi.id && got.status === "succeeded" && got.amount === 1000, got);
const missing = await raises(() => stripe.paymentIntents.retrieve("pi_nope"));
check("retrieve unknown is 404", missing instanceof Stripe.errors.StripeInvalidRequestError
  && missing.statusCode === 404 && missing.code === "resource_missing", show(missing));

// Refund, once.
const refund = await stripe.refunds.create({ payment_intent: pi.id }, { idempotencyKey: `node-${run}-r` });
check("refund", refund.object === "refund" && refund.status === "succeeded"
  && refund.amount === 1000 && refund.payment_intent === pi.id, refund);
const replayed = await stripe.refunds.create({ payment_intent: pi.id }, { idempotencyKey: `node-${run}-r` });
check("refund replay is the same refund", replayed.id === refund.id, replayed);
const twice = await raises(() => stripe.refunds.create({ payment_intent: pi.id }));
check("second refund refused", twice instanceof Stripe.errors.StripeInvalidRequestError
  && twice.code === "charge_already_refunded", show(twice));
check("intent shows the refund", (await stripe.paymentIntents.retrieve(pi.id)).amount_refunded === 1000);

// Partial refunds up to the captured amount.
const part = await stripe.paymentIntents.create({ payment_method: "pm_card_visa", confirm: true, ...card });
const first = await stripe.refunds.create({ payment_intent: part.id, amount: 300 }, { idempotencyKey: `node-${run}-p1` });
check("partial refund", first.status === "succeeded" && first.amount === 300, first);
const firstAgain = await stripe.refunds.create({ payment_intent: part.id, amount: 300 }, { idempotencyKey: `node-${run}-p1` });
check("partial refund replay is the same refund", firstAgain.id === first.id, firstAgain);
const second = await stripe.refunds.create({ payment_intent: part.id, amount: 500 });
check("second partial refund", second.amount === 500 && second.id !== first.id, second);
check("intent sums its partial refunds", (await stripe.paymentIntents.retrieve(part.id)).amount_refunded === 800);
const tooMuch = await raises(() => stripe.refunds.create({ payment_intent: part.id, amount: 201 }));
check("more than is left refused on amount", tooMuch instanceof Stripe.errors.StripeInvalidRequestError
  && tooMuch.param === "amount", show(tooMuch));
const rest = await stripe.refunds.create({ payment_intent: part.id, amount: 200 });
check("the rest refunded", rest.amount === 200, rest);
const nothingLeft = await raises(() => stripe.refunds.create({ payment_intent: part.id, amount: 1 }));
check("nothing left: charge_already_refunded", nothingLeft instanceof Stripe.errors.StripeInvalidRequestError
  && nothingLeft.code === "charge_already_refunded", show(nothingLeft));

// Decline: a StripeCardError with the decline code and the declined intent.
const declined = await raises(() => stripe.paymentIntents.create({
  payment_method: "pm_card_chargeDeclinedInsufficientFunds", confirm: true, ...card,
}));
check("decline raises StripeCardError", declined instanceof Stripe.errors.StripeCardError, show(declined));
check("decline code", declined.code === "card_declined" && declined.decline_code === "insufficient_funds", show(declined));
check("402", declined.statusCode === 402, String(declined.statusCode));
check("declined intent carried", declined.payment_intent?.status === "requires_payment_method",
  declined.payment_intent ?? "none");

// 3-D Secure and processing: not paid.
const action = await stripe.paymentIntents.create({ payment_method: "pm_card_authenticationRequired", confirm: true, ...card });
check("3-D Secure requires action", action.status === "requires_action"
  && action.next_action?.type === "use_stripe_sdk", action);
const processing = await stripe.paymentIntents.create({ payment_method: "pm_card_sandbox_processing", confirm: true, ...card });
check("processing", processing.status === "processing", processing.status);

// Idempotent replay: same key and parameters give the same object; other parameters an error.
const key = `node-${run}-idem`;
const idem1 = await stripe.paymentIntents.create({ payment_method: "pm_card_visa", confirm: true, ...card }, { idempotencyKey: key });
const idem2 = await stripe.paymentIntents.create({ payment_method: "pm_card_visa", confirm: true, ...card }, { idempotencyKey: key });
check("replay returns the same intent", idem1.id === idem2.id, `${idem1.id} ${idem2.id}`);
const other = await raises(() => stripe.paymentIntents.create(
  { payment_method: "pm_card_visa", confirm: true, ...card, amount: 2000 }, { idempotencyKey: key },
));
check("same key, other params refused", other instanceof Stripe.errors.StripeIdempotencyError, show(other));

// Update, with Stripe's merge semantics for metadata (a key set to "" is deleted); the amount
// can change until money is taken, never after.
const upd = await stripe.paymentIntents.create({
  payment_method: "pm_card_visa", metadata: { order_id: `node-${run}-u`, keep: "k", drop: "d" }, ...card,
});
const updated = await stripe.paymentIntents.update(upd.id, {
  amount: 1500, description: "two seats", metadata: { drop: "", added: "a" },
});
check("update", updated.object === "payment_intent" && updated.id === upd.id && updated.amount === 1500
  && updated.description === "two seats" && updated.status === "requires_confirmation", updated);
check("update merges metadata", updated.metadata.keep === "k" && updated.metadata.added === "a"
  && !("drop" in updated.metadata) && updated.metadata.order_id === `node-${run}-u`, updated.metadata);
const updPaid = await stripe.paymentIntents.confirm(upd.id);
check("confirmed at the updated amount", updPaid.status === "succeeded" && updPaid.amount_received === 1500, updPaid);
const late = await raises(() => stripe.paymentIntents.update(upd.id, { amount: 1 }));
check("amount fixed once succeeded", late instanceof Stripe.errors.StripeInvalidRequestError
  && late.statusCode === 400 && late.code === "payment_intent_unexpected_state" && late.param === "amount", show(late));
const noted = await stripe.paymentIntents.update(upd.id, { metadata: { note: "x" } });
check("metadata still updatable after success", noted.metadata.note === "x" && noted.amount === 1500, noted);
const updMissing = await raises(() => stripe.paymentIntents.update("pi_nope", { metadata: { a: "b" } }));
check("update unknown is 404", updMissing instanceof Stripe.errors.StripeInvalidRequestError
  && updMissing.statusCode === 404 && updMissing.code === "resource_missing", show(updMissing));

// Cancel an intent left waiting for 3-D Secure.
const waiting = await stripe.paymentIntents.create({ payment_method: "pm_card_authenticationRequired", confirm: true, ...card });
const canceled = await stripe.paymentIntents.cancel(waiting.id, { cancellation_reason: "abandoned" });
check("cancel", canceled.status === "canceled" && canceled.cancellation_reason === "abandoned", canceled);

// List: Stripe's list object, newest first, paged by the library's own auto-pagination.
const listed = await stripe.paymentIntents.list({ limit: 2 });
check("list", listed.object === "list" && listed.url === "/v1/payment_intents" && listed.data.length === 2
  && listed.has_more === true, listed);
check("list is newest first", listed.data[0].id === waiting.id && listed.data[1].id === upd.id,
  listed.data.map((i) => i.id));
const every = await stripe.paymentIntents.list({ limit: 3 }).autoPagingToArray({ limit: 1000 });
const everyIds = every.map((i) => i.id);
check("auto-pagination visits each intent once", new Set(everyIds).size === everyIds.length
  && [pi, pending, part, action, processing, upd, waiting].every((i) => everyIds.includes(i.id)), everyIds);
check("auto-pagination keeps newest first", every.every((i, n) => n === 0 || every[n - 1].created >= i.created));
const newer = await stripe.paymentIntents.list({ ending_before: pi.id, limit: 2 });
check("ending_before pages towards newer", newer.data.map((i) => i.id).join() === [part.id, pending.id].join()
  && newer.has_more === true, newer.data.map((i) => i.id));
const badCursor = await raises(() => stripe.paymentIntents.list({ starting_after: "pi_nope" }));
check("unknown cursor named", badCursor instanceof Stripe.errors.StripeInvalidRequestError
  && badCursor.code === "resource_missing" && badCursor.param === "starting_after", show(badCursor));
const badLimit = await raises(() => stripe.paymentIntents.list({ limit: 101 }));
check("limit above 100 refused", badLimit instanceof Stripe.errors.StripeInvalidRequestError
  && badLimit.param === "limit", show(badLimit));

// Search by metadata, as booking's reconciliation does.
const found = await stripe.paymentIntents.search({ query: `metadata['order_id']:'node-${run}-u'` });
check("search", found.object === "search_result" && found.data.length === 1 && found.data[0].id === upd.id,
  found.data.map((i) => i.id));

// Refunds: retrieve and list (all, or one intent's).
const gotRefund = await stripe.refunds.retrieve(refund.id);
check("refund retrieve", gotRefund.object === "refund" && gotRefund.id === refund.id
  && gotRefund.amount === 1000 && gotRefund.payment_intent === pi.id, gotRefund);
const noRefund = await raises(() => stripe.refunds.retrieve("re_nope"));
check("refund retrieve unknown is 404", noRefund instanceof Stripe.errors.StripeInvalidRequestError
  && noRefund.statusCode === 404 && noRefund.code === "resource_missing", show(noRefund));
const partRefunds = await stripe.refunds.list({ payment_intent: part.id });
check("refund list of one intent, newest first", partRefunds.object === "list" && partRefunds.url === "/v1/refunds"
  && partRefunds.data.map((r) => r.id).join() === [rest.id, second.id, first.id].join()
  && partRefunds.has_more === false, partRefunds.data.map((r) => r.id));
const allRefunds = await stripe.refunds.list({ limit: 2 }).autoPagingToArray({ limit: 1000 });
check("refund list pages through every refund", allRefunds.map((r) => r.id).sort().join()
  === [refund.id, first.id, second.id, rest.id].sort().join(), allRefunds.map((r) => r.id));

// What the sandbox does not serve is Stripe's JSON error, not a bare 404 the library cannot
// read ("Invalid JSON received from the Stripe API").
const customer = await raises(() => stripe.customers.retrieve("cus_x"));
check("unknown resource: StripeInvalidRequestError", customer instanceof Stripe.errors.StripeInvalidRequestError
  && customer.statusCode === 404
  && customer.message.startsWith("Unrecognized request URL (GET: /v1/customers/cus_x)."), show(customer));
const wrongMethod = await raises(() => stripe.rawRequest("DELETE", `/v1/payment_intents/${pi.id}`));
check("wrong method: StripeInvalidRequestError", wrongMethod instanceof Stripe.errors.StripeInvalidRequestError
  && wrongMethod.statusCode === 404
  && wrongMethod.message.startsWith(`Unrecognized request URL (DELETE: /v1/payment_intents/${pi.id}).`), show(wrongMethod));

// Bad input and a bad key: Stripe's error classes.
const unknown = await raises(() => stripe.paymentIntents.create({ payment_method: "pm_card_visa", colour: "red", ...card }));
check("unknown parameter named", unknown instanceof Stripe.errors.StripeInvalidRequestError
  && unknown.param === "colour", show(unknown));
const negative = await raises(() => stripe.paymentIntents.create({ amount: -5, currency: "jpy", payment_method: "pm_card_visa" }));
check("negative amount refused", negative instanceof Stripe.errors.StripeInvalidRequestError
  && negative.param === "amount", show(negative));
const badKey = await raises(() => stripe.paymentIntents.retrieve(pi.id, {}, { apiKey: "sk_test_wrong" }));
check("wrong key", badKey instanceof Stripe.errors.StripeAuthenticationError, show(badKey));

console.log(`${passed} passed, 0 failed`);

#!/usr/bin/env python3
"""Builds Floodgate's OpenAPI 3.1 documents (issue 18) from one description:

  docs/openapi/booking.json        booking (GET /openapi.json on booking's listener)

(the gateway's two documents are generated from its code: gateway/src/openapi.rs)

The processes serve the committed files (include_str!), so what they serve is what is
reviewed. `build.py --check` fails when a committed file differs from what this script
builds; booking's tests fail when a route is missing from booking.json; the schemathesis run
(deploy/tests/openapi.sh) fails when the running stack answers outside the documents.

Written as Python so the shared pieces (the error body, the usual refusals, the auth
schemes) are defined once; the output is plain JSON.
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "openapi"
VERSION = "0.2.0"

# ---------------------------------------------------------------- building blocks

def ref(name):
    return {"$ref": f"#/components/schemas/{name}"}


def obj(props, required=(), extra=True, desc=None):
    s = {"type": "object", "properties": props}
    if required:
        s["required"] = list(required)
    if not extra:
        s["additionalProperties"] = False
    if desc:
        s["description"] = desc
    return s


def arr(items, **kw):
    return {"type": "array", "items": items, **kw}


S = {"type": "string"}
I = {"type": "integer"}
B = {"type": "boolean"}
TS = {"type": "string", "format": "date-time"}
MONEY = {"type": "integer", "minimum": 0, "description": "integer minor units"}
NULLABLE_S = {"type": ["string", "null"]}
NULLABLE_TS = {"type": ["string", "null"], "format": "date-time"}
SLUG = {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,63}$"}

ERROR_CODES_NOTE = (
    "Every refusal is `{\"code\", \"message\", ...details}` with a stable `code` "
    "(docs/api.md lists them per endpoint)."
)


def error_schema():
    return obj(
        {"code": {"type": "string", "pattern": "^[A-Z][A-Z0-9_]*$"}, "message": S},
        required=("code", "message"),
        desc=ERROR_CODES_NOTE,
    )


REFUSALS = {
    "400": "Malformed request (bad JSON, a missing header such as `Idempotency-Key`)",
    "401": "No valid credentials (`ADMISSION_REQUIRED {reason}` or `UNAUTHORIZED`)",
    "403": "Not allowed (`WRONG_EVENT`, `FORBIDDEN`, ...)",
    "404": "Not found",
    "405": "Method not allowed",
    "409": "Conflict with the current state (the code says which)",
    "413": "Body too large",
    "415": "Not `application/json`",
    "422": "Well-formed but invalid (`VALIDATION_FAILED {field}`, unknown references)",
    "429": "Rate limited (`Retry-After`)",
    "503": "A dependency is unavailable (`Retry-After`)",
}


def err(*codes):
    return {
        c: {"description": REFUSALS.get(c, "Refused"), "content": {"application/json": {"schema": ref("Error")}}}
        for c in codes
    }


def ok(schema, desc="OK", code="200", headers=None):
    r = {"description": desc, "content": {"application/json": {"schema": schema}}}
    if headers:
        r["headers"] = headers
    return {code: r}


def no_content(desc="Done, no body"):
    return {"204": {"description": desc}}


def body(schema, required=True):
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def path_param(name, schema=S, desc=None):
    p = {"name": name, "in": "path", "required": True, "schema": schema}
    if desc:
        p["description"] = desc
    return p


def query(name, schema=S, desc=None):
    p = {"name": name, "in": "query", "required": False, "schema": schema}
    if desc:
        p["description"] = desc
    return p


IDEMPOTENCY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": True,
    "description": "1..=255 visible ASCII characters; the same key replays the first answer",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
}
IDEMPOTENCY_OPTIONAL = dict(
    IDEMPOTENCY, required=False,
    description="Optional; 1..=255 visible ASCII characters; the same key and body replay the first "
                "answer, another body under the key is `422 IDEMPOTENCY_KEY_REUSED`")
ACTOR = {
    "name": "X-Floodgate-Actor",
    "in": "header",
    "required": True,
    "description": "The operator behind an ops change (recorded in the audit log)",
    "schema": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[ -~]+$"},
}


def op(summary, responses, *, tag, params=(), req=None, security=None, desc=None):
    o = {"summary": summary, "tags": [tag], "responses": {}}
    for r in responses:
        o["responses"].update(r)
    if params:
        o["parameters"] = list(params)
    if req is not None:
        o["requestBody"] = req
    if security is not None:
        o["security"] = security
    if desc:
        o["description"] = desc
    return o


ADMIN = [{"admin": []}]
ADMITTED = [{"admission": []}, {"admissionCookie": []}]
IDENTITY = [{"identity": []}]
NONE = []

# ---------------------------------------------------------------- booking

def booking_schemas():
    tier = obj({"tier": S, "price": MONEY}, required=("tier", "price"))
    ga_counts = obj(
        {"tier": S, "capacity": I, "available": I, "held": I, "sold": I, "held_back": I},
        required=("tier", "capacity", "available", "held", "sold"),
    )
    item = obj(
        {
            "kind": {"enum": ["sku", "seat", "ga"]},
            "sku": S, "seat_id": S, "ga_tier": S, "name": S,
            "quantity": I, "unit_price": MONEY, "amount": MONEY,
        },
        required=("kind", "quantity", "unit_price", "amount"),
    )
    order = obj(
        {
            "id": S,
            "status": {"enum": ["PENDING_PAYMENT", "PAID", "EXPIRED", "CANCELLED", "REFUNDED", "DISPUTED"]},
            "source": {"enum": ["cart", "hold"]},
            "hold_id": NULLABLE_S, "event_id": NULLABLE_S,
            "total": MONEY, "currency": S, "items": arr(item),
            "expires_at": TS, "created_at": TS, "paid_at": NULLABLE_TS,
            "tickets": arr({"type": "object"}), "payment": {"type": ["object", "null"]},
        },
        required=("id", "status", "total", "currency", "items"),
    )
    product = obj(
        {
            "sku": S, "event": NULLABLE_S, "name": S, "price": MONEY, "hot": B, "stock_shards": I,
            "stock": I, "available": I, "reserved": I, "sold": I,
        },
        required=("sku", "name", "price", "stock"),
    )
    auction = obj(
        {
            "id": S, "event": NULLABLE_S, "seller": S, "you_sell": B, "title": S,
            "start_price": MONEY, "min_increment": MONEY, "current_price": {"type": ["integer", "null"]},
            "min_next_bid": I, "leader": NULLABLE_S, "you_lead": B, "bid_count": I, "hot": B,
            "status": {"enum": ["OPEN", "CLOSED"]}, "end_time": TS, "extensions": I,
            "max_extensions": I, "created_at": TS, "closed_at": NULLABLE_TS,
        },
        required=("id", "title", "status", "end_time"),
    )
    cart_line = obj({"sku": S, "name": S, "quantity": I, "unit_price": MONEY, "amount": MONEY},
                    required=("sku", "quantity"))
    return {
        "Error": error_schema(),
        "PriceTier": tier,
        "EventCounts": obj(
            {
                "id": S, "name": S, "venue": S, "sale_start": TS, "hold_ttl_s": I,
                "max_tickets_per_account": I, "seats": I, "available": I, "held": I, "sold": I,
                "held_back": I, "refund_stock": {"enum": ["release", "hold_back"]}, "no_orphans": B,
                "ga_tiers": arr(ga_counts),
            },
            required=("id", "name", "sale_start", "seats", "available", "held", "sold", "ga_tiers"),
        ),
        "CreateEvent": obj(
            {
                "id": SLUG,
                "name": {"type": "string", "minLength": 1, "maxLength": 200},
                "venue": {"type": "string", "maxLength": 200},
                "sale_start": TS,
                "hold_ttl_s": {"type": "integer", "minimum": 10, "maximum": 86400, "default": 600},
                "max_tickets_per_account": {"type": "integer", "minimum": 1, "maximum": 100, "default": 4},
                "price_tiers": arr(obj({"tier": S, "price": MONEY}, required=("tier", "price"), extra=False), maxItems=50),
                "seat_map": obj(
                    {
                        "sections": arr(obj(
                            {"name": S, "rows": {"type": "integer", "minimum": 1, "maximum": 100},
                             "seats_per_row": {"type": "integer", "minimum": 1, "maximum": 100}, "price_tier": S},
                            required=("name", "rows", "seats_per_row", "price_tier"), extra=False), maxItems=20),
                        "ranks": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                                  "maxProperties": 200, "description": "seat id → rank (lower is better)"},
                        "seats": arr(obj(
                            {"seat_id": S, "section": S, "row": I, "number": I, "price_tier": S,
                             "rank": {"type": "integer", "minimum": 0}},
                            required=("seat_id", "section", "row", "number", "price_tier"), extra=False), maxItems=200),
                    },
                    extra=False,
                    desc="sections (rows × seats_per_row each, ids `{section}-R{row}-{number}`) or explicit seats; "
                         "at most 200,000 seats (this document bounds the sizes it generates)",
                ),
                "ga_tiers": arr(obj(
                    {"tier": S, "price": MONEY, "capacity": {"type": "integer", "minimum": 0, "maximum": 10000000},
                     "shards": {"type": "integer", "minimum": 1, "maximum": 64}},
                    required=("tier", "price", "capacity"), extra=False), maxItems=20),
                "refund_stock": {"enum": ["release", "hold_back"], "default": "release"},
                "no_orphans": {"type": "boolean", "default": False,
                               "description": "refuse explicit holds that strand a single seat"},
            },
            required=("name", "sale_start"),
            extra=False,
        ),
        "EventCreated": obj({"id": S, "seats": I, "ga_tiers": {}}, required=("id",)),
        "Hold": obj(
            {
                "hold_id": S, "event": S, "kind": {"enum": ["seats", "ga"]}, "seats": arr(S),
                "tier": S, "quantity": I, "held_until": TS, "expires_at": TS, "total": MONEY,
            },
            required=("hold_id", "kind", "expires_at", "total"),
        ),
        "OrderItem": item,
        "Order": order,
        "Product": product,
        "CreateProduct": obj(
            {
                "sku": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"}, "event": S,
                "name": {"type": "string", "minLength": 1, "maxLength": 200}, "price": MONEY,
                "stock": {"type": "integer", "minimum": 0, "maximum": 1000000000}, "hot": B,
                "stock_shards": {"type": "integer", "minimum": 1, "maximum": 64},
            },
            required=("sku", "event", "name", "price", "stock"),
            extra=False,
        ),
        "UpdateProduct": obj(
            {
                "name": {"type": "string", "minLength": 1, "maxLength": 200}, "price": MONEY,
                "stock": {"type": "integer", "minimum": 0, "maximum": 1000000000}, "hot": B, "event": S,
                "stock_shards": {"type": "integer", "minimum": 1, "maximum": 64},
            },
            extra=False,
        ),
        "Cart": obj({"lines": arr(cart_line), "total": MONEY, "currency": S}, required=("lines",)),
        "CartItem": obj({"sku": S, "quantity": I, "lines": arr(cart_line)}, required=("sku", "quantity")),
        "Auction": auction,
        "Bid": obj(
            {
                "bid_id": S, "auction_id": S, "bidder": S, "amount": MONEY,
                "status": {"enum": ["ACCEPTED"]}, "current_price": MONEY, "leader": S, "you_lead": B,
                "placed_at": TS, "end_time": TS, "extended": B,
            },
            required=("bid_id", "auction_id", "amount", "status"),
        ),
    }


def booking_paths():
    ev = path_param("event", desc="event id (a slug)")
    inv, prod, cart, orders, pay, auc, ops, health = (
        "events and seats", "products", "cart", "orders", "payments", "auctions", "ops", "health")
    fan = ("401", "403", "404")
    p = {}
    p["/healthz"] = {"get": op("Liveness", [ok(obj({"status": S}, required=("status",)))], tag=health, security=NONE)}
    ready = obj({"postgres": B, "redis": B, "ready": B}, required=("postgres", "redis", "ready"))
    p["/readyz"] = {"get": op("Readiness (Postgres reachable; Redis reported)",
                              [ok(ready), ok(ready, "Not ready: Postgres unreachable", "503")],
                              tag=health, security=NONE)}
    p["/openapi.json"] = {"get": op("This document", [ok({"type": "object"})], tag=health, security=NONE)}
    p["/admin/events"] = {"post": op(
        "Create an event with its seat map and GA tiers (all or nothing)",
        [ok(ref("EventCreated"), "Created", "201"), err("400", "401", "409", "413", "415", "422")],
        tag=inv, req=body(ref("CreateEvent")), security=ADMIN)}
    p["/admin/events/{event}"] = {
        "get": op("An event's seat and GA counts (one snapshot)",
                  [ok(ref("EventCounts")), err("401", "404")], tag=inv, params=[ev], security=ADMIN),
        "patch": op(
            "Change an event's name, sale start or limits (audited with before/after)",
            [ok(obj({"id": S, "name": S, "sale_start": TS, "hold_ttl_s": I, "max_tickets_per_account": I},
                    required=("id", "name", "sale_start", "hold_ttl_s", "max_tickets_per_account"))),
             err("400", "401", "404", "409", "413", "415", "422")],
            tag=ops, params=[ev, ACTOR], security=ADMIN,
            req=body(obj({
                "name": {"type": "string", "minLength": 1, "maxLength": 200},
                "sale_start": TS,
                "hold_ttl_s": {"type": "integer", "minimum": 10, "maximum": 86400},
                "max_tickets_per_account": {"type": "integer", "minimum": 1, "maximum": 100},
            }, extra=False))),
    }
    p["/admin/products"] = {"post": op(
        "Create a product of an event",
        [ok(ref("Product"), "Created", "201"), err("400", "401", "409", "413", "415", "422")],
        tag=prod, req=body(ref("CreateProduct")), security=ADMIN)}
    sku = path_param("sku")
    p["/admin/products/{sku}"] = {
        "get": op("A product with its stock summed over its rows",
                  [ok(ref("Product")), err("401", "404")], tag=prod, params=[sku], security=ADMIN),
        "put": op("Change a product (absolute values)",
                  [ok(ref("Product")), err("400", "401", "404", "409", "413", "415", "422")],
                  tag=prod, params=[sku], req=body(ref("UpdateProduct")), security=ADMIN),
    }
    p["/admin/products/{sku}/flash/reconcile"] = {"post": op(
        "Reset the flash gate from Postgres",
        [ok(obj({"sku": S, "gate": {"type": ["integer", "null"]}}, required=("sku",))), err("401", "404", "503")],
        tag=prod, params=[sku], security=ADMIN)}
    p["/api/events/{event}"] = {"get": op(
        "The event as the shop shows it", [ok({"type": "object"}), err(*fan)],
        tag=inv, params=[ev], security=ADMITTED)}
    p["/api/events/{event}/seats"] = {"get": op(
        "The full seat map (large: prefer layout + availability)",
        [ok(obj({"event": S, "seats": arr({"type": "object"})}, required=("event", "seats"))),
         {"304": {"description": "Not modified (If-None-Match)"}}, err(*fan)],
        tag=inv, params=[ev], security=ADMITTED)}
    p["/api/events/{event}/seats/layout"] = {"get": op(
        "The compact layout (never changes for an event)",
        [ok(obj({"event": S, "id": S, "format": I, "seats": I, "tiers": arr({"type": "object"}),
                 "sections": arr({"type": "object"})}, required=("event", "id", "format", "seats", "sections"))),
         {"304": {"description": "Not modified"}}, err(*fan)],
        tag=inv, params=[ev], security=ADMITTED)}
    p["/api/events/{event}/seats/availability"] = {"get": op(
        "The compact availability (2 bits per seat, base64)",
        [ok(obj({"event": S, "layout": S, "seats": I, "encoding": {"enum": ["2bit-base64"]}, "data": S},
                required=("event", "layout", "seats", "encoding", "data"))),
         {"304": {"description": "Not modified"}}, err(*fan)],
        tag=inv, params=[ev], security=ADMITTED)}
    best = obj(
        {
            "quantity": {"type": "integer", "minimum": 1, "maximum": 10},
            "section": {"type": "string", "minLength": 1, "maxLength": 32},
            "tiers": arr({"type": "string", "minLength": 1, "maxLength": 32}, minItems=1, maxItems=20),
            "adjacent": {"type": "boolean", "default": True},
        },
        required=("quantity",), extra=False,
        desc="booking picks the best free seats (lowest rank: front rows, centre), never stranding one")
    hold_req = {"oneOf": [
        obj({"seats": arr({"type": "string", "minLength": 1, "maxLength": 64}, minItems=1, maxItems=10)},
            required=("seats",), extra=False),
        obj({"best_available": best}, required=("best_available",), extra=False),
    ]}
    p["/api/events/{event}/holds"] = {"post": op(
        "Hold seats (one conditional statement: all or nothing)",
        [ok(ref("Hold"), "Held", "201"), err("400", "401", "403", "404", "409", "413", "415", "422", "429", "503")],
        tag=inv, params=[ev], req=body(hold_req), security=ADMITTED,
        desc="`409` codes: `SEAT_TAKEN`, `ORPHAN_SEAT {seats}` (events with `no_orphans`), "
             "`NO_SEATS_TOGETHER`, `SOLD_OUT`, `LIMIT_EXCEEDED`, `SALE_NOT_STARTED`.")}
    p["/api/events/{event}/ga-holds"] = {"post": op(
        "Hold general-admission units of a tier",
        [ok(ref("Hold"), "Held", "201"), err("400", "401", "403", "404", "409", "413", "415", "422", "429")],
        tag=inv, params=[ev],
        req=body(obj({"tier": S, "quantity": {"type": "integer", "minimum": 1, "maximum": 100}},
                     required=("tier", "quantity"), extra=False)),
        security=ADMITTED)}
    p["/api/holds/{hold}"] = {"delete": op(
        "Release one's own hold (also when already released or expired)",
        [no_content(), err("401", "404", "409")], tag=inv, params=[path_param("hold")], security=ADMITTED)}
    qty = obj({"quantity": {"type": "integer", "minimum": 0, "maximum": 99}}, required=("quantity",), extra=False)
    for base, deprecated in (("/api/events/{event}/cart", False), ("/api/cart", True)):
        params = [ev] if not deprecated else []
        g = op("The cart at current prices", [ok(ref("Cart")), err(*fan, "503")],
               tag=cart, params=params, security=ADMITTED)
        put = op("Set a line's quantity (0 removes)",
                 [ok(ref("CartItem")), err("400", *fan, "413", "415", "422", "503")],
                 tag=cart, params=params + [sku], req=body(qty), security=ADMITTED)
        dele = op("Remove a line (also when absent)", [no_content(), err(*fan, "503")],
                  tag=cart, params=params + [sku], security=ADMITTED)
        if deprecated:
            for o in (g, put, dele):
                o["deprecated"] = True
                o["description"] = "Alias of the event-scoped path for the token's own event."
        p[base] = {"get": g}
        p[base + "/items/{sku}"] = {"put": put, "delete": dele}
    order_req = {"oneOf": [
        obj({"source": {"const": "cart"}}, required=("source",), extra=False),
        obj({"source": {"const": "hold"}, "hold_id": {"type": "string", "minLength": 1, "maxLength": 64}},
            required=("hold_id",), extra=False),
    ]}
    replay = {"Idempotent-Replayed": {"schema": {"const": "true"}, "description": "a replay of the first answer"}}
    p["/api/orders"] = {"post": op(
        "Order a hold or the cart (reserves inventory; idempotent)",
        [ok(ref("Order"), "Created", "201"), ok(ref("Order"), "The first answer, replayed", headers=replay),
         err("400", "401", "403", "404", "409", "413", "415", "422", "429", "503")],
        tag=orders, params=[IDEMPOTENCY], req=body(order_req), security=ADMITTED)}
    oid = path_param("id")
    p["/api/orders/{id}"] = {"get": op(
        "One's own order", [ok(ref("Order")), err("401", "404")], tag=orders, params=[oid], security=ADMITTED)}
    p["/api/orders/{id}/pay"] = {"post": op(
        "Pay an order (never charges twice)",
        [ok(ref("Order"), "Paid (or already paid)"),
         err("400", "401", "402", "403", "404", "409", "413", "415", "422", "429", "502", "503", "504")],
        tag=pay, params=[oid, IDEMPOTENCY],
        req=body(obj({"payment_method": {"type": "string", "minLength": 1, "maxLength": 255}},
                     required=("payment_method",), extra=False)),
        security=ADMITTED)}
    p["/api/orders/{id}/pay"]["post"]["responses"]["402"]["description"] = "Card declined (`CARD_DECLINED`)"
    for c, d in (("502", "Provider error, outcome unknown"), ("504", "Provider timeout, outcome unknown")):
        p["/api/orders/{id}/pay"]["post"]["responses"][c]["description"] = d
    p["/webhooks/payments"] = {"post": op(
        "A signed payment-provider event (`Stripe-Signature`)",
        [ok(obj({"received": B, "duplicate": B}, required=("received",))), err("400", "413", "503")],
        tag=pay, security=NONE,
        params=[{"name": "Stripe-Signature", "in": "header", "required": True, "schema": S}],
        req=body({"type": "object"}))}
    aid = path_param("id")
    p["/api/auctions"] = {"post": op(
        "Create an auction of the token's event",
        [ok(ref("Auction"), "Created", "201"), ok(ref("Auction"), "Replayed", headers=replay),
         err("400", "401", "403", "409", "413", "415", "422", "503")],
        tag=auc, params=[IDEMPOTENCY],
        req=body(obj({
            "event": S, "title": {"type": "string", "minLength": 1, "maxLength": 200},
            "start_price": {"type": "integer", "minimum": 1, "maximum": 10**15},
            "min_increment": {"type": "integer", "minimum": 1, "maximum": 10**15},
            "end_time": TS, "hot": B, "max_extensions": {"type": "integer", "minimum": 0, "maximum": 1000},
        }, required=("event", "title", "start_price", "min_increment", "end_time"), extra=False)),
        security=ADMITTED)}
    p["/api/auctions/{id}"] = {"get": op(
        "An auction", [ok(ref("Auction")), err("401", "403", "404", "503")], tag=auc, params=[aid], security=ADMITTED)}
    p["/api/auctions/{id}/bids"] = {"post": op(
        "Bid (decided at once; anti-sniping extends the end)",
        [ok(ref("Bid"), "Accepted", "201"), ok(ref("Bid"), "Replayed"),
         err("400", "401", "403", "404", "409", "413", "415", "422", "429", "503")],
        tag=auc, params=[aid, IDEMPOTENCY],
        req=body(obj({"amount": {"type": "integer", "minimum": 1, "maximum": 10**15}}, required=("amount",), extra=False)),
        security=ADMITTED)}
    # Ops: search, detail, audit (ops/), seat kills (inventory/kills).
    cursor = query("cursor", {"type": "string", "minLength": 1, "maxLength": 200},
                   "the `next_cursor` of the previous page (opaque)")
    limit = query("limit", {"type": "integer", "minimum": 1, "maximum": 200, "default": 50})
    statuses = ["PENDING_PAYMENT", "PAID", "EXPIRED", "CANCELLED", "REFUNDED", "DISPUTED"]
    order_line = obj({
        "id": S, "account_id": S, "status": {"enum": statuses}, "source": S, "event_id": S,
        "total": MONEY, "currency": S, "created_at": TS, "updated_at": TS, "paid_at": TS,
    }, required=("id", "account_id", "status", "total", "created_at"))
    p["/admin/orders"] = {"get": op(
        "Search orders (newest first, keyset pages)",
        [ok(obj({"orders": arr(order_line), "next_cursor": S}, required=("orders",))), err("401", "422")],
        tag=ops, security=ADMIN,
        params=[query("account", {"type": "string", "minLength": 1, "maxLength": 200}),
                query("event", {"type": "string", "minLength": 1, "maxLength": 64}),
                query("status", {"enum": statuses}),
                query("created_from", TS), query("created_to", TS), limit, cursor])}
    p["/admin/orders/{id}"] = {"get": op(
        "One order with its payment attempts, provider events, refunds, tickets and audit entries",
        [ok(obj({"order": {"type": "object"}, "payments": arr({"type": "object"}),
                 "provider_events": arr({"type": "object"}), "refunds": arr({"type": "object"}),
                 "ops_refunds": arr({"type": "object"}),
                 "tickets": arr({"type": "object"}), "audit": arr({"type": "object"})},
                required=("order", "payments", "provider_events", "refunds", "ops_refunds", "tickets", "audit"))),
         err("401", "404")],
        tag=ops, params=[oid], security=ADMIN)}
    p["/admin/audit"] = {"get": op(
        "The ops audit log (newest first): who changed what, when",
        [ok(obj({"entries": arr(obj({"id": I, "at": TS, "actor": S, "action": S, "target": S,
                                      "event_id": S, "detail": {}},
                                     required=("id", "at", "actor", "action", "target"))),
                 "next_cursor": S}, required=("entries",))), err("401", "422")],
        tag=ops, security=ADMIN,
        params=[query("event", {"type": "string", "minLength": 1, "maxLength": 64}),
                query("target", {"type": "string", "minLength": 1, "maxLength": 300}),
                query("action", {"type": "string", "minLength": 1, "maxLength": 100}), limit, cursor])}
    seat_ids = arr({"type": "string", "minLength": 1, "maxLength": 64}, minItems=1, maxItems=500)
    kill_answer = obj({"event_id": S, "seats": arr(S), "status": S}, required=("event_id", "seats", "status"))
    kill_errs = err("400", "401", "404", "409", "413", "415", "422")
    release = op("Put killed or held-back seats back on sale (all or nothing)", [ok(kill_answer), kill_errs],
                 tag=ops, params=[ev, ACTOR, IDEMPOTENCY_OPTIONAL], security=ADMIN,
                 req=body(obj({"seats": seat_ids}, required=("seats",), extra=False)))
    p["/admin/events/{event}/seat-kills"] = {
        "post": op("Take free seats out of sale (all or nothing; `409 SEATS_NOT_FREE` names the others)",
                   [ok(kill_answer), kill_errs], tag=ops, params=[ev, ACTOR, IDEMPOTENCY_OPTIONAL],
                   security=ADMIN,
                   req=body(obj({"seats": seat_ids,
                                 "reason": {"enum": ["production", "accessibility", "sponsor", "damaged", "other"]},
                                 "note": {"type": "string", "maxLength": 500}},
                                required=("seats", "reason"), extra=False))),
        "delete": release,
    }
    p["/admin/events/{event}/seat-kills/release"] = {"post": release}
    # GA hold-backs (inventory/holdbacks).
    holdback = obj({
        "id": S, "event_id": S, "tier": S, "quantity": I, "reason": S, "note": NULLABLE_S, "actor": S,
        "status": {"enum": ["active", "released"]}, "created_at": S, "released_at": NULLABLE_S,
        "released_by": NULLABLE_S,
    }, required=("id", "event_id", "tier", "quantity", "status"))
    hb_id = {"name": "id", "in": "path", "required": True, "schema": S}
    p["/admin/events/{event}/ga-holdbacks"] = {
        "post": op("Take units of a GA tier out of sale (all or nothing; `409 SOLD_OUT` when not enough are on sale)",
                   [ok(holdback, "Held back", "201"), ok(holdback, "The first answer replayed"),
                    err("400", "401", "404", "409", "413", "415", "422")],
                   tag=ops, params=[ev, ACTOR, IDEMPOTENCY_OPTIONAL], security=ADMIN,
                   req=body(obj({"tier": {"type": "string", "minLength": 1, "maxLength": 64},
                                 "quantity": {"type": "integer", "minimum": 1, "maximum": 1000000},
                                 "reason": {"enum": ["production", "accessibility", "sponsor", "damaged", "other"]},
                                 "note": {"type": "string", "maxLength": 500}},
                                required=("tier", "quantity", "reason"), extra=False))),
        "get": op("An event's GA hold-backs, newest first", [ok(obj({"holdbacks": arr(holdback)},
                                                                    required=("holdbacks",))),
                                                             err("401", "404")],
                  tag=ops, params=[ev], security=ADMIN),
    }
    p["/admin/events/{event}/ga-holdbacks/{id}/release"] = {"post": op(
        "Put all units of a hold-back back on sale, once (`409 HOLDBACK_RELEASED` after)",
        [ok(holdback), err("400", "401", "404", "409", "422")],
        tag=ops, params=[ev, hb_id, ACTOR, IDEMPOTENCY_OPTIONAL], security=ADMIN)}
    # Fans' own orders.
    p["/api/orders"]["get"] = op(
        "One's own orders (newest first, keyset pages)",
        [ok(obj({"orders": arr({"type": "object"}), "next_cursor": S}, required=("orders",))), err("401", "403", "422")],
        tag=orders, security=ADMITTED,
        params=[query("event", {"type": "string", "minLength": 1, "maxLength": 64}), limit, cursor])
    p["/api/orders/{id}/cancel"] = {"post": op(
        "Cancel one's own pending order (never one whose payment may be under way)",
        [ok(ref("Order")), err("401", "403", "404", "409", "503")],
        tag=orders, params=[oid], security=ADMITTED,
        desc="`409 ORDER_NOT_CANCELLABLE {status}` or `409 PAYMENT_IN_PROGRESS`.")}
    # Ops: refunds and cancellations (payments/ops).
    refund_row = obj({
        "id": S, "order_id": S, "event_id": NULLABLE_S, "amount": MONEY,
        "stock": {"enum": ["release", "kill"]}, "origin": {"enum": ["ops", "event_cancel"]},
        "status": {"enum": ["pending", "succeeded", "failed"]}, "provider_refund_id": NULLABLE_S,
        "actor": S, "reason": NULLABLE_S, "attempts": I,
        "reverses_order": B, "lines": arr(I, description="the order lines this refund takes"),
    }, required=("id", "order_id", "amount", "status", "lines"))
    refunded = obj({"order_id": S, "status": S, "refund": {"anyOf": [refund_row, {"type": "null"}]}},
                   required=("order_id", "status"))
    refund_req = obj({
        "items": arr({"type": "integer", "minimum": 1, "maximum": 2147483647}, minItems=1, maxItems=1000,
                     uniqueItems=True,
                     description="order line numbers to refund (each once); absent: every line not "
                                 "refunded yet"),
        "stock": {"enum": ["release", "kill"], "description": "default: the event's refund_stock"},
        "reason": {"type": "string", "minLength": 1, "maxLength": 500},
    }, extra=False)
    money = ("400", "401", "404", "409", "413", "415", "422", "502", "503")
    p["/admin/orders/{id}/refund"] = {"post": op(
        "Refund a paid order, in full or some of its lines (each line exactly once, whatever races it)",
        [ok(refunded, "Refunded (or the first answer replayed)"), err(*money)],
        tag=ops, params=[oid, ACTOR, IDEMPOTENCY], req=body(refund_req), security=ADMIN)}
    p["/admin/orders/{id}/cancel"] = {"post": op(
        "Cancel an order: a pending one ends like an expiry, a paid one is refunded",
        [ok(refunded), err(*money)],
        tag=ops, params=[oid, ACTOR, IDEMPOTENCY], req=body(refund_req), security=ADMIN)}
    p["/admin/events/{event}/cancel"] = {"post": op(
        "Cancel an event: pending orders end, every paid order is refunded once by a resumable job",
        [ok({"type": "object"}, "Cancelled before: nothing new queued"),
         ok({"type": "object"}, "Cancelled now: refunds queued", "202"),
         err("400", "401", "404", "409", "413", "415", "422")],
        tag=ops, params=[ev, ACTOR],
        req=body(obj({"reason": {"type": "string", "minLength": 1, "maxLength": 500}}, extra=False)),
        security=ADMIN)}
    p["/admin/events/{event}/cancellation"] = {"get": op(
        "The progress of an event's cancellation",
        [ok(obj({
            "event": S, "cancelled": B, "cancelled_at": NULLABLE_TS, "cancelled_by": NULLABLE_S,
            "reason": NULLABLE_S, "paid_remaining": I, "refunds_queued": I, "refunded": I,
            "pending": I, "retrying": I, "failed": I, "done": B,
        }, required=("event", "cancelled", "done"))), err("401", "404")],
        tag=ops, params=[ev], security=ADMIN)}
    return p


def booking_doc():
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Floodgate booking",
            "version": VERSION,
            "description": "The booking core behind the waiting room: holds, carts, orders, payments, "
                           "auctions, ops. Fans reach `/api/…` only through the gateway, with an admission "
                           "token; `/admin/…` takes the admin bearer secret. WebSocket `GET /ws/auctions/{id}` "
                           "and the ops page (`GET /ops/` and its files: HTML, script, styles) are "
                           "described in docs/api.md. " + ERROR_CODES_NOTE,
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "servers": [{"url": "http://127.0.0.1:8090", "description": "the local stack"}],
        "security": ADMITTED,
        "paths": booking_paths(),
        "components": {
            "schemas": booking_schemas(),
            "securitySchemes": {
                "admission": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                              "description": "an admission token from the waiting room"},
                "admissionCookie": {"type": "apiKey", "in": "cookie", "name": "fg_admission"},
                "admin": {"type": "http", "scheme": "bearer", "description": "the admin secret"},
            },
        },
    }

# ---------------------------------------------------------------- gateway
# The gateway's two documents (docs/openapi/gateway.json, gateway-admin.json) are generated
# from its code: `UPDATE_OPENAPI=1 cargo test -p gateway --test openapi` (gateway/src/openapi.rs).


DOCS = {"booking.json": booking_doc}


def render(doc):
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def main(argv):
    check = "--check" in argv
    stale = []
    for name, build in DOCS.items():
        text = render(build())
        path = OUT / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"openapi: stale {', '.join(stale)}: run deploy/openapi/build.py and commit", file=sys.stderr)
        return 1
    print("openapi: " + ("up to date" if check else "written") + f" ({len(DOCS)} documents)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

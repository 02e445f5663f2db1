#!/usr/bin/env python3
"""Builds Floodgate's OpenAPI 3.1 documents (issue 18) from one description:

  docs/openapi/booking.json        booking (GET /openapi.json on booking's listener)
  docs/openapi/gateway.json        the gateway's public listener (GET /openapi.json there)
  docs/openapi/gateway-admin.json  the gateway's admin listener (GET /openapi.json there)

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

GW_READY = obj({"redis": B, "upstream": B}, required=("redis",))

def gateway_doc():
    ev = path_param("event")
    q = "waiting room"
    place = obj({"event": S, "session": S, "kind": {"enum": ["draw", "fifo"]}, "score": {}, "joined_at": {}})
    waiting = obj(
        {
            "event": S,
            "state": {"enum": ["waiting", "admitted", "paused", "closed", "sold_out", "expired"]},
            "new": B, "session": S, "kind": {"enum": ["draw", "fifo"]}, "receipt": S, "status_url": S,
            "poll_after_ms": I, "position": I, "ahead": I, "queue_length": I, "eta_seconds": {"type": ["integer", "null"]},
            "admit_per_minute": {}, "token": S, "expires_at": {}, "expires_in_s": I, "next": S,
            "access": {"enum": ["open", "registered"]},
            "safety_net": {"enum": ["queueing"], "description": "a safety-net room is queueing a surge"},
            "opens_at": {"type": "string", "format": "date-time",
                         "description": "a scheduled change opens the sale then"},
        },
        required=("state",),
    )
    place_hdr = {"name": "X-Floodgate-Place", "in": "header", "required": False, "schema": S,
                 "description": "the place receipt (or the fg_place cookie): answered from gateway memory"}
    pow_body = obj({"pow": obj({"challenge": S, "solution": S}, required=("challenge", "solution"))})
    p = {
        "/healthz": {"get": op("Liveness", [ok({"type": "object"})], tag="health", security=NONE)},
        "/readyz": {"get": op("Readiness (Redis and an upstream reachable)",
                              [ok(GW_READY), ok(GW_READY, "Not ready", "503")], tag="health", security=NONE)},
        "/openapi.json": {"get": op("This document", [ok({"type": "object"})], tag="health", security=NONE)},
        "/dev/login": {"post": op(
            "A development identity token (dev mode only; 404 otherwise)",
            [ok(obj({"account": S, "token": S}, required=("account", "token"))),
             err("400", "404", "413", "415", "422", "429")],
            tag="identity", security=NONE,
            req=body(obj({"account": {"type": "string", "minLength": 1, "maxLength": 200}}, required=("account",))))},
        "/queue/{event}/join": {"post": op(
            "Join the waiting room (the same place again on a repeat)",
            [ok(waiting, "A new place", "201"), ok(waiting, "The same place again"),
             err("400", "401", "403", "404", "409", "413", "415", "429", "503")],
            tag=q, params=[ev], security=IDENTITY, req=body(pow_body, required=False))},
        "/queue/{event}/register": {"post": op(
            "Register for a registered-only room (idempotent; open until registration_closes)",
            [ok(obj({"event": S, "registered": B, "registration_closes": NULLABLE_TS, "join_url": S},
                    required=("event", "registered"))),
             err("401", "404", "409", "413", "429", "503")],
            tag=q, params=[ev], security=IDENTITY,
            desc="`409 REGISTRATION_CLOSED` after `registration_closes` (Redis time) for an account "
                 "not registered before; `409 REGISTRATION_NOT_REQUIRED` in a room open to everyone. "
                 "A join from an account not on a registered room's list is `403 NOT_REGISTERED` "
                 "(`registration_closes`, `registration_open`, `register_url` while open).")},
        "/queue/{event}/status": {"get": op(
            "Position, ETA, or the admission token once admitted",
            [ok(waiting), err("401", "404", "429", "503")], tag=q, params=[ev, place_hdr], security=IDENTITY)},
        "/queue/{event}/draw": {"get": op(
            "The pre-sale draw's commitment and, after the start, its seed",
            [ok(obj({"seed_hash": S, "sale_start": {}, "revealed": B, "seed": {}, "hash": {}, "score": {},
                     "access": {"enum": ["open", "registered"]}, "registered": {}})),
             err("404", "429", "503")],
            tag=q, params=[ev], security=NONE)},
        "/queue/{event}/receipt": {"post": op(
            "Check a place receipt",
            [ok(obj({"valid": B, "place": place}, required=("valid",))), err("400", "404", "413", "415", "422", "429")],
            tag=q, params=[ev], security=NONE,
            req=body(obj({"receipt": S}, required=("receipt",))))},
        "/queue/{event}/challenge": {"get": op(
            "A proof-of-work challenge (when the event requires one)",
            [ok(obj({"challenge": S, "difficulty": I, "algorithm": S})), err("401", "404", "429", "503")],
            tag=q, params=[ev], security=IDENTITY)},
    }
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "Floodgate gateway (public listener)",
            "version": VERSION,
            "description": "The waiting room. Admitted traffic under `/api/…`, `/ws/…` and "
                           "`/webhooks/payments` is forwarded to booking (booking's own document, "
                           "`GET /openapi.json` on booking, describes it). " + ERROR_CODES_NOTE,
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "servers": [{"url": "http://127.0.0.1:8080", "description": "the local stack"}],
        "paths": p,
        "components": {
            "schemas": {"Error": error_schema()},
            "securitySchemes": {
                "identity": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                             "description": "the fan's login (identity) token"},
            },
        },
    }
    return doc


def gateway_admin_doc():
    ev = path_param("event")
    t = "room config"
    change_in = obj({"at": TS, "set": {"type": "object", "description": "a partial room config"}},
                    required=("at", "set"), extra=False)
    auto = {"type": ["object", "null"], "properties": {
        "floor": I, "ceiling": I, "target_p99_ms": I, "max_error_ratio": {"type": "number"}}}
    config = obj(
        {
            "sale_start": TS,
            "admit_per_minute": {"type": "integer", "minimum": 1, "maximum": 1000000},
            "mode": {"enum": ["queue", "paused", "passthrough", "closed", "safety_net"]},
            "max_active": {"type": "integer", "minimum": 0, "maximum": 10000000},
            "token_ttl_s": {"type": "integer", "minimum": 30, "maximum": 86400},
            "max_session_s": {"type": "integer", "minimum": 30, "maximum": 86400},
            "auto": auto,
            "claim_deadline_s": {"type": "integer", "minimum": 10, "maximum": 3600},
            "pow_difficulty": {"type": "integer", "minimum": 0, "maximum": 24},
            "access": {"enum": ["open", "registered"]},
            "registration_closes": {**TS, "description": "required with access registered; not after sale_start"},
            "safety_net": {"type": ["object", "null"], "properties": {
                "arrivals_per_minute": {"type": "integer", "minimum": 1, "maximum": 1000000}},
                "description": "required with mode safety_net"},
            "schedule": arr(change_in, description="when present, the whole pending list; absent keeps it"),
            "queue_shards": {"type": "integer", "minimum": 1, "maximum": 16,
                             "description": "sub-queues the event's queue is split over (default 1); fixed "
                                            "when the room is created (`409 QUEUE_SHARDS_FIXED` for another "
                                            "count); every mode and access works split"},
        },
        required=("sale_start", "admit_per_minute", "mode"),
    )
    change = obj({"id": S, "at": TS, "set": {"type": "object"},
                  "status": {"enum": ["pending", "applied", "cancelled", "failed"]},
                  "scheduled_by": S, "scheduled_at": TS, "edited_by": S, "edited_at": TS,
                  "done_by": S, "done_at": TS, "problems": arr({"type": "object"})},
                 required=("id", "at", "set", "status", "scheduled_by", "scheduled_at"))
    shown = obj({"event": S, "config": {"type": "object"}, "version": {}, "seed_hash": {},
                 "effective_admit_per_minute": {}, "sold_out": B, "schedule": arr(change),
                 "safety_net_state": {"type": ["string", "null"], "enum": ["pass", "queueing", None]},
                 "opens_at": NULLABLE_TS}, required=("event", "config"))
    actor_opt = dict(ACTOR, required=False,
                     description="The operator behind the change (audit log); `unnamed` when absent")
    cid = path_param("id", SLUG, "the change id")
    entry = obj({"id": S, "at": TS, "actor": S, "action": {"enum": [
                     "config.put", "schedule.add", "schedule.edit", "schedule.cancel",
                     "schedule.apply", "schedule.fail", "sold_out", "revoke",
                     "registrations.add", "registrations.remove", "registrations.replace"]},
                 "before": {}, "after": {}, "change": S, "version": I,
                 "schedule_before": {}, "schedule_after": {}},
                required=("id", "at", "actor", "action", "before", "after"))
    p = {
        "/healthz": {"get": op("Liveness", [ok({"type": "object"})], tag="health", security=NONE)},
        "/readyz": {"get": op("Readiness", [ok(GW_READY), ok(GW_READY, "Not ready", "503")],
                              tag="health", security=NONE)},
        "/openapi.json": {"get": op("This document", [ok({"type": "object"})], tag="health", security=NONE)},
        "/admin/events/{event}/config": {
            "get": op("An event's room config", [ok(shown), err("401", "404", "405", "503")], tag=t, params=[ev]),
            "put": op("Set an event's room config (validated whole; nothing applied on a refusal)",
                      [ok(shown), err("400", "401", "404", "405", "409", "413", "415", "422", "503")],
                      tag=t, params=[ev, actor_opt], req=body(config)),
        },
        "/admin/events/{event}/schedule": {
            "get": op("Pending scheduled changes, by time",
                      [ok(obj({"event": S, "pending": arr(change)}, required=("event", "pending"))),
                       err("401", "404", "405", "503")], tag=t, params=[ev]),
            "post": op("Schedule a change (the merged config must validate; nothing stored otherwise)",
                       [ok(change, "Scheduled", "201"),
                        err("400", "401", "404", "405", "413", "415", "422", "503")],
                       tag=t, params=[ev, ACTOR], req=body(change_in)),
        },
        "/admin/events/{event}/schedule/{id}": {
            "get": op("One scheduled change, any status", [ok(change), err("401", "404", "405", "503")],
                      tag=t, params=[ev, cid]),
            "put": op("Edit a pending change (`409 CHANGE_NOT_PENDING` once applied or cancelled)",
                      [ok(change), err("400", "401", "404", "405", "409", "413", "415", "422", "503")],
                      tag=t, params=[ev, cid, ACTOR], req=body(change_in)),
            "delete": op("Cancel a pending change", [ok(change), err("400", "401", "404", "405", "409", "503")],
                         tag=t, params=[ev, cid, ACTOR]),
        },
        "/admin/events/{event}/audit": {"get": op(
            "The config audit log, newest first",
            [ok(obj({"event": S, "entries": arr(entry), "next_before": NULLABLE_S},
                    required=("event", "entries", "next_before"))),
             err("401", "404", "405", "422", "503")],
            tag=t, params=[ev, query("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "default 50"),
                           query("before", S, "`next_before` of the previous page")])},
        "/admin/events/{event}/revoke": {"post": op(
            "Revoke an account's or a session's admission",
            [ok(obj({"revoked": {}, "revoked_at": {}})), err("400", "401", "404", "405", "413", "415", "422", "503")],
            tag=t, params=[ev, actor_opt],
            req=body({"oneOf": [obj({"account": S}, required=("account",)), obj({"session": S}, required=("session",))]}))},
        "/admin/events/{event}/sold_out": {"put": op(
            "Mark an event sold out (or not)",
            [ok({"type": "object"}), err("400", "401", "404", "405", "413", "415", "422", "503")],
            tag=t, params=[ev, actor_opt], req=body(obj({"sold_out": B}, required=("sold_out",))))},
        "/admin/events/{event}/registrations": {
            "put": op(
                "Upload a registration list: one account id per line (text/plain)",
                [ok(obj({"event": S, "mode": {"enum": ["add", "remove", "replace"]}, "accounts": I,
                         "changed": I, "count": I}, required=("event", "mode", "accounts", "count"))),
                 err("400", "401", "404", "405", "413", "415", "422", "503")],
                tag="registrations",
                params=[ev, query("mode", {"enum": ["add", "remove", "replace"]},
                                  "add (default: union), remove, or replace (the list becomes exactly this body)")],
                req={"required": False, "content": {"text/plain": {"schema": S}}},
                desc="Validated whole: any malformed id is `422 INVALID_ACCOUNTS` with the bad line "
                     "numbers and nothing changes. Idempotent. Bounded by "
                     "`gateway.registrations_max_body_bytes` (64 MiB by default; `413` above)."),
            "get": op(
                "How many accounts are on the list (and whether one is)",
                [ok(obj({"event": S, "count": I, "account": S, "registered": B}, required=("event", "count"))),
                 err("401", "404", "405", "422", "503")],
                tag="registrations",
                params=[ev, query("account", S, "an account id to look up")]),
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Floodgate gateway (admin listener)", "version": VERSION,
                 "description": "Ops control of the waiting room. " + ERROR_CODES_NOTE,
                 "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"}},
        "servers": [{"url": "http://127.0.0.1:8081", "description": "the local stack"}],
        "security": ADMIN,
        "paths": p,
        "components": {
            "schemas": {"Error": error_schema()},
            "securitySchemes": {"admin": {"type": "http", "scheme": "bearer", "description": "the admin secret"}},
        },
    }


# booking.json is generated by booking itself from its handlers (utoipa, issue 40;
# booking/tests/api/openapi.rs); booking_doc() above is what it replaced.
DOCS = {"gateway.json": gateway_doc, "gateway-admin.json": gateway_admin_doc}


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

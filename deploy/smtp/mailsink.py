#!/usr/bin/python3
"""Floodgate's local SMTP server: a real SMTP server (Debian's python3-aiosmtpd) that keeps
every message it accepts in a Maildir, and a small HTTP view to read them.

    /usr/bin/python3 deploy/smtp/mailsink.py --smtp-port 2525 --http-port 2580 --maildir DIR
    /usr/bin/python3 deploy/smtp/mailsink.py ... --sink      # count, keep nothing (benchmarks)

Started and stopped by `deploy/stack` (deploy/stack.d/smtp.sh); tests read what arrived over
HTTP (deploy/testkit, `testkit::mail`). It never relays anything anywhere.

Recipient policies, so tests can drive the mailer's error paths through a real SMTP dialogue:
- local part `reject-...`      -> `550 5.1.1` at RCPT TO (a permanent refusal);
- local part `tempfail<N>-...` -> `451 4.3.0` at RCPT TO for the first N attempts to that
  address, then accepted (a temporary refusal that a retry gets past).

HTTP view (127.0.0.1 only):
- `GET /`                             a page listing the messages, newest first;
- `GET /api/messages[?to=ADDR]`       JSON, oldest first: [{"id", "from", "to", "subject",
                                      "message_id", "received_at"}];
- `GET /api/messages/{id}/raw`        the message as received (message/rfc822);
- `GET /api/stats`                    {"accepted", "rejected", "tempfailed", "connections",
                                      "distinct_message_ids"} (since start; a restart counts
                                      the Maildir again, not the refusals).
"""

import argparse
import email.parser
import email.policy
import html
import json
import mailbox
import os
import re
import signal
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP

TEMPFAIL = re.compile(r"^tempfail(\d+)-", re.IGNORECASE)
# Largest message accepted (the mailer's messages with a QR per ticket are far smaller).
MAX_MESSAGE_BYTES = 10 * 1024 * 1024


MESSAGE_ID = re.compile(rb"^message-id:[ \t]*(<[^>\r\n]*>)", re.IGNORECASE | re.MULTILINE)


def message_id_of(raw):
    """The Message-ID header of a message (its header block only), or None."""
    head = raw.split(b"\r\n\r\n", 1)[0]
    m = MESSAGE_ID.search(head)
    return m.group(1).decode("ascii", "replace") if m else None


class Store:
    """What arrived: the Maildir plus an in-memory index, rebuilt from the Maildir at start."""

    def __init__(self, maildir, sink):
        self.sink = sink
        self.lock = threading.Lock()
        self.index = []  # dicts, in order of receipt
        self.stats = {"accepted": 0, "rejected": 0, "tempfailed": 0, "connections": 0, "distinct_message_ids": 0}
        # Every Message-ID seen (kept in sink mode too): a message sent twice shows as
        # accepted > distinct_message_ids.
        self.message_ids = set()
        self.tempfail_seen = {}
        self.box = None
        if not sink:
            # A Maildir's three folders (`create=True` makes them only when `maildir` is new).
            for sub in ("new", "cur", "tmp"):
                os.makedirs(os.path.join(maildir, sub), exist_ok=True)
            self.box = mailbox.Maildir(maildir, create=True)
            for key in self.box.iterkeys():
                try:
                    with open(os.path.join(maildir, "new", key), "rb") as f:
                        raw = f.read()
                except FileNotFoundError:
                    continue
                self.index.append(self.describe(key, raw, os.path.getmtime(os.path.join(maildir, "new", key))))
                self.stats["accepted"] += 1
                mid = message_id_of(raw)
                if mid and mid not in self.message_ids:
                    self.message_ids.add(mid)
                    self.stats["distinct_message_ids"] += 1
            self.index.sort(key=lambda m: (m["received_at"], m["id"]))
        self.maildir = maildir

    @staticmethod
    def describe(key, raw, when, envelope_from=None, envelope_to=None):
        headers = email.parser.BytesHeaderParser(policy=email.policy.default).parsebytes(raw)
        rcpts = envelope_to
        if rcpts is None:
            rcpts = [a.strip() for a in (headers.get("X-Floodgate-Envelope-To") or "").split(",") if a.strip()]
        return {
            "id": key,
            "from": envelope_from or str(headers.get("X-Floodgate-Envelope-From") or headers.get("From") or ""),
            "to": rcpts,
            "subject": str(headers.get("Subject") or ""),
            "message_id": str(headers.get("Message-ID") or ""),
            "received_at": datetime.fromtimestamp(when, timezone.utc).isoformat(timespec="milliseconds"),
        }

    def add(self, envelope):
        mid = message_id_of(envelope.original_content)
        with self.lock:
            self.stats["accepted"] += 1
            if mid and mid not in self.message_ids:
                self.message_ids.add(mid)
                self.stats["distinct_message_ids"] += 1
            if self.sink:
                return
            # The envelope is kept in the stored file (a header above the message), so the
            # view can filter by recipient after a restart too.
            trace = (
                "X-Floodgate-Envelope-From: {}\r\nX-Floodgate-Envelope-To: {}\r\n".format(
                    envelope.mail_from, ", ".join(envelope.rcpt_tos)
                )
            ).encode()
            raw = trace + envelope.original_content
            key = self.box.add(raw)
            self.index.append(self.describe(key, raw, time.time(), envelope.mail_from, list(envelope.rcpt_tos)))

    def list(self, to=None):
        with self.lock:
            items = list(self.index)
        if to:
            to = to.lower()
            items = [m for m in items if any(r.lower() == to for r in m["to"])]
        return items

    def raw(self, key):
        if self.sink or "/" in key or key.startswith("."):
            return None
        for sub in ("new", "cur"):
            path = os.path.join(self.maildir, sub, key)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    return f.read()
        return None


class Handler:
    def __init__(self, store):
        self.store = store

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        local = address.split("@", 1)[0].lower()
        if local.startswith("reject-"):
            with self.store.lock:
                self.store.stats["rejected"] += 1
            return "550 5.1.1 <{}>: mailbox unavailable".format(address)
        m = TEMPFAIL.match(local)
        if m:
            with self.store.lock:
                seen = self.store.tempfail_seen.get(address.lower(), 0)
                if seen < int(m.group(1)):
                    self.store.tempfail_seen[address.lower()] = seen + 1
                    self.store.stats["tempfailed"] += 1
                    return "451 4.3.0 <{}>: try again later".format(address)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.store.add(envelope)
        return "250 2.0.0 Message accepted for delivery"


class CountingSMTP(SMTP):
    def __init__(self, *args, store=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._store = store

    def connection_made(self, transport):
        with self._store.lock:
            self._store.stats["connections"] += 1
        super().connection_made(transport)


class SinkController(Controller):
    def __init__(self, handler, store, **kwargs):
        self._store = store
        super().__init__(handler, **kwargs)

    def factory(self):
        return CountingSMTP(
            self.handler,
            store=self._store,
            data_size_limit=MAX_MESSAGE_BYTES,
            hostname="floodgate-mailsink",
            ident="Floodgate mailsink",
        )


def make_view(store):
    class View(BaseHTTPRequestHandler):
        server_version = "floodgate-mailsink"

        def log_message(self, fmt, *args):  # quiet: the stack's log is for problems
            pass

        def send(self, status, body, ctype):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            url = urlparse(self.path)
            q = parse_qs(url.query)
            if url.path == "/api/messages":
                body = json.dumps(store.list((q.get("to") or [None])[0])).encode()
                return self.send(200, body, "application/json")
            if url.path == "/api/stats":
                with store.lock:
                    body = json.dumps(store.stats).encode()
                return self.send(200, body, "application/json")
            m = re.fullmatch(r"/api/messages/([^/]+)/raw", url.path)
            if m:
                raw = store.raw(m.group(1))
                if raw is None:
                    return self.send(404, b'{"code":"NOT_FOUND"}', "application/json")
                return self.send(200, raw, "message/rfc822")
            if url.path == "/":
                rows = "".join(
                    "<tr><td>{}</td><td>{}</td><td><a href=\"/api/messages/{}/raw\">{}</a></td></tr>".format(
                        html.escape(m["received_at"]),
                        html.escape(", ".join(m["to"])),
                        html.escape(m["id"]),
                        html.escape(m["subject"] or "(no subject)"),
                    )
                    for m in reversed(store.list())
                )
                page = (
                    "<!doctype html><meta charset=utf-8><title>Floodgate mail</title>"
                    "<h1>Mail received by the local SMTP server</h1>"
                    "<p>{} messages (newest first). Nothing here left this machine.</p>"
                    "<table><tr><th>Received</th><th>To</th><th>Subject</th></tr>{}</table>"
                ).format(len(store.list()), rows)
                return self.send(200, page.encode(), "text/html; charset=utf-8")
            return self.send(404, b'{"code":"NOT_FOUND"}', "application/json")

    return View


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smtp-port", type=int, default=2525)
    p.add_argument("--http-port", type=int, default=2580)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--maildir", default=".stack/mail")
    p.add_argument("--sink", action="store_true", help="count messages, keep none")
    a = p.parse_args()

    store = Store(a.maildir, a.sink)
    controller = SinkController(Handler(store), store, hostname=a.host, port=a.smtp_port)
    controller.start()
    view = ThreadingHTTPServer((a.host, a.http_port), make_view(store))
    threading.Thread(target=view.serve_forever, daemon=True).start()
    print(
        "mailsink: SMTP on {}:{}, view on http://{}:{}/ ({})".format(
            a.host, a.smtp_port, a.host, a.http_port, "sink" if a.sink else a.maildir
        ),
        flush=True,
    )

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    view.shutdown()
    controller.stop()


if __name__ == "__main__":
    main()

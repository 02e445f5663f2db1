// Floodgate tickets: the one script that draws a fan's tickets, used by the ticket page
// (/e/{event}/tickets) and by the shop's ticket step, so both show exactly the same codes.
//
// What it guarantees:
// - The QR code encodes the ticket's code text exactly (byte mode, no re-encoding), with a
//   4-module quiet zone, at least 240 CSS px, whole device pixels per module (no blurry edges
//   that a door scanner misreads).
// - Rotating codes (`<static code>~<8-digit TOTP>`, RFC 6238, HMAC-SHA256, T0 = 0, 15 s steps)
//   are computed on the device with WebCrypto from the ticket's `rotating_secret`; no network is
//   used, so they keep turning offline. A moving bar, the seconds left and the device clock show
//   that the code is live: a screenshot is recognisably frozen.
// - A voided ticket never shows a code, only "voided" and its reason.
// - Text from the API is set as text (textContent), never parsed as markup.
//
// Needs: static/vendor/qrcode-generator-2.0.4.js (global `qrcode`), static/tickets-i18n.js
// (window.FG_TICKETS_STRINGS).
(function () {
  "use strict";

  var STEP_S = 15;
  var QUIET = 4;
  var MIN_CSS = 240;
  var MAX_CSS = 360;
  var STRINGS = window.FG_TICKETS_STRINGS || { en: {}, ja: {} };

  function tr(lang, key, params) {
    var table = STRINGS[lang] || STRINGS.en || {};
    var s = table[key];
    if (s === undefined) s = (STRINGS.en || {})[key];
    if (s === undefined) return key;
    if (params) {
      s = s.replace(/\{(\w+)\}/g, function (m, k) {
        return Object.prototype.hasOwnProperty.call(params, k) ? String(params[k]) : m;
      });
    }
    return s;
  }

  // ---- where tickets come from ----------------------------------------------------------

  // Booking's base URL, written into the page by the gateway ([gateway] tickets_api_url);
  // empty means this origin.
  function apiBase() {
    var meta = document.querySelector('meta[name="floodgate-tickets-api"]');
    return meta && meta.content ? meta.content.replace(/\/$/, "") : "";
  }

  // The fan's login (identity) token, as the waiting page keeps it for this event.
  function identity(event) {
    try { return window.localStorage.getItem("fg_wait_" + event + "_identity"); } catch (e) { return null; }
  }

  // The token's subject, read without verifying (booking verifies): only to keep one fan's
  // saved tickets from being shown to another account signed in on the same device.
  function subject(token) {
    try {
      var part = String(token).split(".")[1];
      var json = new TextDecoder().decode(b64uBytes(part));
      var sub = JSON.parse(json).sub;
      return typeof sub === "string" ? sub : null;
    } catch (e) { return null; }
  }

  // GET with the Bearer token, no cookies (booking's ticket reads are CORS `*` without
  // credentials). Resolves {ok, status, data}; rejects only when the network failed.
  function get(path, token) {
    var headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    return fetch(apiBase() + path, { headers: headers, credentials: "omit", cache: "no-store" })
      .then(function (r) {
        return r.json().then(function (d) { return d; }, function () { return {}; })
          .then(function (data) { return { ok: r.ok, status: r.status, data: data }; });
      });
  }

  // ---- rotating codes ---------------------------------------------------------------------

  function b64uBytes(s) {
    s = String(s).replace(/-/g, "+").replace(/_/g, "/");
    while (s.length % 4) s += "=";
    var bin = atob(s);
    var out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  var keys = new Map(); // secret text -> Promise<CryptoKey>, imported once per ticket

  function hmacKey(raw, cacheKey) {
    if (cacheKey && keys.has(cacheKey)) return keys.get(cacheKey);
    if (!window.crypto || !crypto.subtle) {
      // WebCrypto exists only in secure contexts (https, localhost).
      return Promise.reject(new Error("no WebCrypto: the page is not on a secure origin"));
    }
    var p = crypto.subtle.importKey("raw", raw, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
    if (cacheKey) keys.set(cacheKey, p);
    return p;
  }

  // RFC 6238 with HMAC-SHA256 and 8 digits over raw key bytes (booking/src/tickets/totp.rs).
  function totpRaw(raw, unixS, stepS, cacheKey) {
    var counter = Math.floor(unixS / (stepS || STEP_S));
    var msg = new Uint8Array(8);
    var view = new DataView(msg.buffer);
    view.setUint32(0, Math.floor(counter / 4294967296));
    view.setUint32(4, counter >>> 0);
    return hmacKey(raw, cacheKey).then(function (key) {
      return crypto.subtle.sign("HMAC", key, msg);
    }).then(function (buf) {
      var mac = new Uint8Array(buf);
      var off = mac[mac.length - 1] & 0x0f;
      var bin = (((mac[off] & 0x7f) << 24) | (mac[off + 1] << 16) | (mac[off + 2] << 8) | mac[off + 3]) >>> 0;
      return String(bin % 100000000).padStart(8, "0");
    });
  }

  // The 8 digits of a ticket's code at `unixS`, from its base64url `rotating_secret`.
  function totp(secret, unixS) {
    return totpRaw(b64uBytes(secret), unixS, STEP_S, secret);
  }

  // ---- drawing ----------------------------------------------------------------------------

  // Draws `text` as a QR code on `canvas`, at least `cssSize` CSS px (never under 240).
  function drawQr(canvas, text, cssSize) {
    var qr = qrcode(0, "M");
    qr.addData(text, "Byte");
    qr.make();
    var n = qr.getModuleCount();
    var total = n + 2 * QUIET;
    var dpr = window.devicePixelRatio || 1;
    var css = Math.max(MIN_CSS, cssSize || MIN_CSS);
    var px = Math.max(1, Math.ceil((css * dpr) / total)); // device pixels per module
    var size = px * total;
    canvas.width = size;
    canvas.height = size;
    canvas.style.width = size / dpr + "px";
    canvas.style.height = size / dpr + "px";
    var ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, size, size);
    ctx.fillStyle = "#000";
    for (var r = 0; r < n; r++) {
      for (var c = 0; c < n; c++) {
        if (qr.isDark(r, c)) ctx.fillRect((c + QUIET) * px, (r + QUIET) * px, px, px);
      }
    }
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }

  function locale(lang) { return lang === "ja" ? "ja-JP" : "en-GB"; }

  // "Fri 1 May 2031, 19:00 JST" in the event's zone (the device's when the event has none).
  function when(info, lang) {
    if (!info || !info.starts_at) return "";
    var opts = { dateStyle: "full", timeStyle: "short" };
    if (info.timezone) opts.timeZone = info.timezone;
    var line;
    try {
      line = new Intl.DateTimeFormat(locale(lang), opts).format(new Date(info.starts_at));
      var zone = new Intl.DateTimeFormat(locale(lang), { timeZone: info.timezone || undefined, timeZoneName: "short" })
        .formatToParts(new Date(info.starts_at)).filter(function (p) { return p.type === "timeZoneName"; })[0];
      if (zone) line += " " + zone.value;
      if (info.doors_at) {
        var doors = new Intl.DateTimeFormat(locale(lang), { timeStyle: "short", timeZone: info.timezone || undefined })
          .format(new Date(info.doors_at));
        line += " · " + tr(lang, "tk.doors", { time: doors });
      }
    } catch (e) {
      line = info.starts_at;
    }
    return line;
  }

  function what(tk, lang, opts) {
    if (tk.seat && opts && opts.seatName) return opts.seatName(tk.seat);
    if (tk.seat) return tr(lang, "tk.seat", { seat: tk.seat });
    if (tk.tier) return tr(lang, "tk.tier", { tier: tk.tier });
    return "";
  }

  function canvasSize(container) {
    var w = container.clientWidth || MIN_CSS;
    return Math.max(MIN_CSS, Math.min(MAX_CSS, w - 32));
  }

  // Renders `tickets` into `list` (an <ul>/<ol>). Returns {stop()} that ends the rotation
  // timer. `info` is the event's ticket-info (may be null: the card then leaves it out);
  // `opts.seatName(seatId)` names a seat (the shop knows its map; default "Seat <id>").
  function render(list, tickets, info, lang, opts) {
    list.textContent = "";
    var rotating = [];
    var size = canvasSize(list);
    tickets.forEach(function (tk) {
      var li = el("li", "tk" + (tk.status === "voided" ? " tk-voided" : ""));
      li.dataset.ticket = tk.id;
      li.appendChild(el("p", "tk-what", what(tk, lang, opts)));
      if (info && info.name) li.appendChild(el("p", "tk-event", info.name));
      var w = when(info, lang);
      if (w) li.appendChild(el("p", "tk-when", w));
      if (info && (info.venue || info.venue_address)) {
        li.appendChild(el("p", "tk-venue", [info.venue, info.venue_address].filter(Boolean).join(" — ")));
      }
      if (tk.status === "voided" || !tk.code) {
        var reason = tk.void_reason ? tr(lang, "tk.reason." + tk.void_reason) : "";
        if (reason === "tk.reason." + tk.void_reason) reason = tk.void_reason;
        li.appendChild(el("p", "tk-void", tr(lang, "tk.voided") + (reason ? " — " + reason : "")));
      } else {
        var box = el("div", "tk-code");
        var canvas = el("canvas", "tk-qr");
        canvas.setAttribute("role", "img");
        canvas.setAttribute("aria-label", tr(lang, "tk.qr.label", { what: what(tk, lang, opts) }));
        box.appendChild(canvas);
        li.appendChild(box);
        if (tk.rotating_secret) {
          var live = el("div", "tk-live");
          var bar = el("div", "tk-bar");
          var fill = el("div", "tk-fill");
          bar.appendChild(fill);
          var count = el("p", "tk-count");
          count.setAttribute("aria-live", "off");
          live.appendChild(bar);
          live.appendChild(count);
          li.appendChild(live);
          rotating.push({ tk: tk, canvas: canvas, fill: fill, count: count, step: -1 });
        } else {
          drawQr(canvas, tk.code, size);
        }
      }
      li.appendChild(el("p", "tk-id", tr(lang, "tk.id", { id: tk.id })));
      list.appendChild(li);
    });
    var timer = null;
    var clockFmt = new Intl.DateTimeFormat(locale(lang), { hour: "2-digit", minute: "2-digit", second: "2-digit" });
    function turn() {
      var nowMs = Date.now();
      var nowS = Math.floor(nowMs / 1000);
      var step = Math.floor(nowS / STEP_S);
      var left = STEP_S - ((nowMs / 1000) % STEP_S);
      rotating.forEach(function (r) {
        r.fill.style.width = ((left / STEP_S) * 100).toFixed(1) + "%";
        r.count.textContent = tr(lang, "tk.rotates", { s: Math.ceil(left), time: clockFmt.format(new Date(nowMs)) });
        if (r.step === step) return;
        r.step = step;
        totp(r.tk.rotating_secret, nowS).then(function (digits) {
          if (r.step !== step) return; // a newer step already drew
          drawQr(r.canvas, r.tk.code + "~" + digits, size);
          r.canvas.dataset.step = String(step);
        }, function (e) {
          r.count.textContent = tr(lang, "tk.nocrypto");
          if (window.console) console.error("rotating code:", e);
        });
      });
    }
    if (rotating.length) {
      turn();
      timer = setInterval(turn, 200);
    }
    return { stop: function () { if (timer) clearInterval(timer); timer = null; } };
  }

  window.FgTickets = {
    STEP_S: STEP_S,
    apiBase: apiBase,
    identity: identity,
    subject: subject,
    get: get,
    totp: totp,
    totpRaw: totpRaw,
    drawQr: drawQr,
    when: when,
    render: render,
    t: tr
  };
})();

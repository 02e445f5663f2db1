// Floodgate storefront: the page an admitted fan lands on (/e/{event}/shop).
//
// What it guarantees to the fan and to the backend:
// - Every API call is same-origin with credentials, so the HttpOnly `fg_admission` cookie
//   set by the waiting room travels with it; the admission token is never read or stored by
//   this script. (The login token the waiting page keeps is only read for the `email` claim
//   that prefills the optional ticket e-mail field.)
// - Checkout sends ONE Idempotency-Key per checkout attempt and reuses it on every retry of
//   that attempt (network error, 5xx, 409 in flight), so a double click or a retry never
//   creates a second order. Payment likewise: one key per payment attempt, reused until a
//   definite answer; only after a definite decline does the next attempt get a new key (and
//   the card choice is locked while an attempt's outcome is unknown).
// - Countdowns come from the server's `held_until` / `expires_at`, corrected by the clock
//   skew measured from the `Date` response header; the server decides expiry, the page only
//   shows it.
// - Only the open section's seats exist as DOM buttons (a page of rows at a time); the
//   overview draws each section on a small canvas, so a 60,000-seat map stays cheap.
// - sessionStorage (not localStorage) keeps the current hold/order/idempotency keys so a
//   reload resumes the same checkout instead of starting a second one. Nothing secret in it.
(function () {
  "use strict";

  var STRINGS = window.FG_SHOP_STRINGS || { en: {}, ja: {} };
  var REFRESH_MS = 4000;          // seat map refresh while choosing
  var REFRESH_MS_LARGE = 8000;    // ... for very large maps (parsing costs on phones)
  var MAX_CELLS_PER_PAGE = 1200;  // seat buttons rendered at once
  var IN_FLIGHT_RETRIES = 6;
  var STORE_KEY_PREFIX = "fg_shop_v1:";

  function $(id) { return document.getElementById(id); }

  // ---------------------------------------------------------------------------------------
  // Event, language, strings
  // ---------------------------------------------------------------------------------------

  var pathMatch = location.pathname.match(/^\/e\/([a-z0-9_-]{1,64})\/shop\/?$/);
  var EVENT = pathMatch ? pathMatch[1] : (new URLSearchParams(location.search).get("event") || "");

  function pickLang() {
    try {
      var saved = window.localStorage.getItem("fg_lang");
      if (saved === "en" || saved === "ja") return saved;
    } catch (e) { /* storage blocked: fall through */ }
    var langs = navigator.languages && navigator.languages.length ? navigator.languages : [navigator.language || "en"];
    for (var i = 0; i < langs.length; i++) {
      var l = String(langs[i]).toLowerCase();
      if (l.indexOf("ja") === 0) return "ja";
      if (l.indexOf("en") === 0) return "en";
    }
    return "en";
  }

  var S = {
    lang: pickLang(),
    skewMs: 0,
    map: null,
    info: null,
    selected: new Set(),
    taken: new Map(),           // seat id -> until (ms): "just taken", shown as held meanwhile
    openSection: null,
    rowPage: 0,
    mode: "seats",
    step: "choose",
    hold: null,
    order: null,
    orderKey: null,
    pay: null,
    tickets: null,
    codes: null,                // the drawn codes of the ticket step ({stop()})
    codeData: null,             // ... and what they were drawn from ({order, tickets, info})
    busyUntil: 0,
    polling: null,
    pollFailures: 0,
    stopped: false,
    acting: false,
    cells: new Map(),
    focusId: null,
    gaTier: null
  };

  function t(key, params) {
    var table = STRINGS[S.lang] || STRINGS.en;
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

  function applyStrings() {
    document.documentElement.lang = S.lang;
    var nodes = document.querySelectorAll("[data-i18n]");
    for (var i = 0; i < nodes.length; i++) nodes[i].textContent = t(nodes[i].getAttribute("data-i18n"));
    var labelled = document.querySelectorAll("[data-i18n-label]");
    for (var j = 0; j < labelled.length; j++) {
      labelled[j].setAttribute("aria-label", t(labelled[j].getAttribute("data-i18n-label")));
    }
    $("lang").setAttribute("lang", S.lang === "ja" ? "en" : "ja");
    var name = (S.map && S.map.name) || EVENT;
    document.title = t("doc.title", { event: name });
  }

  function money(minor, currency) {
    if (minor === null || minor === undefined || !isFinite(minor)) return "";
    var cur = currency || (S.order && S.order.currency) || (S.map && S.map.currency) || "JPY";
    try {
      var fmt = new Intl.NumberFormat(S.lang === "ja" ? "ja-JP" : "en-US", { style: "currency", currency: cur });
      var digits = fmt.resolvedOptions().maximumFractionDigits || 0;
      return fmt.format(minor / Math.pow(10, digits));
    } catch (e) {
      return String(minor) + " " + cur;
    }
  }

  function clock(ms) {
    var s = Math.max(0, Math.ceil(ms / 1000));
    var m = Math.floor(s / 60);
    var r = s % 60;
    return m + ":" + (r < 10 ? "0" : "") + r;
  }

  // ---------------------------------------------------------------------------------------
  // Messages
  // ---------------------------------------------------------------------------------------

  function showAlert(text, linkHref, linkText) {
    var el = $("alert");
    el.textContent = text;
    var close = document.createElement("button");
    close.type = "button";
    close.className = "dismiss";
    close.setAttribute("aria-label", t("btn.dismiss"));
    close.textContent = "×";
    close.addEventListener("click", clearAlert);
    el.appendChild(close);
    if (linkHref) {
      el.appendChild(document.createTextNode(" "));
      var a = document.createElement("a");
      a.href = linkHref;
      a.textContent = linkText;
      el.appendChild(a);
    }
    el.hidden = false;
  }

  function clearAlert() {
    var el = $("alert");
    el.textContent = "";
    el.hidden = true;
  }

  function notice(text) {
    $("notice").textContent = text || "";
  }

  // ---------------------------------------------------------------------------------------
  // HTTP
  // ---------------------------------------------------------------------------------------

  function newKey() {
    if (window.crypto && typeof window.crypto.randomUUID === "function") return window.crypto.randomUUID();
    var b = new Uint8Array(16);
    window.crypto.getRandomValues(b);
    return Array.prototype.map.call(b, function (x) { return (x < 16 ? "0" : "") + x.toString(16); }).join("");
  }

  function noteServerDate(resp) {
    var d = Date.parse(resp.headers.get("Date") || "");
    // `Date` has one-second resolution: aim at the middle of the second.
    if (isFinite(d)) S.skewMs = d + 500 - Date.now();
  }

  function serverNow() { return Date.now() + S.skewMs; }

  // Resolves to {status, ok, data, retryAfter}; status 0 is a network failure. Never throws.
  function api(method, path, body, extraHeaders, cacheMode) {
    var headers = { "Accept": "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (extraHeaders) for (var k in extraHeaders) headers[k] = extraHeaders[k];
    return fetch(path, {
      method: method,
      credentials: "same-origin",
      headers: headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: cacheMode || "no-store"
    }).then(function (resp) {
      noteServerDate(resp);
      var ra = parseInt(resp.headers.get("Retry-After") || "", 10);
      return resp.text().then(function (text) {
        var data = {};
        if (text) { try { data = JSON.parse(text); } catch (e) { data = {}; } }
        return { status: resp.status, ok: resp.ok, data: data || {}, retryAfter: isFinite(ra) ? ra : null };
      });
    }, function () {
      return { status: 0, ok: false, data: { code: "NETWORK" }, retryAfter: null };
    });
  }

  function setBusy(seconds) {
    S.busyUntil = Date.now() + seconds * 1000;
    updateActions();
    setTimeout(updateActions, seconds * 1000 + 50);
  }

  function isBusy() { return Date.now() < S.busyUntil; }

  var redirecting = false;
  function backToWaitingRoom() {
    if (redirecting) return;
    redirecting = true;
    S.stopped = true;
    stopPolling();
    var href = "/e/" + encodeURIComponent(EVENT);
    showAlert(t("msg.admission"), href, t("msg.admission.link"));
    setTimeout(function () { location.assign(href); }, 4000);
  }

  // Handles answers that mean the same everywhere. Returns true when handled.
  function handleCommon(r) {
    var code = r.data && r.data.code;
    if (r.status === 0) { showAlert(t("msg.network")); return true; }
    // WRONG_EVENT (403): the admission is for another event; this event's waiting room
    // gives one for this event.
    if (r.status === 401 || code === "ADMISSION_REQUIRED" || code === "WRONG_EVENT") { backToWaitingRoom(); return true; }
    if (r.status === 429) {
      var s = r.retryAfter || 5;
      showAlert(t("msg.rate_limited", { s: s }));
      setBusy(s);
      return true;
    }
    if (r.status === 503 || r.status === 502 || r.status === 504) {
      var w = r.retryAfter || 5;
      showAlert(t("msg.busy", { s: w }));
      setBusy(w);
      return true;
    }
    if (r.status === 422 || r.status === 400) {
      showAlert(t("msg.validation", { message: (r.data && r.data.message) || code || r.status }));
      return true;
    }
    return false;
  }

  function showGeneric(r) {
    showAlert(t("msg.generic", { code: (r.data && r.data.code) || r.status }));
  }

  // ---------------------------------------------------------------------------------------
  // Persistence of the checkout in progress (sessionStorage; nothing secret)
  // ---------------------------------------------------------------------------------------

  function save() {
    try {
      var v = { step: S.step, hold: S.hold, order: S.order, orderKey: S.orderKey, pay: S.pay, tickets: S.tickets };
      window.sessionStorage.setItem(STORE_KEY_PREFIX + EVENT, JSON.stringify(v));
    } catch (e) { /* private mode: the page still works, a reload just starts over */ }
  }

  function restore() {
    try {
      var raw = window.sessionStorage.getItem(STORE_KEY_PREFIX + EVENT);
      if (!raw) return;
      var v = JSON.parse(raw);
      if (!v || typeof v !== "object") return;
      S.hold = v.hold || null;
      S.order = v.order || null;
      S.orderKey = v.orderKey || null;
      S.pay = v.pay || null;
      S.tickets = v.tickets || null;
      if (v.step === "ticket" && S.tickets) S.step = "ticket";
      else if (v.step === "pay" && S.order) S.step = "pay";
      else if (v.step === "hold" && S.hold) S.step = "hold";
    } catch (e) { /* unreadable: start over */ }
  }

  function resetCheckout() {
    S.hold = null;
    S.order = null;
    S.orderKey = null;
    S.pay = null;
    S.tickets = null;
    if (S.codes) { S.codes.stop(); S.codes = null; }
    S.codeData = null;
    $("ticket-codes").hidden = true;
    $("ticket-codes").textContent = "";
    $("tickets").hidden = false;
    save();
  }

  // ---------------------------------------------------------------------------------------
  // Seat map: normalise, load, refresh
  // ---------------------------------------------------------------------------------------

  // `seats` is the JSON map's shape (GET /api/events/{event}/seats, or the compact map
  // decoded by loadSeats): {"event", "seats": [{seat_id, section, row, number, tier, status}]}. `info` is GET /api/events/{event}: name, venue,
  // max_tickets_per_account, currency, price_tiers [{tier, price}], ga_tiers [{tier, price,
  // capacity, available}] (empty object until it has loaded once).
  function normalise(seats, info) {
    var map = {
      name: info.name || "",
      venue: info.venue || "",
      limit: Number(info.max_tickets_per_account) || null,
      currency: info.currency || "JPY",
      prices: new Map(),
      seats: new Map(),
      sections: [],
      ga: []
    };
    (Array.isArray(info.price_tiers) ? info.price_tiers : []).forEach(function (p) {
      map.prices.set(String(p.tier), Number(p.price));
    });
    var bySection = new Map();
    (Array.isArray(seats.seats) ? seats.seats : []).forEach(function (x) {
      if (!x || !x.seat_id) return;
      var seat = {
        id: String(x.seat_id),
        section: String(x.section || ""),
        row: Number(x.row) || 0,
        number: Number(x.number) || 0,
        tier: String(x.tier || ""),
        status: x.status === "held" || x.status === "sold" ? x.status : "available"
      };
      map.seats.set(seat.id, seat);
      var sec = bySection.get(seat.section);
      if (!sec) {
        sec = { name: seat.section, rows: new Map(), maxNumber: 0, total: 0, free: 0, order: bySection.size };
        bySection.set(seat.section, sec);
      }
      var row = sec.rows.get(seat.row);
      if (!row) { row = []; sec.rows.set(seat.row, row); }
      row.push(seat);
      sec.total++;
      if (seat.status === "available") sec.free++;
      if (seat.number > sec.maxNumber) sec.maxNumber = seat.number;
    });
    bySection.forEach(function (sec) {
      sec.rowNos = Array.from(sec.rows.keys()).sort(function (a, b) { return a - b; });
      sec.rows.forEach(function (r) { r.sort(function (a, b) { return a.number - b.number; }); });
      map.sections.push(sec);
    });
    map.sections.sort(function (a, b) { return a.order - b.order; });
    map.ga = (Array.isArray(info.ga_tiers) ? info.ga_tiers : []).map(function (g) {
      return {
        tier: String(g.tier),
        price: Number(g.price),
        available: g.available === undefined ? null : Number(g.available)
      };
    });
    return map;
  }

  function seatName(id) {
    var s = S.map && S.map.seats.get(id);
    if (!s) return id;
    return t("hold.seat", { section: s.section, row: s.row, number: s.number });
  }

  function seatPrice(seat) {
    var p = S.map && S.map.prices.get(seat.tier);
    return p === undefined || !isFinite(p) ? null : p;
  }

  function limit() {
    return (S.map && S.map.limit) || 10;
  }

  // The compact seat map (docs/api.md, "Compact seat map"): the layout (what exists; never
  // changes for an event) is read once, the availability (2 bits per seat, ~20 KB for 60,000
  // seats) on every refresh with its ETag, so an unchanged map costs a 304 and no parsing.
  // Servers without the compact form get the JSON map as before.
  var compact = { layout: null, availTag: null, decoded: null, unsupported: false };

  // GET with our own If-None-Match; resolves like api() plus {etag, notModified}.
  function getTagged(path, tag) {
    var headers = { "Accept": "application/json" };
    if (tag) headers["If-None-Match"] = tag;
    return fetch(path, { method: "GET", credentials: "same-origin", headers: headers, cache: "no-store" })
      .then(function (resp) {
        noteServerDate(resp);
        var ra = parseInt(resp.headers.get("Retry-After") || "", 10);
        var etag = resp.headers.get("ETag");
        if (resp.status === 304) return { status: 304, ok: true, notModified: true, data: null, etag: tag, retryAfter: null };
        return resp.text().then(function (text) {
          var data = {};
          if (text) { try { data = JSON.parse(text); } catch (e) { data = {}; } }
          return { status: resp.status, ok: resp.ok, data: data || {}, etag: etag, retryAfter: isFinite(ra) ? ra : null };
        });
      }, function () {
        return { status: 0, ok: false, data: { code: "NETWORK" }, retryAfter: null };
      });
  }

  // Layout + availability -> the JSON map's shape {event, seats: [{seat_id, section, row,
  // number, tier, status}]}. Seat i of the layout (sections, rows, runs in order) has status
  // bits 2*(i%4).. of byte i/4: 0 available, 1 held, 2 sold.
  function decodeCompact(layout, avail) {
    var bin = atob(String(avail.data || ""));
    var tiers = Array.isArray(layout.tiers) ? layout.tiers : [];
    var seats = [];
    (layout.sections || []).forEach(function (sec) {
      (sec.rows || []).forEach(function (row) {
        (row.runs || []).forEach(function (run) {
          var tier = tiers[run[2]] ? String(tiers[run[2]].tier) : "";
          for (var k = 0; k < run[1]; k++) {
            var i = seats.length;
            var code = (bin.charCodeAt(i >> 2) >> ((i & 3) * 2)) & 3;
            var n = run[0] + k;
            seats.push({
              seat_id: run[3] ? String(run[3][k]) : sec.name + "-R" + row.row + "-" + n,
              section: sec.name, row: row.row, number: n, tier: tier,
              status: code === 1 ? "held" : code === 2 ? "sold" : "available"
            });
          }
        });
      });
    });
    return { event: layout.event, seats: seats };
  }

  // Resolves like api(); `unchanged` when the availability answered 304.
  function loadSeats(cacheMode, retried) {
    var base = "/api/events/" + encodeURIComponent(EVENT);
    if (compact.unsupported) return api("GET", base + "/seats", undefined, null, cacheMode || "default");
    var layoutP = compact.layout ? Promise.resolve({ ok: true, data: compact.layout }) : getTagged(base + "/seats/layout", null);
    return layoutP.then(function (rl) {
      if (!rl.ok) {
        if (rl.status === 404 && !(rl.data && rl.data.code === "UNKNOWN_EVENT")) {
          compact.unsupported = true;  // an older server: the JSON map
          return loadSeats(cacheMode, retried);
        }
        return rl;
      }
      compact.layout = rl.data;
      var tag = compact.decoded ? compact.availTag : null;
      return getTagged(base + "/seats/availability", tag).then(function (ra) {
        if (ra.notModified) return { status: 200, ok: true, unchanged: true, data: compact.decoded };
        if (!ra.ok) return ra;
        if (ra.data.layout !== compact.layout.id) {
          // Availability of another layout (the event was recreated): read both again, once.
          compact.layout = null;
          compact.decoded = null;
          if (retried) return { status: 502, ok: false, data: { code: "BAD_SEAT_MAP" }, retryAfter: null };
          return loadSeats(cacheMode, true);
        }
        compact.decoded = decodeCompact(compact.layout, ra.data);
        compact.availTag = ra.etag;
        return { status: 200, ok: true, data: compact.decoded };
      });
    });
  }

  // The seat map and the event details (limit, prices, GA availability) load together; the
  // details are re-read on refresh only when the event has GA tiers (their counts move).
  function loadMap(cacheMode) {
    var base = "/api/events/" + encodeURIComponent(EVENT);
    var needInfo = !S.info || (Array.isArray(S.info.ga_tiers) && S.info.ga_tiers.length > 0);
    return Promise.all([
      loadSeats(cacheMode),
      needInfo ? api("GET", base, undefined, null, cacheMode || "default") : Promise.resolve(null)
    ]).then(function (rs) {
      var r = rs[0];
      var ri = rs[1];
      if (!r.ok) return r;
      if (ri && ri.ok) S.info = ri.data;
      else if (ri && (ri.status === 401 || ri.status === 403 || ri.status === 429 || ri.status >= 500)) return ri;
      var prev = S.map;
      // An unchanged availability with unchanged details keeps the map as it is.
      var next = r.unchanged && !ri && prev ? prev : normalise(r.data, S.info || {});
      S.map = next;
      if (S.pollFailures >= 2) notice("");  // the "could not refresh" note is stale now
      S.pollFailures = 0;
      afterMapChange(prev, next);
      return r;
    });
  }

  // Seats picked by the fan that someone else took meanwhile are dropped from the pick and
  // marked, so the fan sees why.
  function afterMapChange(prev, next) {
    var lost = [];
    S.selected.forEach(function (id) {
      var s = next.seats.get(id);
      if (!s || s.status !== "available") lost.push(id);
    });
    lost.forEach(markTaken);
    if (lost.length) notice(t("msg.picked_lost"));
    if (!prev) {
      renderHeader();
      renderChooser();
      setStep(S.step, false);
      return;
    }
    if (next.sections.length !== prev.sections.length) {
      renderChooser();
      return;
    }
    renderOverview();
    updateCells();
    renderGa();
    updateActions();
  }

  function pollDelay() {
    var base = S.map && S.map.seats.size > 20000 ? REFRESH_MS_LARGE : REFRESH_MS;
    var backoff = Math.min(30000, base * Math.pow(2, S.pollFailures));
    return backoff * (0.85 + Math.random() * 0.3);
  }

  function schedulePoll() {
    stopPolling();
    if (S.stopped) return;
    S.polling = setTimeout(function () {
      if (S.stopped) return;
      if (document.hidden || (S.step !== "choose" && S.map)) { schedulePoll(); return; }
      loadMap().then(function (r) {
        if (!r.ok) {
          S.pollFailures++;
          if (r.status === 401 || (r.data && (r.data.code === "ADMISSION_REQUIRED" || r.data.code === "WRONG_EVENT"))) { backToWaitingRoom(); return; }
          if (S.pollFailures === 2) notice(t("msg.stale_map"));
        }
        schedulePoll();
      });
    }, pollDelay());
  }

  function stopPolling() {
    if (S.polling) clearTimeout(S.polling);
    S.polling = null;
  }

  // ---------------------------------------------------------------------------------------
  // Rendering: header, tabs, overview, grid, GA
  // ---------------------------------------------------------------------------------------

  function renderHeader() {
    $("event-name").textContent = (S.map && S.map.name) || EVENT;
    $("event-venue").textContent = (S.map && S.map.venue) || "";
    var note = $("limit-note");
    if (S.map && S.map.limit) {
      note.textContent = t("limit.note", { n: S.map.limit });
      note.hidden = false;
    } else {
      note.hidden = true;
    }
    applyStrings();
  }

  function renderChooser() {
    $("loading").hidden = true;
    var hasSeats = S.map.sections.length > 0;
    var hasGa = S.map.ga.length > 0;
    $("tabs").hidden = !(hasSeats && hasGa);
    if (!hasSeats && hasGa) S.mode = "ga";
    if (S.openSection === null && S.map.sections.length === 1) S.openSection = S.map.sections[0].name;
    if (S.openSection !== null && !S.map.sections.some(function (s) { return s.name === S.openSection; })) {
      S.openSection = null;
    }
    $("no-seats").hidden = hasSeats || hasGa;
    renderMode();
    renderOverview();
    renderSection();
    renderGa();
    updateActions();
  }

  function renderMode() {
    var seats = S.mode === "seats";
    $("tab-seats").setAttribute("aria-selected", String(seats));
    $("tab-ga").setAttribute("aria-selected", String(!seats));
    $("tab-seats").tabIndex = seats ? 0 : -1;
    $("tab-ga").tabIndex = seats ? -1 : 0;
    $("panel-seats").hidden = !seats;
    $("panel-ga").hidden = seats;
    $("tray").hidden = !seats || S.step !== "choose" || !S.map || S.map.sections.length === 0;
  }

  var COLORS = { available: "#2e8b57", held: "#d08a00", sold: "#8a8a8a", selected: "#0b57d0" };

  function drawSection(canvas, sec) {
    var cols = Math.max(1, sec.maxNumber);
    var rows = Math.max(1, sec.rowNos.length);
    var cell = Math.max(2, Math.min(6, Math.floor(240 / Math.max(cols, rows))));
    canvas.width = cols * cell;
    canvas.height = rows * cell;
    var ctx = canvas.getContext("2d");
    if (!ctx) return;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    var pad = cell > 2 ? 1 : 0;
    sec.rowNos.forEach(function (rowNo, y) {
      sec.rows.get(rowNo).forEach(function (seat) {
        ctx.fillStyle = COLORS[seatState(seat)];
        ctx.fillRect((seat.number - 1) * cell, y * cell, cell - pad, cell - pad);
      });
    });
  }

  function renderOverview() {
    var nav = $("sections");
    // A drill-down: the overview while no section is open, the open section's seats after.
    nav.hidden = S.map.sections.length < 2 || S.openSection !== null;
    if (nav.hidden) return;
    var existing = nav.querySelectorAll(".section-card");
    if (existing.length !== S.map.sections.length) {
      nav.textContent = "";
      S.map.sections.forEach(function (sec) {
        var b = document.createElement("button");
        b.type = "button";
        b.className = "section-card";
        b.dataset.section = sec.name;
        var n = document.createElement("span");
        n.className = "sc-name";
        var c = document.createElement("canvas");
        c.setAttribute("aria-hidden", "true");
        var f = document.createElement("span");
        f.className = "sc-free";
        b.appendChild(n);
        b.appendChild(c);
        b.appendChild(f);
        b.addEventListener("click", function () { openSection(sec.name, true); });
        nav.appendChild(b);
      });
      existing = nav.querySelectorAll(".section-card");
    }
    S.map.sections.forEach(function (sec, i) {
      var b = existing[i];
      b.dataset.section = sec.name;
      b.querySelector(".sc-name").textContent = sec.name;
      b.querySelector(".sc-free").textContent = t("ga.left", { n: sec.free.toLocaleString() });
      b.setAttribute("aria-label", t("section.summary", { name: sec.name, free: sec.free, total: sec.total }));
      if (sec.name === S.openSection) b.setAttribute("aria-current", "true");
      else b.removeAttribute("aria-current");
      drawSection(b.querySelector("canvas"), sec);
    });
  }

  function openSection(name, focus) {
    S.openSection = name;
    S.rowPage = 0;
    renderOverview();
    renderSection();
    $("section-view").scrollIntoView({ block: "start" });
    if (focus) {
      var first = $("grid").querySelector('.seat[tabindex="0"]');
      if (first) first.focus();
    }
  }

  function currentSection() {
    if (!S.map || S.openSection === null) return null;
    for (var i = 0; i < S.map.sections.length; i++) {
      if (S.map.sections[i].name === S.openSection) return S.map.sections[i];
    }
    return null;
  }

  function rowsPerPage(sec) {
    return Math.max(1, Math.floor(MAX_CELLS_PER_PAGE / Math.max(1, sec.maxNumber)));
  }

  // The server caches the map for a second, so a refresh right after a SEAT_TAKEN may still
  // call the lost seat available: trust the 409 for a few seconds.
  var TAKEN_TRUST_MS = 5000;

  function markTaken(id) {
    S.selected.delete(id);
    S.taken.set(id, Date.now() + TAKEN_TRUST_MS);
  }

  function seatState(seat) {
    if (S.selected.has(seat.id)) return "selected";
    var until = S.taken.get(seat.id);
    if (seat.status === "available" && until !== undefined && Date.now() < until) return "held";
    return seat.status;
  }

  function seatLabel(seat, state) {
    var p = seatPrice(seat);
    var st = t("status." + state);
    if (S.taken.has(seat.id) && state !== "selected") st = t("status.taken");
    return t("seat.label", {
      row: seat.row, number: seat.number, tier: seat.tier,
      price: p === null ? "" : " " + money(p), status: st
    });
  }

  function paintCell(btn, seat) {
    var state = seatState(seat);
    var cls = "seat s-" + state + (S.taken.has(seat.id) ? " s-taken" : "");
    if (btn.className !== cls) btn.className = cls;
    btn.setAttribute("aria-pressed", String(state === "selected"));
    btn.setAttribute("aria-disabled", String(state === "held" || state === "sold"));
    btn.setAttribute("aria-label", seatLabel(seat, state));
  }

  function renderSection() {
    var view = $("section-view");
    var sec = currentSection();
    var grid = $("grid");
    S.cells = new Map();
    grid.textContent = "";
    if (!sec) { view.hidden = true; return; }
    view.hidden = false;
    $("section-title").textContent = t("section.title", { name: sec.name });
    $("section-back").hidden = S.map.sections.length < 2;
    grid.setAttribute("aria-label", t("grid.label", { name: sec.name }));
    var per = rowsPerPage(sec);
    var pages = Math.ceil(sec.rowNos.length / per);
    if (S.rowPage >= pages) S.rowPage = Math.max(0, pages - 1);
    var rowNos = sec.rowNos.slice(S.rowPage * per, S.rowPage * per + per);
    var frag = document.createDocumentFragment();
    var firstFocusable = null;
    rowNos.forEach(function (rowNo, r) {
      var row = document.createElement("div");
      row.className = "row";
      row.setAttribute("role", "group");
      row.setAttribute("aria-label", t("row.label", { row: rowNo }));
      var label = document.createElement("span");
      label.className = "row-label";
      label.setAttribute("aria-hidden", "true");
      label.textContent = rowNo;
      row.appendChild(label);
      var byNumber = new Map();
      sec.rows.get(rowNo).forEach(function (s) { byNumber.set(s.number, s); });
      for (var n = 1; n <= sec.maxNumber; n++) {
        var seat = byNumber.get(n);
        if (!seat) {
          var gap = document.createElement("span");
          gap.className = "seat gap";
          gap.setAttribute("aria-hidden", "true");
          row.appendChild(gap);
          continue;
        }
        var b = document.createElement("button");
        b.type = "button";
        b.dataset.seat = seat.id;
        b.dataset.r = String(r);
        b.dataset.c = String(n);
        b.tabIndex = -1;
        b.textContent = String(seat.number);
        paintCell(b, seat);
        S.cells.set(seat.id, b);
        if (!firstFocusable && (seat.id === S.focusId)) firstFocusable = b;
        row.appendChild(b);
      }
      frag.appendChild(row);
    });
    grid.appendChild(frag);
    fitCells(sec);
    if (!firstFocusable) {
      firstFocusable = grid.querySelector(".seat.s-available") || grid.querySelector("button.seat");
    }
    if (firstFocusable) firstFocusable.tabIndex = 0;
    var pager = $("pager");
    pager.hidden = pages < 2;
    if (pages > 1) {
      $("rows-prev").disabled = S.rowPage === 0;
      $("rows-next").disabled = S.rowPage >= pages - 1;
      $("rows-label").textContent = t("rows.page", { from: rowNos[0], to: rowNos[rowNos.length - 1] });
    }
  }

  // Seat size: fill the width on a phone, but never under 24 CSS px (touch target minimum,
  // WCAG 2.5.8) nor over 34; wider sections scroll sideways (and pinch-zoom still works).
  function fitCells(sec) {
    var wrap = $("grid-wrap");
    var width = wrap.clientWidth - 8;
    var labelW = 30;
    var gap = 3;
    var cell = Math.floor((width - labelW) / Math.max(1, sec.maxNumber)) - gap;
    cell = Math.max(24, Math.min(34, cell));
    $("grid").style.setProperty("--cell", cell + "px");
  }

  // Refresh: repaint only the rendered cells (a page of one section).
  function updateCells() {
    var sec = currentSection();
    if (!sec) { $("section-view").hidden = true; return; }
    S.cells.forEach(function (btn, id) {
      var seat = S.map.seats.get(id);
      if (seat) paintCell(btn, seat);
    });
  }

  function toggleSeat(id) {
    if (S.step !== "choose") return;
    notice("");
    var seat = S.map && S.map.seats.get(id);
    if (!seat) return;
    if (S.selected.has(id)) {
      S.selected.delete(id);
    } else {
      if (seatState(seat) !== "available") return;
      if (S.selected.size >= limit()) {
        notice(t("msg.limit.pick", { limit: limit() }));
        return;
      }
      S.selected.add(id);
      S.taken.delete(id);
    }
    clearAlert();
    var btn = S.cells.get(id);
    if (btn) paintCell(btn, seat);
    var sec = currentSection();
    if (sec) {
      var card = $("sections").querySelector('.section-card[data-section="' + CSS.escape(sec.name) + '"] canvas');
      if (card) drawSection(card, sec);
    }
    updateActions();
  }

  function moveFocus(from, dr, dc) {
    var r = Number(from.dataset.r) + dr;
    var c = Number(from.dataset.c) + dc;
    var grid = $("grid");
    for (var guard = 0; guard < 400; guard++) {
      var target = grid.querySelector('button.seat[data-r="' + r + '"][data-c="' + c + '"]');
      if (target) {
        from.tabIndex = -1;
        target.tabIndex = 0;
        target.focus();
        S.focusId = target.dataset.seat;
        return;
      }
      if (dc !== 0) c += dc; else r += dr;
      if (r < 0 || c < 0 || r > 1000 || c > 2000) return;
    }
  }

  function renderGa() {
    var box = $("ga-tiers");
    if (!S.map) return;
    box.textContent = "";
    var legend = document.createElement("legend");
    legend.className = "sr-only";
    legend.textContent = t("tab.ga");
    box.appendChild(legend);
    if (S.gaTier === null) {
      var firstOpen = S.map.ga.filter(function (g) { return g.available === null || g.available > 0; })[0];
      S.gaTier = firstOpen ? firstOpen.tier : null;
    }
    S.map.ga.forEach(function (g) {
      var soldOut = g.available !== null && g.available <= 0;
      var lab = document.createElement("label");
      lab.className = "ga-opt" + (soldOut ? " soldout" : "");
      var input = document.createElement("input");
      input.type = "radio";
      input.name = "ga-tier";
      input.value = g.tier;
      input.disabled = soldOut;
      input.checked = g.tier === S.gaTier && !soldOut;
      input.addEventListener("change", function () { S.gaTier = g.tier; updateActions(); });
      var name = document.createElement("span");
      name.textContent = t("ga.tier", { tier: g.tier, price: money(g.price) });
      var left = document.createElement("span");
      left.className = "muted";
      left.textContent = soldOut ? t("ga.soldout") : (g.available === null ? "" : t("ga.left", { n: g.available.toLocaleString() }));
      lab.appendChild(input);
      lab.appendChild(name);
      lab.appendChild(left);
      box.appendChild(lab);
    });
    $("ga-qty").max = String(limit());
  }

  function gaQty() {
    var q = parseInt($("ga-qty").value, 10);
    if (!isFinite(q) || q < 1) q = 1;
    return Math.min(q, limit());
  }

  function updateActions() {
    if (!S.map) return;
    var n = S.selected.size;
    var total = 0;
    var priced = true;
    S.selected.forEach(function (id) {
      var s = S.map.seats.get(id);
      var p = s ? seatPrice(s) : null;
      if (p === null) priced = false; else total += p;
    });
    $("tray-text").textContent = n === 0 ? t("tray.none")
      : priced ? t("tray.some", { n: n, total: money(total) }) : t("tray.some.noprice", { n: n });
    var busy = isBusy() || S.acting;
    $("hold").disabled = n === 0 || busy;
    $("clear").hidden = n === 0;
    var gaOk = S.gaTier !== null;
    $("ga-hold").disabled = !gaOk || busy;
    $("best-hold").disabled = busy;
    $("ga-hold").textContent = gaOk ? t("btn.hold.ga", { n: gaQty(), tier: S.gaTier }) : t("ga.soldout");
    $("checkout").disabled = busy;
    $("release").disabled = busy;
    var payBtn = $("pay");
    payBtn.disabled = busy;
    if (S.order) {
      payBtn.textContent = S.pay && S.pay.pending ? t("btn.pay.retry") : t("btn.pay", { total: money(S.order.total, S.order.currency) });
    }
    var locked = !!(S.pay && S.pay.pending);
    var radios = document.querySelectorAll('input[name="card"]');
    for (var i = 0; i < radios.length; i++) {
      radios[i].disabled = locked || S.acting;
      if (locked) radios[i].checked = radios[i].value === S.pay.method;
    }
  }

  // ---------------------------------------------------------------------------------------
  // Steps
  // ---------------------------------------------------------------------------------------

  var timer = null;

  function setStep(step, focus) {
    S.step = step;
    document.body.classList.toggle("choosing", step === "choose");
    ["choose", "hold", "pay", "ticket"].forEach(function (s) {
      $("step-" + s).hidden = s !== step;
    });
    var items = $("steps").querySelectorAll("li");
    for (var i = 0; i < items.length; i++) {
      if (items[i].dataset.step === step) items[i].setAttribute("aria-current", "step");
      else items[i].removeAttribute("aria-current");
    }
    renderMode();
    if (timer) clearInterval(timer);
    timer = null;
    if (step === "hold") renderHold();
    if (step === "pay") renderPay();
    if (step === "ticket") renderTickets();
    if (step === "hold" || step === "pay") {
      tick();
      timer = setInterval(tick, 1000);
    }
    if (step === "choose") schedulePoll(); else stopPolling();
    save();
    updateActions();
    if (focus) {
      var h = $(step + "-h");
      if (h && step !== "choose") h.focus();
    }
  }

  function holdItems(list, hold) {
    list.textContent = "";
    if (hold.kind === "ga") {
      var li = document.createElement("li");
      var a = document.createElement("span");
      a.textContent = t("hold.ga", { tier: hold.ga_tier });
      var b = document.createElement("span");
      b.textContent = "× " + hold.quantity;
      li.appendChild(a);
      li.appendChild(b);
      list.appendChild(li);
      return;
    }
    (hold.seats || []).forEach(function (id) {
      var li = document.createElement("li");
      var a = document.createElement("span");
      a.textContent = seatName(id);
      var b = document.createElement("span");
      var seat = S.map && S.map.seats.get(id);
      var p = seat ? seatPrice(seat) : null;
      b.textContent = p === null ? "" : money(p);
      li.appendChild(a);
      li.appendChild(b);
      list.appendChild(li);
    });
  }

  // The address the identity provider vouches for, as a suggestion: the `email` claim of the
  // fan's login token (kept by the waiting page). Read, never verified here: booking checks
  // the address it is sent, and the fan sees and may change it.
  function identityEmail() {
    try {
      var tok = window.localStorage.getItem("fg_wait_" + EVENT + "_identity") || "";
      var part = tok.split(".")[1];
      if (!part) return "";
      var json = atob(part.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((part.length + 3) % 4));
      var claims = JSON.parse(decodeURIComponent(Array.prototype.map.call(json, function (c) {
        return "%" + ("0" + c.charCodeAt(0).toString(16)).slice(-2);
      }).join("")));
      return typeof claims.email === "string" && claims.email.length <= 254 ? claims.email : "";
    } catch (e) {
      return "";
    }
  }

  function renderHold() {
    var field = $("email");
    if (field && !field.value && !field.dataset.prefilled) {
      field.value = identityEmail();
      field.dataset.prefilled = "1";
    }
    holdItems($("hold-items"), S.hold);
    $("hold-total").textContent = S.hold.total !== undefined ? money(S.hold.total) : "";
  }

  function renderPay() {
    if (S.hold) holdItems($("pay-items"), S.hold);
    $("pay-total").textContent = money(S.order.total, S.order.currency);
    $("pay-order").textContent = t("pay.order", { id: S.order.id });
    $("pay-working").hidden = true;
  }

  function renderTickets() {
    var list = $("tickets");
    list.textContent = "";
    (S.tickets || []).forEach(function (tk) {
      var li = document.createElement("li");
      li.className = "ticket";
      var what = document.createElement("div");
      what.className = "t-what";
      what.textContent = tk.seat_id ? seatName(tk.seat_id) : t("hold.ga", { tier: tk.ga_tier || "" });
      var id = document.createElement("div");
      id.className = "t-id";
      id.textContent = t("ticket.id", { id: tk.id });
      var ok = document.createElement("span");
      ok.className = "t-ok";
      ok.setAttribute("aria-hidden", "true");
      ok.textContent = "✓";
      li.appendChild(what);
      li.appendChild(id);
      li.appendChild(ok);
      list.appendChild(li);
    });
    $("ticket-order").textContent = S.order ? t("ticket.order", { id: S.order.id, total: money(S.order.total, S.order.currency) }) : "";
    $("ticket-page-link").href = "/e/" + EVENT + "/tickets" + (S.order ? "?order=" + encodeURIComponent(S.order.id) : "");
    renderCodes();
  }

  // The order's scannable codes, drawn by the ticket page's renderer (tickets-render.js) from
  // booking's ticket read with the fan's login token (class identity; the admission cookie
  // does not count there). Read once per order; a language switch redraws from that copy.
  // Without a token or a connection the plain list above stays.
  function renderCodes() {
    if (S.codes) { S.codes.stop(); S.codes = null; }
    if (!S.order) return;
    var order = S.order.id;
    if (S.codeData && S.codeData.order === order) { drawCodes(); return; }
    ticketScripts().then(function () { fetchCodes(order); }, function () { /* plain list stays */ });
  }

  // The ticket renderer and its QR encoder (~70 KB) load only at the ticket step: every
  // admitted fan loads the shop on sale day, few of them at once reach this step.
  var ticketScriptsLoad = null;
  function ticketScripts() {
    if (window.FgTickets) return Promise.resolve();
    if (ticketScriptsLoad) return ticketScriptsLoad;
    var css = document.createElement("link");
    css.rel = "stylesheet";
    css.href = "/tickets.css";
    document.head.appendChild(css);
    ticketScriptsLoad = ["/vendor/qrcode-generator-2.0.4.js", "/tickets-i18n.js", "/tickets-render.js"]
      .reduce(function (prev, src) {
        return prev.then(function () {
          return new Promise(function (resolve, reject) {
            var el = document.createElement("script");
            el.src = src;
            el.onload = resolve;
            el.onerror = function () { reject(new Error("could not load " + src)); };
            document.head.appendChild(el);
          });
        });
      }, Promise.resolve());
    ticketScriptsLoad.catch(function () { ticketScriptsLoad = null; });
    return ticketScriptsLoad;
  }

  function fetchCodes(order) {
    var R = window.FgTickets;
    var token = R.identity(EVENT);
    if (!token) return;
    Promise.all([
      R.get("/api/events/" + encodeURIComponent(EVENT) + "/ticket-info"),
      R.get("/api/orders/" + encodeURIComponent(order) + "/tickets", token)
    ]).then(function (rs) {
      var list = rs[1];
      if (S.step !== "ticket" || !S.order || S.order.id !== order) return;
      if (!list.ok || !Array.isArray(list.data.tickets) || !list.data.tickets.length) return;
      S.codeData = { order: order, tickets: list.data.tickets, info: rs[0].ok ? rs[0].data : null };
      drawCodes();
    }, function () { /* offline: the plain list stays, the ticket page link works later */ });
  }

  function drawCodes() {
    if (S.codes) S.codes.stop();
    var d = S.codeData;
    S.codes = window.FgTickets.render($("ticket-codes"), d.tickets, d.info, S.lang, { seatName: seatName });
    $("ticket-codes").hidden = false;
    $("tickets").hidden = true;
  }

  function deadline() {
    if (S.step === "hold" && S.hold) return Date.parse(S.hold.held_until || S.hold.expires_at || "");
    if (S.step === "pay" && S.order) return Date.parse(S.order.expires_at || "");
    return NaN;
  }

  function tick() {
    var d = deadline();
    if (!isFinite(d)) return;
    var left = d - serverNow();
    var el = S.step === "hold" ? $("hold-countdown") : $("pay-countdown");
    el.textContent = t(S.step === "hold" ? "hold.countdown" : "pay.countdown", { time: clock(left) });
    el.parentNode.classList.toggle("urgent", left < 60000);
    if (left <= 0 && !S.acting) {
      // The server decides; the page only stops offering a checkout that cannot succeed.
      expired(S.step === "hold" ? "msg.hold_expired" : "msg.order_expired");
    }
  }

  function expired(msgKey) {
    resetCheckout();
    showAlert(t(msgKey));
    backToChoose(true);
  }

  function backToChoose(refresh) {
    S.selected.clear();
    setStep("choose", false);
    if (refresh) loadMap("no-cache");
    if (S.map) { renderOverview(); renderSection(); renderGa(); }
    updateActions();
  }

  // ---------------------------------------------------------------------------------------
  // Actions
  // ---------------------------------------------------------------------------------------

  function act(fn) {
    if (S.acting || isBusy()) return;
    S.acting = true;
    notice("");
    updateActions();
    Promise.resolve().then(fn).then(function () {
      S.acting = false;
      updateActions();
    }, function () {
      S.acting = false;
      showAlert(t("msg.network"));
      updateActions();
    });
  }

  function onHoldError(r) {
    var code = r.data && r.data.code;
    if (code === "SEAT_TAKEN") {
      var seats = Array.isArray(r.data.seats) ? r.data.seats.map(String) : [];
      seats.forEach(markTaken);
      var names = seats.slice(0, 4).map(seatName).join(", ") + (seats.length > 4 ? " …" : "");
      showAlert(t("msg.seat_taken", { seats: names || "?" }));
      updateCells();
      updateActions();
      return loadMap("no-cache");
    }
    if (code === "NO_SEATS_TOGETHER") {
      showAlert(t("msg.no_seats_together", { n: r.data.quantity || "?" }));
      return loadMap("no-cache");
    }
    if (code === "ORPHAN_SEAT") {
      var lone = Array.isArray(r.data.seats) ? r.data.seats.map(String) : [];
      showAlert(t("msg.orphan_seat", { seats: lone.slice(0, 4).map(seatName).join(", ") || "?" }));
      return;
    }
    if (code === "SOLD_OUT") {
      showAlert(t("msg.sold_out"));
      return loadMap("no-cache");
    }
    if (code === "LIMIT_EXCEEDED") {
      showAlert(t("msg.limit", { limit: r.data.limit !== undefined ? r.data.limit : limit(), held: r.data.held !== undefined ? r.data.held : 0 }));
      return;
    }
    if (code === "SALE_NOT_STARTED") { showAlert(t("msg.not_started")); return; }
    if (code === "UNKNOWN_SEATS") {
      showAlert(t("msg.validation", { message: r.data.message || code }));
      return loadMap("no-cache");
    }
    if (!handleCommon(r)) showGeneric(r);
  }

  function held(data, fallback) {
    S.hold = {
      hold_id: data.hold_id,
      kind: data.kind || fallback.kind,
      seats: data.seats || fallback.seats || [],
      ga_tier: data.tier || data.ga_tier || fallback.ga_tier || null,
      quantity: data.quantity || fallback.quantity || (data.seats ? data.seats.length : 0),
      held_until: data.held_until || data.expires_at,
      total: data.total
    };
    S.order = null;
    S.orderKey = null;
    S.pay = null;
    S.selected.clear();
    clearAlert();
    notice("");
    setStep("hold", true);
  }

  function holdSeats() {
    var seats = Array.from(S.selected).sort();
    if (!seats.length) return;
    return api("POST", "/api/events/" + encodeURIComponent(EVENT) + "/holds", { seats: seats })
      .then(function (r) {
        if (r.status === 201 || r.status === 200) return held(r.data, { kind: "seats", seats: seats });
        return onHoldError(r);
      });
  }

  // Best available: booking picks the seats (front and centre first, never stranding one).
  function holdBest() {
    var q = parseInt($("best-qty").value, 10) || 1;
    var body = { best_available: { quantity: q, adjacent: $("best-adjacent").checked } };
    return api("POST", "/api/events/" + encodeURIComponent(EVENT) + "/holds", body)
      .then(function (r) {
        if (r.status === 201 || r.status === 200) return held(r.data, { kind: "seats" });
        return onHoldError(r);
      });
  }

  function holdGa() {
    if (S.gaTier === null) return;
    var q = gaQty();
    return api("POST", "/api/events/" + encodeURIComponent(EVENT) + "/ga-holds", { tier: S.gaTier, quantity: q })
      .then(function (r) {
        if (r.status === 201 || r.status === 200) return held(r.data, { kind: "ga", ga_tier: S.gaTier, quantity: q });
        return onHoldError(r);
      });
  }

  function releaseHold() {
    if (!S.hold) return backToChoose(true);
    return api("DELETE", "/api/holds/" + encodeURIComponent(S.hold.hold_id)).then(function (r) {
      if (r.ok || r.status === 404 || r.status === 409) {
        resetCheckout();
        clearAlert();
        notice(t("msg.released"));
        backToChoose(true);
        return;
      }
      if (!handleCommon(r)) showGeneric(r);
    });
  }

  function isExpiry(code) {
    return typeof code === "string" && /EXPIRED/.test(code);
  }

  function sleep(ms) { return new Promise(function (res) { setTimeout(res, ms); }); }

  // POST /api/orders with this checkout's key; the same key on every retry.
  function checkout(attempt) {
    if (!S.hold) return;
    if (!S.orderKey) { S.orderKey = newKey(); save(); }
    var body = { hold_id: S.hold.hold_id };
    var email = ($("email") && $("email").value || "").trim();
    if (email) body.email = email;
    return api("POST", "/api/orders", body, { "Idempotency-Key": S.orderKey })
      .then(function (r) {
        var code = r.data && r.data.code;
        if (r.status === 422 && r.data && r.data.field === "email") {
          // Nothing was created: the fan corrects the address and checks out again (a new
          // body, so a new key: the old one belonged to the refused body).
          S.orderKey = null;
          save();
          showAlert(t("msg.email", { message: r.data.message || code }));
          $("email").focus();
          return;
        }
        if ((r.status === 201 || r.status === 200) && r.data.id) {
          S.order = {
            id: r.data.id, total: r.data.total, currency: r.data.currency || "JPY",
            expires_at: r.data.expires_at, status: r.data.status
          };
          S.pay = null;
          clearAlert();
          setStep("pay", true);
          return;
        }
        if (r.status === 409 && code === "IDEMPOTENCY_IN_FLIGHT" && (attempt || 0) < IN_FLIGHT_RETRIES) {
          return sleep(800 * ((attempt || 0) + 1)).then(function () { return checkout((attempt || 0) + 1); });
        }
        if (isExpiry(code)) {
          expired("msg.hold_expired");
          return;
        }
        if (code === "IDEMPOTENCY_KEY_REUSED") {
          // The key belonged to another body (e.g. a hold from a previous visit): new attempt.
          S.orderKey = null;
          save();
        }
        if (code === "SOLD_OUT" || code === "INSUFFICIENT_STOCK") { showAlert(t("msg.sold_out")); return; }
        if (!handleCommon(r)) showGeneric(r);
      });
  }

  function chosenCard() {
    var c = document.querySelector('input[name="card"]:checked');
    return c ? c.value : "pm_card_visa";
  }

  // One payment attempt: a key per attempt, reused while the outcome is unknown.
  function pay(attempt) {
    if (!S.order) return;
    if (!S.pay || !S.pay.pending) {
      S.pay = { key: newKey(), method: chosenCard(), pending: true };
      save();
    }
    $("pay-working").hidden = false;
    return api("POST", "/api/orders/" + encodeURIComponent(S.order.id) + "/pay",
      { payment_method: S.pay.method }, { "Idempotency-Key": S.pay.key })
      .then(function (r) {
        $("pay-working").hidden = true;
        var code = r.data && r.data.code;
        if (r.ok && (r.data.status === "PAID" || Array.isArray(r.data.tickets))) {
          S.pay = null;
          S.tickets = Array.isArray(r.data.tickets) ? r.data.tickets : [];
          S.order.status = "PAID";
          clearAlert();
          notice("");
          setStep("ticket", true);
          return;
        }
        if (r.status === 402 || code === "CARD_DECLINED") {
          // A definite decline: the next attempt (maybe another card) gets a new key.
          S.pay = null;
          save();
          var reason = r.data.decline_code || r.data.reason || "";
          showAlert(t("msg.declined", { reason: reason ? " (" + reason + ")" : "" }));
          var first = document.querySelector('input[name="card"]:not(:checked)') || document.querySelector('input[name="card"]');
          updateActions();
          if (first) first.focus();
          return;
        }
        if (r.status === 409 && (code === "IDEMPOTENCY_IN_FLIGHT" || code === "PAYMENT_IN_PROGRESS")) {
          // This attempt (or an earlier one of this order) is still running at the provider:
          // ask again with the same key and card; never start a second charge meanwhile.
          if ((attempt || 0) < IN_FLIGHT_RETRIES) {
            $("pay-working").hidden = false;
            return sleep(1000 * ((attempt || 0) + 1)).then(function () { return pay((attempt || 0) + 1); });
          }
          showAlert(t("msg.in_progress"));
          return;
        }
        if (code === "PAYMENT_REFUNDED") {
          resetCheckout();
          showAlert(t("msg.refunded"));
          backToChoose(true);
          return;
        }
        if (isExpiry(code) || code === "ORDER_NOT_PAYABLE") {
          resetCheckout();
          showAlert(t("msg.order_expired") + (r.data.refunded ? " " + t("msg.refunded.note") : ""));
          backToChoose(true);
          return;
        }
        if (code === "IDEMPOTENCY_KEY_REUSED") { S.pay = null; save(); }
        if (r.status === 0 || r.status === 502 || r.status === 504 ||
            code === "PAYMENT_PROVIDER_ERROR" || code === "PAYMENT_PROVIDER_TIMEOUT") {
          // Unknown outcome: keep the key and the card so the retry cannot charge twice.
          showAlert(t("msg.provider"));
          return;
        }
        if (!handleCommon(r)) showGeneric(r);
      });
  }

  // ---------------------------------------------------------------------------------------
  // Wiring
  // ---------------------------------------------------------------------------------------

  function wire() {
    $("lang").addEventListener("click", function () {
      S.lang = S.lang === "ja" ? "en" : "ja";
      try { window.localStorage.setItem("fg_lang", S.lang); } catch (e) { /* preference only */ }
      applyStrings();
      if (S.map) { renderHeader(); renderOverview(); renderSection(); renderGa(); }
      if (S.step === "hold") renderHold();
      if (S.step === "pay") renderPay();
      if (S.step === "ticket") renderTickets();
      updateActions();
      tick();
    });
    $("tab-seats").addEventListener("click", function () { S.mode = "seats"; renderMode(); });
    $("tab-ga").addEventListener("click", function () { S.mode = "ga"; renderMode(); });
    $("tabs").addEventListener("keydown", function (e) {
      if (e.key !== "ArrowLeft" && e.key !== "ArrowRight") return;
      S.mode = S.mode === "seats" ? "ga" : "seats";
      renderMode();
      $(S.mode === "seats" ? "tab-seats" : "tab-ga").focus();
      e.preventDefault();
    });
    $("grid").addEventListener("click", function (e) {
      var b = e.target.closest("button.seat");
      if (!b) return;
      S.focusId = b.dataset.seat;
      toggleSeat(b.dataset.seat);
    });
    $("grid").addEventListener("keydown", function (e) {
      var b = e.target.closest("button.seat");
      if (!b) return;
      var moves = { ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0] };
      var m = moves[e.key];
      if (m) { moveFocus(b, m[0], m[1]); e.preventDefault(); }
    });
    $("section-back").addEventListener("click", function () {
      S.openSection = null;
      renderOverview();
      renderSection();
      var first = $("sections").querySelector(".section-card");
      if (first) first.focus();
    });
    $("rows-prev").addEventListener("click", function () { S.rowPage = Math.max(0, S.rowPage - 1); renderSection(); });
    $("rows-next").addEventListener("click", function () { S.rowPage++; renderSection(); });
    $("clear").addEventListener("click", function () {
      S.selected.clear();
      updateCells();
      renderOverview();
      updateActions();
    });
    $("hold").addEventListener("click", function () { act(holdSeats); });
    $("ga-form").addEventListener("submit", function (e) { e.preventDefault(); act(holdGa); });
    $("best-form").addEventListener("submit", function (e) { e.preventDefault(); act(holdBest); });
    $("ga-qty").addEventListener("input", updateActions);
    $("ga-less").addEventListener("click", function () { $("ga-qty").value = String(Math.max(1, gaQty() - 1)); updateActions(); });
    $("ga-more").addEventListener("click", function () { $("ga-qty").value = String(Math.min(limit(), gaQty() + 1)); updateActions(); });
    $("checkout").addEventListener("click", function () { act(function () { return checkout(0); }); });
    $("release").addEventListener("click", function () { act(releaseHold); });
    $("pay-form").addEventListener("submit", function (e) { e.preventDefault(); act(function () { return pay(0); }); });
    $("cancel").addEventListener("click", function () {
      // The order expires on its own and returns the seats; nothing to call here.
      resetCheckout();
      clearAlert();
      backToChoose(true);
    });
    $("again").addEventListener("click", function () {
      resetCheckout();
      clearAlert();
      backToChoose(true);
    });
    window.addEventListener("resize", function () {
      var sec = currentSection();
      if (sec) fitCells(sec);
    });
    document.addEventListener("visibilitychange", function () {
      if (!document.hidden && S.step === "choose" && !S.stopped) {
        loadMap().then(function () { schedulePoll(); });
      }
    });
  }

  function start() {
    applyStrings();
    wire();
    if (!EVENT) { backToWaitingRoom(); return; }
    restore();
    loadMap().then(function (r) {
      if (!r.ok) {
        $("loading").hidden = true;
        if (r.status === 404) { showGeneric(r); return; }
        if (!handleCommon(r)) showGeneric(r);
        if (!S.stopped) { S.pollFailures++; schedulePoll(); }
      }
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

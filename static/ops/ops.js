// Floodgate ops page (served by booking at /ops/, never by the gateway): order search and
// detail, refund and cancel, event cancellation with its progress, the audit log. It calls
// booking's admin API on the same origin; no framework, no build step.
//
// Secrets: the admin secret and the operator's name live in sessionStorage only (this tab,
// gone when it closes) — never localStorage, cookies or the URL — and are read from there at
// each call. Everything the page stores is in sessionStorage.
//
// Never twice: each money-moving intent (refund or cancel of one order with one body) gets a
// fresh Idempotency-Key when the operator confirms it; the key is kept, in sessionStorage,
// while the outcome is unknown (network error, 5xx, request still in flight at the server),
// so a retry — even after a reload — sends the same key and booking answers the first
// request's result instead of acting again. A definite answer (2xx, 4xx) ends the intent.
(function () {
  "use strict";

  var I18N = window.FG_OPS_I18N || { en: {} };
  var KEY_SECRET = "fg_ops_secret", KEY_ACTOR = "fg_ops_actor", KEY_LANG = "fg_ops_lang";
  var KEY_INTENTS = "fg_ops_intents";
  var POLL_MS = 1000;

  var S = {
    lang: "en",
    search: null,        // {params, cursor}
    detail: null,        // the last GET /admin/orders/{id} answer
    confirm: null,       // {intent, path, body, text}
    audit: null,         // {params, cursor}
    poll: null,          // timer of the cancellation progress
    pollEvent: null
  };

  function $(id) { return document.getElementById(id); }

  // ---- storage (sessionStorage only) ---------------------------------------------------
  function sget(k) { try { return sessionStorage.getItem(k); } catch (e) { return null; } }
  function sset(k, v) {
    try { if (v === null) sessionStorage.removeItem(k); else sessionStorage.setItem(k, v); }
    catch (e) { /* storage off: the page works until the tab closes */ }
  }
  function intents() {
    try { return JSON.parse(sget(KEY_INTENTS) || "{}") || {}; } catch (e) { return {}; }
  }
  function saveIntents(all) { sset(KEY_INTENTS, JSON.stringify(all)); }

  // An unguessable key from the browser's CSPRNG (crypto.randomUUID needs a secure context;
  // getRandomValues works on plain http too, e.g. an internal host name).
  function newKey() {
    var b = new Uint8Array(16);
    crypto.getRandomValues(b);
    var s = "ops-";
    for (var i = 0; i < b.length; i++) s += (b[i] < 16 ? "0" : "") + b[i].toString(16);
    return s;
  }

  // ---- i18n ------------------------------------------------------------------------------
  function pickLang() {
    var saved = sget(KEY_LANG);
    if (saved && I18N[saved]) return saved;
    return (navigator.language || "en").toLowerCase().indexOf("ja") === 0 ? "ja" : "en";
  }
  function has(key) { return !!(I18N[S.lang] && I18N[S.lang][key]); }
  function t(key, vars) {
    var s = (I18N[S.lang] && I18N[S.lang][key]) || (I18N.en && I18N.en[key]) || key;
    if (vars) {
      s = s.replace(/\{(\w+)\}/g, function (m, name) {
        return vars[name] === undefined || vars[name] === null ? m : String(vars[name]);
      });
    }
    return s;
  }
  function applyLang() {
    document.documentElement.lang = S.lang;
    $("lang").textContent = S.lang === "ja" ? "English" : "日本語";
    document.title = t("doc.title");
    var nodes = document.querySelectorAll("[data-i18n]");
    for (var i = 0; i < nodes.length; i++) nodes[i].textContent = t(nodes[i].getAttribute("data-i18n"));
    var labelled = document.querySelectorAll("[data-i18n-label]");
    for (var j = 0; j < labelled.length; j++) labelled[j].setAttribute("aria-label", t(labelled[j].getAttribute("data-i18n-label")));
    rewordNotices();
    renderAll();
  }

  // ---- formatting ------------------------------------------------------------------------
  function locale() { return S.lang === "ja" ? "ja-JP" : "en-GB"; }
  function money(minor, currency) {
    if (minor === null || minor === undefined) return "–";
    try {
      var f = new Intl.NumberFormat(locale(), { style: "currency", currency: currency || "JPY" });
      var digits = f.resolvedOptions().maximumFractionDigits;
      return f.format(minor / Math.pow(10, digits));
    } catch (e) { return String(minor) + " " + (currency || ""); }
  }
  function when(iso) {
    if (!iso) return "–";
    var d = new Date(iso);
    if (isNaN(d.getTime())) return String(iso);
    return d.toLocaleString(locale(), { dateStyle: "medium", timeStyle: "medium" });
  }
  function statusText(s) { return has("status." + s) ? t("status." + s) : String(s || "–"); }

  // ---- DOM helpers (textContent only: nothing from the API is parsed as HTML) -------------
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function row(cells) {
    var tr = document.createElement("tr");
    for (var i = 0; i < cells.length; i++) {
      var c = cells[i];
      if (c instanceof Node) { var td = document.createElement("td"); td.appendChild(c); tr.appendChild(td); }
      else tr.appendChild(el("td", c));
    }
    return tr;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  // `words` is a function giving the text in the current language, so a language switch
  // re-words every notice on screen (applyLang calls rewordNotices).
  var notices = {};
  function notice(id, words, kind) {
    var n = $(id);
    if (!words) {
      delete notices[id];
      n.hidden = true; n.textContent = ""; n.removeAttribute("data-kind");
      return;
    }
    notices[id] = words;
    n.hidden = false;
    n.textContent = words();
    n.className = "notice " + (kind || "");
    n.setAttribute("data-kind", kind || "info");
  }
  function rewordNotices() {
    for (var id in notices) if (Object.prototype.hasOwnProperty.call(notices, id)) $(id).textContent = notices[id]();
  }

  // ---- the API ---------------------------------------------------------------------------
  // Resolves (never rejects) with {status, body, network}: status 0 and network true when no
  // answer came back (the request may or may not have reached booking).
  function api(method, path, body, key, secret) {
    var headers = { "Accept": "application/json", "Authorization": "Bearer " + (secret || sget(KEY_SECRET) || "") };
    var actor = sget(KEY_ACTOR);
    if (actor) headers["X-Floodgate-Actor"] = actor;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (key) headers["Idempotency-Key"] = key;
    var init = { method: method, headers: headers, cache: "no-store", credentials: "omit", redirect: "error" };
    if (body !== undefined) init.body = JSON.stringify(body);
    return fetch(path, init).then(function (resp) {
      return resp.text().then(function (text) {
        var parsed = null;
        try { parsed = text ? JSON.parse(text) : null; } catch (e) { parsed = null; }
        return { status: resp.status, body: parsed, network: false };
      });
    }, function () {
      return { status: 0, body: null, network: true };
    });
  }
  function ok(r) { return r.status >= 200 && r.status < 300; }
  // The outcome of a write is unknown: keep its key so a retry replays rather than repeats.
  // 501 (not available) and REFUND_REFUSED are definite answers: nothing happened.
  function unknownOutcome(r) {
    var code = r.body && r.body.code;
    if (r.network || code === "IDEMPOTENCY_IN_FLIGHT") return true;
    return r.status >= 500 && r.status !== 501 && code !== "REFUND_REFUSED";
  }
  // The page's words for a stable code; the server's own message for a code it does not know.
  function errorText(r) {
    if (r.network) return t("err.network");
    var b = r.body || {};
    if (b.code && has("err." + b.code)) {
      return t("err." + b.code, { status: b.status ? statusText(b.status) : "", field: b.field || "",
                                  message: b.message || "", why: b.why || "" });
    }
    if (b.message) return b.message + (b.code ? " (" + b.code + ")" : "");
    return t("err.http", { n: r.status });
  }
  function qs(params) {
    var parts = [];
    for (var k in params) {
      if (Object.prototype.hasOwnProperty.call(params, k) && params[k] !== "" && params[k] !== null && params[k] !== undefined) {
        parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(params[k]));
      }
    }
    return parts.length ? "?" + parts.join("&") : "";
  }
  function seg(s) { return encodeURIComponent(s); }

  // ---- sign in / out ---------------------------------------------------------------------
  function signedIn() { return !!(sget(KEY_SECRET) && sget(KEY_ACTOR)); }
  function showView() {
    var inside = signedIn();
    document.body.setAttribute("data-state", inside ? "ops" : "login");
    $("login-view").hidden = inside;
    $("ops-view").hidden = !inside;
    $("logout").hidden = !inside;
    $("who").hidden = !inside;
    $("who").textContent = inside ? t("who", { name: sget(KEY_ACTOR) }) : "";
  }
  function signIn(ev) {
    ev.preventDefault();
    var secret = $("secret").value;
    var actor = $("actor").value.trim();
    if (!secret) { notice("login-message", function () { return t("login.need_secret"); }, "bad"); return; }
    // The name travels in an HTTP header: visible ASCII only, 1 to 200 characters.
    if (!actor || actor.length > 200 || !/^[\x20-\x7e]+$/.test(actor)) {
      notice("login-message", function () { return t("login.bad_actor"); }, "bad");
      return;
    }
    notice("login-message", function () { return t("login.checking"); }, "info");
    // Check the secret with a read before keeping it: a wrong one is refused (401) and
    // nothing is stored or changed.
    api("GET", "/admin/audit?limit=1", undefined, null, secret)
      .then(function (r) {
        if (!ok(r)) { notice("login-message", function () { return errorText(r); }, "bad"); return; }
        sset(KEY_SECRET, secret);
        sset(KEY_ACTOR, actor);
        $("secret").value = "";
        notice("login-message", null);
        showView();
        loadAudit(true);
      });
  }
  function signOut() {
    stopPoll();
    sset(KEY_SECRET, null);
    sset(KEY_ACTOR, null);
    sset(KEY_INTENTS, null);
    S.detail = null; S.search = null; S.audit = null; S.confirm = null;
    clear($("results-body")); $("results").hidden = true; $("detail").hidden = true;
    clear($("audit-body")); $("audit-table").hidden = true;
    showView();
  }

  // ---- order search (keyset pages) -------------------------------------------------------
  function isoFromLocal(v) {
    if (!v) return "";
    var d = new Date(v);
    return isNaN(d.getTime()) ? null : d.toISOString();
  }
  function search(ev) {
    if (ev) ev.preventDefault();
    var from = isoFromLocal($("q-from").value), to = isoFromLocal($("q-to").value);
    if (from === null || to === null) { notice("search-message", function () { return t("orders.bad_time"); }, "bad"); return; }
    var limit = Number($("q-limit").value || 20);
    if (!(limit >= 1 && limit <= 200 && Math.floor(limit) === limit)) {
      notice("search-message", function () { return t("orders.bad_limit"); }, "bad");
      return;
    }
    S.search = {
      params: { account: $("q-account").value.trim(), event: $("q-event").value.trim(),
                status: $("q-status").value, created_from: from, created_to: to, limit: limit },
      cursor: null
    };
    clear($("results-body"));
    loadPage();
  }
  function loadPage() {
    var q = S.search;
    if (!q) return;
    var params = {};
    for (var k in q.params) params[k] = q.params[k];
    if (q.cursor) params.cursor = q.cursor;
    notice("search-message", function () { return t("loading"); }, "info");
    $("next-page").hidden = true;
    api("GET", "/admin/orders" + qs(params)).then(function (r) {
      if (!ok(r)) { notice("search-message", function () { return errorText(r); }, "bad"); return; }
      notice("search-message", null);
      var orders = (r.body && r.body.orders) || [];
      var body = $("results-body");
      for (var i = 0; i < orders.length; i++) body.appendChild(orderRow(orders[i]));
      $("results").hidden = body.childNodes.length === 0;
      $("results-empty").hidden = body.childNodes.length !== 0;
      q.cursor = (r.body && r.body.next_cursor) || null;
      $("next-page").hidden = !q.cursor;
    });
  }
  function orderRow(o) {
    var open = el("button", o.id, "link");
    open.type = "button";
    open.setAttribute("data-order", o.id);
    open.setAttribute("aria-label", t("orders.open", { id: o.id }));
    open.addEventListener("click", function () { openOrder(o.id); });
    var tr = row([open, o.account_id, o.event_id || "–", statusText(o.status),
                  money(o.total, o.currency), when(o.created_at)]);
    tr.cells[4].className = "num";
    tr.setAttribute("data-status", o.status);
    return tr;
  }

  // ---- one order -------------------------------------------------------------------------
  function openOrder(id) {
    S.confirm = null;
    $("confirm").hidden = true;
    notice("action-message", null);
    return loadOrder(id, true);
  }
  function loadOrder(id, scroll) {
    return api("GET", "/admin/orders/" + seg(id)).then(function (r) {
      if (!ok(r)) { notice("search-message", function () { return errorText(r); }, "bad"); return; }
      notice("search-message", null);
      S.detail = r.body;
      $("detail").hidden = false;
      renderDetail();
      if (scroll) $("detail").scrollIntoView({ block: "start" });
    });
  }
  function renderDetail() {
    var d = S.detail;
    if (!d || !d.order) return;
    var o = d.order;
    $("detail").setAttribute("data-order", o.id);
    $("detail").setAttribute("data-status", o.status);
    $("d-id").textContent = o.id;
    $("d-status").textContent = statusText(o.status);
    $("d-account").textContent = o.account_id || "–";
    $("d-event").textContent = o.event_id || "–";
    $("d-total").textContent = money(o.total, o.currency);
    $("d-created").textContent = when(o.created_at);
    $("d-paid").textContent = when(o.paid_at);

    var items = $("d-items"); clear(items);
    (o.items || []).forEach(function (it, i) {
      var line = it.line || i + 1;
      var pick = el("input");
      pick.type = "checkbox";
      pick.value = String(line);
      pick.className = "pick";
      pick.setAttribute("aria-label", t("detail.pick_line", { n: line }));
      var name = it.name || it.seat_id || it.ga_tier || it.sku || "";
      var tr = row([pick, String(line), name, String(it.quantity), money(it.amount, o.currency)]);
      tr.cells[3].className = "num"; tr.cells[4].className = "num";
      items.appendChild(tr);
    });

    var pays = $("d-payments"); clear(pays);
    (d.payments || []).forEach(function (p) {
      var tr = row([String(p.attempt), has("pay." + p.status) ? t("pay." + p.status) : p.status,
                    money(p.amount, p.currency), p.provider_payment_id || "–", when(p.updated_at)]);
      tr.cells[2].className = "num";
      tr.setAttribute("data-status", p.status);
      pays.appendChild(tr);
    });

    list("d-events", d.provider_events, function (w) {
      return when(w.received_at) + " · " + w.event_type + " · " + w.provider_event_id;
    });
    var refunds = (d.ops_refunds || []).map(function (r) {
      return { text: t("detail.refund_line", { amount: money(r.amount, o.currency), status: r.status,
                                               actor: r.actor, stock: r.stock,
                                               id: r.provider_refund_id || r.id }), status: r.status };
    });
    (d.refunds || []).forEach(function (r) {
      // Refunds the provider made on its own (not asked for here) show as payment reversals.
      if (!(d.ops_refunds || []).some(function (x) { return x.provider_refund_id && x.provider_refund_id === r.refund_id; })) {
        refunds.push({ text: t("detail.reversal_line", { amount: money(r.amount, r.currency), status: r.status,
                                                          id: r.refund_id || r.payment_id }), status: r.status });
      }
    });
    list("d-refunds", refunds, function (r) { return r.text; });
    list("d-tickets", d.tickets, function (k) {
      return (k.seat_id || k.ga_tier || k.id) + " · " + (k.valid ? t("ticket.valid") : t("ticket.void", { why: k.void_reason || "" }));
    });
    list("d-audit", d.audit, function (a) { return when(a.at) + " · " + a.actor + " · " + a.action; });

    var paid = o.status === "PAID", pending = o.status === "PENDING_PAYMENT";
    $("a-refund").disabled = !paid;
    $("a-lines").disabled = !paid;
    $("a-cancel").disabled = !(paid || pending);
  }
  function list(id, items, text) {
    var ul = $(id); clear(ul);
    if (!items || !items.length) { ul.appendChild(el("li", t("none"), "muted")); return; }
    items.forEach(function (x) {
      var li = el("li", text(x));
      if (x && x.status) li.setAttribute("data-status", x.status);
      ul.appendChild(li);
    });
  }

  // ---- refund / cancel with confirmation -------------------------------------------------
  function actionBody(lines) {
    var body = {};
    if (lines) body.items = lines;
    if ($("a-stock").value) body.stock = $("a-stock").value;
    var reason = $("a-reason").value.trim();
    if (reason) body.reason = reason;
    return body;
  }
  function ask(kind) {
    var o = S.detail && S.detail.order;
    if (!o) return;
    var lines = null;
    if (kind === "lines") {
      lines = [];
      var picks = document.querySelectorAll("#d-items input.pick:checked");
      for (var i = 0; i < picks.length; i++) lines.push(Number(picks[i].value));
      if (!lines.length) { notice("action-message", function () { return t("action.pick_first"); }, "bad"); return; }
    }
    var body = actionBody(lines);
    var path = "/admin/orders/" + seg(o.id) + (kind === "cancel" ? "/cancel" : "/refund");
    var words = function () {
      var amount = money(o.total, o.currency);
      if (kind === "cancel") return t(o.status === "PAID" ? "confirm.cancel_paid" : "confirm.cancel", { id: o.id, amount: amount });
      if (kind === "lines") return t("confirm.refund_lines", { id: o.id, lines: lines.join(", ") });
      return t("confirm.refund", { id: o.id, amount: amount });
    };
    S.confirm = { intent: path + " " + JSON.stringify(body), path: path, body: body, words: words };
    $("confirm-text").textContent = words();
    $("confirm").hidden = false;
    $("confirm-yes").textContent = intents()[S.confirm.intent] ? t("action.retry") : t("action.confirm");
    notice("action-message", null);
    $("confirm-yes").focus();
  }
  function confirmYes() {
    var c = S.confirm;
    if (!c) return;
    var all = intents();
    var key = all[c.intent] || newKey();   // a retry of an unknown outcome reuses its key
    all[c.intent] = key;
    saveIntents(all);
    $("confirm-yes").disabled = true;
    notice("action-message", function () { return t("working"); }, "info");
    api("POST", c.path, c.body, key).then(function (r) {
      $("confirm-yes").disabled = false;
      var now = intents();
      if (unknownOutcome(r)) {
        // Keep the key: the retry replays this request's result (never a second refund).
        $("confirm-yes").textContent = t("action.retry");
        notice("action-message", function () { return errorText(r) + " " + t("err.retry_safe"); }, "bad");
        return;
      }
      delete now[c.intent];
      saveIntents(now);
      S.confirm = null;
      $("confirm").hidden = true;
      if (ok(r)) {
        var status = r.body && r.body.status;
        notice("action-message", function () { return t("done.order", { status: statusText(status) }); }, "ok");
      } else {
        notice("action-message", function () { return errorText(r); }, "bad");
      }
      var id = S.detail && S.detail.order && S.detail.order.id;
      if (id) loadOrder(id, false);
      loadAudit(true);
    });
  }
  function confirmNo() {
    S.confirm = null;
    $("confirm").hidden = true;
    notice("action-message", null);
  }

  // ---- event cancel and its progress -----------------------------------------------------
  function eventId() { return $("e-id").value.trim(); }
  function askEventCancel(ev) {
    ev.preventDefault();
    var id = eventId();
    if (!id) { notice("event-message", function () { return t("event.need_id"); }, "bad"); return; }
    $("e-confirm-text").textContent = t("confirm.event", { id: id });
    $("e-typed").value = "";
    $("e-confirm-yes").disabled = true;
    $("e-confirm").hidden = false;
    notice("event-message", null);
    $("e-typed").focus();
  }
  function typedMatches() { return $("e-typed").value.trim() === eventId() && eventId() !== ""; }
  function eventCancelYes() {
    if (!typedMatches()) return;   // the button is disabled too; this guards a stale click
    var id = eventId();
    var body = {};
    var reason = $("e-reason").value.trim();
    if (reason) body.reason = reason;
    $("e-confirm-yes").disabled = true;
    notice("event-message", function () { return t("working"); }, "info");
    // Idempotent by itself (a repeat answers 200, cancelled_now false): no key needed.
    api("POST", "/admin/events/" + seg(id) + "/cancel", body).then(function (r) {
      $("e-confirm-yes").disabled = !typedMatches();
      if (!ok(r)) { notice("event-message", function () { return errorText(r); }, "bad"); return; }
      $("e-confirm").hidden = true;
      var now = !!(r.body && r.body.cancelled_now), queued = r.body ? r.body.refunds_queued_now : 0;
      notice("event-message", function () {
        return t(now ? "event.cancelled_now" : "event.cancelled_before", { n: queued });
      }, "ok");
      if (r.body && r.body.progress) renderProgress(r.body.progress);
      startPoll(id);
      loadAudit(true);
    });
  }
  function startPoll(id) {
    stopPoll();
    S.pollEvent = id;
    $("e-shown").textContent = id;
    var tick = function () {
      api("GET", "/admin/events/" + seg(id) + "/cancellation").then(function (r) {
        if (S.pollEvent !== id) return;
        if (!ok(r)) {
          notice("event-message", function () { return errorText(r); }, "bad");
          // A lost answer is retried; a definite refusal (unknown event, bad secret) stops.
          if (r.network || r.status >= 500) S.poll = setTimeout(tick, POLL_MS * 3);
          return;
        }
        renderProgress(r.body);
        if (!(r.body.cancelled && r.body.done)) { S.poll = setTimeout(tick, POLL_MS); return; }
        S.poll = null;
        // The open order may have been one of the refunds: show its new state.
        var open = S.detail && S.detail.order;
        if (open && open.event_id === id) loadOrder(open.id, false);
        loadAudit(true);
      });
    };
    tick();
  }
  function stopPoll() {
    if (S.poll) clearTimeout(S.poll);
    S.poll = null;
    S.pollEvent = null;
  }
  function renderProgress(p) {
    S.progress = p;
    $("e-view").hidden = false;
    $("e-shown").textContent = p.event;
    $("e-refunded").textContent = String(p.refunded);
    $("e-pending").textContent = String(p.pending);
    $("e-retrying").textContent = String(p.retrying);
    $("e-failed").textContent = String(p.failed);
    $("e-paid").textContent = String(p.paid_remaining);
    var state = !p.cancelled ? "event.state.live" : p.done ? "event.state.done" : "event.state.running";
    $("e-state").textContent = t(state);
    $("e-view").setAttribute("data-done", p.cancelled && p.done ? "true" : "false");
    var total = p.refunded + p.pending + p.failed;
    var pct = !p.cancelled ? 0 : total === 0 ? (p.done ? 100 : 0) : Math.round(100 * (p.refunded + p.failed) / total);
    $("e-fill").style.width = pct + "%";
    $("e-bar").setAttribute("aria-valuenow", String(pct));
  }

  // ---- audit log -------------------------------------------------------------------------
  function auditSubmit(ev) {
    ev.preventDefault();
    loadAudit(true);
  }
  function loadAudit(fresh) {
    if (!signedIn()) return;
    if (fresh || !S.audit) {
      S.audit = { params: { event: $("au-event").value.trim(), limit: 25 }, cursor: null };
      clear($("audit-body"));
    }
    var a = S.audit;
    var params = { event: a.params.event, limit: a.params.limit };
    if (a.cursor) params.cursor = a.cursor;
    $("audit-next").hidden = true;
    api("GET", "/admin/audit" + qs(params)).then(function (r) {
      if (a !== S.audit) return;   // a newer load replaced this one
      if (!ok(r)) { notice("audit-message", function () { return errorText(r); }, "bad"); return; }
      notice("audit-message", null);
      var entries = (r.body && r.body.entries) || [];
      var body = $("audit-body");
      entries.forEach(function (e) {
        var tr = row([when(e.at), e.actor, e.action, e.target]);
        tr.setAttribute("data-action", e.action);
        tr.title = JSON.stringify(e.detail);
        body.appendChild(tr);
      });
      $("audit-table").hidden = body.childNodes.length === 0;
      $("audit-empty").hidden = body.childNodes.length !== 0;
      a.cursor = (r.body && r.body.next_cursor) || null;
      $("audit-next").hidden = !a.cursor;
    });
  }

  // ---- wiring ------------------------------------------------------------------------------
  function renderAll() {
    showView();
    if (S.detail) renderDetail();
    if (S.progress) renderProgress(S.progress);
    if (!$("e-confirm").hidden) $("e-confirm-text").textContent = t("confirm.event", { id: eventId() });
    if (S.confirm) {
      $("confirm-text").textContent = S.confirm.words();
      $("confirm-yes").textContent = intents()[S.confirm.intent] ? t("action.retry") : t("action.confirm");
    }
  }
  function start() {
    S.lang = pickLang();
    $("lang").addEventListener("click", function () {
      S.lang = S.lang === "ja" ? "en" : "ja";
      sset(KEY_LANG, S.lang);
      applyLang();
    });
    $("logout").addEventListener("click", signOut);
    $("login-form").addEventListener("submit", signIn);
    $("search-form").addEventListener("submit", search);
    $("next-page").addEventListener("click", loadPage);
    $("d-close").addEventListener("click", function () { $("detail").hidden = true; S.detail = null; });
    $("a-refund").addEventListener("click", function () { ask("refund"); });
    $("a-lines").addEventListener("click", function () { ask("lines"); });
    $("a-cancel").addEventListener("click", function () { ask("cancel"); });
    $("confirm-yes").addEventListener("click", confirmYes);
    $("confirm-no").addEventListener("click", confirmNo);
    $("event-form").addEventListener("submit", askEventCancel);
    $("e-typed").addEventListener("input", function () { $("e-confirm-yes").disabled = !typedMatches(); });
    $("e-id").addEventListener("input", function () { $("e-confirm").hidden = true; });
    $("e-confirm-yes").addEventListener("click", eventCancelYes);
    $("e-confirm-no").addEventListener("click", function () { $("e-confirm").hidden = true; });
    $("e-progress").addEventListener("click", function () {
      if (!eventId()) { notice("event-message", function () { return t("event.need_id"); }, "bad"); return; }
      notice("event-message", null);
      startPoll(eventId());
    });
    $("audit-form").addEventListener("submit", auditSubmit);
    $("audit-next").addEventListener("click", function () { loadAudit(false); });
    applyLang();
    if (signedIn()) loadAudit(true);
    document.body.setAttribute("data-ready", "true");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

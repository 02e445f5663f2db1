// Floodgate ops page (served by booking at /ops/, never by the gateway): order search and
// detail, refund and cancel, event cancellation with its progress, the audit log, and (for
// admins) the operators and their credentials. It calls booking's admin API on the same
// origin; no framework, no build step.
//
// Who: each person signs in with their own operator credential (`fgop_` + 43 characters,
// issued by an admin; the shared bootstrap admin secret is for automation and is refused
// here). It is checked with GET /admin/operators/me before it is kept; the credential, the
// operator's name and role live in sessionStorage only (this tab, gone when it closes) —
// never localStorage, cookies or the URL — and the credential is read from there at each
// call. Booking records the credential's holder as the actor; the page sends no name.
//
// Roles: the page hides or disables what the role may not do (viewer reads; support also
// refunds and cancels orders; admin also cancels events and manages operators), but booking
// decides: a 403 ROLE_FORBIDDEN is shown as such, and a 401 in the middle of a session (the
// credential was revoked or expired) signs the tab out, saying why.
//
// A newly issued credential is shown once, in a read-only field, and only in the page: it is
// never stored, and is wiped when the admin leaves the operators section or signs out.
//
// Never twice: each money-moving intent (refund or cancel of one order with one body) gets a
// fresh Idempotency-Key when the operator confirms it; the key is kept, in sessionStorage,
// while the outcome is unknown (network error, 5xx, request still in flight at the server),
// so a retry — even after a reload — sends the same key and booking answers the first
// request's result instead of acting again. A definite answer (2xx, 4xx) ends the intent.
(function () {
  "use strict";

  var I18N = window.FG_OPS_I18N || { en: {} };
  var KEY_CRED = "fg_ops_credential", KEY_NAME = "fg_ops_name", KEY_ROLE = "fg_ops_role";
  var KEY_ID = "fg_ops_operator_id", KEY_LANG = "fg_ops_lang";
  // An operator credential's shape (shared::credentials): refused before any request if not.
  var CREDENTIAL = /^fgop_[A-Za-z0-9_-]{43}$/;
  var ROLES = ["viewer", "support", "admin"];
  var KEY_INTENTS = "fg_ops_intents";
  var POLL_MS = 1000;

  var S = {
    lang: "en",
    search: null,        // {params, cursor}
    detail: null,        // the last GET /admin/orders/{id} answer
    confirm: null,       // {intent, path, body, text}
    audit: null,         // {params, cursor}
    poll: null,          // timer of the cancellation progress
    pollEvent: null,
    operators: null,     // the last GET /admin/operators list
    revoke: null,        // {id, name, role}: the revocation awaiting confirmation
    newSeen: false       // the new credential's box has been on screen since it was shown
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
  // Resolves (never rejects) with {status, body, network, retryAfter}: status 0 and network
  // true when no answer came back (the request may or may not have reached booking).
  // `credential` is given only by the sign-in check; every other call uses the tab's, and a
  // 401 to it ends the session (after the caller has seen the answer: signOut then wipes
  // whatever the caller showed).
  function api(method, path, body, key, credential) {
    var mine = !credential;
    var headers = { "Accept": "application/json", "Authorization": "Bearer " + (credential || sget(KEY_CRED) || "") };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (key) headers["Idempotency-Key"] = key;
    var init = { method: method, headers: headers, cache: "no-store", credentials: "omit", redirect: "error" };
    if (body !== undefined) init.body = JSON.stringify(body);
    return fetch(path, init).then(function (resp) {
      return resp.text().then(function (text) {
        var parsed = null;
        try { parsed = text ? JSON.parse(text) : null; } catch (e) { parsed = null; }
        return { status: resp.status, body: parsed, network: false,
                 retryAfter: resp.headers.get("Retry-After") };
      });
    }, function () {
      return { status: 0, body: null, network: true };
    }).then(function (r) {
      if (mine && r.status === 401 && signedIn()) {
        var why = r.body && r.body.reason;
        setTimeout(function () {
          if (!signedIn()) return;
          signOut();
          notice("login-message", function () { return t(has("out." + why) ? "out." + why : "out.refused"); }, "bad");
        }, 0);
      }
      return r;
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
    if (b.code === "UNAUTHORIZED" && b.reason && has("auth." + b.reason)) return t("auth." + b.reason);
    if (b.code && has("err." + b.code)) {
      return t("err." + b.code, { status: b.status ? statusText(b.status) : "", field: b.field || "",
                                  message: b.message || "", why: b.why || "",
                                  role: roleName(b.role), required: roleName(b.required_role),
                                  seconds: r.retryAfter || "60" });
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

  // ---- sign in / out, roles -------------------------------------------------------------
  function signedIn() { return !!(sget(KEY_CRED) && sget(KEY_NAME) && ROLES.indexOf(sget(KEY_ROLE)) >= 0); }
  function role() { return signedIn() ? sget(KEY_ROLE) : null; }
  // Whether the signed-in role includes `needed` (viewer < support < admin).
  function allows(needed) { var r = role(); return !!r && ROLES.indexOf(r) >= ROLES.indexOf(needed); }
  function roleName(r) { return r && has("role." + r) ? t("role." + r) : String(r || "–"); }
  function showView() {
    var inside = signedIn();
    document.body.setAttribute("data-state", inside ? "ops" : "login");
    document.body.setAttribute("data-role", role() || "");
    $("login-view").hidden = inside;
    $("ops-view").hidden = !inside;
    $("logout").hidden = !inside;
    $("who").hidden = !inside;
    $("who").textContent = inside ? t("who", { name: sget(KEY_NAME), role: roleName(role()) }) : "";
    applyRole();
  }
  // What the role may not do is hidden (whole sections) or disabled with the reason.
  function applyRole() {
    var inside = signedIn(), orders = allows("support"), admin = allows("admin");
    $("a-role-note").hidden = !inside || orders;
    $("a-role-note").textContent = t("role.need_support", { role: roleName(role()) });
    $("e-cancel").hidden = !admin;
    $("e-reason-wrap").hidden = !admin;
    $("e-role-note").hidden = !inside || admin;
    $("e-role-note").textContent = t("role.need_admin_event", { role: roleName(role()) });
    if (!admin) $("e-confirm").hidden = true;
    $("nav-operators").hidden = !admin;
    $("operators").hidden = !admin;
    if (!admin) clearNewCredential();
  }
  function signIn(ev) {
    ev.preventDefault();
    var credential = $("credential").value.trim();
    if (!credential) { notice("login-message", function () { return t("login.need_credential"); }, "bad"); return; }
    // Only a personal operator credential: the shared admin secret (or anything else) is
    // refused here and never sent.
    if (!CREDENTIAL.test(credential)) {
      notice("login-message", function () { return t("login.bad_shape"); }, "bad");
      return;
    }
    notice("login-message", function () { return t("login.checking"); }, "info");
    $("login-form").querySelector("button[type=submit]").disabled = true;
    // Check it with a read before keeping it: a wrong one is refused (401) and nothing is
    // stored or changed.
    api("GET", "/admin/operators/me", undefined, null, credential).then(function (r) {
      $("login-form").querySelector("button[type=submit]").disabled = false;
      var me = r.body || {};
      if (!ok(r)) { notice("login-message", function () { return errorText(r); }, "bad"); return; }
      if (me.bootstrap || !me.name || ROLES.indexOf(me.role) < 0) {
        notice("login-message", function () { return t("login.bad_shape"); }, "bad");
        return;
      }
      sset(KEY_CRED, credential);
      sset(KEY_NAME, me.name);
      sset(KEY_ROLE, me.role);
      sset(KEY_ID, me.id || null);
      $("credential").value = "";
      notice("login-message", null);
      showView();
      loadAudit(true);
      loadOperators();
    });
  }
  // Forgets everything of this session: the credential, what was on screen, open intents.
  function signOut() {
    stopPoll();
    sset(KEY_CRED, null);
    sset(KEY_NAME, null);
    sset(KEY_ROLE, null);
    sset(KEY_ID, null);
    sset(KEY_INTENTS, null);
    S.detail = null; S.search = null; S.audit = null; S.confirm = null; S.progress = null;
    S.operators = null; S.revoke = null;
    for (var id in notices) if (Object.prototype.hasOwnProperty.call(notices, id)) notice(id, null);
    clear($("results-body")); $("results").hidden = true; $("results-empty").hidden = true;
    $("next-page").hidden = true; $("detail").hidden = true; $("confirm").hidden = true;
    $("detail").removeAttribute("data-order"); $("detail").removeAttribute("data-status");
    $("e-confirm").hidden = true; $("e-view").hidden = true;
    clear($("audit-body")); $("audit-table").hidden = true; $("audit-empty").hidden = true;
    $("audit-next").hidden = true;
    clear($("op-body")); $("op-table").hidden = true; $("op-empty").hidden = true;
    $("op-confirm").hidden = true;
    clearNewCredential();
    showView();
    $("credential").focus();
  }
  // On load with a kept session: ask again who this is. A revoked or expired credential
  // signs the tab out at once (api's 401 handling); booking's name and role replace the
  // kept ones.
  function recheck() {
    api("GET", "/admin/operators/me").then(function (r) {
      if (!ok(r) || !r.body || !signedIn() || ROLES.indexOf(r.body.role) < 0) return;
      sset(KEY_NAME, r.body.name);
      sset(KEY_ROLE, r.body.role);
      renderAll();
      loadOperators();
    });
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
    // Booking sends the address masked (a***@example.com), never in full.
    $("d-email").textContent = o.email || (o.email_erased_at ? t("email.erased", { at: when(o.email_erased_at) }) : "–");
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
    list("d-mail", d.mail, function (m) {
      return when(m.created_at) + " · " + m.kind + " · " + m.state + " · " + m.attempts +
        (m.last_error ? " · " + m.last_error : "");
    });
    list("d-audit", d.audit, function (a) { return when(a.at) + " · " + whoText(a) + " · " + a.action; });

    var paid = o.status === "PAID", pending = o.status === "PENDING_PAYMENT", may = allows("support");
    $("a-refund").disabled = !paid || !may;
    $("a-lines").disabled = !paid || !may;
    $("a-cancel").disabled = !(paid || pending) || !may;
    $("m-resend").disabled = !paid || !may || !o.email;
    $("m-forget").disabled = !may || !o.email;
  }
  // Ticket e-mail: a resend queues a new message with the current codes (support role;
  // booking audits it); "forget" erases the address at once, after a confirmation.
  function mailResend() {
    var d = S.detail;
    if (!d || !d.order) return;
    var id = d.order.id;
    $("m-resend").disabled = true;
    notice("mail-message", function () { return t("loading"); }, "info");
    api("POST", "/admin/orders/" + seg(id) + "/tickets/resend").then(function (r) {
      if (ok(r)) {
        var delivery = r.body && r.body.delivery;
        notice("mail-message", function () { return t("mail.queued", { id: delivery }); }, "ok");
      } else {
        notice("mail-message", function () { return errorText(r); }, "bad");
      }
      return loadOrder(id, false);
    });
  }
  function mailForgetYes() {
    var d = S.detail;
    $("m-confirm").hidden = true;
    if (!d || !d.order) return;
    var id = d.order.id;
    api("POST", "/admin/orders/" + seg(id) + "/forget-email").then(function (r) {
      if (ok(r)) {
        var erased = r.body && r.body.erased;
        notice("mail-message", function () { return t(erased ? "mail.erased" : "mail.nothing"); }, "ok");
      } else {
        notice("mail-message", function () { return errorText(r); }, "bad");
      }
      return loadOrder(id, false);
    });
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
    if (!allows("admin")) return;   // hidden for other roles; Enter in the form lands here
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

  // Who made an audit entry: the actor with their role; for the bootstrap secret also the
  // name its caller gave (a note, not an identity).
  function whoText(e) {
    var s = e.role ? t("audit.who", { actor: e.actor, role: roleName(e.role) }) : String(e.actor);
    if (e.note) s += " · " + t("audit.note", { note: e.note });
    return s;
  }

  // ---- audit log -------------------------------------------------------------------------
  function auditSubmit(ev) {
    ev.preventDefault();
    loadAudit(true);
  }
  function loadAudit(fresh) {
    if (!signedIn()) return;
    if (fresh || !S.audit) {
      S.audit = { params: { event: $("au-event").value.trim(), limit: 25 }, cursor: null, entries: [] };
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
      a.entries = a.entries.concat(entries);
      renderAudit();
      a.cursor = (r.body && r.body.next_cursor) || null;
      $("audit-next").hidden = !a.cursor;
    });
  }

  // ---- operators (admins only) ------------------------------------------------------------
  function loadOperators() {
    if (!allows("admin")) return;
    api("GET", "/admin/operators").then(function (r) {
      if (!allows("admin")) return;
      if (!ok(r)) { notice("op-message", function () { return errorText(r); }, "bad"); return; }
      S.operators = (r.body && r.body.operators) || [];
      renderOperators();
    });
  }
  function renderOperators() {
    if (!S.operators) return;
    var body = $("op-body"); clear(body);
    S.operators.forEach(function (o) {
      var last;
      if (o.status === "active") {
        last = el("button", t("op.revoke"), "secondary small");
        last.type = "button";
        last.setAttribute("data-revoke", o.id);
        last.setAttribute("aria-label", t("op.revoke_who", { name: o.name }));
        last.addEventListener("click", function () { askRevoke(o); });
      } else if (o.status === "revoked") {
        last = t("op.revoked_by", { who: o.revoked_by || "–", at: when(o.revoked_at) });
      } else {
        last = "";
      }
      var status = has("op.status." + o.status) ? t("op.status." + o.status) : o.status;
      var tr = row([o.name, roleName(o.role), status, o.created_by, when(o.created_at), when(o.expires_at), last]);
      tr.setAttribute("data-operator", o.id);
      tr.setAttribute("data-status", o.status);
      tr.setAttribute("data-role", o.role);
      body.appendChild(tr);
    });
    $("op-table").hidden = S.operators.length === 0;
    $("op-empty").hidden = S.operators.length !== 0;
  }
  function issueOperator(ev) {
    ev.preventDefault();
    var name = $("op-name").value.trim();
    if (!name || name.length > 200 || /[\u0000-\u001f\u007f]/.test(name)) {
      notice("op-message", function () { return t("op.bad_name"); }, "bad");
      return;
    }
    var days = $("op-days").value.trim();
    var body = { name: name, role: $("op-role").value };
    if (days !== "") {
      var n = Number(days);
      if (!(n >= 1 && n <= 366 && Math.floor(n) === n)) {
        notice("op-message", function () { return t("op.bad_days"); }, "bad");
        return;
      }
      body.expires_at = new Date(Date.now() + n * 86400000).toISOString();
    }
    clearNewCredential();
    $("op-issue").disabled = true;
    notice("op-message", function () { return t("working"); }, "info");
    // Not idempotent (each call issues a new credential): an unknown outcome says to check
    // the list instead of offering a retry.
    api("POST", "/admin/operators", body).then(function (r) {
      $("op-issue").disabled = false;
      if (r.network || r.status >= 500) {
        notice("op-message", function () { return errorText(r) + " " + t("op.unknown"); }, "bad");
        loadOperators();
        return;
      }
      if (!ok(r) || !r.body || !r.body.credential) { notice("op-message", function () { return errorText(r); }, "bad"); return; }
      var made = r.body;
      notice("op-message", function () { return t("op.issued", { name: made.name, role: roleName(made.role) }); }, "ok");
      $("op-name").value = "";
      showNewCredential(made);
      loadOperators();
      loadAudit(true);
    });
  }
  // The credential lives in this read-only field only (never in S or storage).
  function showNewCredential(made) {
    $("op-secret").value = made.credential;
    var words = function () {
      return t("op.new_for", { name: made.name, role: roleName(made.role), expires: when(made.expires_at) });
    };
    S.newWords = words;
    $("op-new-for").textContent = words();
    $("op-new").hidden = false;
    S.newSeen = false;
    notice("op-copy-message", null);
    // Copying is the next thing to do: Enter or Space does it.
    $("op-copy").focus();
  }
  function clearNewCredential() {
    $("op-secret").value = "";
    $("op-new").hidden = true;
    $("op-new-for").textContent = "";
    S.newWords = null;
    S.newSeen = false;
    if (notices["op-copy-message"]) notice("op-copy-message", null);
  }
  function copyCredential() {
    var value = $("op-secret").value;
    if (!value) return;
    var copied = function () { notice("op-copy-message", function () { return t("op.copied"); }, "ok"); };
    var byHand = function () {
      var f = $("op-secret");
      f.focus();
      f.select();
      var done = false;
      try { done = document.execCommand("copy"); } catch (e) { done = false; }
      if (done) copied();
      else notice("op-copy-message", function () { return t("op.copy_failed"); }, "bad");
    };
    if (navigator.clipboard && navigator.clipboard.writeText) navigator.clipboard.writeText(value).then(copied, byHand);
    else byHand();
  }
  function askRevoke(o) {
    S.revoke = o;
    $("op-confirm-text").textContent = revokeWords();
    $("op-confirm").hidden = false;
    notice("op-revoke-message", null);
    $("op-confirm-yes").focus();
  }
  function revokeWords() {
    var o = S.revoke;
    if (!o) return "";
    var self = o.id === sget(KEY_ID);
    return t(self ? "op.confirm_revoke_self" : "op.confirm_revoke", { name: o.name, role: roleName(o.role) });
  }
  function revokeYes() {
    var o = S.revoke;
    if (!o) return;
    $("op-confirm-yes").disabled = true;
    notice("op-revoke-message", function () { return t("working"); }, "info");
    // A DELETE is idempotent (a repeat answers 204 and changes nothing): retrying is safe.
    api("DELETE", "/admin/operators/" + seg(o.id)).then(function (r) {
      $("op-confirm-yes").disabled = false;
      // No answer: the confirmation stays for a retry; a definite one closes it.
      if (r.network || r.status >= 500) { notice("op-revoke-message", function () { return errorText(r) + " " + t("err.retry_safe"); }, "bad"); return; }
      S.revoke = null;
      $("op-confirm").hidden = true;
      if (!ok(r)) { notice("op-revoke-message", function () { return errorText(r); }, "bad"); return; }
      notice("op-revoke-message", function () { return t("op.revoked", { name: o.name }); }, "ok");
      loadOperators();
      loadAudit(true);
    });
  }
  function revokeNo() {
    S.revoke = null;
    $("op-confirm").hidden = true;
    notice("op-revoke-message", null);
  }
  // Leaving the operators section wipes a shown credential: another section chosen in the
  // navigation, or the section scrolled wholly out of view after it had been seen.
  function watchLeaving() {
    window.addEventListener("hashchange", function () {
      if (location.hash !== "#operators") clearNewCredential();
    });
    if (!("IntersectionObserver" in window)) return;
    new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        if ($("op-new").hidden) return;
        if (e.isIntersecting) S.newSeen = true;
        else if (S.newSeen) clearNewCredential();
      });
    }).observe($("operators"));
  }

  // The loaded pages of the audit log, in the current language.
  function renderAudit() {
    var body = $("audit-body");
    clear(body);
    var entries = (S.audit && S.audit.entries) || [];
    entries.forEach(function (e) {
      var tr = row([when(e.at), whoText(e), e.action, e.target]);
      tr.setAttribute("data-action", e.action);
      tr.title = JSON.stringify(e.detail);
      body.appendChild(tr);
    });
    $("audit-table").hidden = entries.length === 0;
    $("audit-empty").hidden = !S.audit || entries.length !== 0;
  }

  // ---- wiring ------------------------------------------------------------------------------
  function renderAll() {
    showView();
    if (S.detail) renderDetail();
    renderOperators();
    if (S.audit && S.audit.entries.length) renderAudit();
    if (S.revoke) $("op-confirm-text").textContent = revokeWords();
    if (S.newWords) $("op-new-for").textContent = S.newWords();
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
    $("m-resend").addEventListener("click", mailResend);
    $("m-forget").addEventListener("click", function () { $("m-confirm").hidden = false; $("m-confirm-yes").focus(); });
    $("m-confirm-yes").addEventListener("click", mailForgetYes);
    $("m-confirm-no").addEventListener("click", function () { $("m-confirm").hidden = true; });
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
    $("op-form").addEventListener("submit", issueOperator);
    $("op-copy").addEventListener("click", copyCredential);
    $("op-new-done").addEventListener("click", clearNewCredential);
    $("op-confirm-yes").addEventListener("click", revokeYes);
    $("op-confirm-no").addEventListener("click", revokeNo);
    watchLeaving();
    applyLang();
    if (signedIn()) {
      recheck();
      loadAudit(true);
      loadOperators();
    }
    document.body.setAttribute("data-ready", "true");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

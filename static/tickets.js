// Floodgate ticket page (/e/{event}/tickets): the signed-in fan's tickets for one event, with
// scannable codes, on the day of the show.
//
// What it guarantees:
// - Tickets are read from booking with the fan's login (identity) token only, never the
//   admission cookie (GET /api/tickets, filtered to this event; `?order=ID` shows one order's,
//   GET /api/orders/{id}/tickets). Booking's base URL comes from the gateway
//   (<meta name="floodgate-tickets-api">).
// - Once loaded, the page keeps working with no network: a service worker (tickets-sw.js)
//   keeps the page's files, and the last answer is kept in localStorage, tagged with the
//   account it belongs to, and shown with "offline — saved at <time>" when booking cannot be
//   reached. Rotating codes are computed on the device (tickets-render.js).
// - A saved copy is never shown to another account signed in on the same device.
(function () {
  "use strict";

  var R = window.FgTickets;
  var m = location.pathname.match(/^\/e\/([a-z0-9_-]{1,64})\/tickets\/?$/);
  var EVENT = m ? m[1] : "";
  var ORDER = new URLSearchParams(location.search).get("order") || "";
  var SAVE_KEY = "fg_tickets_v1:" + EVENT;

  function $(id) { return document.getElementById(id); }

  function pickLang() {
    try {
      var saved = localStorage.getItem("fg_lang");
      if (saved === "en" || saved === "ja") return saved;
    } catch (e) { /* storage blocked */ }
    var langs = navigator.languages && navigator.languages.length ? navigator.languages : [navigator.language || "en"];
    for (var i = 0; i < langs.length; i++) {
      var l = String(langs[i]).toLowerCase();
      if (l.indexOf("ja") === 0) return "ja";
      if (l.indexOf("en") === 0) return "en";
    }
    return "en";
  }

  var S = { lang: pickLang(), view: null, shown: null, note: null };

  function t(key, params) { return R.t(S.lang, key, params); }

  function applyStrings() {
    document.documentElement.lang = S.lang;
    var nodes = document.querySelectorAll("[data-i18n]");
    for (var i = 0; i < nodes.length; i++) nodes[i].textContent = t(nodes[i].getAttribute("data-i18n"));
    var labelled = document.querySelectorAll("[data-i18n-label]");
    for (var j = 0; j < labelled.length; j++) labelled[j].setAttribute("aria-label", t(labelled[j].getAttribute("data-i18n-label")));
    $("lang").setAttribute("lang", S.lang === "ja" ? "en" : "ja");
    var name = (S.view && S.view.info && S.view.info.name) || EVENT;
    $("event-name").textContent = name;
    document.title = t("doc.title", { event: name });
  }

  // ---- the saved copy ---------------------------------------------------------------------

  function save(view) {
    try { localStorage.setItem(SAVE_KEY, JSON.stringify(view)); } catch (e) { /* full or blocked: online only */ }
  }

  function saved(sub) {
    try {
      var v = JSON.parse(localStorage.getItem(SAVE_KEY) || "null");
      if (!v || !Array.isArray(v.tickets)) return null;
      if (sub && v.sub !== sub) return null;
      return v;
    } catch (e) { return null; }
  }

  // ---- showing ------------------------------------------------------------------------------

  function setNote(key, params) {
    S.note = key ? { key: key, params: params || {} } : null;
    var n = $("note");
    n.hidden = !key;
    n.textContent = key ? t(key, params) : "";
  }

  function savedAt(ms) {
    return new Intl.DateTimeFormat(S.lang === "ja" ? "ja-JP" : "en-GB", { dateStyle: "medium", timeStyle: "short" }).format(new Date(ms));
  }

  function show() {
    $("loading").hidden = true;
    applyStrings();
    if (S.note) setNote(S.note.key, S.note.key === "page.offline" ? { time: savedAt(S.view.saved_at) } : S.note.params);
    if (S.shown) S.shown.stop();
    var v = S.view;
    if (!v) { $("list").textContent = ""; return; }
    var tickets = v.tickets.filter(function (tk) { return tk.event === EVENT; });
    var inOrder = ORDER && v.orders && v.orders[ORDER];
    if (inOrder) {
      tickets = tickets.filter(function (tk) { return inOrder.indexOf(tk.id) >= 0; });
      $("order-line").hidden = false;
      $("order-text").textContent = t("page.order", { id: ORDER });
      $("all-link").href = "/e/" + EVENT + "/tickets";
    }
    $("none").hidden = tickets.length > 0;
    S.shown = R.render($("list"), tickets, v.info, S.lang);
    // For the benchmark: when the codes were first on screen (docs/benchmarks.md).
    if (tickets.length && !S.marked && window.performance && performance.mark) {
      S.marked = true;
      performance.mark("fg-tickets-shown");
    }
  }

  // ---- loading ------------------------------------------------------------------------------

  function offline(sub) {
    S.view = saved(sub);
    if (S.view) setNote("page.offline", { time: savedAt(S.view.saved_at) });
    else setNote("page.offline.none");
    show();
  }

  function load() {
    var token = R.identity(EVENT);
    var sub = token ? R.subject(token) : null;
    if (!token) {
      $("signin").hidden = false;
      $("signin-link").href = "/e/" + EVENT;
      S.view = saved(null);
      if (S.view) setNote("page.offline", { time: savedAt(S.view.saved_at) });
      show();
      return;
    }
    var reads = [
      R.get("/api/events/" + encodeURIComponent(EVENT) + "/ticket-info"),
      R.get("/api/tickets", token)
    ];
    if (ORDER) reads.push(R.get("/api/orders/" + encodeURIComponent(ORDER) + "/tickets", token));
    Promise.all(reads).then(function (rs) {
      var info = rs[0], mine = rs[1], order = rs[2];
      // Booking's refusal of the login token. (The gateway's ADMISSION_REQUIRED means the
      // deployment routes /api/tickets to the gateway: a setup error, not the fan's sign-in.)
      if (mine.status === 401 && mine.data.code !== "ADMISSION_REQUIRED") {
        $("signin-link").href = "/e/" + EVENT;
        S.view = saved(sub);
        setNote("page.signin.again");
        show();
        return;
      }
      if (!mine.ok || !Array.isArray(mine.data.tickets)) {
        S.view = saved(sub);
        setNote("page.error", { status: mine.status });
        show();
        return;
      }
      var before = saved(sub);
      var orders = (before && before.orders) || {};
      if (order && order.ok && Array.isArray(order.data.tickets)) {
        orders[ORDER] = order.data.tickets.map(function (tk) { return tk.id; });
      }
      S.view = {
        sub: sub,
        saved_at: Date.now(),
        info: info.ok ? info.data : (before && before.info) || null,
        tickets: mine.data.tickets.filter(function (tk) { return tk.event === EVENT; }),
        orders: orders
      };
      save(S.view);
      setNote(null);
      show();
    }, function () {
      // fetch rejected: no network (or booking unreachable). The saved copy, said so.
      offline(sub);
    });
  }

  // ---- offline shell and the screen ------------------------------------------------------------

  function registerWorker() {
    if (!("serviceWorker" in navigator) || !EVENT) return;
    // Scope: this event's ticket page only. Service workers need a secure origin (https, or
    // localhost): elsewhere this fails and the page simply needs the network to load.
    navigator.serviceWorker.register("/tickets-sw.js", { scope: "/e/" + EVENT + "/tickets" })
      .catch(function (e) { if (window.console) console.warn("offline copy unavailable:", e.message); });
  }

  // Keeps the screen on while the codes are shown, where the browser allows it.
  function stayAwake() {
    if (!("wakeLock" in navigator)) return;
    var ask = function () {
      if (document.visibilityState === "visible") navigator.wakeLock.request("screen").catch(function () { /* optional */ });
    };
    document.addEventListener("visibilitychange", ask);
    ask();
  }

  function start() {
    applyStrings();
    $("lang").addEventListener("click", function () {
      S.lang = S.lang === "ja" ? "en" : "ja";
      try { localStorage.setItem("fg_lang", S.lang); } catch (e) { /* preference only */ }
      show();
    });
    if (!EVENT) { $("loading").hidden = true; return; }
    registerWorker();
    stayAwake();
    load();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

// Floodgate waiting room (/e/{event}): joins the queue once, then polls the status at the
// interval the gateway asks for (it grows with the distance to the front and is jittered),
// and moves on to the shop when admitted. No framework, no build step; works from a CDN when
// the page sets <meta name="floodgate-api" content="https://gateway.example">.
//
// Identity: the fan's login token comes from the event site (#identity=<token> in the URL,
// or window.FLOODGATE_IDENTITY); on the local stack the gateway's dev login issues one.
// The place belongs to the account, so reloading, closing the tab or switching devices keeps
// it: joining again returns the same place.
(function () {
  "use strict";

  var I18N = window.FG_WAITING_I18N || { en: {} };
  var m = location.pathname.match(/^\/e\/([a-z0-9_-]{1,64})\/?$/);
  var EVENT = m ? m[1] : (new URLSearchParams(location.search).get("event") || "");
  var metaApi = document.querySelector('meta[name="floodgate-api"]');
  var API = metaApi ? metaApi.content.replace(/\/$/, "") : "";
  var STORE = "fg_wait_" + EVENT + "_";

  var S = { lang: "en", state: "joining", first: null, timer: null, identity: null, lastStatus: null, name: null };

  function $(id) { return document.getElementById(id); }

  function store(k, v) {
    try { if (v === null) localStorage.removeItem(STORE + k); else localStorage.setItem(STORE + k, v); }
    catch (e) { /* private mode: the place is still kept server-side */ }
  }
  function load(k) { try { return localStorage.getItem(STORE + k); } catch (e) { return null; } }

  // ---- i18n ----------------------------------------------------------------------------
  function pickLang() {
    var saved = null;
    try { saved = localStorage.getItem("fg_lang"); } catch (e) { /* ignore */ }
    if (saved && I18N[saved]) return saved;
    return (navigator.language || "en").toLowerCase().indexOf("ja") === 0 ? "ja" : "en";
  }
  function t(key, n) {
    var s = (I18N[S.lang] && I18N[S.lang][key]) || (I18N.en && I18N.en[key]) || key;
    return n === undefined ? s : s.replace("{n}", String(n));
  }
  function applyLang() {
    document.documentElement.lang = S.lang;
    $("lang").textContent = S.lang === "ja" ? "English" : "日本語";
    var nodes = document.querySelectorAll("[data-i18n]");
    for (var i = 0; i < nodes.length; i++) nodes[i].textContent = t(nodes[i].getAttribute("data-i18n"));
    render();
  }

  // ---- rendering -----------------------------------------------------------------------
  // The event's name (the room config's `name`, from the join answer: one string or one per
  // language): the fan's language, then English, then the event's id. Set as text only.
  function eventName() {
    var n = S.name;
    if (typeof n === "string" && n) return n;
    if (n && typeof n === "object") {
      if (typeof n[S.lang] === "string" && n[S.lang]) return n[S.lang];
      for (var k in n) {
        if (Object.prototype.hasOwnProperty.call(n, k) && k.split("-")[0] === S.lang && typeof n[k] === "string" && n[k]) return n[k];
      }
      if (typeof n.en === "string" && n.en) return n.en;
    }
    return EVENT;
  }
  function fmtNumber(n) {
    try { return Number(n).toLocaleString(S.lang === "ja" ? "ja-JP" : "en-US"); } catch (e) { return String(n); }
  }
  function fmtEta(s) {
    if (s === null || s === undefined) return t("eta.unknown");
    if (s < 10) return t("eta.soon");
    if (s < 90) return t("eta.seconds", s);
    if (s < 5400) return t("eta.minutes", Math.round(s / 60));
    return t("eta.hours", Math.round(s / 3600));
  }

  function message(text, cls) {
    var el = $("message");
    if (!text) { el.hidden = true; return; }
    el.hidden = false;
    el.className = "message " + (cls || "");
    el.textContent = text;
  }
  function action(label, fn) {
    var b = $("action");
    if (!label) { b.hidden = true; b.onclick = null; return; }
    b.hidden = false;
    b.textContent = label;
    b.onclick = fn;
  }

  function render() {
    var st = S.lastStatus || {};
    $("event-name").textContent = eventName();
    var title = {
      joining: "title.joining", waiting: "title.waiting", paused: "title.paused", closed: "title.closed",
      sold_out: "title.sold_out", admitted: "title.admitted", expired: "title.expired",
      unavailable: "title.unavailable", unknown: "title.unknown", login: "title.login", pow: "title.pow",
      network: "title.unavailable", slow: "title.unavailable", not_registered: "title.not_registered"
    }[S.state] || "title.waiting";
    $("headline").textContent = t(title);
    document.body.setAttribute("data-state", S.state);
    var inQueue = (S.state === "waiting" || S.state === "paused") && st.position !== undefined;
    $("queue").hidden = !inQueue;
    if (inQueue) {
      $("position").textContent = fmtNumber(st.position);
      $("ahead").textContent = fmtNumber(st.ahead);
      $("eta").textContent = S.state === "paused" ? t("eta.unknown") : fmtEta(st.eta_seconds);
      var first = S.first || st.ahead || 0;
      var pct = first > 0 ? Math.max(0, Math.min(100, Math.round(100 * (1 - st.ahead / first)))) : 100;
      $("progress-fill").style.width = pct + "%";
      $("progress").setAttribute("aria-valuenow", String(pct));
      $("updated").textContent = new Date().toLocaleTimeString(S.lang === "ja" ? "ja-JP" : "en-US");
    }
    var msgs = { paused: ["msg.paused", "warn"], closed: ["msg.closed", "bad"], sold_out: ["msg.sold_out", "bad"],
      admitted: ["msg.admitted", ""], expired: ["msg.expired", "warn"], unknown: ["msg.unknown", "bad"],
      login: ["msg.login", "warn"] };
    if (msgs[S.state]) message(t(msgs[S.state][0]), msgs[S.state][1]);
    else if (S.state === "unavailable") message(t("msg.unavailable", S.retryIn), "warn");
    else if (S.state === "network") message(t("msg.network", S.retryIn), "warn");
    else if (S.state === "slow") message(t("msg.slow", S.retryIn), "warn");
    else if (S.state === "not_registered") message(notRegistered(), "bad");
    else message(null);
    $("room-note").hidden = !(S.access === "registered" && inQueue);
    $("room-note").textContent = t("msg.registered_room");
    note(st);
    if (S.state === "expired") action(t("action.rejoin"), function () { action(null); join(); });
    else if (S.state === "admitted" && S.next) action(t("action.shop"), function () { location.assign(S.next); });
    else if (S.state === "not_registered" && S.reg && S.reg.open) action(t("action.register"), register);
    else action(null);
  }

  // The safety net queueing a surge, and a scheduled opening ("the sale opens at HH:MM" in
  // the fan's own time zone), explained beside the queue state (issue 19).
  function note(st) {
    var parts = [];
    var waiting = S.state === "waiting" || S.state === "paused" || S.state === "closed";
    if (waiting && st.safety_net === "queueing") parts.push(t("note.safety_net"));
    if (waiting && st.opens_at) {
      var at = new Date(st.opens_at);
      if (!isNaN(at.getTime())) {
        parts.push(t("note.opens_at", at.toLocaleTimeString(S.lang === "ja" ? "ja-JP" : "en-US",
          { hour: "2-digit", minute: "2-digit", hour12: false })));
      }
    }
    var el = $("note");
    el.hidden = !parts.length;
    el.textContent = parts.join(" ");
  }

  function setState(s) { S.state = s; render(); }

  // ---- registered rooms ----------------------------------------------------------------
  // The closing time in the fan's own language and time zone.
  function fmtTime(iso) {
    var d = new Date(iso);
    if (!iso || isNaN(d.getTime())) return "—";
    try {
      return d.toLocaleString(S.lang === "ja" ? "ja-JP" : "en-US", { dateStyle: "medium", timeStyle: "short" });
    } catch (e) { return d.toLocaleString(); }
  }
  function notRegistered() {
    var r = S.reg || {};
    var text = t("msg.not_registered");
    if (r.closes) text += (S.lang === "ja" ? "" : " ") + t(r.open ? "msg.registration_closes" : "msg.registration_closed", fmtTime(r.closes));
    return text;
  }
  function register() {
    action(null);
    call("POST", "/queue/" + EVENT + "/register", undefined, S.identity).then(function (r) {
      if (r.status === 200) { join(); return; }
      if (r.data && r.data.code === "REGISTRATION_CLOSED") {
        S.reg = { closes: r.data.registration_closes || (S.reg && S.reg.closes), open: false };
        setState("not_registered");
        return;
      }
      if (common(r, register)) return;
      S.retryIn = 5; setState("network"); later(register, 5000);
    });
  }

  // ---- HTTP ----------------------------------------------------------------------------
  function call(method, path, body, auth) {
    var headers = { "Accept": "application/json" };
    if (auth) headers["Authorization"] = "Bearer " + auth;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    return fetch(API + path, {
      method: method, headers: headers, credentials: "include", cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body)
    }).then(function (r) {
      var ra = parseInt(r.headers.get("Retry-After") || "", 10);
      return r.text().then(function (text) {
        var data = {};
        try { data = text ? JSON.parse(text) : {}; } catch (e) { data = {}; }
        return { status: r.status, data: data, retryAfter: isFinite(ra) ? ra : null };
      });
    }, function () { return { status: 0, data: {}, retryAfter: null }; });
  }

  function later(fn, ms) {
    clearTimeout(S.timer);
    S.timer = setTimeout(fn, Math.max(250, ms));
  }

  // Answers that mean the same for join and status. Returns true when handled.
  function common(r, retry) {
    var code = r.data && r.data.code;
    if (r.status === 0) { S.retryIn = 5; setState("network"); later(retry, 5000); return true; }
    if (r.status === 503) { S.retryIn = r.retryAfter || 5; setState("unavailable"); later(retry, S.retryIn * 1000); return true; }
    if (r.status === 429) { S.retryIn = r.retryAfter || 5; setState("slow"); later(retry, S.retryIn * 1000); return true; }
    if (r.status === 401) {
      // The login token expired or is not accepted: get a fresh one once, then retry.
      S.identity = null;
      store("identity", null);
      identity().then(function (id) { if (id) retry(); });
      return true;
    }
    if (code === "UNKNOWN_EVENT") { setState("unknown"); return true; }
    if (code === "EVENT_CLOSED") { setState("closed"); return true; }
    if (code === "SOLD_OUT") { setState("sold_out"); return true; }
    return false;
  }

  // ---- identity ------------------------------------------------------------------------
  function identity() {
    var fromHash = new URLSearchParams(location.hash.slice(1)).get("identity");
    if (fromHash) {
      store("identity", fromHash);
      history.replaceState(null, "", location.pathname + location.search);
    }
    S.identity = window.FLOODGATE_IDENTITY || fromHash || load("identity");
    if (S.identity) return Promise.resolve(S.identity);
    // Local stack only: the gateway's dev login (404 elsewhere).
    var account = load("account");
    if (!account) {
      var b = new Uint8Array(6);
      crypto.getRandomValues(b);
      account = "fan-" + Array.prototype.map.call(b, function (x) { return ("0" + x.toString(16)).slice(-2); }).join("");
      store("account", account);
    }
    return call("POST", "/dev/login", { account: account }).then(function (r) {
      if (r.status === 200 && r.data.token) {
        S.identity = r.data.token;
        store("identity", S.identity);
        return S.identity;
      }
      setState("login");
      return null;
    });
  }

  // ---- proof of work (only when the event asks for it) ----------------------------------
  function zeroBits(buf) {
    var bytes = new Uint8Array(buf), bits = 0;
    for (var i = 0; i < bytes.length; i++) {
      if (bytes[i] === 0) { bits += 8; continue; }
      for (var b = 7; b >= 0; b--) { if (bytes[i] & (1 << b)) return bits; bits++; }
    }
    return bits;
  }
  function solve(challenge, difficulty) {
    var enc = new TextEncoder(), n = 0;
    function step() {
      var batch = [];
      for (var i = 0; i < 256; i++, n++) {
        batch.push((function (cand) {
          return crypto.subtle.digest("SHA-256", enc.encode(challenge + ":" + cand)).then(function (d) {
            return zeroBits(d) >= difficulty ? cand : null;
          });
        })(String(n)));
      }
      return Promise.all(batch).then(function (found) {
        for (var j = 0; j < found.length; j++) if (found[j] !== null) return found[j];
        return step();
      });
    }
    return step();
  }

  // ---- the flow ------------------------------------------------------------------------
  function join(pow) {
    if (!S.identity) return identity().then(function (id) { if (id) join(pow); });
    return call("POST", "/queue/" + EVENT + "/join", pow ? { pow: pow } : undefined, S.identity).then(function (r) {
      if (r.status === 403 && r.data.code === "POW_REQUIRED") {
        setState("pow");
        return call("GET", "/queue/" + EVENT + "/challenge", undefined, S.identity).then(function (c) {
          if (c.status !== 200) return common(c, join);
          return solve(c.data.challenge, c.data.difficulty).then(function (solution) {
            return join({ challenge: c.data.challenge, solution: solution });
          });
        });
      }
      if (r.status === 403 && r.data.code === "NOT_REGISTERED") {
        S.reg = { closes: r.data.registration_closes, open: !!r.data.registration_open };
        setState("not_registered");
        return;
      }
      if (common(r, join)) return;
      if (r.status === 200 || r.status === 201) {
        S.access = r.data.access;
        // Kept for this event, so a closed or sold-out room still shows its name after a reload.
        S.name = r.data.name || null;
        store("name", S.name ? JSON.stringify(S.name) : null);
        if (r.data.receipt) { store("receipt", r.data.receipt); $("receipt").textContent = r.data.receipt.slice(0, 24) + "…"; }
        if (r.status === 201) store("first", null);
        // A waiting fan is told where they stand and when to ask next; an admitted one (or an
        // older gateway without a position) asks right away.
        if (r.data.state !== "admitted" && r.data.ahead !== undefined) { show(r.data); return; }
        poll();
        return;
      }
      S.retryIn = 5; setState("network"); later(join, 5000);
    });
  }

  function poll() {
    call("GET", "/queue/" + EVENT + "/status", undefined, S.identity).then(function (r) {
      if (r.status === 404 && r.data.code === "NOT_IN_QUEUE") { join(); return; }
      if (common(r, poll)) return;
      if (r.status !== 200) { S.retryIn = 5; setState("network"); later(poll, 5000); return; }
      show(r.data);
    });
  }

  // Renders a status (or a join answer carrying a position) and schedules the next poll.
  function show(st) {
    S.lastStatus = st;
    if (st.state === "admitted") {
      S.next = st.next || ("/e/" + EVENT + "/shop");
      setState("admitted");
      // The HttpOnly cookie carries the admission; the token is also kept for API clients.
      try { sessionStorage.setItem("fg_admission_" + EVENT, st.token || ""); } catch (e) { /* ok */ }
      setTimeout(function () { location.assign(S.next); }, 600);
      return;
    }
    if (st.state === "expired") { store("first", null); S.first = null; setState("expired"); return; }
    if (st.ahead !== undefined) {
      var first = parseInt(load("first") || "", 10);
      if (!isFinite(first) || first < st.ahead) { first = st.ahead; store("first", String(first)); }
      S.first = first;
    }
    setState(st.state === "waiting" || st.state === "paused" || st.state === "closed" || st.state === "sold_out"
      ? st.state : "waiting");
    if (st.state === "closed" || st.state === "sold_out") return;
    later(poll, st.poll_after_ms || 5000);
  }

  // ---- start ---------------------------------------------------------------------------
  S.lang = pickLang();
  $("lang").addEventListener("click", function () {
    S.lang = S.lang === "ja" ? "en" : "ja";
    try { localStorage.setItem("fg_lang", S.lang); } catch (e) { /* preference only */ }
    applyLang();
  });
  try { S.name = JSON.parse(load("name") || "null"); } catch (e) { S.name = null; }
  var receipt = load("receipt");
  if (receipt) $("receipt").textContent = receipt.slice(0, 24) + "…";
  applyLang();
  if (!EVENT) { setState("unknown"); return; }
  identity().then(function (id) { if (id) join(); });
})();

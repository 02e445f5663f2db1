// Floodgate ticket page's service worker: keeps the page's own files so that a fan who loaded
// their tickets once can open them again at the door with no network.
//
// Registered by tickets.js with scope /e/{event}/tickets (this file sits at the root, so any
// scope below / is allowed without Service-Worker-Allowed). Network first, cache as fallback:
// a fan online always gets the current page; offline, the last copy. Only the page shell is
// cached here: the tickets themselves are kept by the page (localStorage), and the worker never
// touches API calls, which go to booking's origin and must not be answered from a stale cache.
"use strict";

var CACHE = "fg-tickets-shell-v1";
var SHELL = [
  "/tickets.css",
  "/tickets.js",
  "/tickets-render.js",
  "/tickets-i18n.js",
  "/vendor/qrcode-generator-2.0.4.js",
  "/favicon.svg"
];

function pagePath() {
  return new URL(self.registration.scope).pathname;
}

self.addEventListener("install", function (event) {
  event.waitUntil(
    caches.open(CACHE)
      .then(function (cache) { return cache.addAll(SHELL.concat([pagePath()])); })
      .then(function () { return self.skipWaiting(); })
  );
});

self.addEventListener("activate", function (event) {
  event.waitUntil(
    caches.keys().then(function (names) {
      return Promise.all(names.filter(function (n) { return n.indexOf("fg-tickets-shell-") === 0 && n !== CACHE; })
        .map(function (n) { return caches.delete(n); }));
    }).then(function () { return self.clients.claim(); })
  );
});

function isShell(url) {
  if (url.origin !== self.location.origin) return false;
  return SHELL.indexOf(url.pathname) >= 0 || url.pathname.replace(/\/$/, "") === pagePath().replace(/\/$/, "");
}

self.addEventListener("fetch", function (event) {
  var req = event.request;
  if (req.method !== "GET") return;
  var url = new URL(req.url);
  if (!isShell(url)) return;
  var key = url.origin + url.pathname; // `?order=` pages share the one cached page
  event.respondWith(
    fetch(req).then(function (resp) {
      if (resp.ok) {
        var copy = resp.clone();
        caches.open(CACHE).then(function (cache) { return cache.put(key, copy); });
      }
      return resp;
    }, function () {
      return caches.match(key).then(function (hit) { return hit || Response.error(); });
    })
  );
});

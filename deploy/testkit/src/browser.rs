//! A minimal Chrome DevTools Protocol client over WebSocket (tokio-tungstenite) for Debian's
//! headless Chromium: launch it with a throw-away profile, open pages (plain, or with a phone
//! viewport), navigate, evaluate, wait for an expression, click with real mouse events at an
//! element's centre (so an element hidden under another one is not clickable, as for a
//! person), press keys, hold or fail requests, record the answers a page got, take
//! screenshots.
//!
//! Uncaught page exceptions are collected and checked by [`Page::assert_no_js_errors`]. Every
//! failure (a DevTools error, an expression that throws, a wait that times out) panics with
//! what was asked and what the page showed.

use base64::Engine;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// The Chromium binary: `$CHROMIUM`, else `chromium` / `chromium-browser` on the PATH.
pub fn find_chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// The Chromium binary for a browser test, or `None` (with a printed reason) when it is absent
/// and `CI` is unset; in CI a missing Chromium fails the test. `test` names the test in the
/// message.
pub fn chromium_or_skip(test: &str) -> Option<PathBuf> {
    match find_chromium() {
        Some(p) => Some(p),
        None if std::env::var_os("CI").is_some() => {
            panic!("CI is set but Chromium is missing: apt-get install chromium (or set CHROMIUM)")
        }
        None => {
            eprintln!(
                "SKIPPED {test}: Chromium not found (install the Debian package `chromium` or \
                 set CHROMIUM); set CI=1 to make this a failure"
            );
            None
        }
    }
}

pub struct Browser {
    child: tokio::process::Child,
    profile: PathBuf,
    out: mpsc::UnboundedSender<Message>,
    pending: Pending,
    next_id: AtomicU64,
    errors: Arc<Mutex<Vec<String>>>,
    /// Requests paused by `Fetch` interception (the `Fetch.requestPaused` parameters: id,
    /// request with its headers), waiting for [`Page::release_requests`] or
    /// [`Page::fail_requests`].
    paused: Arc<Mutex<Vec<Value>>>,
    /// Every answer a page with [`Page::record_responses`] on received: its session, URL and
    /// HTTP status.
    responses: Arc<Mutex<Vec<(String, String, u16)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Browser {
    /// Starts Chromium headless with a fresh profile, in US English and UTC (times on a page
    /// are the fan's local time: fixed here, so tests can name them), and connects to it.
    pub async fn launch(binary: &std::path::Path) -> Browser {
        let profile = std::env::temp_dir().join(format!("fg-chromium-{}", shared::ids::new_id()));
        std::fs::create_dir_all(&profile).expect("profile dir");
        let mut child = tokio::process::Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--lang=en-US",
                // Port 0: Chromium picks one and prints it, so no port can be taken meanwhile.
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .env("TZ", "UTC")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromium");
        let stderr = child.stderr.take().expect("chromium stderr");
        let mut lines = BufReader::new(stderr).lines();
        let ws_url = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.split("DevTools listening on ").nth(1) {
                    return Some(rest.trim().to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .expect("chromium did not print its DevTools URL");
        // Keep draining stderr so Chromium never blocks on a full pipe.
        let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let (ws, _) = tokio_tungstenite::connect_async(ws_url.as_str())
            .await
            .expect("connect to DevTools");
        let (mut sink, mut stream) = ws.split();
        let (out, mut out_rx) = mpsc::unbounded_channel::<Message>();
        let writer = tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
        });
        let pending: Pending = Arc::default();
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let paused: Arc<Mutex<Vec<Value>>> = Arc::default();
        let responses: Arc<Mutex<Vec<(String, String, u16)>>> = Arc::default();
        let (p, e, held, answers) = (
            pending.clone(),
            errors.clone(),
            paused.clone(),
            responses.clone(),
        );
        let reader = tokio::spawn(async move {
            while let Some(Ok(msg)) = stream.next().await {
                let Message::Text(text) = msg else { continue };
                let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else {
                    continue;
                };
                if let Some(id) = v["id"].as_u64() {
                    if let Some(tx) = p.lock().expect("pending lock").remove(&id) {
                        let _ = tx.send(v);
                    }
                } else if v["method"] == "Fetch.requestPaused" {
                    if v["params"]["requestId"].is_string() {
                        held.lock().expect("paused lock").push(v["params"].clone());
                    }
                } else if v["method"] == "Network.responseReceived" {
                    let r = &v["params"]["response"];
                    answers.lock().expect("responses lock").push((
                        v["sessionId"].as_str().unwrap_or_default().to_owned(),
                        r["url"].as_str().unwrap_or_default().to_owned(),
                        r["status"]
                            .as_u64()
                            .and_then(|s| u16::try_from(s).ok())
                            .unwrap_or(0),
                    ));
                } else if v["method"] == "Runtime.exceptionThrown" {
                    let d = &v["params"]["exceptionDetails"];
                    let text = d["exception"]["description"]
                        .as_str()
                        .or(d["text"].as_str())
                        .unwrap_or("exception")
                        .to_owned();
                    e.lock().expect("errors lock").push(text);
                }
            }
        });
        Browser {
            child,
            profile,
            out,
            pending,
            next_id: AtomicU64::new(1),
            errors,
            paused,
            responses,
            tasks: vec![drain, writer, reader],
        }
    }

    /// Sends one command (to the browser, or to a page session) and waits for its result.
    pub async fn call(&self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.call_within(session, method, params, Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("DevTools {method} timed out"))
    }

    /// [`Browser::call`] that gives up after `limit` and answers `None` instead of panicking.
    pub async fn call_within(
        &self,
        session: Option<&str>,
        method: &str,
        params: Value,
        limit: Duration,
    ) -> Option<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(id, tx);
        self.out
            .send(Message::Text(msg.to_string().into()))
            .expect("DevTools connection closed");
        let Ok(reply) = tokio::time::timeout(limit, rx).await else {
            self.pending.lock().expect("pending lock").remove(&id);
            return None;
        };
        let v = reply.expect("DevTools reply dropped");
        if let Some(err) = v.get("error") {
            panic!("DevTools {method} failed: {err}");
        }
        Some(v["result"].clone())
    }

    /// Opens a page with a phone-sized viewport (CSS pixels) and returns it.
    pub async fn new_page(&self, width: u32, height: u32) -> Page<'_> {
        let page = self.open_page().await;
        page.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 2, "mobile": true}),
        )
        .await;
        page
    }

    /// Opens a page with Chromium's own (desktop) viewport and returns it.
    pub async fn open_page(&self) -> Page<'_> {
        let target = self
            .call(None, "Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let target_id = target["targetId"].as_str().expect("targetId").to_owned();
        let attached = self
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target_id, "flatten": true}),
            )
            .await;
        let session = attached["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_owned();
        let page = Page {
            browser: self,
            session,
        };
        page.call("Page.enable", json!({})).await;
        page.call("Runtime.enable", json!({})).await;
        page
    }
}

pub struct Page<'b> {
    browser: &'b Browser,
    session: String,
}

impl Page<'_> {
    pub async fn call(&self, method: &str, params: Value) -> Value {
        self.browser.call(Some(&self.session), method, params).await
    }

    /// Sets the languages the page sees (`navigator.language`, `Accept-Language`).
    pub async fn set_locale(&self, locale: &str) {
        self.call("Emulation.setLocaleOverride", json!({"locale": locale}))
            .await;
        self.call(
            "Network.setUserAgentOverride",
            json!({"userAgent": "Mozilla/5.0 (Linux; Android 14) floodgate-e2e", "acceptLanguage": locale}),
        )
        .await;
    }

    pub async fn navigate(&self, url: &str) {
        let r = self.call("Page.navigate", json!({"url": url})).await;
        assert!(
            r.get("errorText").is_none(),
            "navigation to {url} failed: {r}"
        );
        self.wait_for(
            "document.readyState === 'complete'",
            Duration::from_secs(15),
        )
        .await;
    }

    /// Evaluates an expression (promises awaited) and returns its JSON value.
    pub async fn eval(&self, expression: &str) -> Value {
        match self.try_eval(expression).await {
            Ok(v) => v,
            Err(ex) => panic!("evaluating `{expression}` threw: {ex}"),
        }
    }

    /// Evaluates an expression (promises awaited): its JSON value, or the exception it threw.
    async fn try_eval(&self, expression: &str) -> Result<Value, Value> {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
            )
            .await;
        match r.get("exceptionDetails") {
            Some(ex) => Err(ex.clone()),
            None => Ok(r["result"]["value"].clone()),
        }
    }

    /// Polls `expression` until it is truthy (not false/null/undefined/""/0); returns it.
    pub async fn wait_for(&self, expression: &str, timeout: Duration) -> Value {
        self.wait_until(expression, timeout, truthy).await
    }

    /// Polls `expression` every 100 ms until `done` holds for its value; returns it. An
    /// expression that throws counts as not done yet (while a page loads, `document.body` can
    /// be null). After `timeout`, panics with the expression, its last value (or exception)
    /// and the page's text.
    pub async fn wait_until(
        &self,
        expression: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.try_eval(expression).await {
                Ok(v) if done(&v) => return v,
                Ok(v) => format!("last value {v}"),
                Err(ex) => format!("it threw {ex}"),
            };
            if Instant::now() > deadline {
                let body = self.text("body").await;
                panic!("timed out waiting for `{expression}`; {last}; page text:\n{body}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The visible text of the first element matching `selector` ("" when none).
    pub async fn text(&self, selector: &str) -> String {
        let sel = serde_json::to_string(selector).expect("selector json");
        self.eval(&format!(
            "(() => {{ const e = document.querySelector({sel}); return e ? e.innerText : ''; }})()"
        ))
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    /// Clicks the first element matching `selector` like a person would: scrolls it into
    /// view, checks that it is the topmost element at its centre, and sends a real mouse
    /// press and release there.
    pub async fn click(&self, selector: &str) {
        let sel = serde_json::to_string(selector).expect("selector json");
        let point = self
            .eval(&format!(
                "(() => {{
                    const e = document.querySelector({sel});
                    if (!e) return {{missing: true}};
                    e.scrollIntoView({{block: 'center', inline: 'center'}});
                    const r = e.getBoundingClientRect();
                    const x = r.left + r.width / 2, y = r.top + r.height / 2;
                    const top = document.elementFromPoint(x, y);
                    return {{x, y, w: r.width, h: r.height,
                             covered: !(top && (top === e || e.contains(top))),
                             top: top ? top.outerHTML.slice(0, 120) : null}};
                }})()"
            ))
            .await;
        assert!(point["missing"].is_null(), "no element matches {selector}");
        assert!(
            point["w"].as_f64().unwrap_or(0.0) > 0.0,
            "{selector} is not visible: {point}"
        );
        assert_eq!(
            point["covered"], false,
            "{selector} is covered by another element: {point}"
        );
        let (x, y) = (point["x"].clone(), point["y"].clone());
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            )
            .await;
        }
    }

    /// Presses a key on the focused element (`key` as in `KeyboardEvent.key`: "ArrowRight",
    /// "Enter", " ").
    pub async fn press(&self, key: &str) {
        let (code, vk, text) = match key {
            "ArrowLeft" => ("ArrowLeft", 37, ""),
            "ArrowUp" => ("ArrowUp", 38, ""),
            "ArrowRight" => ("ArrowRight", 39, ""),
            "ArrowDown" => ("ArrowDown", 40, ""),
            "Enter" => ("Enter", 13, "\r"),
            " " => ("Space", 32, " "),
            "Tab" => ("Tab", 9, ""),
            other => panic!("press: unsupported key {other}"),
        };
        let mut down = json!({"type": "keyDown", "key": key, "code": code,
                              "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk});
        if !text.is_empty() {
            down["text"] = json!(text);
        }
        self.call("Input.dispatchKeyEvent", down).await;
        self.call(
            "Input.dispatchKeyEvent",
            json!({"type": "keyUp", "key": key, "code": code,
                   "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk}),
        )
        .await;
    }

    /// Saves a PNG screenshot of the viewport (or the full page) to `path`.
    ///
    /// Screenshots are pictures for people, never evidence a test relies on, so one that
    /// headless Chromium does not produce is reported and skipped rather than failing the
    /// test: CI saw `captureScreenshot` wait forever for a frame of a page that had lost
    /// the foreground to a permission grant. The page is brought to the front first.
    pub async fn screenshot(&self, path: &std::path::Path, full_page: bool) {
        self.call("Page.bringToFront", json!({})).await;
        let Some(r) = self
            .browser
            .call_within(
                Some(&self.session),
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": full_page}),
                Duration::from_secs(20),
            )
            .await
        else {
            eprintln!(
                "screenshot {} skipped: Chromium produced no frame within 20 s",
                path.display()
            );
            return;
        };
        let data = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("screenshot base64");
        std::fs::write(path, data).expect("write screenshot");
    }

    /// Holds back every request whose URL matches `pattern` (`*` wildcards) until
    /// [`Page::release_requests`]: the page sees them as slow, not failed.
    pub async fn hold_requests(&self, pattern: &str) {
        self.call(
            "Fetch.enable",
            json!({"patterns": [{"urlPattern": pattern, "requestStage": "Request"}]}),
        )
        .await;
    }

    /// Lets the held requests go on and stops holding new ones. Returns how many were held.
    pub async fn release_requests(&self) -> usize {
        let held: Vec<Value> =
            std::mem::take(&mut *self.browser.paused.lock().expect("paused lock"));
        for p in &held {
            self.call(
                "Fetch.continueRequest",
                json!({"requestId": p["requestId"]}),
            )
            .await;
        }
        self.call("Fetch.disable", json!({})).await;
        held.len()
    }

    /// Holds back the answers to requests whose URL matches `pattern`: the server has done
    /// the work, the page has not seen the result yet (see [`Page::fail_requests`]).
    pub async fn hold_responses(&self, pattern: &str) {
        self.call(
            "Fetch.enable",
            json!({"patterns": [{"urlPattern": pattern, "requestStage": "Response"}]}),
        )
        .await;
    }

    /// How many requests (or answers) are held right now.
    pub fn held(&self) -> usize {
        self.browser.paused.lock().expect("paused lock").len()
    }

    /// Fails every held request as a dropped connection (for a held answer: the work was
    /// done but the page sees a network error), stops holding, and returns what was held
    /// (`request.headers` shows what the page sent).
    pub async fn fail_requests(&self) -> Vec<Value> {
        let held: Vec<Value> =
            std::mem::take(&mut *self.browser.paused.lock().expect("paused lock"));
        for p in &held {
            self.call(
                "Fetch.failRequest",
                json!({"requestId": p["requestId"], "errorReason": "ConnectionReset"}),
            )
            .await;
        }
        self.call("Fetch.disable", json!({})).await;
        held
    }

    /// Records from now on every answer this page receives (document, scripts, styles,
    /// images, fetches), for [`Page::responses`].
    pub async fn record_responses(&self) {
        self.call("Network.enable", json!({})).await;
    }

    /// The answers recorded for this page so far: URL and HTTP status, in arrival order.
    pub fn responses(&self) -> Vec<(String, u16)> {
        self.browser
            .responses
            .lock()
            .expect("responses lock")
            .iter()
            .filter(|(session, _, _)| *session == self.session)
            .map(|(_, url, status)| (url.clone(), *status))
            .collect()
    }

    /// Uncaught exceptions the page threw so far.
    pub fn js_errors(&self) -> Vec<String> {
        self.browser.errors.lock().expect("errors lock").clone()
    }

    pub fn assert_no_js_errors(&self) {
        let errors = self.js_errors();
        assert!(errors.is_empty(), "the page threw: {errors:#?}");
    }
}

/// JavaScript's truthiness of a returned value (objects and arrays are truthy).
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::String(s) => !s.is_empty(),
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page that changes its text 300 ms after it loads.
    const LATE_TEXT: &str = "data:text/html,<p id=x>early</p><script>\
        setTimeout(() => document.getElementById('x').textContent = 'late', 300)</script>";

    #[tokio::test]
    async fn a_page_is_evaluated_and_awaited() {
        let Some(bin) = chromium_or_skip("testkit's browser test") else {
            return;
        };
        let browser = Browser::launch(&bin).await;
        let page = browser.open_page().await;
        page.navigate(LATE_TEXT).await;
        let v = page
            .wait_until(
                "document.getElementById('x').textContent",
                Duration::from_secs(10),
                |v| v == "late",
            )
            .await;
        assert_eq!(v, "late");
        assert_eq!(page.text("#x").await, "late");
        assert_eq!(page.eval("Promise.resolve(6 * 7)").await, 42);
        // Pinned at launch, whatever the machine's settings.
        assert_eq!(page.eval("navigator.language").await, "en-US");
        assert_eq!(
            page.eval("Intl.DateTimeFormat().resolvedOptions().timeZone")
                .await,
            "UTC"
        );
        let phone = browser.new_page(390, 844).await;
        phone
            .navigate("data:text/html,<meta name=viewport content='width=device-width'>")
            .await;
        assert_eq!(phone.eval("window.innerWidth").await, 390);
        page.assert_no_js_errors();
    }

    #[tokio::test]
    #[should_panic(expected = "timed out waiting for `document.title`; last value \"\"")]
    async fn a_wait_that_times_out_names_the_expression_and_its_last_value() {
        let Some(bin) = chromium_or_skip("testkit's browser test") else {
            panic!("timed out waiting for `document.title`; last value \"\" (skipped)");
        };
        let browser = Browser::launch(&bin).await;
        let page = browser.open_page().await;
        page.wait_for("document.title", Duration::from_millis(300))
            .await;
    }
}

//! The waiting page in a real headless Chromium (Debian's `chromium`), driven over the
//! DevTools protocol against a running gateway: it must show the fan's position, then move
//! on to the event's shop page once admitted.

use crate::helpers::*;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

pub(crate) struct Chromium {
    child: Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn chromium_binary() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|b| {
        Command::new(b)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

pub(crate) fn launch(bin: &str) -> Chromium {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("fg-chromium-{}", shared::ids::new_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--lang=en-US",
        ])
        .arg(format!("--user-data-dir={}", dir.display()))
        .arg(format!("--remote-debugging-port={port}"))
        .arg("about:blank")
        // Times on the page are the fan's local time: UTC here, so tests can name them.
        .env("TZ", "UTC")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Chromium { child, dir, port }
}

/// A minimal DevTools-protocol client for one page.
pub(crate) struct Page {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
}

impl Page {
    pub(crate) async fn open(chrome: &Chromium) -> Page {
        let http = client();
        let deadline = Instant::now() + Duration::from_secs(20);
        let ws_url = loop {
            if let Ok(r) = http
                .get(format!("http://127.0.0.1:{}/json/list", chrome.port))
                .send()
                .await
                && let Ok(list) = r.json::<Vec<Value>>().await
                && let Some(url) = list
                    .iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            {
                break url.to_owned();
            }
            assert!(Instant::now() < deadline, "chromium did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (ws, _) = tokio_tungstenite::connect_async(ws_url).await.unwrap();
        Page { ws, next_id: 0 }
    }

    pub(crate) async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws.send(Message::Text(msg.into())).await.unwrap();
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), self.ws.next())
                .await
                .expect("devtools did not answer")
                .unwrap()
                .unwrap();
            if let Message::Text(t) = m {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["id"] == id {
                    return v;
                }
            }
        }
    }

    pub(crate) async fn eval(&mut self, expr: &str) -> Value {
        let v = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expr, "returnByValue": true}),
            )
            .await;
        v["result"]["result"]["value"].clone()
    }

    /// Polls `expr` until `pred` holds (or panics with the last value after `within`).
    pub(crate) async fn wait_for(
        &mut self,
        expr: &str,
        within: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let v = self.eval(expr).await;
            if pred(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for `{expr}`; last value {v}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test]
async fn waiting_page_shows_the_position_then_moves_on_to_the_shop() {
    let Some(bin) = chromium_binary() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium is required in CI (deploy/stack test installs it)"
        );
        eprintln!("skipping the browser test: chromium is not installed");
        return;
    };
    let app = TestApp::spawn().await;
    let paused = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 600,
                        "mode": "paused"});
    assert!(app.put_config("br", paused).await.status().is_success());
    // Two fans already wait, so the browser's fan is third.
    for a in ["first-fan", "second-fan"] {
        let t = app.login(a).await;
        assert!(app.join("br", &t).await.status().is_success());
    }
    let chrome = launch(bin);
    let mut page = Page::open(&chrome).await;
    page.call("Page.navigate", json!({"url": app.url("/e/br")}))
        .await;
    // The page logs in (dev mode), joins and shows the position and the paused state.
    page.wait_for(
        "document.getElementById('position') && document.getElementById('position').textContent",
        Duration::from_secs(15),
        |v| v == "3",
    )
    .await;
    let state = page.eval("document.body.getAttribute('data-state')").await;
    assert_eq!(state, "paused");
    let ahead = page
        .eval("document.getElementById('ahead').textContent")
        .await;
    assert_eq!(ahead, "2");
    // Japanese on request.
    page.eval("document.getElementById('lang').click()").await;
    let label = page
        .eval("document.querySelector('[data-i18n=\"label.position\"]').textContent")
        .await;
    assert_eq!(label, "あなたの順番");
    // Reloading keeps the place.
    page.call("Page.reload", json!({})).await;
    page.wait_for(
        "document.getElementById('position') && document.getElementById('position').textContent",
        Duration::from_secs(15),
        |v| v == "3",
    )
    .await;
    // Admission opens: the page moves on to the shop by itself, with the admission cookie.
    let open = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 6000});
    assert!(app.put_config("br", open).await.status().is_success());
    page.wait_for("location.pathname", Duration::from_secs(20), |v| {
        v == "/e/br/shop"
    })
    .await;
    let cookies = page
        .call("Network.getCookies", json!({"urls": [app.url("/")]}))
        .await;
    let names: Vec<&str> = cookies["result"]["cookies"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        names.contains(&"fg_admission"),
        "admission cookie not stored: {cookies}"
    );
}

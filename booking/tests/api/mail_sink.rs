//! The SMTP sink's HTTP view, as `testkit::mail` will offer it (a stand-in until the shared
//! kit lands; same interface): messages by recipient, raw and parsed, and QR decoding by
//! Debian's `zbarimg`.

use std::time::{Duration, Instant};

pub struct Mailbox {
    view: String,
    client: reqwest::Client,
}

#[derive(Debug, Clone)]
pub struct Message {
    pub id: String,
    pub to: Vec<String>,
    pub subject: String,
    pub message_id: String,
    pub raw: Vec<u8>,
}

impl Message {
    pub fn parsed(&self) -> mail_parser::Message<'_> {
        mail_parser::MessageParser::default()
            .parse(&self.raw)
            .expect("a parsable message")
    }
}

/// The SMTP URL booking is given in tests, or `None` without a sink.
pub fn smtp_url() -> Option<String> {
    std::env::var("FLOODGATE_TEST_SMTP_URL").ok()
}

impl Mailbox {
    pub fn from_env() -> Option<Self> {
        let view = std::env::var("FLOODGATE_TEST_MAIL_VIEW_URL").ok()?;
        Some(Self {
            view: view.trim_end_matches('/').to_owned(),
            client: reqwest::Client::new(),
        })
    }

    /// Every message to `to` so far, oldest first.
    pub async fn messages(&self, to: &str) -> Vec<Message> {
        let url = format!("{}/api/messages", self.view);
        let list: Vec<serde_json::Value> = self
            .client
            .get(&url)
            .query(&[("to", to)])
            .send()
            .await
            .expect("mail view reachable")
            .json()
            .await
            .expect("mail view JSON");
        let mut out = Vec::new();
        for m in list {
            let id = m["id"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| m["id"].to_string());
            let raw = self
                .client
                .get(format!("{}/api/messages/{id}/raw", self.view))
                .send()
                .await
                .expect("raw message")
                .bytes()
                .await
                .expect("raw body")
                .to_vec();
            out.push(Message {
                id,
                to: m["to"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default(),
                subject: m["subject"].as_str().unwrap_or_default().to_owned(),
                message_id: m["message_id"].as_str().unwrap_or_default().to_owned(),
                raw,
            });
        }
        out
    }

    /// Waits until `to` has at least `count` messages (panics after `timeout`).
    pub async fn wait_for(&self, to: &str, count: usize, timeout: Duration) -> Vec<Message> {
        let start = Instant::now();
        loop {
            let got = self.messages(to).await;
            if got.len() >= count {
                return got;
            }
            assert!(
                start.elapsed() < timeout,
                "{to}: {} of {count} messages after {timeout:?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The texts of the QR codes in a PNG (`zbarimg --raw`).
pub fn zbar_decode(png: &[u8]) -> Vec<String> {
    let path = std::env::temp_dir().join(format!("fg-qr-{}.png", shared::ids::new_id()));
    std::fs::write(&path, png).expect("write the PNG");
    let out = std::process::Command::new("zbarimg")
        .args(["--raw", "-q", "-Sbinary"])
        .arg(&path)
        .output()
        .expect("zbarimg runs (Debian package zbar-tools)");
    let _ = std::fs::remove_file(&path);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

//! A workspace binary run as its own process by a test (the kill test, the startup tests):
//! its stderr is echoed through the test's own output, so a failing run shows it beside the
//! panic, and its tail is kept for the panic message.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Lines of stderr kept for the panic message.
const TAIL_LINES: usize = 40;

/// The workspace's binaries sit beside booking's (one target directory).
pub fn binary(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_booking")).with_file_name(name);
    assert!(
        path.exists(),
        "{} missing: build the workspace (`cargo test --workspace --all-targets --no-run`)",
        path.display()
    );
    path
}

/// A running child process; killed when dropped.
pub struct Service {
    pub name: &'static str,
    pub child: Child,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl Service {
    /// Spawns `cmd` (its environment as the caller set it) with stdout dropped and stderr
    /// echoed as `[name] line`.
    pub fn spawn(name: &'static str, mut cmd: Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(pipe) = child.stderr.take() {
            let tail = stderr.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("[{name}] {line}");
                    let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                    if tail.len() == TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            });
        }
        Self {
            name,
            child,
            stderr,
        }
    }

    pub fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Polls `url` until it answers 200 (generous deadline: a debug build starting on a loaded
    /// machine). A process that exits meanwhile fails the test at once, with its status and
    /// stderr; one that never gets ready fails with the last answer it gave.
    pub async fn wait_up(&mut self, client: &reqwest::Client, url: &str, bearer: Option<&str>) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the echo task drain what the process wrote before it died.
                tokio::time::sleep(Duration::from_millis(200)).await;
                panic!(
                    "{} exited before it was ready ({status}); its stderr:\n{}",
                    self.name,
                    self.stderr_tail()
                );
            }
            let mut req = client.get(url).timeout(Duration::from_secs(5));
            if let Some(b) = bearer {
                req = req.bearer_auth(b);
            }
            let last = match req.send().await {
                Ok(r) if r.status().is_success() => return,
                Ok(r) => {
                    let status = r.status();
                    format!("{status}: {}", r.text().await.unwrap_or_default())
                }
                Err(e) => format!("{e:#}"),
            };
            assert!(
                Instant::now() < deadline,
                "{url} ({}) never came up; last answer: {last}; its stderr:\n{}",
                self.name,
                self.stderr_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the process (SIGKILL) and reaps it.
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

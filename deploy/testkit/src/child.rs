//! A workspace binary run by a test as its own process, as an operator runs it (the kill
//! tests, the startup tests).
//!
//! - [`Service`]: a long-running child whose stderr is echoed through the test's own output
//!   (so a failing run shows it beside the panic) with its tail kept for the panic message;
//!   [`Service::wait_up`] fails at once when the process exits before it is ready.
//! - [`run_to_exit`]: a child expected to stop by itself (a refused configuration), returning
//!   its status and stderr.
//! - [`binary_beside`]: another binary of the workspace, found in the test's target directory.

use std::collections::VecDeque;
use std::io::Read;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Lines of stderr kept for the panic message.
const TAIL_LINES: usize = 40;

/// How long [`Service::wait_up`] waits: generous, for a debug build starting on a loaded
/// machine.
const UP_WITHIN: Duration = Duration::from_secs(90);

/// How long [`run_to_exit`] lets a binary run before it counts as not stopping.
const EXIT_WITHIN: Duration = Duration::from_secs(60);

/// The workspace binary `name`, beside `exe` (a test's `env!("CARGO_BIN_EXE_<its crate>")`):
/// the workspace's binaries share one target directory. Panics, saying how to build it, when
/// it is missing.
pub fn binary_beside(exe: &str, name: &str) -> PathBuf {
    let path = PathBuf::from(exe).with_file_name(name);
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
    /// echoed as `[name] line`. Must be called inside a tokio runtime (the echo is a task).
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

    /// The last lines the process wrote to stderr (at most 40).
    pub fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Polls `url` (with `bearer` as a bearer token, if any) until it answers 2xx, for up to
    /// 90 s. A process that exits meanwhile fails the test at once, with its status and
    /// stderr; one that never gets ready fails with the last answer it gave.
    pub async fn wait_up(&mut self, client: &reqwest::Client, url: &str, bearer: Option<&str>) {
        let deadline = Instant::now() + UP_WITHIN;
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

    /// Stops the process (SIGKILL: the tests that use this want it gone, not drained) and
    /// reaps it.
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// Runs `cmd` (named `name` in messages) with stdout dropped until it exits, for at most
/// 60 s, and returns its status and everything it wrote to stderr. For binaries expected to
/// stop by themselves, such as one refusing its configuration.
pub fn run_to_exit(name: &str, mut cmd: std::process::Command) -> (ExitStatus, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let deadline = Instant::now() + EXIT_WITHIN;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .unwrap_or_else(|e| panic!("wait for {name}: {e}"))
        {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name} did not exit within {} s", EXIT_WITHIN.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut stderr)
        .unwrap_or_else(|e| panic!("read {name}'s stderr: {e}"));
    (status, stderr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_to_exit_returns_the_status_and_stderr() {
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "echo refused >&2; exit 3"]);
        let (status, stderr) = run_to_exit("sh", cmd);
        assert_eq!(status.code(), Some(3));
        assert_eq!(stderr, "refused\n");
    }

    #[tokio::test]
    #[should_panic(expected = "exited before it was ready")]
    async fn wait_up_fails_at_once_when_the_process_exits() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo cannot bind >&2; exit 1"]);
        let mut service = Service::spawn("sh", cmd);
        // Port 1: nothing listens there; a wait that missed the exit would end after 90 s
        // with "never came up" instead.
        service
            .wait_up(&reqwest::Client::new(), "http://127.0.0.1:1/healthz", None)
            .await;
    }

    #[tokio::test]
    async fn stderr_tail_keeps_the_last_lines() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "for i in $(seq 1 50); do echo line$i >&2; done"]);
        let mut service = Service::spawn("sh", cmd);
        let _ = service.child.wait().await;
        let tail = crate::wait::eventually(Duration::from_secs(5), "line50 in the tail", || {
            let tail = service.stderr_tail();
            async move { tail.ends_with("line50").then_some(tail) }
        })
        .await;
        assert_eq!(tail.lines().count(), TAIL_LINES);
        assert!(tail.starts_with("line11\n"), "{tail}");
    }
}

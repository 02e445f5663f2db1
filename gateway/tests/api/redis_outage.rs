//! Redis stopped and restarted under a running gateway (a private redis-server; the shared
//! one is never touched).

use crate::helpers::*;
use reqwest::StatusCode;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PrivateRedis {
    port: u16,
    dir: std::path::PathBuf,
    child: Option<Child>,
}

impl PrivateRedis {
    pub fn start(port: u16, dir: &std::path::Path) -> PrivateRedis {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "private redis did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        PrivateRedis {
            port,
            dir: dir.to_owned(),
            child: Some(child),
        }
    }

    /// Starts the server again on the same port with the same data directory.
    fn restart(&mut self) {
        let again = PrivateRedis::start(self.port, &self.dir);
        let mut again = std::mem::ManuallyDrop::new(again);
        self.child = again.child.take();
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn redis_outage_keeps_admitted_fans_working_and_recovers() {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("fg-redis-{}", shared::ids::new_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut redis = PrivateRedis::start(port, &dir);
    let app = TestApp::spawn_with(|c| {
        c.redis.url = secrecy::SecretString::from(format!("redis://127.0.0.1:{port}"));
        // A private single server, whatever the suite runs on.
        c.redis.mode = shared::config::RedisMode::Standalone;
        c.redis.response_timeout_ms = crate::helpers::FAIL_FAST_REDIS_TIMEOUT_MS;
    })
    .await;
    app.open_event("out", 60000).await;
    let fan = app.login("fan-admitted").await;
    app.join("out", &fan).await;
    let v = app.wait_admitted("out", &fan, Duration::from_secs(5)).await;
    let admission = v["token"].as_str().unwrap().to_owned();

    redis.stop();
    // Admitted fans keep working: the token is verified without Redis.
    for _ in 0..5 {
        let r = app
            .http
            .get(app.url("/api/events/out/seats"))
            .bearer_auth(&admission)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    // New arrivals get a clear, quick 503 with Retry-After.
    let newcomer = app.login("fan-new").await;
    let t0 = Instant::now();
    let r = app.join("out", &newcomer).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "join hung for {:?}",
        t0.elapsed()
    );
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(json(r).await["code"], "WAITING_ROOM_UNAVAILABLE");
    let r = app.status("out", &fan).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let r = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        app.http
            .get(app.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );

    // Redis comes back (same data): the gateway recovers by itself.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = app.join("out", &newcomer).await;
        if r.status() == StatusCode::CREATED {
            break;
        }
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(Instant::now() < deadline, "gateway did not recover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.wait_admitted("out", &newcomer, Duration::from_secs(5))
        .await;
}

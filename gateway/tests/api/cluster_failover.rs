//! A Redis Cluster master dies (`kill -9`) in the middle of a join and admission burst: its
//! replica takes over, every fan still gets in, nobody is admitted twice, and joins see
//! `503` + `Retry-After` only for a few seconds. A private cluster of six `redis-server`s, so
//! killing a master disturbs no other test; it runs in the cluster pass of CI
//! (`FLOODGATE_REDIS_CLUSTER=1 deploy/stack test`).

use crate::helpers::*;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct PrivateCluster {
    nodes: Vec<(u16, Child)>,
    dir: std::path::PathBuf,
}

impl PrivateCluster {
    fn start() -> PrivateCluster {
        let dir = std::env::temp_dir().join(format!("fg-cluster-{}", shared::ids::new_id()));
        let mut nodes = Vec::new();
        while nodes.len() < 6 {
            // The cluster bus listens on port + 10000: both below the ephemeral range.
            let port = free_port();
            if port > 22_000 || std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_err() {
                continue;
            }
            let d = dir.join(port.to_string());
            std::fs::create_dir_all(&d).unwrap();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args([
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                    "--save",
                    "",
                ])
                // Replicas sync at once (the default waits 5 s for more replicas to attach).
                .args(["--repl-diskless-sync-delay", "0"])
                .arg("--dir")
                .arg(&d)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be installed");
            nodes.push((port, child));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for (port, _) in &nodes {
            while std::net::TcpStream::connect(("127.0.0.1", *port)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "cluster node {port} did not start"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli must be installed");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = PrivateCluster { nodes, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !c.nodes.iter().all(|(p, _)| cluster_ok(*p)) {
            assert!(Instant::now() < deadline, "cluster never became ok");
            std::thread::sleep(Duration::from_millis(100));
        }
        // A replica that has not synced with its master cannot take over from it.
        while !c.nodes.iter().all(|(p, _)| synced(*p)) {
            assert!(Instant::now() < deadline, "replicas never synced");
            std::thread::sleep(Duration::from_millis(100));
        }
        c
    }

    fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|(p, _)| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn cli(port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The port of the master serving `key`'s slot.
    fn master_of(&self, key: &str) -> u16 {
        let any = self.nodes[0].0;
        let slot: u16 = Self::cli(any, &["cluster", "keyslot", key])
            .trim()
            .parse()
            .unwrap();
        for line in Self::cli(any, &["cluster", "nodes"]).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let serves = f[8..].iter().any(|r| match r.split_once('-') {
                Some((a, b)) => {
                    (a.parse().unwrap_or(u16::MAX)..=b.parse().unwrap_or(0)).contains(&slot)
                }
                None => r.parse() == Ok(slot),
            });
            if serves {
                let addr = f[1].split('@').next().unwrap();
                return addr.rsplit(':').next().unwrap().parse().unwrap();
            }
        }
        panic!("no master serves slot {slot}");
    }

    fn kill(&mut self, port: u16) {
        let (_, child) = self.nodes.iter_mut().find(|(p, _)| *p == port).unwrap();
        child.kill().unwrap(); // SIGKILL: no shutdown, no last AOF flush
        child.wait().unwrap();
    }
}

async fn redis_conn_to(seeds: &str) -> Conn {
    Connector::new(&shared::config::RedisSettings {
        url: secrecy::SecretString::from(seeds.to_owned()),
        mode: shared::config::RedisMode::Cluster,
        ..Default::default()
    })
    .unwrap()
    .conn()
    .await
    .unwrap()
}

/// A master, or a replica whose link to its master is up.
fn synced(port: u16) -> bool {
    let info = PrivateCluster::cli(port, &["info", "replication"]);
    info.contains("role:master") || info.contains("master_link_status:up")
}

fn cluster_ok(port: u16) -> bool {
    PrivateCluster::cli(port, &["cluster", "info"]).contains("cluster_state:ok")
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for (_, c) in &mut self.nodes {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Default)]
struct Seen {
    unavailable: Vec<Instant>,
    restored: usize,
}

/// One fan: join (again after a 503, with their receipt once they have one), poll until
/// admitted; returns the admission token.
async fn fan(app: &TestApp, ev: &str, token: String, seen: Arc<Mutex<Seen>>) -> Option<String> {
    let mut receipt: Option<String> = None;
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut joined = false;
    let mut last = String::new();
    loop {
        if Instant::now() > deadline {
            eprintln!("a fan never got in; last answer: {last}");
            return None;
        }
        let path = if joined { "status" } else { "join" };
        let mut req = if joined {
            app.http.get(app.url(&format!("/queue/{ev}/{path}")))
        } else {
            app.http.post(app.url(&format!("/queue/{ev}/{path}")))
        }
        .bearer_auth(&token);
        if let Some(r) = &receipt {
            req = req.header("x-floodgate-place", r);
        }
        let r = req.send().await.unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        last = format!("{path} {status} {v}");
        match status {
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(v["code"], "WAITING_ROOM_UNAVAILABLE");
                seen.lock().unwrap().unavailable.push(Instant::now());
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            StatusCode::NOT_FOUND if v["code"] == "NOT_IN_QUEUE" => {
                // The place was lost with the master's last writes: join again, receipt shown.
                joined = false;
                continue;
            }
            s if s.is_success() => {}
            s => panic!("unexpected {s}: {v}"),
        }
        if !joined {
            joined = true;
            if v["restored"] == true {
                seen.lock().unwrap().restored += 1;
            }
            if let Some(r) = v["receipt"].as_str() {
                receipt = Some(r.to_owned());
            }
        }
        if v["state"] == "admitted"
            && let Some(t) = v["token"].as_str()
        {
            return Some(t.to_owned());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_master_killed_mid_burst_loses_no_fan_and_admits_nobody_twice() {
    if !cluster() {
        eprintln!(
            "skipped: runs in the cluster pass (FLOODGATE_REDIS_CLUSTER=1 deploy/stack test)"
        );
        return;
    }
    let mut cluster = PrivateCluster::start();
    let seeds = cluster.seeds();
    let app = TestApp::spawn_with(|c| {
        c.redis.url = secrecy::SecretString::from(seeds.clone());
        c.redis.mode = shared::config::RedisMode::Cluster;
        c.redis.response_timeout_ms = crate::helpers::FAIL_FAST_REDIS_TIMEOUT_MS;
    })
    .await;
    let ev = "failover";
    let cfg = json!({"sale_start": "2020-01-01T00:00:00Z", "admit_per_minute": 6000});
    assert_eq!(app.put_config(ev, cfg).await.status(), StatusCode::OK);
    let n = 300;
    let mut tokens = Vec::new();
    for i in 0..n {
        tokens.push(app.login(&format!("fo-{i:04}")).await);
    }
    let master = cluster.master_of(&app.key(ev, "q"));
    let seen = Arc::new(Mutex::new(Seen::default()));
    // Arrivals spread over ~4 s; the master dies after one.
    let fans = futures::stream::iter(tokens.into_iter().enumerate())
        .map(|(i, t)| {
            let (app, seen) = (&app, seen.clone());
            async move {
                tokio::time::sleep(Duration::from_millis(i as u64 * 13)).await;
                fan(app, ev, t, seen).await
            }
        })
        .buffer_unordered(n)
        .collect::<Vec<Option<String>>>();
    let killer = async {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        cluster.kill(master);
        Instant::now()
    };
    let (admitted, killed_at) = tokio::join!(fans, killer);
    let admitted = admitted.into_iter().flatten().count();
    if admitted < n {
        let metrics = app
            .http
            .get(app.admin_url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for l in metrics
            .lines()
            .filter(|l| l.starts_with("fg_") && !l.contains("bucket"))
        {
            eprintln!("{l}");
        }
        let mut conn = redis_conn_to(&cluster.seeds()).await;
        let q: Value = redis::cmd("ZCARD")
            .arg(app.key(ev, "q"))
            .query_async::<redis::Value>(&mut conn)
            .await
            .map(|v| json!(format!("{v:?}")))
            .unwrap_or(Value::Null);
        let lease: Value = redis::cmd("GET")
            .arg(app.key(ev, "lease"))
            .query_async::<redis::Value>(&mut conn)
            .await
            .map(|v| json!(format!("{v:?}")))
            .unwrap_or(Value::Null);
        eprintln!("q {q} lease {lease}");
        for (p, _) in &cluster.nodes {
            eprintln!(
                "node {p}: {}",
                PrivateCluster::cli(*p, &["cluster", "nodes"]).replace('\n', " | ")
            );
        }
    }
    assert_eq!(admitted, n, "every fan got an admission token");

    // Nobody admitted twice: the admission log (on the promoted replica) names each fan once.
    let mut conn = redis_conn_to(&seeds).await;
    let log = admissions(&mut conn, &app.key(ev, "admissions")).await;
    let mut once = std::collections::HashSet::new();
    for (a, _, _) in &log {
        assert!(once.insert(a.clone()), "{a} admitted twice");
    }
    let seen = seen.lock().unwrap();
    // The failover was exercised, and the outage it caused was short.
    assert!(
        !seen.unavailable.is_empty(),
        "no request met the dead master"
    );
    let last = seen.unavailable.iter().max().unwrap();
    let outage = last.saturating_duration_since(killed_at);
    assert!(
        outage < Duration::from_secs(10),
        "503s for {outage:?} after the master died"
    );
    println!(
        "master :{master} killed; 503 answers: {} over {outage:?}; places restored from receipts: {}; admissions logged: {}",
        seen.unavailable.len(),
        seen.restored,
        log.len()
    );
}

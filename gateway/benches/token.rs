//! Micro-benchmark of the per-request admission check (`cargo bench -p gateway --bench
//! token`): a plain timing loop over many iterations, reported as ns per call. A timing loop
//! rather than criterion keeps the dependency tree small; the numbers are stable to a few
//! percent on an idle machine, which is all the comparison needs (HS256 vs the design
//! target of "a few microseconds").
//!
//! Also `token mint-identities N` prints N dev identity tokens (for the join/status load
//! test in deploy/bench/gateway.sh), signed with `FLOODGATE_IDENTITY__KEY`.

use gateway::fasttoken::FastVerifier;
use gateway::live::Live;
use gateway::proxy::check_admission;
use http::{HeaderMap, HeaderValue};
use secrecy::SecretString;
use shared::config::{IdentitySettings, KeySettings, TokenSettings};
use shared::identity::IdentityVerifier;
use shared::token::AdmissionTokens;
use std::hint::black_box;
use std::time::Instant;

fn time<F: FnMut() -> bool>(name: &str, iters: u32, mut f: F) {
    for _ in 0..iters / 10 {
        black_box(f());
    }
    let start = Instant::now();
    let mut ok = 0u32;
    for _ in 0..iters {
        ok += u32::from(black_box(f()));
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(iters);
    println!("{name:<44} {ns:>9.0} ns/op   ({ok}/{iters} accepted)");
}

fn main() {
    // `cargo bench` passes `--bench` first; look for the mode anywhere.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match args.first().map(String::as_str) {
        Some("lua") => {
            match args.get(1).map(String::as_str) {
                Some("join") => print!("{}", gateway::store::JOIN_LUA),
                Some("status") => print!("{}", gateway::store::STATUS_LUA),
                _ => eprintln!("usage: token lua join|status"),
            }
            return;
        }
        Some("mint-identities") => {}
        // `cargo test --all-targets` runs this binary without `--bench`: a quick smoke run.
        _ => {
            return bench(if std::env::args().any(|a| a == "--bench") {
                200_000
            } else {
                1_000
            });
        }
    }
    {
        let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
        let key = std::env::var("FLOODGATE_IDENTITY__KEY")
            .unwrap_or_else(|_| IdentitySettings::default().key.expose_secret_string());
        let v = IdentityVerifier::new(&IdentitySettings {
            key: SecretString::from(key),
            dev_login: true,
            ..IdentitySettings::default()
        })
        .expect("identity settings");
        let now = chrono::Utc::now().timestamp();
        for i in 0..n {
            println!("{}", v.dev_mint(&format!("bench-{i}"), now).expect("mint"));
        }
    }
}

fn bench(iters: u32) {
    let settings = TokenSettings {
        current_kid: "k2".into(),
        keys: vec![
            KeySettings {
                kid: "k1".into(),
                secret: SecretString::from("bench-key-one-0123456789abcdef0123456789"),
            },
            KeySettings {
                kid: "k2".into(),
                secret: SecretString::from("bench-key-two-0123456789abcdef0123456789"),
            },
        ],
        ..TokenSettings::default()
    };
    let tokens = AdmissionTokens::new(&settings).expect("keys");
    let fast = FastVerifier::new(&settings);
    let now = chrono::Utc::now().timestamp();
    let (tok, _) = tokens
        .mint(
            "fan-12345",
            "0193a0f0c1d27c3e9a1b2c3d4e5f6a7b",
            "tour-2027-tokyo",
            now,
            600,
        )
        .expect("mint");
    let live = Live::default();
    let mut bearer = HeaderMap::new();
    bearer.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {tok}")).expect("header"),
    );
    let mut cookie = HeaderMap::new();
    cookie.insert(
        http::header::COOKIE,
        HeaderValue::from_str(&format!("theme=dark; fg_admission={tok}; lang=ja")).expect("header"),
    );
    let mut bad = tok.clone();
    bad.pop();
    bad.push(if tok.ends_with('A') { 'B' } else { 'A' });
    println!("admission token: HS256, {} bytes", tok.len());
    time(
        "shared AdmissionTokens::verify (jsonwebtoken)",
        iters,
        || tokens.verify(&tok).is_ok(),
    );
    time(
        "gateway FastVerifier::verify (ring, one pass)",
        iters,
        || fast.verify(&tok, now).is_ok(),
    );
    time(
        "gateway FastVerifier::verify_cached (repeat)",
        iters,
        || fast.verify_cached(&tok, now).is_ok(),
    );
    time("check_admission: Bearer, event path", iters, || {
        check_admission(&fast, &live, &bearer, Some("tour-2027-tokyo"), now).is_ok()
    });
    time("check_admission: cookie", iters, || {
        check_admission(&fast, &live, &cookie, None, now).is_ok()
    });
    time("FastVerifier, bad signature (refused)", iters, || {
        fast.verify(&bad, now).is_ok()
    });
    time("mint", iters / 4, || {
        tokens
            .mint("fan-1", "s", "tour-2027-tokyo", now, 600)
            .is_ok()
    });
}

trait ExposeString {
    fn expose_secret_string(&self) -> String;
}

impl ExposeString for SecretString {
    fn expose_secret_string(&self) -> String {
        use secrecy::ExposeSecret;
        self.expose_secret().to_owned()
    }
}

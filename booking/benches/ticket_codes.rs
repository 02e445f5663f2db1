//! Signing and verifying ticket codes (issue 43; `deploy/stack bench tickets` runs it):
//!
//!     cargo bench -p booking --bench ticket_codes [-- --quick]
//!
//! Measures, on one core, per operation: signing a code (Ed25519 compact JWS), verifying it
//! (what a scanner or the door does per scan; goal ≤ 50 µs), a rotating code's TOTP, and the
//! per-ticket secret. The baseline in the same run is the admission-token check every
//! admitted request already pays (HS256 via `jsonwebtoken`), so the verify figure is also
//! given as a ratio to it, which this noisy box moves far less than the absolute numbers.
//! Each figure is the median of `ROUNDS` rounds (3 with `--quick`, else 11).
//!
//! Prints a human table, then one JSON line (`{"bench":"ticket_codes",…}`) for scripts.

use booking::tickets::code::{SigningKeySetting, TicketClaims, TicketKeys, rotating_text};
use secrecy::SecretString;
use shared::config::{KeySettings, TokenSettings};
use shared::token::AdmissionTokens;
use std::hint::black_box;
use std::time::Instant;

/// Median nanoseconds per call of `f` over `rounds` rounds of `iters` calls.
fn measure(rounds: usize, iters: u32, mut f: impl FnMut()) -> f64 {
    // Warm-up: caches, branch predictors, lazy statics.
    for _ in 0..iters / 10 + 1 {
        f();
    }
    let mut per_call: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(iters)
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[per_call.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rounds, iters) = if quick { (3, 2_000) } else { (11, 20_000) };

    let keys = TicketKeys::new(
        &[SigningKeySetting {
            kid: "bench-1".into(),
            // A fixed 32-byte seed (base64url): the figures do not depend on the key.
            secret: SecretString::from("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".to_owned()),
        }],
        "bench-1",
        &SecretString::from("bench-handle-secret".to_owned()),
        &SecretString::from("bench-door-secret".to_owned()),
    )
    .map_err(|e| anyhow::anyhow!("ticket keys: {e}"))?;
    let claims = TicketClaims {
        tid: "01936f1e8c7a7d2e9b3f4a5b6c7d8e9f".into(),
        evt: "tour-2027-tokyo-dome-day1".into(),
        seat: Some("A12-R30-S117".into()),
        tier: None,
        hnd: keys.handle("fan-0123456789"),
        ver: 1,
        iat: 1_796_000_000,
        rot: None,
    };
    let code = keys.sign(&claims);
    anyhow::ensure!(keys.verify(&code)? == claims, "the code must verify");

    let tokens = AdmissionTokens::new(&TokenSettings {
        current_kid: "bench-1".into(),
        keys: vec![KeySettings {
            kid: "bench-1".into(),
            secret: SecretString::from("bench-admission-secret-0123456789abcdef".to_owned()),
        }],
        ..TokenSettings::default()
    })
    .map_err(|e| anyhow::anyhow!("admission keys: {e}"))?;
    let now = chrono::Utc::now().timestamp();
    let (admission, _) = tokens
        .mint(
            "fan-0123456789",
            "sess",
            "tour-2027-tokyo-dome-day1",
            now,
            600,
        )
        .map_err(|e| anyhow::anyhow!("minting: {e}"))?;
    anyhow::ensure!(
        tokens.verify(&admission).is_ok(),
        "the admission must verify"
    );

    let secret = keys.ticket_secret(&claims.evt, &claims.tid, claims.ver);
    let sign_ns = measure(rounds, iters, || {
        black_box(keys.sign(black_box(&claims)));
    });
    let verify_ns = measure(rounds, iters, || {
        let _ = black_box(keys.verify(black_box(&code)));
    });
    let baseline_ns = measure(rounds, iters, || {
        let _ = black_box(tokens.verify(black_box(&admission)));
    });
    let rotating_ns = measure(rounds, iters, || {
        black_box(rotating_text(
            black_box(&code),
            &secret,
            black_box(1_796_000_000),
        ));
    });
    let secret_ns = measure(rounds, iters, || {
        black_box(keys.ticket_secret(&claims.evt, black_box(&claims.tid), claims.ver));
    });

    let us = |ns: f64| ns / 1000.0;
    println!("ticket codes ({rounds} rounds x {iters} calls, median per call, one core)");
    println!("  sign a code                 {:>8.2} µs", us(sign_ns));
    println!(
        "  verify a code               {:>8.2} µs   (goal ≤ 50 µs)",
        us(verify_ns)
    );
    println!(
        "  admission token check       {:>8.2} µs   (baseline: HS256, every admitted request)",
        us(baseline_ns)
    );
    println!(
        "  verify / admission check    {:>8.2}x",
        verify_ns / baseline_ns
    );
    println!("  rotating text (TOTP step)   {:>8.2} µs", us(rotating_ns));
    println!("  per-ticket secret           {:>8.2} µs", us(secret_ns));
    println!("  code length                 {:>8} bytes", code.len());
    println!(
        "{{\"bench\":\"ticket_codes\",\"quick\":{quick},\"sign_us\":{:.3},\"verify_us\":{:.3},\"admission_verify_us\":{:.3},\"verify_ratio\":{:.3},\"rotating_us\":{:.3},\"secret_us\":{:.3},\"code_bytes\":{}}}",
        us(sign_ns),
        us(verify_ns),
        us(baseline_ns),
        verify_ns / baseline_ns,
        us(rotating_ns),
        us(secret_ns),
        code.len()
    );
    Ok(())
}

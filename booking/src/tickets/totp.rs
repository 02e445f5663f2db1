//! Time-based one-time passwords (RFC 6238) with HMAC-SHA256 and 8 digits: the moving part of a
//! rotating ticket code. The fan's device computes them offline from the ticket's secret; the
//! door accepts the current step and one either side (clock drift, the seconds a scan takes).
//!
//! T0 = 0; the step is a parameter (15 s for tickets, 30 s in RFC 6238's own test vectors).

use ring::hmac;

/// Digits in a ticket TOTP.
pub const DIGITS: u32 = 8;
/// Seconds per TOTP step for ticket codes (DESIGN section 9).
pub const TICKET_STEP_S: u64 = 15;
/// Steps either side of the current one a door accepts.
pub const WINDOW: u64 = 1;

/// The 8-digit code for `unix_s` under `key` with `step_s`-second steps (RFC 6238 with
/// HMAC-SHA256, RFC 4226's dynamic truncation).
pub fn code(key: &[u8], unix_s: u64, step_s: u64) -> String {
    at_counter(key, unix_s / step_s.max(1))
}

fn at_counter(key: &[u8], counter: u64) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    let mac = hmac::sign(&key, &counter.to_be_bytes());
    let mac = mac.as_ref();
    // The last byte's low nibble picks four bytes; the top bit is dropped (RFC 4226 5.3).
    let offset = usize::from(mac[mac.len() - 1] & 0x0f);
    let bin = u32::from_be_bytes([
        mac[offset] & 0x7f,
        mac[offset + 1],
        mac[offset + 2],
        mac[offset + 3],
    ]);
    format!(
        "{:0width$}",
        bin % 10u32.pow(DIGITS),
        width = DIGITS as usize
    )
}

/// Whether `presented` is the code of the step at `unix_s` or of one step either side.
/// Compared in constant time per candidate.
pub fn accepts(key: &[u8], presented: &str, unix_s: u64, step_s: u64) -> bool {
    if presented.len() != DIGITS as usize || !presented.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let now = unix_s / step_s.max(1);
    let mut ok = false;
    for counter in now.saturating_sub(WINDOW)..=now.saturating_add(WINDOW) {
        let expected = at_counter(key, counter);
        ok |= bool::from(subtle::ConstantTimeEq::ct_eq(
            expected.as_bytes(),
            presented.as_bytes(),
        ));
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6238 appendix B, the SHA-256 column (30 s steps, 8 digits, the 32-byte ASCII key).
    #[test]
    fn rfc_6238_sha256_vectors() {
        let key = b"12345678901234567890123456789012";
        for (t, expected) in [
            (59, "46119246"),
            (1_111_111_109, "68084774"),
            (1_111_111_111, "67062674"),
            (1_234_567_890, "91819424"),
            (2_000_000_000, "90698825"),
            (20_000_000_000, "77737706"),
        ] {
            assert_eq!(code(key, t, 30), expected, "T = {t}");
        }
    }

    #[test]
    fn the_current_step_and_one_either_side_are_accepted() {
        let key = b"per-ticket secret";
        let now = 1_800_000_000; // a multiple of 15: the start of a step
        let step = TICKET_STEP_S;
        let current = code(key, now, step);
        assert!(accepts(key, &current, now, step));
        assert!(accepts(key, &code(key, now - step, step), now, step));
        assert!(accepts(key, &code(key, now + step, step), now, step));
        assert!(!accepts(key, &code(key, now - 2 * step, step), now, step));
        assert!(!accepts(key, &code(key, now + 2 * step, step), now, step));
        // Within one step the code does not change.
        assert_eq!(code(key, now + step - 1, step), current);
        assert!(!accepts(key, "1234567", now, step));
        assert!(!accepts(key, "abcdefgh", now, step));
        assert!(!accepts(b"another key", &current, now, step));
    }
}

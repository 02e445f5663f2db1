//! A ticket code as a QR PNG for the e-mail: the code's text exactly, error correction M,
//! a 4-module quiet zone (ISO/IEC 18004), each module [`MODULE_PX`] pixels square, 8-bit
//! grayscale. The QR matrix comes from `qrcode` without its image features; `png` encodes it
//! (docs/decisions.md, "QR codes in e-mail").

use anyhow::Context;
use qrcode::{Color, EcLevel, QrCode};

/// Quiet zone on every side, in modules.
pub const QUIET_MODULES: usize = 4;
/// Pixels per module: a ~300-byte code is ~70 modules, ~600 px with the quiet zone, which
/// the HTML shows at 280 CSS px (at least 240, DESIGN section 9).
pub const MODULE_PX: usize = 8;

/// The PNG of `text`'s QR code.
pub fn png(text: &str) -> anyhow::Result<Vec<u8>> {
    let code = QrCode::with_error_correction_level(text.as_bytes(), EcLevel::M)
        .context("failed to encode a ticket code as a QR code")?;
    let modules = code.width();
    let colors = code.to_colors();
    let side_modules = modules + 2 * QUIET_MODULES;
    let side = side_modules * MODULE_PX;
    let mut pixels = vec![255u8; side * side];
    for (i, color) in colors.iter().enumerate() {
        if *color != Color::Dark {
            continue;
        }
        let (mx, my) = (i % modules + QUIET_MODULES, i / modules + QUIET_MODULES);
        for y in my * MODULE_PX..(my + 1) * MODULE_PX {
            let row = y * side;
            pixels[row + mx * MODULE_PX..row + (mx + 1) * MODULE_PX].fill(0);
        }
    }
    let side32 = u32::try_from(side).context("QR image too large")?;
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, side32, side32);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder
        .write_header()
        .context("failed to write the QR PNG header")?;
    writer
        .write_image_data(&pixels)
        .context("failed to write the QR PNG")?;
    writer.finish().context("failed to finish the QR PNG")?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_png_has_a_quiet_zone_and_square_modules() {
        let bytes = png("hello ticket").expect("png");
        let decoder = png::Decoder::new(std::io::Cursor::new(&bytes));
        let mut reader = decoder.read_info().expect("info");
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).expect("frame");
        assert_eq!(info.width, info.height);
        let side = info.width as usize;
        assert_eq!(side % MODULE_PX, 0);
        // The quiet zone is white all round; the finder pattern's corner right after it is
        // dark.
        let quiet = QUIET_MODULES * MODULE_PX;
        assert!(buf[..quiet * side].iter().all(|&p| p == 255));
        assert!((0..side).all(|y| buf[y * side..y * side + quiet].iter().all(|&p| p == 255)));
        assert_eq!(buf[quiet * side + quiet], 0);
    }
}

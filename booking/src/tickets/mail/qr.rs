//! A ticket code as a QR PNG for the e-mail: the code's text exactly, error correction M,
//! a 4-module quiet zone (ISO/IEC 18004), each module [`MODULE_PX`] pixels square, 1-bit
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
    // One bit per pixel (1 = white), rows padded to whole bytes: an eighth of the pixels an
    // 8-bit image would deflate. Each module row is drawn once and copied to its pixel rows.
    let stride = side.div_ceil(8);
    let mut pixels = vec![0xffu8; stride * side];
    let mut row = vec![0xffu8; stride];
    for my in 0..modules {
        row.fill(0xff);
        for mx in 0..modules {
            if colors[my * modules + mx] != Color::Dark {
                continue;
            }
            let x0 = (mx + QUIET_MODULES) * MODULE_PX;
            for x in x0..x0 + MODULE_PX {
                row[x / 8] &= !(0x80 >> (x % 8));
            }
        }
        let y0 = (my + QUIET_MODULES) * MODULE_PX;
        for y in y0..y0 + MODULE_PX {
            pixels[y * stride..(y + 1) * stride].copy_from_slice(&row);
        }
    }
    let side32 = u32::try_from(side).context("QR image too large")?;
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, side32, side32);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::One);
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
        let mut decoder = png::Decoder::new(std::io::Cursor::new(&bytes));
        // 1-bit pixels as 0 / 255 bytes.
        decoder.set_transformations(png::Transformations::EXPAND);
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

// Decodes the QR codes in PNG screenshots with an independent decoder (npm `zxing-wasm`,
// ZXing-C++), as a door's scanner would read the fan's screen.
//
//   node qr_decode.mjs < {"pngs": [base64 PNG...]}
//
// Prints {"texts": [text | null ...]}: the one QR code's text per image, null when none is
// found. The tools live outside this folder (FLOODGATE_TEST_NODE_MODULES, deploy/node/install.sh).
import { createRequire } from "node:module";
import { join } from "node:path";
import { readFileSync } from "node:fs";

const modules = process.env.FLOODGATE_TEST_NODE_MODULES;
if (!modules) {
  console.error("FLOODGATE_TEST_NODE_MODULES is not set");
  process.exit(2);
}
const require = createRequire(join(modules, "..", "resolve-from-here.js"));
const zxing = require("zxing-wasm/reader");
// Offline: the wasm from the package itself, never its CDN default.
zxing.prepareZXingModule({
  overrides: { wasmBinary: readFileSync(require.resolve("zxing-wasm/reader/zxing_reader.wasm")) },
});

let input = "";
for await (const chunk of process.stdin) input += chunk;
const { pngs } = JSON.parse(input);
const texts = [];
for (const png of pngs) {
  const found = await zxing.readBarcodes(Buffer.from(png, "base64"), { formats: ["QRCode"], tryHarder: true });
  texts.push(found.length === 1 && found[0].isValid ? found[0].text : null);
}
console.log(JSON.stringify({ texts }));

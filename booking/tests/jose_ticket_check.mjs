// Verifies Floodgate ticket codes with an independent JOSE library (npm `jose`), against the
// JWKS fetched over HTTP from booking, exactly as a third party's door would.
//
//   node jose_ticket_check.mjs < {"jwks_url", "valid": [code...], "invalid": [code...]}
//
// Prints {"valid": [{"ok", "payload"?, "header"?, "error"?}], "invalid": [{"ok", "error"?}]}.
// The tools live outside this folder (FLOODGATE_TEST_NODE_MODULES, deploy/node/install.sh).
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.env.FLOODGATE_TEST_NODE_MODULES;
if (!modules) {
  console.error("FLOODGATE_TEST_NODE_MODULES is not set");
  process.exit(2);
}
const require = createRequire(join(modules, "..", "resolve-from-here.js"));
const jose = await import(pathToFileURL(require.resolve("jose")).href);

let input = "";
for await (const chunk of process.stdin) input += chunk;
const { jwks_url, valid, invalid } = JSON.parse(input);
const jwks = jose.createRemoteJWKSet(new URL(jwks_url));
const options = { algorithms: ["EdDSA"], typ: "fg-ticket+jwt" };

async function check(code) {
  try {
    const { payload, protectedHeader } = await jose.jwtVerify(code, jwks, options);
    return { ok: true, payload, header: protectedHeader };
  } catch (e) {
    return { ok: false, error: e.code ?? String(e) };
  }
}

const out = { valid: [], invalid: [] };
for (const code of valid) out.valid.push(await check(code));
for (const code of invalid) out.invalid.push(await check(code));
console.log(JSON.stringify(out));

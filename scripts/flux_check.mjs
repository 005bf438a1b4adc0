#!/usr/bin/env node
// Check Flux sources with the real Flux language server (npm @influxdata/flux-lsp-node,
// the flux-lsp Rust crate compiled to wasm; scripts/setup.sh installs it in .tools/flux).
//
//   echo '{"name": "from(bucket: \"b\") |> range(start: -1h)"}' | node scripts/flux_check.mjs
//   -> {"name": []}
//
// Reads JSON {name: fluxSource} on stdin and prints JSON {name: ["line:col severity: message"]}
// (1-based line and column). Exit 0 when the check ran, whatever it found; 2 when it could not run.
// Each source is opened as the only file of its own folder: flux-lsp analyses the .flux files of
// one folder as one package, so sources sharing a folder would see each other's definitions.
// What the server reports (errors unless marked): syntax errors; undefined identifiers (unknown
// functions, packages used without `import`); invalid import paths; wrong argument names and
// missing required arguments of stdlib functions; type errors found by inference (including
// invalid regex literals); warnings for identifiers InfluxDB may provide (v, task, params) and
// hints for experimental/contrib packages. It knows nothing about buckets, measurements, fields
// or column types, and does not run the query.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const PACKAGE = process.env.FLUX_LSP_PACKAGE ||
  join(dirname(fileURLToPath(import.meta.url)), "..", ".tools", "flux", "node_modules", "@influxdata", "flux-lsp-node");
const SEVERITY = { 1: "error", 2: "warning", 3: "info", 4: "hint" };
const TIMEOUT_MS = 10000;

function fail(message) {
  process.stderr.write(`flux_check: ${message}\n`);
  process.exit(2);
}

// The wasm logs through console.* and console.info goes to stdout: keep stdout for the result,
// drop the server's info/debug chatter ("language server initialized"), keep warnings on stderr.
for (const level of ["log", "info", "debug"]) console[level] = () => {};
console.warn = (...args) => process.stderr.write(args.join(" ") + "\n");

async function main() {
  let sources;
  try {
    sources = JSON.parse(readFileSync(0, "utf8"));
  } catch (err) {
    fail(`stdin is not JSON: ${err.message}`);
  }
  if (sources === null || typeof sources !== "object" || Array.isArray(sources) ||
      Object.values(sources).some((s) => typeof s !== "string")) {
    fail("stdin must be a JSON object {name: fluxSource}");
  }
  let flux;
  try {
    flux = createRequire(import.meta.url)(PACKAGE);
  } catch (err) {
    fail(`cannot load ${PACKAGE} (run scripts/setup.sh): ${err.message}`);
  }
  const server = new flux.Lsp();
  const published = new Map(); // uri -> diagnostics (the first publish for that uri)
  server.onMessage((text) => {
    const msg = JSON.parse(text);
    if (msg.method === "textDocument/publishDiagnostics" && !published.has(msg.params.uri)) {
      published.set(msg.params.uri, msg.params.diagnostics);
    }
  });
  server.run().catch((err) => fail(`server stopped: ${err}`));
  const send = (method, params, id) =>
    server.send(JSON.stringify({ jsonrpc: "2.0", ...(id === undefined ? {} : { id }), method, params }));
  await send("initialize", { processId: null, rootUri: null, capabilities: {} }, 1);
  await send("initialized", {});

  const result = {};
  const names = Object.keys(sources);
  for (const [i, name] of names.entries()) {
    const uri = `file:///source-${i}/query.flux`;
    await send("textDocument/didOpen", { textDocument: { uri, languageId: "flux", version: 1, text: sources[name] } });
    const deadline = Date.now() + TIMEOUT_MS;
    while (!published.has(uri)) {
      if (Date.now() > deadline) fail(`no diagnostics published for ${JSON.stringify(name)}`);
      await new Promise((resolve) => setTimeout(resolve, 1));
    }
    result[name] = published.get(uri).map((d) =>
      `${d.range.start.line + 1}:${d.range.start.character + 1} ${SEVERITY[d.severity] || "error"}: ${d.message}`);
  }
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(0);
}

main().catch((err) => fail(err && err.stack ? err.stack : String(err)));

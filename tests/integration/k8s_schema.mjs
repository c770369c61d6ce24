// Validate Kubernetes objects against the Kubernetes API's OpenAPI schemas, offline.
//
// usage: node k8s_schema.mjs NPM_DIR OBJECTS.json [OBJECTS.json...]
//
// NPM_DIR holds node_modules with kubernetes-models (the API's schemas compiled to validators,
// one class per kind) and typescript. Two passes:
//  1. each object through its kind's validate(): types, required fields, enums, formats;
//  2. the objects as typed object literals (the models' interfaces) through tsc --noEmit,
//     whose excess-property check refuses fields the API does not have (validate() lets
//     unknown fields through, as the API server's non-strict decoding does).
// Prints every problem with the object's kind/name and path; exits 1 if any, 0 if none.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

const [npmDir, ...files] = process.argv.slice(2);
if (!npmDir || files.length === 0) {
  console.error("usage: node k8s_schema.mjs NPM_DIR OBJECTS.json...");
  process.exit(2);
}
const models = path.join(path.resolve(npmDir), "node_modules", "kubernetes-models");
let problems = 0;
const fail = (msg) => {
  problems++;
  console.log(`k8s_schema: FAIL: ${msg}`);
};

// apiVersion "v1" -> "v1"; "apps/v1" -> "apps/v1"; the file is MODELS/<that>/<Kind>.js.
function modelPath(o) {
  const f = path.join(models, o.apiVersion, `${o.kind}.js`);
  return fs.existsSync(f) ? f : null;
}

const objects = [];
for (const f of files) {
  for (const o of JSON.parse(fs.readFileSync(f, "utf8"))) objects.push({ o, src: f });
}
const tsLines = [];
let i = 0;
for (const { o, src } of objects) {
  const id = `${o.kind}/${o.metadata?.name} (${path.basename(src)})`;
  const mp = typeof o.apiVersion === "string" && typeof o.kind === "string" && modelPath(o);
  if (!mp) {
    fail(`${id}: no schema for apiVersion ${o.apiVersion} kind ${o.kind}`);
    continue;
  }
  const mod = await import(mp);
  const Model = mod[o.kind];
  try {
    new Model(o).validate();
  } catch (e) {
    fail(`${id}: ${e.message}`);
  }
  const rel = `kubernetes-models/${o.apiVersion}/${o.kind}`;
  tsLines.push(`import type { I${o.kind} as T${i} } from "${rel}";`);
  tsLines.push(`// ${id}\nexport const o${i}: T${i} = ${JSON.stringify(o, null, 1)};`);
  i++;
}

// Pass 2: excess properties (unknown fields), through the models' type declarations.
if (tsLines.length) {
  const dir = fs.mkdtempSync(path.join(path.resolve(npmDir), "check-"));
  try {
    fs.writeFileSync(path.join(dir, "objects.ts"), tsLines.join("\n") + "\n");
    const tsc = path.join(path.resolve(npmDir), "node_modules", "typescript", "bin", "tsc");
    try {
      execFileSync(process.execPath, [tsc, "--noEmit", "--strict", "--skipLibCheck",
        "--target", "es2022", "--module", "esnext", "--moduleResolution", "bundler",
        "--pretty", "false", path.join(dir, "objects.ts")], { encoding: "utf8", timeout: 120000 });
    } catch (e) {
      const out = `${e.stdout || ""}${e.stderr || ""}`.trim() || String(e);
      // Name the object each error is in: find the "// Kind/name" line above it.
      const src = fs.readFileSync(path.join(dir, "objects.ts"), "utf8").split("\n");
      for (const line of out.split("\n")) {
        const m = line.match(/objects\.ts\((\d+),\d+\): (.*)/);
        if (!m) {
          if (line.trim()) fail(line.trim());
          continue;
        }
        let at = Number(m[1]) - 1;
        while (at > 0 && !src[at].startsWith("// ")) at--;
        fail(`${src[at].slice(3)}: line ${m[1]}: ${m[2]}: ${src[Number(m[1]) - 1].trim()}`);
      }
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
if (problems) {
  console.log(`k8s_schema: ${problems} problem(s) in ${objects.length} objects`);
  process.exit(1);
}
const ver = JSON.parse(fs.readFileSync(path.join(models, "package.json"), "utf8")).version;
console.log(`k8s_schema: ${objects.length} objects valid against kubernetes-models ${ver} ` +
  "(schema validation and unknown fields)");

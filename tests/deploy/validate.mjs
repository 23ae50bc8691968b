// Validates Kubernetes manifests the way an API server with strict field
// validation would, without a cluster:
//  - each object against its API's JSON schema (kubernetes-models: types,
//    required fields, enums, formats such as quantities), and
//  - unknown fields (a misspelled key) against the same API's TypeScript
//    types: every object becomes a typed object literal, and TypeScript's
//    excess-property check names each key its type does not have. (The
//    JSON schemas that kubernetes-models compiles allow extra properties,
//    as the OpenAPI spec does, so they alone would let a typo through.)
// A target that is a directory is a kustomization: it is rendered first
// (render.mjs) and every object it produces is validated.
//
//   node validate.mjs [--kubectl PATH] TARGET...
//
// Prints one line per object ("ok  FILE  Kind/name") or per problem
// ("error  FILE  Kind/name  PATH: MESSAGE"), then "N objects, M errors".
// --kubectl: also render each kustomization with `kubectl kustomize` and
// require the same objects as render.mjs. Exit status: 0 when there is no
// error, 1 otherwise, 2 on bad usage.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";
import { renderKustomization, sameObjects } from "./render.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const ts = require("typescript");

// "apps/v1" + "Deployment" -> the kubernetes-models module and its interface.
function modelFor(apiVersion, kind) {
  if (typeof apiVersion !== "string" || typeof kind !== "string") return null;
  const parts = apiVersion.split("/");
  const dir = parts.length === 1 ? parts[0] : `${parts[0]}/${parts[1]}`;
  const module = `kubernetes-models/${dir}/${kind}`;
  const file = path.join(here, "node_modules", module + ".d.ts");
  if (!fs.existsSync(file)) return null;
  return { module, iface: `I${kind}` };
}

// Renders `obj` as lines of TypeScript, each tagged with the manifest path it
// belongs to. Simple recursive emitter: objects and arrays open on the key's
// line and close on their own.
function emit(obj, out) {
  const walk = (value, p, prefix, indent, suffix) => {
    if (value !== null && typeof value === "object") {
      const isArray = Array.isArray(value);
      const entries = isArray ? value.map((v, i) => [i, v]) : Object.entries(value);
      if (entries.length === 0) {
        out.push({ path: p, text: indent + prefix + (isArray ? "[]" : "{}") + suffix });
        return;
      }
      out.push({ path: p, text: indent + prefix + (isArray ? "[" : "{") });
      for (const [k, v] of entries) {
        const childPath = isArray ? `${p}[${k}]` : p === "" ? k : `${p}.${k}`;
        walk(v, childPath, isArray ? "" : JSON.stringify(k) + ": ", indent + "  ", ",");
      }
      out.push({ path: p, text: indent + (isArray ? "]" : "}") + suffix });
      return;
    }
    out.push({ path: p, text: indent + prefix + JSON.stringify(value) + suffix });
  };
  walk(obj, "", "", "", ";");
}

// Loads every object of every target: [{source, obj}], or throws.
function load(target, kubectl, problems) {
  const stat = fs.statSync(target);
  if (stat.isDirectory()) {
    const rendered = renderKustomization(target);
    if (kubectl) {
      const text = execFileSync(kubectl, ["kustomize", target], { encoding: "utf8" });
      const theirs = YAML.parseAllDocuments(text).map((d) => d.toJS());
      const diff = sameObjects(rendered.map((r) => r.obj), theirs);
      if (diff) problems.push({ source: target, name: "kustomization", path: "", message: `kubectl kustomize differs: ${diff}` });
      else console.log(`same as kubectl kustomize  ${target}  ${theirs.length} objects`);
    }
    return rendered;
  }
  const docs = YAML.parseAllDocuments(fs.readFileSync(target, "utf8"));
  const out = [];
  for (const d of docs) {
    if (d.errors.length) throw new Error(`${target}: ${d.errors[0].message}`);
    const obj = d.toJS();
    if (obj !== null) out.push({ source: target, obj });
  }
  return out;
}

function main(argv) {
  let kubectl = null;
  const targets = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--kubectl" && i + 1 < argv.length) kubectl = argv[++i];
    else if (argv[i].startsWith("-")) return usage();
    else targets.push(argv[i]);
  }
  if (targets.length === 0) return usage();

  const problems = [];
  const objects = [];
  for (const t of targets) {
    try {
      objects.push(...load(t, kubectl, problems));
    } catch (e) {
      problems.push({ source: t, name: "-", path: "", message: e.message });
    }
  }

  // 1. The JSON schemas, object by object.
  const typed = [];
  for (const { source, obj } of objects) {
    const name = `${obj?.kind}/${obj?.metadata?.name}`;
    const model = modelFor(obj?.apiVersion, obj?.kind);
    if (!model) {
      problems.push({ source, name, path: "", message: `unknown apiVersion/kind ${obj?.apiVersion}/${obj?.kind}` });
      continue;
    }
    const Cls = require(path.join(here, "node_modules", model.module + ".js"))[obj.kind];
    try {
      new Cls(obj).validate();
    } catch (e) {
      problems.push({ source, name, path: "", message: e.message });
    }
    typed.push({ source, name, obj, model });
  }

  // 2. Unknown fields: one TypeScript file with every object as a literal of
  // its API type.
  const lines = [];
  typed.forEach((t, i) => {
    lines.push({ path: null, text: `import type { ${t.model.iface} as T${i} } from ${JSON.stringify(t.model.module)};` });
  });
  const owner = [];  // line -> index into typed
  typed.forEach((t, i) => {
    const body = [];
    emit(t.obj, body);
    body[0].text = `export const m${i}: T${i} = ` + body[0].text;
    for (const l of body) {
      owner[lines.length] = i;
      lines.push(l);
    }
  });
  if (typed.length) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kvserve-manifests-"));
    const file = path.join(dir, "manifests.ts");
    fs.writeFileSync(file, lines.map((l) => l.text).join("\n") + "\n");
    const program = ts.createProgram([file], {
      strict: true, noEmit: true, skipLibCheck: true, module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext, target: ts.ScriptTarget.ES2022,
      typeRoots: [], types: [], baseUrl: here, paths: { "*": [path.join(here, "node_modules", "*")] },
    });
    for (const d of ts.getPreEmitDiagnostics(program)) {
      const message = ts.flattenDiagnosticMessageText(d.messageText, " ");
      if (!d.file || d.file.fileName !== file) {
        problems.push({ source: "-", name: "-", path: "", message: `typescript: ${message}` });
        continue;
      }
      const line = d.file.getLineAndCharacterOfPosition(d.start).line;
      const i = owner[line];
      const t = i === undefined ? { source: "-", name: "-" } : typed[i];
      const p = lines[line]?.path ?? "";
      // 2353/2561: "Object literal may only specify known properties ..."
      const unknown = d.code === 2353 || d.code === 2561;
      const field = unknown ? (message.match(/'"?([^'"]+)"?' does not exist/) || [])[1] : null;
      problems.push({
        source: t.source, name: t.name, path: p,
        message: unknown ? `unknown field ${JSON.stringify(field)}${d.code === 2561 ? ` (${message.match(/Did you mean to write '([^']+)'/)?.[0] ?? ""})` : ""}` : message,
      });
    }
    fs.rmSync(dir, { recursive: true, force: true });
  }

  const bad = new Set(problems.map((p) => `${p.source}\t${p.name}`));
  for (const t of typed) {
    if (!bad.has(`${t.source}\t${t.name}`)) console.log(`ok  ${t.source}  ${t.name}`);
  }
  for (const p of problems) console.log(`error  ${p.source}  ${p.name}  ${p.path}: ${p.message}`);
  console.log(`${objects.length} objects, ${problems.length} errors`);
  return problems.length === 0 ? 0 : 1;
}

function usage() {
  console.error("usage: node validate.mjs [--kubectl PATH] FILE.yaml|KUSTOMIZATION_DIR...");
  return 2;
}

process.exitCode = main(process.argv.slice(2));

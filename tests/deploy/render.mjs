// A kustomization rendered the way `kustomize build` does, for the subset
// deploy/k8s uses: `resources` (YAML files and kustomization directories)
// and `images` (newName / newTag / digest for containers and init
// containers). Any other key is an error rather than silently ignored, so a
// kustomization that grows a feature fails here until this file learns it.
// The test compares the result with `kubectl kustomize` where kubectl is
// installed.
import fs from "node:fs";
import path from "node:path";
import YAML from "yaml";

const KNOWN_KEYS = new Set(["apiVersion", "kind", "resources", "images"]);
const IMAGE_KEYS = new Set(["name", "newName", "newTag", "digest"]);

// [{source, obj}] for every object the kustomization in `dir` produces.
export function renderKustomization(dir) {
  const kfile = ["kustomization.yaml", "kustomization.yml", "Kustomization"]
    .map((f) => path.join(dir, f)).find((f) => fs.existsSync(f));
  if (!kfile) throw new Error(`${dir}: no kustomization.yaml`);
  const k = YAML.parse(fs.readFileSync(kfile, "utf8"));
  if (k.apiVersion !== "kustomize.config.k8s.io/v1beta1" || k.kind !== "Kustomization") {
    throw new Error(`${kfile}: apiVersion/kind must be kustomize.config.k8s.io/v1beta1 Kustomization`);
  }
  for (const key of Object.keys(k)) {
    if (!KNOWN_KEYS.has(key)) throw new Error(`${kfile}: unknown field "${key}"`);
  }
  const out = [];
  for (const r of k.resources ?? []) {
    const p = path.join(dir, r);
    if (fs.statSync(p).isDirectory()) {
      out.push(...renderKustomization(p));
      continue;
    }
    for (const d of YAML.parseAllDocuments(fs.readFileSync(p, "utf8"))) {
      if (d.errors.length) throw new Error(`${p}: ${d.errors[0].message}`);
      const obj = d.toJS();
      if (obj !== null) out.push({ source: p, obj });
    }
  }
  const seen = new Set();
  for (const { source, obj } of out) {
    const id = `${obj.apiVersion}/${obj.kind}/${obj.metadata?.namespace ?? ""}/${obj.metadata?.name}`;
    if (seen.has(id)) throw new Error(`${source}: ${obj.kind}/${obj.metadata?.name} defined twice`);
    seen.add(id);
  }
  for (const image of k.images ?? []) {
    for (const key of Object.keys(image)) {
      if (!IMAGE_KEYS.has(key)) throw new Error(`${kfile}: images: unknown field "${key}"`);
    }
    let used = false;
    for (const { obj } of out) {
      for (const c of podContainers(obj)) {
        if (imageName(c.image) !== image.name) continue;
        c.image = retag(c.image, image);
        used = true;
      }
    }
    if (!used) throw new Error(`${kfile}: images: no container uses "${image.name}"`);
  }
  return out;
}

function podContainers(obj) {
  const spec = obj.kind === "Pod" ? obj.spec
    : obj.kind === "CronJob" ? obj.spec?.jobTemplate?.spec?.template?.spec
    : obj.spec?.template?.spec;
  if (!spec) return [];
  return [...(spec.initContainers ?? []), ...(spec.containers ?? [])];
}

// "registry:5000/a/b:tag@sha256:..." -> "registry:5000/a/b"
function imageName(image) {
  let s = image.split("@")[0];
  const slash = s.lastIndexOf("/");
  const colon = s.lastIndexOf(":");
  if (colon > slash) s = s.slice(0, colon);
  return s;
}

function retag(image, { newName, newTag, digest }) {
  const name = newName ?? imageName(image);
  if (digest) return `${name}@${digest}`;
  if (newTag) return `${name}:${newTag}`;
  const rest = image.slice(imageName(image).length);
  return name + rest;
}

// null when both lists hold the same objects (any order), else what differs.
export function sameObjects(ours, theirs) {
  const key = (o) => `${o.apiVersion}/${o.kind}/${o.metadata?.name}`;
  const a = new Map(ours.map((o) => [key(o), o]));
  const b = new Map(theirs.map((o) => [key(o), o]));
  for (const k of a.keys()) if (!b.has(k)) return `${k} only in render.mjs`;
  for (const k of b.keys()) if (!a.has(k)) return `${k} only in kubectl kustomize`;
  for (const [k, o] of a) {
    if (JSON.stringify(sortKeys(o)) !== JSON.stringify(sortKeys(b.get(k)))) return `${k} differs`;
  }
  return null;
}

function sortKeys(v) {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === "object") {
    return Object.fromEntries(Object.keys(v).sort().map((k) => [k, sortKeys(v[k])]));
  }
  return v;
}

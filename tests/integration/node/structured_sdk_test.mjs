// Structured outputs and tool calls through the official OpenAI Node SDK:
// response_format json_schema (strict) and tools with tool_choice, plain and
// streamed, over seeds and temperatures; every output must parse and
// validate against its schema with Ajv (a JSON Schema validator that knows
// nothing of kvserve's grammar). The schemas include adversarial ones: deep
// nesting, a long enum, unicode keys, $ref/$defs, anyOf.
//
// Environment:
//   KVSERVE_BASE_URL   e.g. http://127.0.0.1:8000/v1 (required)
//   KVSERVE_API_KEY    bearer key (default "unused")
//   KVSERVE_MODEL      served model name (default: the first of /v1/models)
//   KVSERVE_SEEDS      seeds per schema and temperature (default 3)
// Exit status 0 when every check passes; the last line counts what was
// validated.
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import OpenAI from 'openai';
import { check, sdkClient } from './sdk_client.mjs';


const client = sdkClient(300_000);
const models = await client.models.list();
const model = process.env.KVSERVE_MODEL || models.data[0].id;
const seeds = Number(process.env.KVSERVE_SEEDS || 3);
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

// Strings and numbers are bounded: with random weights an unbounded string
// closes only when the sampler happens to draw its quote.
const deep = (levels) =>
  levels === 0
    ? { type: 'integer', minimum: -5, maximum: 5 }
    : {
        type: 'object',
        properties: { n: deep(levels - 1), tag: { enum: ['x', 'y'] } },
        required: ['n'],
        additionalProperties: false,
      };
const schemas = {
  person: {
    type: 'object',
    properties: {
      name: { type: 'string', minLength: 1, maxLength: 10 },
      age: { type: 'integer', minimum: 0, maximum: 120 },
      id: { type: 'string', format: 'uuid' },
      tags: { type: 'array', items: { type: 'string', maxLength: 4 }, minItems: 1, maxItems: 3 },
      admin: { type: 'boolean' },
    },
    required: ['name', 'age', 'tags'],
    additionalProperties: false,
  },
  deep_nesting: deep(12),
  long_enum: {
    type: 'object',
    properties: {
      city: { enum: Array.from({ length: 300 }, (_, i) => `city-${i}-${'ab'.repeat(i % 7)}`) },
      code: { const: 'Z9' },
    },
    required: ['city', 'code'],
    additionalProperties: false,
  },
  unicode_keys: {
    type: 'object',
    properties: {
      'ключ': { type: 'string', maxLength: 6 },
      '名前': { enum: ['太郎', 'Zoë', '😀'] },
      'a"b\\c': { type: 'null' },
    },
    required: ['ключ', '名前', 'a"b\\c'],
    additionalProperties: false,
  },
  refs_and_any_of: {
    $defs: {
      point: {
        type: 'object',
        properties: { x: { type: 'integer', minimum: 0, maximum: 99 }, y: { type: 'integer', minimum: 0, maximum: 99 } },
        required: ['x', 'y'],
        additionalProperties: false,
      },
    },
    type: 'object',
    properties: {
      shape: {
        anyOf: [
          { type: 'object', properties: { circle: { $ref: '#/$defs/point' } }, required: ['circle'], additionalProperties: false },
          { type: 'array', items: { $ref: '#/$defs/point' }, minItems: 2, maxItems: 3 },
          { type: 'string', maxLength: 3 },
        ],
      },
    },
    required: ['shape'],
    additionalProperties: false,
  },
};

let validated = 0;
const temperatures = [0, 0.8, 1.3];

async function streamedText(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta?.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish };
}

for (const [name, schema] of Object.entries(schemas)) {
  const validate = ajv.compile(schema);
  for (const temperature of temperatures) {
    for (let seed = 0; seed < seeds; ++seed) {
      const params = {
        model,
        messages: [{ role: 'user', content: `Give me a ${name} as JSON.` }],
        response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } },
        max_tokens: 600,
        temperature,
        seed,
      };
      const streamed = seed % 2 === 1;
      let text, finish;
      if (streamed) {
        ({ text, finish } = await streamedText(params));
      } else {
        const r = await client.chat.completions.create(params);
        text = r.choices[0].message.content;
        finish = r.choices[0].finish_reason;
      }
      const where = `${name} t=${temperature} seed=${seed}${streamed ? ' streamed' : ''}`;
      check(finish === 'stop', `${where}: finish_reason ${finish}, text ${JSON.stringify(text)}`);
      let value;
      try {
        value = JSON.parse(text);
      } catch (e) {
        check(false, `${where}: not JSON: ${JSON.stringify(text)}`);
      }
      check(validate(value), `${where}: ${JSON.stringify(text)} fails: ${ajv.errorsText(validate.errors)}`);
      ++validated;
    }
  }
}

// Tools: "required" and a named function constrain decoding to one call of
// the tools' schemas; "auto" parses whatever the model writes.
const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather for a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', minLength: 1, maxLength: 12 }, unit: { enum: ['c', 'f'] } },
        required: ['city', 'unit'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'add',
      parameters: {
        type: 'object',
        properties: { a: { type: 'integer', minimum: -1000, maximum: 1000 }, b: { type: 'integer', minimum: -1000, maximum: 1000 } },
        required: ['a', 'b'],
        additionalProperties: false,
      },
    },
  },
];
const toolValidators = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
let calls = 0;
for (const choice of ['required', { type: 'function', function: { name: 'add' } }]) {
  for (const temperature of temperatures) {
    for (let seed = 0; seed < seeds; ++seed) {
      const params = {
        model,
        messages: [{ role: 'user', content: 'What is the weather in Paris? Or add 2 and 3.' }],
        tools,
        tool_choice: choice,
        max_tokens: 300,
        temperature,
        seed,
      };
      const where = `tool_choice=${JSON.stringify(choice)} t=${temperature} seed=${seed}`;
      let toolCalls, finish;
      if (seed % 2 === 1) {
        const stream = await client.chat.completions.create({ ...params, stream: true });
        const byIndex = new Map();
        for await (const chunk of stream) {
          for (const c of chunk.choices) {
            for (const tc of c.delta?.tool_calls || []) {
              const cur = byIndex.get(tc.index) || { id: '', function: { name: '', arguments: '' } };
              if (tc.id) cur.id = tc.id;
              if (tc.function?.name) cur.function.name += tc.function.name;
              if (tc.function?.arguments) cur.function.arguments += tc.function.arguments;
              byIndex.set(tc.index, cur);
            }
            if (c.finish_reason) finish = c.finish_reason;
          }
        }
        toolCalls = [...byIndex.values()];
      } else {
        const r = await client.chat.completions.create(params);
        toolCalls = r.choices[0].message.tool_calls || [];
        finish = r.choices[0].finish_reason;
      }
      check(finish === 'tool_calls', `${where}: finish_reason ${finish}`);
      check(toolCalls.length === 1, `${where}: ${toolCalls.length} tool calls`);
      const call = toolCalls[0];
      check(call.id.startsWith('call_'), `${where}: id ${call.id}`);
      if (typeof choice === 'object') check(call.function.name === 'add', `${where}: called ${call.function.name}`);
      const validate = toolValidators[call.function.name];
      check(validate !== undefined, `${where}: unknown tool ${call.function.name}`);
      const args = JSON.parse(call.function.arguments);
      check(validate(args), `${where}: arguments ${call.function.arguments} fail: ${ajv.errorsText(validate.errors)}`);
      ++calls;
    }
  }
}

// A schema outside the supported subset is the SDK's BadRequestError naming
// the path inside the schema.
try {
  await client.chat.completions.create({
    model,
    messages: [{ role: 'user', content: 'x' }],
    response_format: {
      type: 'json_schema',
      json_schema: { name: 'bad', schema: { type: 'object', properties: { a: { type: 'string', pattern: '^a+$' } } } },
    },
  });
  check(false, 'an unsupported keyword was accepted');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError, `expected BadRequestError, got ${e}`);
  check(e.param === 'response_format.json_schema.schema.properties.a.pattern', `param ${e.param}`);
}

console.log(`structured sdk: ${validated} schema outputs and ${calls} tool calls validated`);

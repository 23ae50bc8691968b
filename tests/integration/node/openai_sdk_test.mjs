// Drives a running kvserve daemon with the official OpenAI Node SDK:
// completions and chat completions, plain and streamed, plus an error that
// must come back as the SDK's BadRequestError naming the field.
//
// Environment:
//   KVSERVE_BASE_URL     e.g. http://127.0.0.1:8000/v1 (required)
//   KVSERVE_API_KEY      bearer key (default "unused")
//   KVSERVE_MODEL        served model name (default: the first of /v1/models)
//   KVSERVE_GOLDEN_FILE  when set, greedy 256-token completions from an empty
//                        prompt must equal this file's text (final newline off)
// Exit status 0 when every check passes.
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { check, sdkClient } from './sdk_client.mjs';


const client = sdkClient(120_000);

const models = await client.models.list();
check(models.data.length === 1, `expected one model, got ${JSON.stringify(models.data)}`);
const model = process.env.KVSERVE_MODEL || models.data[0].id;
check(models.data[0].id === model, `model list names ${models.data[0].id}, not ${model}`);

const golden = process.env.KVSERVE_GOLDEN_FILE
  ? readFileSync(process.env.KVSERVE_GOLDEN_FILE, 'utf8').replace(/\n+$/, '')
  : null;
const greedy = { model, prompt: '', max_tokens: 256, temperature: 0 };

// Completions, plain.
const completion = await client.completions.create(greedy);
const text = completion.choices[0].text;
check(completion.object === 'text_completion', `object ${completion.object}`);
check(completion.choices[0].finish_reason === 'length', 'finish_reason is not length');
check(completion.usage.completion_tokens === 256, `usage ${JSON.stringify(completion.usage)}`);
if (golden !== null) check(text === golden, 'completion text differs from the reference');

// Completions, streamed.
let streamed = '';
let chunks = 0;
let usage = null;
const stream = await client.completions.create({
  ...greedy,
  stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  chunks += 1;
  if (chunk.usage) usage = chunk.usage;
  if (chunk.choices.length > 0) streamed += chunk.choices[0].text;
}
check(chunks > 10, `only ${chunks} chunks: not streamed`);
check(streamed === text, 'streamed completion differs from the plain one');
check(usage !== null && usage.completion_tokens === 256, `stream usage ${JSON.stringify(usage)}`);

// Chat completions, plain and streamed: greedy, so both say the same.
const chatRequest = {
  model,
  messages: [
    { role: 'system', content: 'You tell short stories.' },
    { role: 'user', content: 'Tell me a story about a dog.' },
  ],
  max_tokens: 64,
  temperature: 0,
};
const chat = await client.chat.completions.create(chatRequest);
const answer = chat.choices[0].message.content;
check(chat.object === 'chat.completion', `object ${chat.object}`);
check(chat.choices[0].message.role === 'assistant', 'role is not assistant');
check(typeof answer === 'string' && answer.length > 0, 'empty chat answer');
check(['stop', 'length'].includes(chat.choices[0].finish_reason), 'bad chat finish_reason');

let chatStreamed = '';
let finish = null;
const chatStream = await client.chat.completions.create({ ...chatRequest, stream: true });
for await (const chunk of chatStream) {
  const choice = chunk.choices[0];
  if (!choice) continue;
  if (choice.delta?.content) chatStreamed += choice.delta.content;
  if (choice.finish_reason) finish = choice.finish_reason;
}
check(chatStreamed === answer, 'streamed chat differs from the plain one');
check(finish === chat.choices[0].finish_reason, 'streamed chat finish_reason differs');

// A bad parameter is a 400 that names it.
try {
  await client.completions.create({ ...greedy, temperature: -1 });
  check(false, 'temperature -1 was accepted');
} catch (err) {
  check(err instanceof OpenAI.BadRequestError, `not a BadRequestError: ${err}`);
  check(err.status === 400, `status ${err.status}`);
  check(err.param === 'temperature', `param ${err.param}`);
}

console.log(`openai sdk: ${chunks} completion chunks, chat answer of ${answer.length} characters`);

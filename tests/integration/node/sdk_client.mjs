// What the Node SDK tests share: check() and the OpenAI client on the
// daemon under test (KVSERVE_BASE_URL, KVSERVE_API_KEY), without retries,
// so a failure is the daemon's answer.
import OpenAI from 'openai';

export function check(condition, message) {
  if (!condition) {
    console.error(`FAILED: ${message}`);
    process.exit(1);
  }
}

export function sdkClient(timeoutMs) {
  return new OpenAI({
    baseURL: process.env.KVSERVE_BASE_URL,
    apiKey: process.env.KVSERVE_API_KEY || 'unused',
    maxRetries: 0,
    timeout: timeoutMs,
  });
}

// The `openai` Node SDK resuming a finished response after every sequence number: creates one
// in background mode, polls responses.retrieve(id) until it is done, then reports its whole
// stream (responses.retrieve(id, {stream: true})) as a `replay` line and, for every number n
// in it, what responses.retrieve(id, {stream: true, starting_after: n}) gives as a `resume`
// line: the events as the SDK parsed them, whole. An error is an `error` line, exit code 1
// (args.mjs).
import OpenAI from 'openai';

import { emit, main, options } from './args.mjs';

async function events(stream) {
  const all = [];
  for await (const event of stream) all.push(event);
  return all;
}

await main(async () => {
  const opts = options();
  const client = new OpenAI({ baseURL: opts.baseURL, apiKey: opts.key, maxRetries: 0 });
  let response = await client.responses.create({
    model: opts.model,
    input: opts.prompt,
    background: true,
  });
  const deadline = Date.now() + 20_000;
  while (response.status === 'queued' || response.status === 'in_progress') {
    if (Date.now() > deadline) throw new Error(`${response.id} still ${response.status}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
    response = await client.responses.retrieve(response.id);
  }
  emit('done', { response_id: response.id, status: response.status, text: response.output_text });
  const whole = await events(await client.responses.retrieve(response.id, { stream: true }));
  emit('replay', { events: whole });
  for (const { sequence_number: after } of whole) {
    const rest = await client.responses.retrieve(response.id, { stream: true, starting_after: after });
    emit('resume', { after, events: await events(rest) });
  }
});

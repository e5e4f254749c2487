// The `openai` Node SDK's Responses API against Bernard, unmodified: responses.create with
// stream: true, reporting every event (its type and sequence_number; a text delta's text),
// then the whole text, the final status and usage. With --background the response is created
// in background mode, and with --drop-after N the script drops the stream once it has the
// event numbered N and goes on with responses.retrieve(id, {stream: true, starting_after: N}),
// as a client whose connection broke would. An error is an `error` line, exit code 1
// (args.mjs).
import OpenAI from 'openai';

import { emit, main, options } from './args.mjs';

/** Reports one streamed event; gives the response object of the events that carry one. */
function report(event, phase) {
  const line = { phase, type: event.type, sequence_number: event.sequence_number };
  if (event.type === 'response.output_text.delta') line.delta = event.delta;
  if (event.response) {
    line.response_id = event.response.id;
    line.status = event.response.status;
  }
  emit('sse', line);
  return event.response;
}

await main(async () => {
  const opts = options({
    background: { type: 'boolean', default: false },
    'drop-after': { type: 'string' },
  });
  const dropAfter = opts['drop-after'] === undefined ? null : Number(opts['drop-after']);
  const client = new OpenAI({ baseURL: opts.baseURL, apiKey: opts.key, maxRetries: 0 });
  const stream = await client.responses.create({
    model: opts.model,
    input: opts.prompt,
    stream: true,
    ...(opts.background ? { background: true } : {}),
  });
  let text = '';
  let response = null;
  let dropped = false;
  for await (const event of stream) {
    response = report(event, 'first') ?? response;
    if (event.type === 'response.output_text.delta') text += event.delta;
    if (dropAfter !== null && event.sequence_number === dropAfter) {
      dropped = true;
      break; // leaving the loop aborts the request: the connection drops
    }
  }
  if (dropped) {
    emit('dropped', { after: dropAfter, response_id: response.id });
    const resumed = await client.responses.retrieve(response.id, {
      stream: true,
      starting_after: dropAfter,
    });
    for await (const event of resumed) {
      response = report(event, 'resumed') ?? response;
      if (event.type === 'response.output_text.delta') text += event.delta;
    }
  }
  emit('final', {
    response_id: response?.id ?? null,
    status: response?.status ?? null,
    text,
    output_text: (response?.output ?? [])
      .flatMap((item) => (item.type === 'message' ? item.content : []))
      .filter((part) => part.type === 'output_text')
      .map((part) => part.text)
      .join(''),
    usage: response?.usage ?? null,
  });
});

// The `openai` Node SDK's chat.completions.create against Bernard, unmodified: with --stream
// it streams (stream_options.include_usage) and reports each text delta, then the whole
// text, the finish reason and the usage; without, the one answer. A typed error from the
// envelope is reported as an `error` line (args.mjs) and the exit code is 1.
import OpenAI from 'openai';

import { emit, main, options } from './args.mjs';

await main(async () => {
  const opts = options({ stream: { type: 'boolean', default: false } });
  const client = new OpenAI({ baseURL: opts.baseURL, apiKey: opts.key, maxRetries: 0 });
  const messages = [{ role: 'user', content: opts.prompt }];
  if (!opts.stream) {
    const completion = await client.chat.completions.create({ model: opts.model, messages });
    const choice = completion.choices[0];
    emit('final', {
      id: completion.id,
      text: choice.message.content,
      role: choice.message.role,
      finish_reason: choice.finish_reason,
      usage: completion.usage ?? null,
    });
    return;
  }
  const stream = await client.chat.completions.create({
    model: opts.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (choice?.delta?.content) {
      text += choice.delta.content;
      emit('delta', { text: choice.delta.content });
    }
    finish = choice?.finish_reason ?? finish;
    usage = chunk.usage ?? usage;
  }
  emit('final', { text, finish_reason: finish, usage });
});

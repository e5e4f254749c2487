// The AI SDK's streamText through its OpenAI provider, unmodified, pointed at Bernard:
// --api chat is createOpenAI({baseURL}).chat(model) (Chat Completions), --api responses the
// provider's default, createOpenAI({baseURL})(model) (the Responses API). Reports each text
// delta, then the response's id (which API answered), the whole text, the finish reason (the
// SDK's and the wire's) and the usage; an error part of the stream, or a throw, as an
// `error` line with exit code 1 (args.mjs).
import { createOpenAI } from '@ai-sdk/openai';
import { streamText } from 'ai';

import { describe, emit, main, options } from './args.mjs';

await main(async () => {
  const opts = options({ api: { type: 'string', default: 'chat' } });
  const provider = createOpenAI({ baseURL: opts.baseURL, apiKey: opts.key });
  const models = { chat: () => provider.chat(opts.model), responses: () => provider(opts.model) };
  if (!(opts.api in models)) throw new Error(`--api is chat or responses, not ${opts.api}`);
  const result = streamText({ model: models[opts.api](), prompt: opts.prompt, maxRetries: 0 });
  let text = '';
  let failed = false;
  let responseId = null;
  for await (const part of result.fullStream) {
    if (part.type === 'text-delta') {
      text += part.text;
      emit('delta', { text: part.text });
    } else if (part.type === 'error') {
      failed = true;
      emit('error', describe(part.error));
    } else if (part.type === 'finish-step') {
      responseId = part.response.id; // chatcmpl-... or resp_...: which API answered
    } else if (part.type === 'finish') {
      emit('final', {
        response_id: responseId,
        text,
        finish_reason: part.finishReason,
        raw_finish_reason: part.rawFinishReason ?? null,
        usage: {
          input_tokens: part.totalUsage.inputTokens ?? null,
          output_tokens: part.totalUsage.outputTokens ?? null,
          total_tokens: part.totalUsage.totalTokens ?? null,
        },
      });
    }
  }
  if (failed) process.exitCode = 1;
});

// What every script here shares: its options (Bernard's base URL, key, model and prompt, from
// argv or the environment) and how it reports, as one JSON object a line on stdout, for
// tests/test_node_clients.py to assert on.
import { parseArgs } from 'node:util';

/**
 * The options common to every script, plus the script's own (`extra`, parseArgs' shape).
 * --base-url (or BERNARD_BASE_URL) is Bernard's /v1 URL; --key (or BERNARD_API_KEY) its key.
 */
export function options(extra = {}) {
  const { values } = parseArgs({
    options: {
      'base-url': { type: 'string', default: process.env.BERNARD_BASE_URL },
      key: { type: 'string', default: process.env.BERNARD_API_KEY ?? 'anything' },
      model: { type: 'string', default: 'bernard-v1' },
      prompt: { type: 'string', default: 'hello' },
      ...extra,
    },
    strict: true,
  });
  if (!values['base-url']) {
    throw new Error('--base-url or BERNARD_BASE_URL is required (Bernard\'s /v1 URL)');
  }
  return { ...values, baseURL: values['base-url'] };
}

/** One line of the report: `{"event": kind, ...fields}`. */
export function emit(event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');
}

/**
 * An error as the report shows it: the class the client raised (the `openai` SDK's typed
 * errors, the AI SDK's APICallError...), and the envelope's status, code, type and param
 * where it carried them.
 */
export function describe(error) {
  const fields = { class: error?.constructor?.name ?? typeof error, message: String(error?.message ?? error) };
  for (const name of ['status', 'statusCode', 'code', 'type', 'param']) {
    if (error?.[name] !== undefined && error?.[name] !== null) fields[name] = error[name];
  }
  return fields;
}

/**
 * Runs a script's body: an error it throws is reported as an `error` line and the process
 * exits 1, so a test sees both what went wrong and that it did.
 */
export async function main(body) {
  try {
    await body();
  } catch (error) {
    emit('error', describe(error));
    process.exitCode = 1;
  }
}

// Talking to this server: the API key, errors, and the streaming formats
// (SSE for OpenAI's streams and the stats stream, NDJSON for pulls).

const KEY_STORAGE = 'localserve.apiKey';

export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || '';
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

/** An error answer of the API, with its status and the server's message. */
export class ApiError extends Error {
  constructor(status, message, body = null) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

/**
 * fetch() on this origin with the API key. A non-2xx answer throws ApiError
 * (a 401 also fires `localserve:auth` on window, so the page asks for the key).
 */
export async function apiFetch(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = apiKey();
  if (key) headers.set('Authorization', `Bearer ${key}`);
  if (options.json !== undefined) {
    headers.set('Content-Type', 'application/json');
    options = { ...options, method: options.method || 'POST', body: JSON.stringify(options.json) };
  }
  const response = await fetch(path, { ...options, headers });
  if (response.ok) return response;
  const text = await response.text();
  let body = null;
  let message = text || response.statusText;
  try {
    body = JSON.parse(text);
    message = body?.error?.message || (typeof body?.error === 'string' ? body.error : message);
  } catch { /* not JSON: keep the text */ }
  if (response.status === 401) window.dispatchEvent(new CustomEvent('localserve:auth', { detail: message }));
  throw new ApiError(response.status, message, body);
}

export async function getJson(path, options = {}) {
  return (await apiFetch(path, options)).json();
}

/** The text of each line of a streamed body, as it arrives. */
async function* lines(response, separator) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let match;
      while ((match = separator.exec(buffer)) !== null) {
        yield buffer.slice(0, match.index);
        buffer = buffer.slice(match.index + match[0].length);
      }
    }
    if (buffer.trim()) yield buffer;
  } finally {
    reader.releaseLock();
  }
}

/** The `data:` payload of each server-sent event (OpenAI streams, the stats stream). */
export async function* sseData(response) {
  for await (const event of lines(response, /\r?\n\r?\n/)) {
    const data = event.split(/\r?\n/)
      .filter((line) => line.startsWith('data:'))
      .map((line) => line.slice(5).replace(/^ /, ''))
      .join('\n');
    if (data) yield data;
  }
}

/** Each JSON object of an NDJSON stream (pulls). */
export async function* ndjson(response) {
  for await (const line of lines(response, /\r?\n/)) {
    if (line.trim()) yield JSON.parse(line);
  }
}

/**
 * Models from /v1/models (with those not loaded when `all`): each as
 * {id, kind, loaded, backend, raw}. The kind comes from the entry's
 * `localserve` block where the server has one, else from `meta`.
 */
export async function listModels({ all = true } = {}) {
  const list = await getJson(all ? '/v1/models?all=true' : '/v1/models');
  return (list.data || []).map((entry) => {
    const info = { ...(entry.meta || {}), ...(entry.localserve || {}) };
    return {
      id: entry.id,
      kind: info.kind || 'chat',
      loaded: info.loaded !== false,
      backend: info.backend || '',
      variantOf: info.variant_of || null,
      raw: entry,
    };
  });
}

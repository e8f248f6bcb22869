// One streamed chat completion: POST /v1/chat/completions with stream=true,
// deltas handed to the caller as they arrive, and the figures of the answer
// (tokens from the stream's usage; time to first token and tokens/s timed here).

import { apiFetch, sseData } from './api.js';

/**
 * Stream `body` (an OpenAI chat request). `onDelta({content, reasoning})` is
 * called for each chunk. Resolves to {stats, finishReason, requestId}; an
 * AbortError propagates when `signal` aborts (the Stop button).
 */
export async function streamChat(body, { signal, onDelta }) {
  const started = performance.now();
  const request = { ...body, stream: true, stream_options: { include_usage: true } };
  const response = await apiFetch('/v1/chat/completions', { json: request, signal });
  const requestId = response.headers.get('X-Request-Id');
  let firstTokenAt = null;
  let usage = null;
  let finishReason = null;
  for await (const data of sseData(response)) {
    if (data === '[DONE]') break;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new Error(chunk.error.message || 'the stream ended with an error');
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices || []) {
      const delta = choice.delta || {};
      const content = delta.content || '';
      const reasoning = delta.reasoning_content || '';
      if ((content || reasoning) && firstTokenAt === null) firstTokenAt = performance.now();
      if (content || reasoning) onDelta({ content, reasoning });
      if (choice.finish_reason) finishReason = choice.finish_reason;
    }
  }
  const ended = performance.now();
  return { stats: figures(usage, started, firstTokenAt, ended), finishReason, requestId };
}

function figures(usage, started, firstTokenAt, ended) {
  const completion = usage?.completion_tokens ?? null;
  const decodeSeconds = firstTokenAt === null ? 0 : (ended - firstTokenAt) / 1000;
  return {
    promptTokens: usage?.prompt_tokens ?? null,
    completionTokens: completion,
    ttftMs: firstTokenAt === null ? null : Math.round(firstTokenAt - started),
    // Tokens after the first over the time they took (the first one's wait is the TTFT).
    tokensPerSecond: completion > 1 && decodeSeconds > 0 ? (completion - 1) / decodeSeconds : null,
    totalMs: Math.round(ended - started),
  };
}

/** "42 tokens · 85.3 tok/s · TTFT 120 ms" */
export function describeStats(stats) {
  if (!stats) return '';
  const parts = [];
  if (stats.completionTokens !== null) parts.push(`${stats.completionTokens} tokens`);
  if (stats.tokensPerSecond !== null) parts.push(`${stats.tokensPerSecond.toFixed(1)} tok/s`);
  if (stats.ttftMs !== null) parts.push(`TTFT ${stats.ttftMs} ms`);
  if (stats.promptTokens !== null) parts.push(`prompt ${stats.promptTokens} tokens`);
  return parts.join(' · ');
}

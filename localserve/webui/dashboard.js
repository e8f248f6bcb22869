// The live dashboard (what `localserve top` shows), from /api/v1/stats/stream.
// The stream runs only while this view is open and the tab visible.

import { apiFetch, sseData } from './api.js';
import { RateChart } from './chart.js';
import { bytes, fill, h, num, seconds } from './dom.js';

// A snapshot every 2 s: on a desktop the browser shares the cores with the
// model, and the page's repaint each second cost a headless Chromium 2.4% of a
// core under load (1.4% at 2 s; bench/webui_overhead.py measures the cost).
const INTERVAL_MS = 2000;
const RETRY_MS = 2000;
const CLASSES = ['interactive', 'default', 'batch'];
const TERMINAL = new Set(['completed', 'failed', 'cancelled', 'expired']);

export class DashboardView {
  constructor(root) {
    this.root = root;
    this.controller = null;
    this.summary = h('div', { class: 'cards', id: 'dash-summary' });
    this.canvas = h('canvas', { class: 'chart', id: 'dash-chart', role: 'img', 'aria-label': 'tokens per second' });
    this.chart = new RateChart(this.canvas, ['decode', 'prefill'], INTERVAL_MS / 1000);
    this.models = h('div', { id: 'dash-models' });
    this.requests = h('tbody', { id: 'dash-requests' });
    this.oneShot = h('tbody', { id: 'dash-oneshot' });
    this.batches = h('tbody', { id: 'dash-batches' });
    this.state = h('span', { class: 'muted', id: 'dash-state' }, 'connecting…');
    fill(root,
      h('div', { class: 'row' }, h('h2', {}, 'Dashboard'), this.state),
      this.summary,
      h('div', { class: 'panel' },
        h('h2', {}, 'Tokens per second'),
        h('div', { class: 'legend' }, h('span', { class: 'decode' }, 'decode'), h('span', { class: 'prefill' }, 'prefill')),
        this.canvas),
      this.models,
      table('Requests in flight', ['id', 'model', 'class', 'state', 'prompt', 'generated', 'tok/s', 'TTFT', 'age'], this.requests),
      table('Micro-batcher (embeddings, speech)', ['model', 'kind', 'queue', 'batches', 'mean batch', 'items/s', 'padding', 'busy'], this.oneShot),
      table('Batch jobs', ['id', 'model', 'status', 'progress', 'failed'], this.batches));
  }

  show() {
    if (this.controller) return;
    this.controller = new AbortController();
    this.run(this.controller.signal);
  }

  hide() {
    this.controller?.abort();
    this.controller = null;
  }

  async run(signal) {
    while (!signal.aborted) {
      try {
        const response = await apiFetch(`/api/v1/stats/stream?interval_ms=${INTERVAL_MS}`, { signal });
        this.state.textContent = 'live';
        for await (const data of sseData(response)) this.update(JSON.parse(data));
        this.state.textContent = 'the stream ended; reconnecting…';
      } catch (error) {
        if (signal.aborted) return;
        this.state.textContent = `disconnected (${error.message}); retrying…`;
        if (error.status === 401) return; // the key dialog is up; the page reloads with the key
      }
      await new Promise((resolve) => { setTimeout(resolve, RETRY_MS); });
    }
  }

  update(snap) {
    const models = snap.models || [];
    const sum = (key) => models.reduce((total, m) => total + (m[key] || 0), 0);
    const classSum = (key) => models.reduce((total, m) => total + Object.values(m[key] || {}).reduce((a, b) => a + b, 0), 0);
    const running = classSum('running');
    this.chart.push(snap.time, { decode: sum('decode_tokens_per_s'), prefill: sum('prefill_tokens_per_s') });
    // Each section is rebuilt only when its data changed: on a desktop the
    // browser shares the cores with the model, and an idle dashboard should
    // cost it nothing (bench/webui_overhead.py).
    const changed = (section, data) => {
      const key = JSON.stringify(data);
      if (this.shown?.[section] === key) return false;
      this.shown = { ...this.shown, [section]: key };
      return true;
    };
    if (changed('summary', [running, classSum('waiting'), sum('decode_tokens_per_s'), snap.process, models.length, snap.loading])) this.fillSummary(snap, models, sum, classSum, running);
    if (changed('models', models)) fill(this.models, models.map(modelPanel));
    if (changed('requests', snap.requests)) this.fillRequests(snap.requests || []);
    if (changed('oneShot', snap.one_shot)) this.fillOneShot(snap.one_shot || {});
    if (changed('batches', snap.batches)) fill(this.batches, (snap.batches || []).map(batchRow));
  }

  fillSummary(snap, models, sum, classSum, running) {
    fill(this.summary,
      card('Running', h('span', { id: 'dash-running' }, num(running)), 'sequences'),
      card('Waiting', h('span', { id: 'dash-waiting' }, num(classSum('waiting'))), 'requests'),
      card('Decode', num(sum('decode_tokens_per_s'), 1), 'tokens/s'),
      card('Process', `${num(snap.process?.cpu_percent, 0)} %`, `CPU · ${bytes(snap.process?.rss_bytes)} RSS`),
      card('Models', num(models.length), `loaded${snap.loading?.length ? ` · ${snap.loading.length} loading` : ''}`));
  }

  fillRequests(requests) {
    fill(this.requests, requests.map((r) => h('tr', { dataset: { state: r.state } },
      h('td', { class: 'mono', title: r.id }, r.id.slice(0, 18)), h('td', {}, r.model), h('td', {}, r.priority_class),
      h('td', {}, r.state), numCell(r.prompt_tokens), numCell(`${num(r.generated_tokens)} / ${num(r.max_tokens)}`),
      numCell(num(r.tokens_per_s, 1)), numCell(seconds(r.ttft_s)), numCell(seconds(r.age_s)))));
  }

  fillOneShot(oneShot) {
    fill(this.oneShot, Object.entries(oneShot).map(([name, s]) => h('tr', {},
      h('td', {}, name), h('td', {}, s.kind || ''), numCell(s.queue_items), numCell(s.batches),
      numCell(num(s.mean_batch_size, 1)), numCell(num(s.items_per_s, 1)), numCell(`${num(100 * (s.padding_ratio || 0), 0)} %`),
      numCell(`${num(100 * (s.busy_fraction || 0), 0)} %`))));
  }
}

function table(title, columns, body) {
  return h('div', { class: 'panel' }, h('h2', {}, title),
    h('table', {}, h('thead', {}, h('tr', {}, columns.map((c) => h('th', {}, c)))), body));
}

function card(title, figure, unit) {
  return h('div', { class: 'card' }, h('h3', {}, title), h('div', { class: 'figure' }, figure, ' ', h('small', {}, unit)));
}

function numCell(value) {
  return h('td', { class: 'num' }, typeof value === 'number' ? num(value) : value);
}

function modelPanel(m) {
  const kvShare = m.kv_total ? m.kv_used / m.kv_total : 0;
  const classes = m.classes || {};
  const facts = [
    ['running', CLASSES.map((c) => `${c} ${m.running?.[c] ?? 0}`).join(' · ')],
    ['waiting', CLASSES.map((c) => `${c} ${m.waiting?.[c] ?? 0}`).join(' · ')],
    ['decode / prefill', `${num(m.decode_tokens_per_s, 1)} / ${num(m.prefill_tokens_per_s, 1)} tokens/s`],
    ['batches', `mean ${num(m.mean_batch_size, 1)} sequences · recent ${(m.recent_batch_sizes || []).slice(-8).join(' ')}`],
    ['busy', `${num(100 * (m.busy_fraction || 0), 0)} %`],
    ['prefix cache (RAM)', `${num(100 * (m.prefix_cache_hit_rate || 0), 0)} % hits · ${num(m.prefix_cache_hit_tokens)} tokens`],
  ];
  if (m.prefix_disk) facts.push(['prefix cache (disk)', `${num(m.prefix_disk_hits)} hits · ${num(m.prefix_disk_misses)} misses · ${bytes(m.prefix_disk_bytes_read)} read`]);
  return h('div', { class: 'panel model', dataset: { model: m.id } },
    h('h2', {}, `${m.id} `, h('span', { class: 'muted' }, `${m.backend} · ${m.device} · ${m.max_num_seqs} slots · ctx ${num(m.n_ctx)}`)),
    h('div', { class: 'meter' }, 'KV cache ', h('progress', { max: '1', value: String(kvShare) }),
      ` ${num(m.kv_used)} / ${num(m.kv_total)} tokens`),
    h('table', {}, h('tbody', {}, facts.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, v))))),
    h('table', { class: 'latency' },
      h('thead', {}, h('tr', {}, ['class', 'requests', 'TTFT p50', 'TTFT p95', 'ITL p50', 'ITL p95', 'queue p50'].map((c) => h('th', {}, c)))),
      h('tbody', {}, CLASSES.map((c) => {
        const f = classes[c] || {};
        return h('tr', {}, h('td', {}, c), numCell(f.num_requests ?? 0), numCell(seconds(f.ttft_p50_s)), numCell(seconds(f.ttft_p95_s)),
          numCell(seconds(f.itl_p50_s)), numCell(seconds(f.itl_p95_s)), numCell(seconds(f.queue_wait_p50_s)));
      }))));
}

function batchRow(b) {
  const counts = b.request_counts || {};
  const done = (counts.completed || 0) + (counts.failed || 0);
  const tone = b.status === 'completed' ? 'ok' : TERMINAL.has(b.status) ? 'bad' : 'warn';
  return h('tr', { dataset: { id: b.id } }, h('td', { class: 'mono' }, b.id), h('td', {}, b.model || ''),
    h('td', {}, h('span', { class: `badge ${tone}` }, b.status)),
    h('td', {}, h('div', { class: 'meter' }, h('progress', { max: String(counts.total || 1), value: String(done) }), `${done} / ${counts.total || 0}`)),
    numCell(counts.failed || 0));
}

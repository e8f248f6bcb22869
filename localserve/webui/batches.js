// The batch jobs view: upload a JSONL file, create a batch (OpenAI's Batch
// API), watch its progress, cancel it, download its output and error files.

import { apiFetch, getJson } from './api.js';
import { download, fill, h } from './dom.js';

const ENDPOINTS = ['/v1/chat/completions', '/v1/completions', '/v1/embeddings', '/v1/responses'];
const TERMINAL = new Set(['completed', 'failed', 'cancelled', 'expired']);
const POLL_MS = 1500;

export class BatchesView {
  constructor(root) {
    this.root = root;
    this.timer = null;
    this.file = h('input', { id: 'batch-file', type: 'file', accept: '.jsonl,.json,application/jsonl,text/plain' });
    this.endpoint = h('select', { id: 'batch-endpoint' }, ENDPOINTS.map((e) => h('option', { value: e }, e)));
    this.createButton = h('button', { id: 'batch-create', class: 'primary', onclick: () => this.create() }, 'Upload and start');
    this.message = h('span', { id: 'batch-message', class: 'muted', role: 'status' });
    this.rows = h('tbody', { id: 'batch-rows' });
    fill(root,
      h('div', { class: 'row' }, h('h2', {}, 'Batch jobs'), h('button', { onclick: () => this.refresh() }, 'Refresh')),
      h('div', { class: 'panel' }, h('h2', {}, 'New batch'),
        h('p', { class: 'muted' }, 'A JSONL file, one request a line: ',
          h('code', {}, '{"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": {…}}'),
          '. Batch work runs in the capacity interactive requests leave idle.'),
        h('div', { class: 'row' }, this.file, 'endpoint', this.endpoint, this.createButton, this.message)),
      h('div', { class: 'panel' },
        h('table', {}, h('thead', {}, h('tr', {}, ['batch', 'created', 'status', 'progress', 'failed', ''].map((c) => h('th', {}, c)))), this.rows)));
  }

  show() {
    this.refresh();
  }

  hide() {
    clearTimeout(this.timer);
    this.timer = null;
  }

  async create() {
    const file = this.file.files[0];
    if (!file) {
      this.message.textContent = 'Choose a JSONL file first.';
      return;
    }
    this.createButton.disabled = true;
    try {
      const form = new FormData();
      form.append('purpose', 'batch');
      form.append('file', file, file.name);
      const uploaded = await getJson('/v1/files', { method: 'POST', body: form });
      const batch = await getJson('/v1/batches', {
        json: { input_file_id: uploaded.id, endpoint: this.endpoint.value, completion_window: '24h', metadata: { source: 'web ui', file: file.name.slice(0, 200) } },
      });
      this.message.textContent = `started ${batch.id}`;
      this.file.value = '';
    } catch (error) {
      this.message.textContent = `failed: ${error.message}`;
    } finally {
      this.createButton.disabled = false;
      this.refresh();
    }
  }

  async refresh() {
    clearTimeout(this.timer);
    try {
      const list = await getJson('/v1/batches?limit=20');
      fill(this.rows, (list.data || []).map((b) => this.row(b)));
      if ((list.data || []).some((b) => !TERMINAL.has(b.status))) this.timer = setTimeout(() => this.refresh(), POLL_MS);
    } catch (error) {
      this.message.textContent = `could not list batches: ${error.message}`;
    }
  }

  row(batch) {
    const counts = batch.request_counts || {};
    const done = (counts.completed || 0) + (counts.failed || 0);
    const actions = [];
    if (!TERMINAL.has(batch.status) && batch.status !== 'cancelling') {
      actions.push(h('button', { class: 'cancel', onclick: () => this.cancel(batch.id) }, 'Cancel'));
    }
    if (batch.output_file_id) actions.push(this.downloadButton('Output', batch.output_file_id, `${batch.id}_output.jsonl`));
    if (batch.error_file_id) actions.push(this.downloadButton('Errors', batch.error_file_id, `${batch.id}_errors.jsonl`));
    return h('tr', { dataset: { id: batch.id, status: batch.status } },
      h('td', { class: 'mono' }, batch.id),
      h('td', {}, new Date(batch.created_at * 1000).toLocaleTimeString()),
      h('td', {}, h('span', { class: `badge ${batch.status === 'completed' ? 'ok' : TERMINAL.has(batch.status) ? 'bad' : 'warn'}` }, batch.status)),
      h('td', {}, h('div', { class: 'meter' }, h('progress', { max: String(counts.total || 1), value: String(done) }), `${done} / ${counts.total || 0}`)),
      h('td', { class: 'num' }, String(counts.failed || 0)),
      h('td', {}, h('div', { class: 'row' }, actions)));
  }

  downloadButton(label, fileId, name) {
    return h('button', {
      class: `download-${label.toLowerCase()}`,
      onclick: async () => {
        try {
          const response = await apiFetch(`/v1/files/${encodeURIComponent(fileId)}/content`);
          download(await response.blob(), name);
        } catch (error) {
          this.message.textContent = `download failed: ${error.message}`;
        }
      },
    }, label);
  }

  async cancel(id) {
    try {
      await apiFetch(`/v1/batches/${encodeURIComponent(id)}/cancel`, { method: 'POST' });
    } catch (error) {
      this.message.textContent = `cancel failed: ${error.message}`;
    }
    this.refresh();
  }
}

// The models view: what is here and what is loaded, load / unload with a
// keep-alive, pull with a progress bar (/api/v1/pull's NDJSON), and details (/api/show).

import { apiFetch, getJson, listModels, ndjson } from './api.js';
import { bytes, fill, h, num } from './dom.js';

export class ModelsView {
  constructor(root) {
    this.root = root;
    this.rows = h('tbody', { id: 'models-rows' });
    this.keepAlive = h('input', { id: 'models-keep-alive', value: '5m', size: '6', 'aria-label': 'Keep alive' });
    this.pullInput = h('input', { id: 'pull-model', size: '40', placeholder: 'catalog id, org/repo[:QUANT] or hf://…' });
    this.pullButton = h('button', { id: 'pull-start', class: 'primary', onclick: () => this.pull() }, 'Pull');
    this.pullBar = h('progress', { id: 'pull-progress', max: '1', value: '0', hidden: true });
    this.pullStatus = h('span', { id: 'pull-status', class: 'muted' });
    this.details = h('pre', { class: 'details', id: 'model-details', hidden: true });
    this.error = h('p', { class: 'error', role: 'alert' });
    fill(root,
      h('div', { class: 'row' }, h('h2', {}, 'Models'), h('button', { onclick: () => this.refresh() }, 'Refresh')),
      h('div', { class: 'panel' }, h('h2', {}, 'Pull a model'),
        h('div', { class: 'row' }, this.pullInput, this.pullButton, this.pullBar, this.pullStatus)),
      h('div', { class: 'panel' },
        h('div', { class: 'row' }, h('h2', {}, 'On this machine'),
          h('label', { class: 'inline' }, 'Keep loaded for', this.keepAlive, h('span', { class: 'muted' }, '(5m, 1h, 0, -1 = forever)'))),
        this.error,
        h('table', {}, h('thead', {}, h('tr', {}, ['model', 'kind', 'backend', 'state', 'size', 'keep alive', ''].map((c) => h('th', {}, c)))), this.rows)),
      h('div', { class: 'panel' }, h('h2', {}, 'Details'), this.details));
  }

  show() {
    this.refresh();
  }

  async refresh() {
    try {
      const [models, loaded] = await Promise.all([listModels(), getJson('/api/v1/loaded')]);
      const held = new Map((loaded.data || []).map((entry) => [entry.id, entry]));
      this.error.textContent = '';
      fill(this.rows, models.map((m) => this.row(m, held.get(m.id))));
    } catch (error) {
      this.error.textContent = `Could not list the models: ${error.message}`;
    }
  }

  row(model, held) {
    const meta = model.raw.meta || {};
    const state = model.loaded ? (held?.state || 'loaded') : 'not loaded';
    const keep = held ? `${held.keep_alive ?? ''}${held.expires_in_s ? ` (unloads in ${num(held.expires_in_s)} s)` : ''}` : '';
    const busy = (button, work) => async () => {
      button.disabled = true;
      try {
        await work();
      } catch (error) {
        this.error.textContent = `${model.id}: ${error.message}`;
      }
      await this.refresh();
    };
    const load = h('button', {}, 'Load');
    load.addEventListener('click', busy(load, () => apiFetch('/api/v1/load', { json: { model: model.id, keep_alive: this.keepAlive.value || undefined } })));
    const unload = h('button', {}, 'Unload');
    unload.addEventListener('click', busy(unload, () => apiFetch('/api/v1/unload', { json: { model: model.id } })));
    const details = h('button', { onclick: () => this.showDetails(model) }, 'Details');
    return h('tr', { dataset: { model: model.id, loaded: String(model.loaded) } },
      h('td', {}, model.id), h('td', {}, model.kind), h('td', {}, model.backend), h('td', {}, state),
      h('td', { class: 'num' }, meta.size_bytes ? bytes(meta.size_bytes) : ''), h('td', {}, keep),
      h('td', {}, h('div', { class: 'row' }, model.loaded ? unload : load, model.kind === 'chat' ? details : null)));
  }

  async showDetails(model) {
    this.details.hidden = false;
    this.details.textContent = `${model.id}: loading…`;
    try {
      const shown = await getJson('/api/show', { json: { model: model.id } });
      const summary = {
        id: model.id,
        details: shown.details,
        capabilities: shown.capabilities,
        parameters: shown.parameters,
        model_info: shown.model_info,
        meta: model.raw.meta,
        template: shown.template,
      };
      this.details.textContent = JSON.stringify(summary, null, 2);
    } catch (error) {
      this.details.textContent = `${model.id}: ${error.message}`;
    }
  }

  async pull() {
    const model = this.pullInput.value.trim();
    if (!model) return;
    this.pullButton.disabled = true;
    this.pullBar.hidden = false;
    this.pullBar.value = 0;
    this.pullStatus.textContent = 'starting…';
    try {
      const response = await apiFetch('/api/v1/pull', { json: { model, stream: true } });
      for await (const line of ndjson(response)) this.pullProgress(line);
    } catch (error) {
      this.pullStatus.textContent = `failed: ${error.message}`;
    } finally {
      this.pullButton.disabled = false;
      this.refresh();
    }
  }

  pullProgress(line) {
    if (line.status === 'error') {
      this.pullStatus.textContent = `failed: ${line.error?.message || 'error'}`;
      return;
    }
    if (line.total) this.pullBar.value = (line.completed ?? line.total) / line.total;
    if (line.status === 'success' || line.status === 'exists') this.pullBar.value = 1;
    const file = line.file ? ` ${line.file}` : '';
    const amount = line.total ? ` ${bytes(line.completed ?? line.total)} / ${bytes(line.total)}` : '';
    const rate = line.rate_bytes_per_s ? ` · ${bytes(line.rate_bytes_per_s)}/s` : '';
    this.pullStatus.textContent = `${line.status}${file}${amount}${rate}`;
  }
}

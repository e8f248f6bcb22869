// The chat view: conversations (sidebar), the model and sampling settings,
// the messages, and the composer with Send / Stop.

import { ApiError, listModels } from './api.js';
import { ConversationStore, loadSettings, saveSettings } from './conversations.js';
import { download, fill, h } from './dom.js';
import { copyText, renderMarkdown } from './markdown.js';
import { describeStats, streamChat } from './stream.js';

export class ChatView {
  constructor(root) {
    this.root = root;
    this.store = new ConversationStore();
    this.settings = loadSettings();
    this.current = this.store.items[0] || this.store.create();
    this.controller = null; // the AbortController of the answer streaming now
    this.build();
    this.renderSidebar();
    this.renderConversation();
    this.loadModels();
  }

  // ---- layout ------------------------------------------------------------------

  build() {
    this.list = h('ul', { class: 'conversations', 'aria-label': 'Conversations' });
    this.model = h('select', { id: 'chat-model', 'aria-label': 'Model', onchange: () => this.saveSetting('model', this.model.value) });
    this.temperature = h('input', {
      id: 'chat-temperature', type: 'number', min: '0', max: '2', step: '0.1', value: String(this.settings.temperature),
      onchange: () => this.saveSetting('temperature', Number(this.temperature.value)),
    });
    this.maxTokens = h('input', {
      id: 'chat-max-tokens', type: 'number', min: '1', step: '1', value: String(this.settings.maxTokens),
      onchange: () => this.saveSetting('maxTokens', Number(this.maxTokens.value)),
    });
    this.system = h('textarea', { id: 'chat-system', rows: '2', placeholder: 'System prompt (optional)', onchange: () => this.saveSystem() });
    this.jsonMode = h('input', { id: 'chat-json', type: 'checkbox', checked: this.settings.jsonMode, onchange: () => this.saveSetting('jsonMode', this.jsonMode.checked) });
    this.schema = h('textarea', {
      id: 'chat-schema', rows: '3', spellcheck: 'false', placeholder: 'JSON schema (empty: any JSON object)',
      onchange: () => this.saveSetting('schema', this.schema.value),
    });
    this.schema.value = this.settings.schema;
    this.messages = h('div', { class: 'messages', id: 'chat-messages', 'aria-live': 'polite' });
    this.input = h('textarea', { id: 'chat-input', rows: '3', placeholder: 'Message (Enter sends, Shift+Enter a new line)' });
    this.input.addEventListener('keydown', (event) => {
      if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.sendInput();
      }
    });
    this.sendButton = h('button', { id: 'chat-send', class: 'primary', onclick: () => this.sendInput() }, 'Send');
    this.stopButton = h('button', { id: 'chat-stop', class: 'danger', hidden: true, onclick: () => this.stop() }, 'Stop');
    this.error = h('p', { class: 'error', id: 'chat-error', role: 'alert' });
    fill(this.root, h('div', { class: 'chat' },
      h('aside', { class: 'sidebar' },
        h('div', { class: 'row' },
          h('button', { id: 'chat-new', onclick: () => this.newConversation() }, 'New chat'),
          h('button', { id: 'chat-export', onclick: () => this.exportConversation() }, 'Export JSON')),
        this.list),
      h('div', { class: 'chat-main' },
        h('div', { class: 'chat-settings' },
          h('label', {}, 'Model ', this.model),
          h('label', {}, 'Temperature ', this.temperature),
          h('label', {}, 'Max tokens ', this.maxTokens),
          h('details', { class: 'more' }, h('summary', {}, 'System prompt · JSON mode'),
            this.system,
            h('label', { class: 'inline' }, this.jsonMode, ' Answer in JSON (structured output)'),
            this.schema)),
        this.messages,
        this.error,
        h('div', { class: 'composer' }, this.input, h('div', { class: 'buttons' }, this.sendButton, this.stopButton)))));
  }

  saveSetting(name, value) {
    this.settings[name] = value;
    saveSettings(this.settings);
  }

  saveSystem() {
    this.current.system = this.system.value;
    this.store.touch(this.current);
  }

  async loadModels() {
    try {
      const models = (await listModels()).filter((m) => m.kind === 'chat');
      models.sort((a, b) => Number(b.loaded) - Number(a.loaded));
      fill(this.model, models.map((m) => h('option', { value: m.id }, m.loaded ? m.id : `${m.id} (not loaded)`)));
      const wanted = models.find((m) => m.id === this.settings.model) || models[0];
      if (wanted) this.model.value = wanted.id;
      this.model.dataset.ready = 'true';
      if (!models.length) this.showError('No chat model here: load or pull one in the Models view.');
    } catch (error) {
      this.showError(`Could not list the models: ${error.message}`);
    }
  }

  // ---- conversations -------------------------------------------------------------

  renderSidebar() {
    fill(this.list, this.store.items.map((c) => {
      const title = h('button', { class: 'title', title: c.title, onclick: () => this.open(c.id) }, c.title);
      const item = h('li', { class: c.id === this.current.id ? 'active' : '', dataset: { id: c.id } }, title,
        h('button', { class: 'icon', title: 'Rename', 'aria-label': `Rename ${c.title}`, onclick: () => this.startRename(item, c) }, '✎'),
        h('button', { class: 'icon', title: 'Delete', 'aria-label': `Delete ${c.title}`, onclick: () => this.deleteConversation(c) }, '✕'));
      return item;
    }));
  }

  startRename(item, conversation) {
    const field = h('input', { class: 'rename', value: conversation.title, 'aria-label': 'New title' });
    const done = (keep) => {
      if (keep) this.store.rename(conversation.id, field.value);
      this.renderSidebar();
    };
    field.addEventListener('keydown', (event) => {
      if (event.key === 'Enter') done(true);
      if (event.key === 'Escape') done(false);
    });
    field.addEventListener('blur', () => done(true));
    fill(item, field);
    field.focus();
    field.select();
  }

  open(id) {
    if (this.controller) return; // one answer at a time; Stop first
    this.current = this.store.get(id) || this.current;
    this.renderSidebar();
    this.renderConversation();
  }

  newConversation() {
    if (this.controller) return;
    this.current = this.store.create();
    this.renderSidebar();
    this.renderConversation();
    this.input.focus();
  }

  deleteConversation(conversation) {
    if (this.controller && conversation.id === this.current.id) return;
    if (!window.confirm(`Delete "${conversation.title}"?`)) return;
    this.store.remove(conversation.id);
    if (conversation.id === this.current.id) this.current = this.store.items[0] || this.store.create();
    this.renderSidebar();
    this.renderConversation();
  }

  exportConversation() {
    const blob = new Blob([JSON.stringify(this.current, null, 2)], { type: 'application/json' });
    const name = this.current.title.replace(/[^\w.-]+/g, '_').slice(0, 40) || 'chat';
    download(blob, `${name}.json`);
  }

  // ---- messages ------------------------------------------------------------------

  renderConversation() {
    this.system.value = this.current.system || '';
    this.showError('');
    fill(this.messages, this.current.messages.map((message, index) => this.messageElement(message, index)));
    this.messages.scrollTop = this.messages.scrollHeight;
  }

  messageElement(message, index) {
    const element = h('article', { class: `msg ${message.role}`, dataset: { index: String(index), state: message.state || 'done' } });
    this.updateMessage(element, message, index);
    return element;
  }

  /** (Re)draw one message from its data: text nodes only. */
  updateMessage(element, message, index) {
    const isLast = index === this.current.messages.length - 1;
    const content = h('div', { class: 'content' });
    if (message.role === 'assistant') content.append(renderMarkdown(message.content));
    else content.append(message.content);
    const parts = [h('div', { class: 'role' }, message.role === 'user' ? 'You' : this.modelLabel(message))];
    if (message.reasoning) {
      const details = h('details', { class: 'reasoning', open: message.state === 'streaming' },
        h('summary', {}, 'Reasoning'), h('div', { class: 'reasoning-text' }, message.reasoning));
      parts.push(details);
    }
    parts.push(content);
    if (message.error) parts.push(h('p', { class: 'error' }, message.error));
    const stats = [describeStats(message.stats), message.state === 'stopped' ? 'stopped' : ''].filter(Boolean).join(' · ');
    if (stats) parts.push(h('div', { class: 'stats' }, stats));
    if (message.state !== 'streaming') parts.push(this.actions(message, index, isLast));
    element.dataset.state = message.state || 'done';
    fill(element, parts);
  }

  modelLabel(message) {
    return message.model || 'assistant';
  }

  actions(message, index, isLast) {
    const buttons = [h('button', { class: 'link', onclick: () => copyText(message.content) }, 'Copy')];
    if (message.role === 'user') buttons.push(h('button', { class: 'link edit', onclick: () => this.startEdit(index) }, 'Edit'));
    if (message.role === 'assistant' && isLast) {
      buttons.push(h('button', { class: 'link regenerate', onclick: () => this.regenerate() }, 'Regenerate'));
    }
    return h('div', { class: 'actions' }, buttons);
  }

  startEdit(index) {
    if (this.controller) return;
    const element = this.messages.querySelector(`[data-index="${index}"]`);
    const field = h('textarea', { class: 'edit-field', rows: '3' });
    field.value = this.current.messages[index].content;
    fill(element, h('div', { class: 'role' }, 'You (editing)'), field, h('div', { class: 'actions' },
      h('button', { class: 'primary', onclick: () => this.resend(index, field.value) }, 'Send'),
      h('button', { onclick: () => this.renderConversation() }, 'Cancel')));
    field.focus();
  }

  /** Edit-and-resend: the conversation from message `index` on is replaced. */
  resend(index, text) {
    if (!text.trim()) return;
    this.current.messages.splice(index);
    this.current.messages.push({ role: 'user', content: text });
    this.store.touch(this.current);
    this.renderConversation();
    this.generate();
  }

  regenerate() {
    if (this.controller) return;
    const last = this.current.messages.at(-1);
    if (last?.role === 'assistant') this.current.messages.pop();
    this.renderConversation();
    this.generate();
  }

  sendInput() {
    const text = this.input.value;
    if (!text.trim() || this.controller) return;
    this.input.value = '';
    this.current.messages.push({ role: 'user', content: text });
    this.store.touch(this.current);
    this.renderSidebar();
    this.renderConversation();
    this.generate();
  }

  stop() {
    this.controller?.abort();
  }

  showError(text) {
    this.error.textContent = text;
  }

  // ---- one answer ----------------------------------------------------------------

  requestBody() {
    const messages = [];
    if (this.current.system?.trim()) messages.push({ role: 'system', content: this.current.system });
    for (const m of this.current.messages) {
      if (m.role === 'user' || (m.role === 'assistant' && m.content)) messages.push({ role: m.role, content: m.content });
    }
    const body = { model: this.model.value, messages, temperature: Number(this.temperature.value) };
    const maxTokens = Number(this.maxTokens.value);
    if (maxTokens > 0) body.max_tokens = maxTokens;
    if (this.jsonMode.checked) {
      const schema = this.schema.value.trim();
      body.response_format = schema
        ? { type: 'json_schema', json_schema: { name: 'answer', schema: JSON.parse(schema), strict: true } }
        : { type: 'json_object' };
    }
    return body;
  }

  async generate() {
    let body;
    try {
      body = this.requestBody();
    } catch (error) {
      this.showError(`The JSON schema is not valid JSON: ${error.message}`);
      return;
    }
    if (!body.model) {
      this.showError('Pick a model first.');
      return;
    }
    const conversation = this.current;
    const message = { role: 'assistant', content: '', reasoning: '', model: body.model, state: 'streaming' };
    conversation.messages.push(message);
    const index = conversation.messages.length - 1;
    const element = this.messageElement(message, index);
    this.messages.append(element);
    this.setBusy(new AbortController());
    let frame = 0;
    const redraw = () => {
      frame = 0;
      this.updateMessage(element, message, index);
      this.messages.scrollTop = this.messages.scrollHeight;
    };
    try {
      const result = await streamChat(body, {
        signal: this.controller.signal,
        onDelta: ({ content, reasoning }) => {
          message.content += content;
          message.reasoning += reasoning;
          if (!frame) frame = requestAnimationFrame(redraw);
        },
      });
      message.stats = result.stats;
      message.state = result.finishReason === 'error' ? 'error' : 'done';
    } catch (error) {
      if (error.name === 'AbortError') {
        message.state = 'stopped';
      } else {
        message.state = 'error';
        message.error = error instanceof ApiError ? `${error.status}: ${error.message}` : error.message;
      }
    } finally {
      if (frame) cancelAnimationFrame(frame);
      this.setBusy(null);
      this.store.touch(conversation);
      if (conversation === this.current) redraw();
      this.renderSidebar();
    }
  }

  setBusy(controller) {
    this.controller = controller;
    this.sendButton.hidden = Boolean(controller);
    this.stopButton.hidden = !controller;
    this.messages.querySelectorAll('.actions button').forEach((b) => { b.disabled = Boolean(controller); });
  }
}

// Conversations kept in this browser (localStorage): a list of
// {id, title, system, createdAt, updatedAt, messages: [{role, content, reasoning, stats, stopped, error}]}.

const STORAGE = 'localserve.conversations';
const SETTINGS = 'localserve.chatSettings';

export const DEFAULT_SETTINGS = { model: '', temperature: 0.7, maxTokens: 512, jsonMode: false, schema: '' };

export class ConversationStore {
  constructor() {
    this.items = load(STORAGE, []).filter((c) => c && Array.isArray(c.messages));
  }

  save() {
    try {
      localStorage.setItem(STORAGE, JSON.stringify(this.items));
    } catch (error) {
      console.warn('conversations not saved:', error);
    }
  }

  get(id) {
    return this.items.find((c) => c.id === id) || null;
  }

  create() {
    const now = Date.now();
    const conversation = { id: newId(), title: 'New chat', system: '', createdAt: now, updatedAt: now, messages: [] };
    this.items.unshift(conversation);
    this.save();
    return conversation;
  }

  rename(id, title) {
    const conversation = this.get(id);
    if (conversation && title.trim()) {
      conversation.title = title.trim().slice(0, 120);
      this.save();
    }
  }

  remove(id) {
    this.items = this.items.filter((c) => c.id !== id);
    this.save();
  }

  touch(conversation) {
    conversation.updatedAt = Date.now();
    if (conversation.title === 'New chat') {
      const first = conversation.messages.find((m) => m.role === 'user');
      if (first) conversation.title = first.content.trim().split('\n')[0].slice(0, 60) || 'New chat';
    }
    this.save();
  }
}

export function loadSettings() {
  return { ...DEFAULT_SETTINGS, ...load(SETTINGS, {}) };
}

export function saveSettings(settings) {
  localStorage.setItem(SETTINGS, JSON.stringify(settings));
}

function load(key, fallback) {
  try {
    return JSON.parse(localStorage.getItem(key)) ?? fallback;
  } catch {
    return fallback;
  }
}

function newId() {
  return crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random().toString(16).slice(2)}`;
}

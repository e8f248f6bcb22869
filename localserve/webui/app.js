// The page: tabs that switch views (each view is built on first open), and
// the API key dialog (shown when a call answers 401).

import { apiKey, getJson, setApiKey } from './api.js';

const VIEWS = {
  chat: () => import('./chat.js').then((m) => m.ChatView),
  dashboard: () => import('./dashboard.js').then((m) => m.DashboardView),
  models: () => import('./models.js').then((m) => m.ModelsView),
  batches: () => import('./batches.js').then((m) => m.BatchesView),
  speech: () => import('./speech.js').then((m) => m.SpeechView),
};
const views = {};
let active = null;

async function show(name) {
  if (!(name in VIEWS)) name = 'chat';
  if (active === name) return;
  if (active && views[active]?.hide) views[active].hide();
  active = name;
  for (const tab of document.querySelectorAll('.tabs [role=tab]')) {
    tab.setAttribute('aria-selected', String(tab.dataset.view === name));
  }
  for (const section of document.querySelectorAll('main .view')) section.hidden = section.dataset.view !== name;
  if (location.hash !== `#${name}`) history.replaceState(null, '', `#${name}`);
  if (!views[name]) {
    const View = await VIEWS[name]();
    views[name] = new View(document.getElementById(`view-${name}`));
  }
  if (active === name && views[name].show) views[name].show();
}

function askForKey(message) {
  const dialog = document.getElementById('key-dialog');
  if (dialog.open) return;
  document.getElementById('key-error').textContent = apiKey() ? `The server refused this key: ${message}` : '';
  dialog.showModal();
  document.getElementById('key-input').focus();
}

async function saveKey() {
  const key = document.getElementById('key-input').value.trim();
  setApiKey(key);
  try {
    await getJson('/v1/models'); // checks the key; a 401 here keeps the dialog open
  } catch (error) {
    document.getElementById('key-error').textContent = `The server refused this key: ${error.message}`;
    return;
  }
  location.reload(); // every view starts over with the key
}

async function showVersion() {
  try {
    const health = await fetch('/health').then((r) => r.json());
    document.getElementById('status').textContent = `server ${health.status}`;
  } catch {
    document.getElementById('status').textContent = 'server unreachable';
  }
}

window.addEventListener('localserve:auth', (event) => askForKey(event.detail));
document.getElementById('key-save').addEventListener('click', saveKey);
document.getElementById('key-input').addEventListener('keydown', (event) => {
  if (event.key === 'Enter') saveKey();
});
for (const tab of document.querySelectorAll('.tabs [role=tab]')) tab.addEventListener('click', () => show(tab.dataset.view));
window.addEventListener('hashchange', () => show(location.hash.slice(1)));
document.addEventListener('visibilitychange', () => {
  const view = views[active];
  if (document.hidden) view?.hide?.();
  else view?.show?.();
});
showVersion();
show(location.hash.slice(1) || 'chat');

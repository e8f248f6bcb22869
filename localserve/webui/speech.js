// The speech view: drop an audio file (or record from the microphone where
// the browser allows it) and read its transcript (/v1/audio/transcriptions).

import { getJson, listModels } from './api.js';
import { fill, h } from './dom.js';

export class SpeechView {
  constructor(root) {
    this.root = root;
    this.recorder = null;
    this.model = h('select', { id: 'speech-model', 'aria-label': 'Speech model' });
    this.file = h('input', { id: 'speech-file', type: 'file', accept: 'audio/*,video/webm', onchange: () => this.transcribe(this.file.files[0]) });
    this.drop = h('div', { class: 'drop', id: 'speech-drop' }, 'Drop an audio file here (wav, mp3, flac, ogg, webm, …)');
    this.record = h('button', { id: 'speech-record', onclick: () => this.toggleRecording() }, 'Record');
    this.status = h('p', { class: 'muted', id: 'speech-status', role: 'status' });
    this.transcript = h('p', { class: 'transcript', id: 'speech-transcript' });
    for (const type of ['dragenter', 'dragover']) {
      this.drop.addEventListener(type, (event) => { event.preventDefault(); this.drop.classList.add('over'); });
    }
    this.drop.addEventListener('dragleave', () => this.drop.classList.remove('over'));
    this.drop.addEventListener('drop', (event) => {
      event.preventDefault();
      this.drop.classList.remove('over');
      this.transcribe(event.dataTransfer.files[0]);
    });
    const canRecord = Boolean(navigator.mediaDevices?.getUserMedia && window.MediaRecorder);
    fill(root,
      h('h2', {}, 'Speech to text'),
      h('div', { class: 'panel' },
        h('div', { class: 'row' }, h('label', {}, 'Model ', this.model), this.file, canRecord ? this.record : null),
        this.drop, this.status),
      h('div', { class: 'panel' }, h('h2', {}, 'Transcript'), this.transcript));
    this.loadModels();
  }

  async loadModels() {
    try {
      const models = (await listModels()).filter((m) => m.kind === 'transcription');
      fill(this.model, models.map((m) => h('option', { value: m.id }, m.loaded ? m.id : `${m.id} (not loaded)`)));
      if (!models.length) this.status.textContent = 'No speech model here (install localserve[speech]).';
    } catch (error) {
      this.status.textContent = `Could not list the models: ${error.message}`;
    }
  }

  async transcribe(blob, name = blob?.name || 'audio.webm') {
    if (!blob) return;
    this.status.textContent = `transcribing ${name}…`;
    this.transcript.textContent = '';
    const started = performance.now();
    try {
      const form = new FormData();
      form.append('model', this.model.value);
      form.append('file', blob, name);
      const result = await getJson('/v1/audio/transcriptions', { method: 'POST', body: form });
      this.transcript.textContent = result.text;
      this.status.textContent = `${name}: ${((performance.now() - started) / 1000).toFixed(1)} s`;
    } catch (error) {
      this.status.textContent = `${name}: ${error.message}`;
    }
  }

  async toggleRecording() {
    if (this.recorder) {
      this.recorder.stop();
      return;
    }
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    } catch (error) {
      this.status.textContent = `No microphone: ${error.message}`;
      return;
    }
    const chunks = [];
    this.recorder = new MediaRecorder(stream);
    this.recorder.addEventListener('dataavailable', (event) => chunks.push(event.data));
    this.recorder.addEventListener('stop', () => {
      stream.getTracks().forEach((track) => track.stop());
      this.recorder = null;
      this.record.textContent = 'Record';
      this.transcribe(new Blob(chunks, { type: chunks[0]?.type || 'audio/webm' }), 'recording.webm');
    });
    this.recorder.start();
    this.record.textContent = 'Stop recording';
    this.status.textContent = 'recording…';
  }
}

// A small Markdown renderer that builds DOM nodes: the model's words only
// ever become text nodes (never parsed as HTML), so markup in an answer shows as text.
// Supported: fenced code blocks (with a copy button), headings, bullet and
// numbered lists, paragraphs, `inline code`, **bold** and *italic*.

import { h } from './dom.js';

const FENCE = /^\s*(```|~~~)\s*([\w+.#-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d+[.)]\s+(.*)$/;
const INLINE = /(`+)([^`]+?)\1|\*\*([^*]+?)\*\*|__([^_]+?)__|\*([^*\s][^*]*?)\*|_([^_\s][^_]*?)_/g;

/** A DocumentFragment of `text` rendered as Markdown. */
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = text.split('\n');
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1; // the closing fence (absent while the answer still streams)
      out.append(codeBlock(body.join('\n'), fence[2]));
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      out.append(h(`h${Math.min(6, heading[1].length + 2)}`, {}, inline(heading[2])));
      i += 1;
      continue;
    }
    if (BULLET.test(line) || NUMBERED.test(line)) {
      const numbered = !BULLET.test(line);
      const pattern = numbered ? NUMBERED : BULLET;
      const list = h(numbered ? 'ol' : 'ul');
      while (i < lines.length && pattern.test(lines[i])) list.append(h('li', {}, inline(pattern.exec(lines[i++])[1])));
      out.append(list);
      continue;
    }
    if (!line.trim()) { i += 1; continue; }
    const paragraph = [];
    while (i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) && !HEADING.test(lines[i])
           && !BULLET.test(lines[i]) && !NUMBERED.test(lines[i])) paragraph.push(lines[i++]);
    const p = h('p');
    paragraph.forEach((part, n) => { if (n) p.append(h('br')); p.append(inline(part)); });
    out.append(p);
  }
  return out;
}

/** Inline spans of one line: code, bold, italic; the rest as text. */
export function inline(text) {
  const out = document.createDocumentFragment();
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) out.append(text.slice(last, match.index));
    if (match[2] !== undefined) out.append(h('code', {}, match[2]));
    else if (match[3] !== undefined || match[4] !== undefined) out.append(h('strong', {}, match[3] ?? match[4]));
    else out.append(h('em', {}, match[5] ?? match[6]));
    last = match.index + match[0].length;
  }
  if (last < text.length) out.append(text.slice(last));
  return out;
}

function codeBlock(code, language) {
  const copy = h('button', { class: 'copy', type: 'button', title: 'Copy the code' }, 'Copy');
  copy.addEventListener('click', async () => {
    await copyText(code);
    copy.textContent = 'Copied';
    setTimeout(() => { copy.textContent = 'Copy'; }, 1200);
  });
  return h('div', { class: 'code' },
    h('div', { class: 'code-head' }, h('span', {}, language || 'code'), copy),
    h('pre', {}, h('code', {}, code)));
}

/** Put `text` on the clipboard (the Clipboard API where allowed, else a hidden textarea). */
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const area = h('textarea', { class: 'offscreen' });
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand('copy');
    area.remove();
  }
}

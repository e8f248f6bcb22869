// A line chart of recent rates on a <canvas> (drawn by hand: a few lines and labels).

const STYLE_VARS = { decode: '--accent', prefill: '--warn', grid: '--line', text: '--muted' };

export class RateChart {
  /** `series`: names of the values pushed each tick, one every `intervalS`; `capacity`: points kept. */
  constructor(canvas, series, intervalS = 1, capacity = 300, minSpan = 30) {
    this.canvas = canvas;
    this.intervalS = intervalS;
    this.series = series;
    this.capacity = capacity;
    this.minSpan = minSpan; // the window starts this wide and grows with the data up to `capacity`
    this.points = []; // [{time, values: {name: number}}]
  }

  push(time, values) {
    this.points.push({ time, values });
    if (this.points.length > this.capacity) this.points.shift();
    const last = values[this.series[0]] ?? 0;
    this.canvas.dataset.points = String(this.points.length);
    this.canvas.dataset.last = String(last);
    this.canvas.setAttribute('aria-label',
      `${this.series.map((s) => `${s} ${Math.round(values[s] ?? 0)} tokens/s`).join(', ')} (last ${this.points.length} samples)`);
    this.draw();
  }

  draw() {
    const ratio = window.devicePixelRatio || 1;
    const width = this.canvas.clientWidth;
    const height = this.canvas.clientHeight;
    if (!width || !height) return; // hidden
    // Resizing a canvas reallocates its backing store: only when the size changed.
    const pixelW = Math.round(width * ratio);
    const pixelH = Math.round(height * ratio);
    if (this.canvas.width !== pixelW || this.canvas.height !== pixelH) {
      this.canvas.width = pixelW;
      this.canvas.height = pixelH;
    }
    const ctx = this.canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    this.colors ??= Object.fromEntries(Object.entries(STYLE_VARS).map(([k, v]) => [k, cssVar(v)]));
    const { colors } = this;
    const top = niceMax(Math.max(1, ...this.points.flatMap((p) => this.series.map((s) => p.values[s] ?? 0))));
    const left = 44;
    const plotW = width - left - 8;
    const plotH = height - 20;
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = colors.text;
    ctx.strokeStyle = colors.grid;
    ctx.lineWidth = 1;
    for (let i = 0; i <= 4; i += 1) {
      const y = 6 + (plotH * i) / 4;
      ctx.beginPath();
      ctx.moveTo(left, y);
      ctx.lineTo(left + plotW, y);
      ctx.stroke();
      ctx.fillText(String(Math.round(top * (1 - i / 4))), 4, y + 4);
    }
    const span = Math.min(this.capacity, Math.max(this.minSpan, this.points.length));
    const every = this.intervalS === 1 ? 'a sample a second' : `a sample every ${this.intervalS} s`;
    ctx.fillText(`last ${span * this.intervalS} s (${every})`, left, height - 2);
    const step = plotW / Math.max(1, span - 1);
    const offset = span - this.points.length;
    for (const name of this.series) {
      ctx.strokeStyle = colors[name] || colors.decode;
      ctx.lineWidth = 2;
      ctx.beginPath();
      this.points.forEach((point, i) => {
        const x = left + (offset + i) * step;
        const y = 6 + plotH * (1 - (point.values[name] ?? 0) / top);
        if (i === 0) ctx.moveTo(x, y);
        else ctx.lineTo(x, y);
      });
      ctx.stroke();
    }
  }
}

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || '#888';
}

/** The next "round" number at or above `value` (1, 2, 5 x 10^n). */
function niceMax(value) {
  const power = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 5, 10]) if (m * power >= value) return m * power;
  return 10 * power;
}

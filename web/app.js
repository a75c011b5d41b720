/* app.js - the ddpmd dashboard: hash routes (#/jobs, #/job/ID, #/sample/ID, #/samples, #/datasets,
 * #/devices, #/new, #/new/DATASET) over the server's REST API. Every URL is relative to the page
 * (never "/..."), so the page works behind a proxy that strips a path prefix. With tokens, every
 * request carries Authorization: Bearer; event streams are read with fetch (EventSource cannot
 * send headers) and images are fetched and shown as blob: URLs, so the token never goes into a
 * URL. The token box shows only where the server needs a token: /healthz says so
 * (auth_required), and a request answered 401 does too.
 */
'use strict';

const TOKEN_KEY = 'ddpmd.token';
const COLORS = ['#2f6fdf', '#e07b24', '#2e9d5b', '#b8453a', '#7a52c7', '#1e9bb0', '#c59a12',
                '#8a6b58', '#d1579b', '#5a6b86', '#7cb342', '#9e9e9e'];

/* ---- small helpers ---- */

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

function bytes(n) {
  if (n === null || n === undefined || !isFinite(n)) return '-';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0, v = Number(n);
  while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)) + ' ' + u[i];
}

function duration(s) {
  if (s === null || s === undefined || !isFinite(s) || s < 0) return '-';
  s = Math.round(s);
  if (s >= 3600) return Math.floor(s / 3600) + 'h' + String(Math.floor(s / 60) % 60).padStart(2, '0') + 'm';
  if (s >= 60) return Math.floor(s / 60) + 'm' + String(s % 60).padStart(2, '0') + 's';
  return s + 's';
}

function num(v, digits) {
  return v === null || v === undefined || !isFinite(v) ? '-' : Number(v).toFixed(digits);
}

const ENDED = new Set(['succeeded', 'failed', 'canceled']);

function stateBadge(state) {
  return el('span', {class: 'state state-' + state, 'data-state': state, text: state});
}

function progressBar(step, steps) {
  const f = steps > 0 ? Math.max(0, Math.min(1, step / steps)) : 0;
  const fill = el('div');
  fill.style.width = (100 * f).toFixed(1) + '%';
  return el('div', {class: 'progress', role: 'progressbar', 'aria-valuenow': step,
                    'aria-valuemax': steps}, fill, el('span', {text: step + ' / ' + steps}));
}

/* the job's images per step from its spec (train.batch, default 32) -> seconds left */
function etaOf(job) {
  const t = job.spec && job.spec.train ? job.spec.train : {};
  const batch = t.batch || 32;
  if (job.state !== 'running' || !(job.images_per_s > 0)) return null;
  return (job.steps - job.step) * batch / job.images_per_s;
}

/* a value to read (hover, labels): 4 significant digits, exponent form when tiny or huge */
function fmtVal(v) {
  if (v === null || v === undefined || !isFinite(v)) return '-';
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3).replace(/\.?0+e/, 'e').replace('e+', 'e');
  return String(Number(v.toPrecision(4)));
}

/* a dotted path (train.batch) in a spec object: read, set, or remove (undefined) */
function getPath(o, path) {
  return path.split('.').reduce((a, k) => (a && typeof a === 'object' && !Array.isArray(a) ? a[k] : undefined), o);
}

function setPath(o, path, v) {
  const keys = path.split('.'), chain = [o];
  for (const k of keys.slice(0, -1)) {
    const a = chain[chain.length - 1];
    if (!a[k] || typeof a[k] !== 'object' || Array.isArray(a[k])) {
      if (v === undefined) return;
      a[k] = {};
    }
    chain.push(a[k]);
  }
  if (v !== undefined) { chain[chain.length - 1][keys[keys.length - 1]] = v; return; }
  delete chain[chain.length - 1][keys[keys.length - 1]];
  for (let i = chain.length - 1; i > 0 && !Object.keys(chain[i]).length; i--) delete chain[i - 1][keys[i - 1]];
}

/* JSON with object keys in order: two values alike whatever order their keys came in */
function canonical(v) {
  if (Array.isArray(v)) return '[' + v.map(canonical).join(',') + ']';
  if (v && typeof v === 'object') return '{' + Object.keys(v).sort().map((k) => JSON.stringify(k) + ':' + canonical(v[k])).join(',') + '}';
  return JSON.stringify(v);
}

/* ---- the API: relative URLs, the token on every request ---- */

const api = {
  token() { return sessionStorage.getItem(TOKEN_KEY) || ''; },
  headers(extra) {
    const h = Object.assign({}, extra || {});
    const t = api.token();
    if (t) h['Authorization'] = 'Bearer ' + t;
    return h;
  },
  /* -> {status, ok, body (parsed JSON, or text)}; network failures give status 0 */
  async req(method, path, body, signal) {
    const init = {method, headers: api.headers(), signal, cache: 'no-store'};
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = typeof body === 'string' ? body : JSON.stringify(body);
    }
    let r;
    try {
      r = await fetch(path, init);
    } catch (e) {
      if (e.name === 'AbortError') throw e;
      return {status: 0, ok: false, body: {detail: 'the server cannot be reached (' + e.message + ')'}};
    }
    const ct = r.headers.get('Content-Type') || '';
    const text = await r.text();
    let parsed = text;
    if (ct.includes('json')) { try { parsed = JSON.parse(text); } catch (e) { parsed = text; } }
    if (r.status === 401) auth.needed(parsed);
    return {status: r.status, ok: r.ok, body: parsed};
  },
  get(path, signal) { return api.req('GET', path, undefined, signal); },
  async blobUrl(path, signal) {
    const r = await fetch(path, {headers: api.headers(), signal, cache: 'no-store'});
    if (!r.ok) return null;
    const url = URL.createObjectURL(await r.blob());
    view.urls.push(url);
    return url;
  },
  /* Server-Sent Events through fetch: onEvent({id, type, data}) for each event; resumes with
   * Last-Event-ID after a dropped connection; resolves when the stream ends (the job ended). */
  async events(path, onEvent, signal) {
    let last = 0, tries = 0;
    while (!signal.aborted) {
      try {
        const h = api.headers({'Accept': 'text/event-stream'});
        if (last > 0) h['Last-Event-ID'] = String(last);
        const r = await fetch(path, {headers: h, signal, cache: 'no-store'});
        if (!r.ok) { if (r.status === 401) auth.needed(null); return false; }
        const reader = r.body.getReader(), dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          buf += dec.decode(value, {stream: true});
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            const ev = {id: 0, type: 'message', data: ''};
            for (const line of block.split('\n')) {
              if (line.startsWith(':')) continue;
              const k = line.indexOf(':');
              const key = k < 0 ? line : line.slice(0, k);
              const val = k < 0 ? '' : line.slice(k + 1).replace(/^ /, '');
              if (key === 'id') ev.id = Number(val);
              else if (key === 'event') ev.type = val;
              else if (key === 'data') ev.data += val;
            }
            if (!ev.data) continue;
            if (ev.id) last = ev.id;
            try { ev.data = JSON.parse(ev.data); } catch (e) { /* keep the text */ }
            tries = 0;
            onEvent(ev);
          }
        }
        return true;
      } catch (e) {
        if (signal.aborted || e.name === 'AbortError') return false;
        if (++tries > 30) return false;
        await sleep(1000, signal);
      }
    }
    return false;
  },
  /* POST a file with upload progress (fetch reports none): onProgress(sent, total) */
  upload(path, body, type, onProgress, signal) {
    return new Promise((resolve) => {
      const x = new XMLHttpRequest();
      x.open('POST', path);
      for (const [k, v] of Object.entries(api.headers({'Content-Type': type}))) x.setRequestHeader(k, v);
      x.upload.onprogress = (e) => { if (e.lengthComputable && onProgress) onProgress(e.loaded, e.total); };
      x.onload = () => {
        let parsed = x.responseText;
        if ((x.getResponseHeader('Content-Type') || '').includes('json')) {
          try { parsed = JSON.parse(parsed); } catch (e) { /* keep the text */ }
        }
        if (x.status === 401) auth.needed(parsed);
        resolve({status: x.status, ok: x.status >= 200 && x.status < 300, body: parsed});
      };
      x.onerror = () => resolve({status: 0, ok: false, body: {detail: 'the upload did not reach the server (or it closed the connection)'}});
      x.onabort = () => resolve({status: 0, ok: false, body: {detail: 'the upload was stopped'}});
      if (signal) signal.addEventListener('abort', () => x.abort(), {once: true});
      x.send(body);
    });
  },
};

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    if (signal) signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, {once: true});
  });
}

/* ---- the token: a box in the header, shown only where tokens are needed (/healthz's
 * auth_required, or a 401 seen); the token lives in sessionStorage for this tab only ---- */

const auth = {
  required: false, /* the server needs a token: /healthz said so, or a request was answered 401 */
  needed(problem) {
    auth.required = true;
    const f = document.getElementById('token-form');
    f.hidden = false;
    f.classList.add('needed');
    document.getElementById('token-state').textContent =
      api.token() ? 'the token was refused' : 'this server needs a token';
    if (problem && problem.detail) document.getElementById('token-state').title = problem.detail;
  },
  init() {
    const f = document.getElementById('token-form'), input = document.getElementById('token-input');
    f.addEventListener('submit', (e) => {
      e.preventDefault();
      const t = input.value.trim();
      if (t) sessionStorage.setItem(TOKEN_KEY, t);
      input.value = '';
      auth.show();
      route();
    });
    document.getElementById('token-forget').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      auth.show();
      route();
    });
    auth.show();
    /* a server without a token file says so: no box there, even with a token kept */
    api.get('healthz').then((r) => {
      if (r.ok && r.body && r.body.auth_required === true && !auth.required) {
        if (api.token()) { auth.required = true; auth.show(); } else auth.needed(null);
      }
    }).catch(() => {});
  },
  show() {
    const f = document.getElementById('token-form');
    f.hidden = !auth.required;
    f.classList.remove('needed');
    const s = document.getElementById('token-state');
    s.title = '';
    s.textContent = api.token() ? 'token set' : '';
  },
};

/* ---- the view: each route renders into #view; leaving it aborts its streams and timers ---- */

const view = {
  ctl: new AbortController(),
  urls: [],
  timers: [],
  reset() {
    view.ctl.abort();
    view.ctl = new AbortController();
    for (const t of view.timers) clearInterval(t);
    view.timers = [];
    lightbox.close();
    for (const u of view.urls) URL.revokeObjectURL(u);
    view.urls = [];
    const m = document.getElementById('view');
    m.replaceChildren();
    for (const k of Object.keys(m.dataset)) delete m.dataset[k];
    return m;
  },
  every(ms, fn) { view.timers.push(setInterval(fn, ms)); },
};

function problemText(res) {
  const b = res.body;
  if (b && typeof b === 'object') return (b.title ? b.title + ': ' : '') + (b.detail || '');
  return 'HTTP ' + res.status + (typeof b === 'string' && b ? ': ' + b.slice(0, 200) : '');
}

function showError(parent, res) {
  parent.append(el('p', {class: 'error', role: 'alert', text: problemText(res)}));
}

/* guards an async renderer: an error shows on the page (never an unhandled rejection) */
function guard(fn) {
  return async (...args) => {
    try {
      await fn(...args);
    } catch (e) {
      if (e && e.name === 'AbortError') return;
      const m = document.getElementById('view');
      m.append(el('p', {class: 'error', role: 'alert', text: 'dashboard error: ' + (e && e.message)}));
    }
  };
}

/* a table whose cells carry their column's name (data-label): on a narrow screen each row is a
 * card of labelled cells (style.css), so the table never overflows the page.
 * cols: [{h, cell(item) -> Node or text, num?}]; attrs(item) -> the row's attributes */
function stackTable(id, cols, items, attrs) {
  const head = el('tr', {}, cols.map((c) => el('th', {class: c.num ? 'num' : null, text: c.h})));
  const rows = items.map((it) => el('tr', attrs ? attrs(it) : {}, cols.map((c) => {
    const v = c.cell(it);
    return el('td', {class: c.num ? 'num' : null, 'data-label': c.h}, v === undefined || v === null ? '' : v);
  })));
  return el('table', {class: 'stack', id}, el('thead', {}, head), el('tbody', {}, rows));
}

/* ---- a horizontal bar of parts [{name, bytes, color?, title?}] over a total ---- */

function partsBar(parts, total, opts) {
  opts = opts || {};
  const sum = parts.reduce((a, p) => a + Math.max(0, p.bytes || 0), 0);
  const whole = Math.max(total || 0, sum) || 1;
  const bar = el('div', {class: 'bar', 'data-bar': opts.name || ''});
  const legend = el('div', {class: 'legend'});
  parts.forEach((p, i) => {
    const color = p.color || COLORS[i % COLORS.length];
    const seg = el('div', {'data-part': p.name, title: p.name + ': ' + bytes(p.bytes) +
                           (p.title ? ' (' + p.title + ')' : '')});
    seg.style.width = (100 * Math.max(0, p.bytes) / whole).toFixed(3) + '%';
    seg.style.background = color;
    bar.append(seg);
    const sw = el('i');
    sw.style.background = color;
    legend.append(el('span', {}, sw, p.name + ' ' + bytes(p.bytes)));
  });
  if (opts.free !== undefined) {
    const seg = el('div', {class: 'free', 'data-part': 'free', title: 'free: ' + bytes(opts.free)});
    seg.style.width = (100 * Math.max(0, opts.free) / whole).toFixed(3) + '%';
    bar.append(seg);
    legend.append(el('span', {}, el('i', {class: 'free-swatch'}), 'free ' + bytes(opts.free)));
  }
  return el('div', {}, bar, legend);
}

/* a job's plan -> the parts of its reservation [{name, bytes}]. plan.parts may list them, as an
 * array [{name, bytes}] or as the planner's columns {device: {name: bytes}, host: {name: bytes}}
 * (host parts named "name (host)"); otherwise every *_bytes field except the totals is a part and
 * what the plan's total holds beyond them is "other (plan)". What reserved holds beyond all the
 * parts is "other", so the bar always adds up to the reservation. */
const PLAN_TOTALS = new Set(['plan_bytes', 'reserved_bytes', 'arena_without_reuse_bytes',
                             'device_bytes', 'host_bytes']);
function planParts(plan, reserved) {
  const parts = [];
  const add = (name, v) => { if (typeof v === 'number' && isFinite(v) && v > 0) parts.push({name, bytes: v}); };
  const pp = plan && plan.parts;
  if (Array.isArray(pp)) {
    for (const p of pp) if (p) add(String(p.name), Number(p.bytes));
  } else if (pp && typeof pp === 'object') {
    for (const [k, v] of Object.entries(pp.device || {})) add(k, v);
    for (const [k, v] of Object.entries(pp.host || {})) add(k + ' (host)', v);
  }
  if (parts.length) {
    add('process_baseline', plan.process_baseline_bytes);
    add('host_data', plan.host_data_bytes);
  } else {
    let inPlan = 0;
    for (const [k, v] of Object.entries(plan || {})) {
      if (!k.endsWith('_bytes') || PLAN_TOTALS.has(k) || typeof v !== 'number' || v <= 0) continue;
      const name = k.slice(0, -6);
      add(name, v);
      if (name !== 'process_baseline' && name !== 'host_data') inPlan += v;
    }
    if (plan && plan.plan_bytes > inPlan) add('other (plan)', plan.plan_bytes - inPlan);
  }
  const sum = parts.reduce((a, p) => a + p.bytes, 0);
  if (reserved > sum) add('other', reserved - sum);
  return parts;
}

/* ---- charts: series over the step axis on a canvas; ticks at 1-2-5 steps; values on hover ---- */

function clean(v) { return Number(v.toPrecision(12)); }

/* about n ticks over [lo, hi] at the multiples of a step of 1, 2 or 5 x 10^k: {ticks, step} */
function niceTicks(lo, hi, n, integer) {
  const raw = (hi - lo) / Math.max(1, n) || Math.abs(hi) || 1;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = clean([1, 2, 5, 10].map((k) => k * p).find((s) => s >= raw * 0.999));
  if (integer) step = Math.max(1, Math.round(step));
  const ticks = [];
  for (let i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9 && ticks.length < 200; i++)
    ticks.push(clean(i * step));
  return {ticks, step};
}

/* the ticks of a log axis over [10^lo, 10^hi]: decades, then 1-2-5 or 1-2-3-5 of each as the
 * span narrows; within half a decade, round values at a 1-2-5 step (0.8, 0.9, 1, 1.1) */
function logTicks(lo, hi) {
  const span = hi - lo, ticks = [];
  if (span > 0.5) {
    const mants = span > 4 ? [1] : span > 1.5 ? [1, 2, 5] : [1, 2, 3, 5];
    for (let d = Math.floor(lo); d <= Math.ceil(hi); d++) {
      for (const m of mants) {
        const v = clean(m * Math.pow(10, d)), l = Math.log10(v);
        if (l >= lo - 1e-9 && l <= hi + 1e-9) ticks.push(v);
      }
    }
    if (ticks.length >= 2) return ticks;
  }
  return niceTicks(Math.pow(10, lo), Math.pow(10, hi), 5).ticks.filter((v) => v > 0);
}

/* a tick's label with the digits its step needs: 0.25, 2e-4, 1500 */
function tickLabel(v, step) {
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (a < 1e-3 || a >= 1e6) {
    const e = Math.floor(Math.log10(a) + 1e-9);
    const digits = Math.max(0, Math.min(6, -Math.floor(Math.log10(step / Math.pow(10, e)) + 1e-9)));
    return v.toExponential(digits).replace(/\.?0+e/, 'e').replace('e+', 'e');
  }
  return v.toFixed(Math.max(0, Math.min(10, -Math.floor(Math.log10(step) + 1e-9))));
}

/* the point of a step-sorted array at step s (or undefined) */
function atStep(points, s) {
  let lo = 0, hi = points.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1, v = points[mid].step;
    if (v === s) return points[mid];
    if (v < s) lo = mid + 1; else hi = mid - 1;
  }
  return undefined;
}

/* draws points ([{step, KEY: value}], sorted by step) as opts.series [{key, name, color, dots?,
 * count?: the canvas data attribute holding how many points it drew}] on a linear or (opts.log)
 * log y axis, opts.ref a dashed line (opts.refName), a cross-hair at step `hover`; the canvas's
 * data-xticks/-yticks list the ticks. -> the geometry hovering needs, or null when empty */
function drawChart(canvas, points, opts, hover) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 600, h = canvas.clientHeight || 220;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  const g = canvas.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  g.font = '11px system-ui, sans-serif';
  const ok = opts.log ? (v) => typeof v === 'number' && v > 0 && isFinite(v)
                      : (v) => typeof v === 'number' && isFinite(v);
  let n = 0, ymin = Infinity, ymax = -Infinity, xmin = Infinity, xmax = -Infinity;
  const series = opts.series.map((s) => {
    const pts = points.filter((p) => ok(p[s.key]));
    for (const p of pts) {
      const v = p[s.key];
      if (v < ymin) ymin = v;
      if (v > ymax) ymax = v;
      if (p.step < xmin) xmin = p.step;
      if (p.step > xmax) xmax = p.step;
    }
    n += pts.length;
    if (s.count) canvas.dataset[s.count] = String(pts.length);
    return Object.assign({pts}, s);
  });
  canvas.dataset.xticks = canvas.dataset.yticks = '';
  if (!n) {
    g.fillStyle = '#687083';
    g.textBaseline = 'top';
    g.fillText(opts.empty || 'nothing logged yet', 12, 12);
    return null;
  }
  const ref = opts.ref > 0 && isFinite(opts.ref) && opts.ref < ymax * 20 ? opts.ref : null;
  if (ref !== null) ymax = Math.max(ymax, ref);
  if (xmax <= xmin) { xmin -= 0.5; xmax += 0.5; }
  const legend = series.length > 1 || ref !== null;
  const L = 50, R = w - 12, T = legend ? 26 : 14, B = h - 34;
  let ylo, yhi, yticks, ylab, Y, note = '';
  if (opts.log) {
    let lo = Math.log10(ymin), hi = Math.log10(ymax);
    if (hi - lo < 0.2) { const c = (hi + lo) / 2; lo = c - 0.1; hi = c + 0.1; }
    const pad = (hi - lo) * 0.06;
    ylo = lo - pad; yhi = hi + pad;
    yticks = logTicks(ylo, yhi);
    ylab = (v) => (v >= 1e-3 && v < 1e6 ? String(v) : v.toExponential().replace('e+', 'e'));
    Y = (v) => B - (Math.log10(v) - ylo) / (yhi - ylo) * (B - T);
  } else {
    const lo = Math.min(0, ymin), hi = ymax > lo ? ymax : lo + (Math.abs(lo) || 1);
    const t = niceTicks(lo, hi, Math.max(2, Math.floor((B - T) / 36)));
    ylo = clean(Math.floor(lo / t.step + 1e-9) * t.step);
    yhi = clean(Math.ceil(hi / t.step - 1e-9) * t.step);
    yticks = [];
    for (let i = 0; ylo + i * t.step <= yhi + t.step * 1e-9; i++) yticks.push(clean(ylo + i * t.step));
    const e = Math.floor(Math.log10(Math.max(Math.abs(ylo), Math.abs(yhi))));
    if (e < -2 || e >= 6) { /* a common factor: 2e-4 at 5e-5 steps reads 0.5 .. 2 (x1e-4) */
      const f = Math.pow(10, e);
      note = '\u00d71e' + e;
      ylab = (v) => tickLabel(clean(v / f), t.step / f);
    } else {
      ylab = (v) => tickLabel(v, t.step);
    }
    Y = (v) => B - (v - ylo) / (yhi - ylo) * (B - T);
  }
  const xt = niceTicks(xmin, xmax, Math.max(2, Math.floor((R - L) / 80)), true);
  const X = (s) => L + (s - xmin) / (xmax - xmin) * (R - L);
  canvas.dataset.xticks = xt.ticks.join(',');
  canvas.dataset.yticks = yticks.join(',');
  /* the y grid and its labels, a label only where it clears the one below */
  g.lineWidth = 1;
  g.textAlign = 'right';
  g.textBaseline = 'middle';
  let lastY = Infinity;
  for (const v of yticks) {
    const y = Math.round(Y(v)) + 0.5;
    g.strokeStyle = '#e3e6ec';
    g.beginPath(); g.moveTo(L, y); g.lineTo(R, y); g.stroke();
    if (lastY - y >= 14) { g.fillStyle = '#687083'; g.fillText(ylab(v), L - 6, y); lastY = y; }
  }
  /* the step axis: integer ticks, labels that do not overlap */
  g.textAlign = 'center';
  g.textBaseline = 'top';
  let lastX = -Infinity;
  for (const s of xt.ticks) {
    const x = Math.round(X(s)) + 0.5, t = String(s), tw = g.measureText(t).width;
    g.strokeStyle = '#687083';
    g.beginPath(); g.moveTo(x, B); g.lineTo(x, B + 4); g.stroke();
    if (x - tw / 2 > lastX + 8 && x + tw / 2 <= w) { g.fillStyle = '#687083'; g.fillText(t, x, B + 6); lastX = x + tw / 2; }
  }
  g.strokeStyle = '#1d2330';
  g.beginPath(); g.moveTo(L + 0.5, T); g.lineTo(L + 0.5, B + 0.5); g.lineTo(R, B + 0.5); g.stroke();
  g.fillStyle = '#1d2330';
  g.fillText('step', (L + R) / 2, B + 20);
  let legendX = L;
  if (note) { /* the y axis's common factor, above it */
    g.textAlign = 'left'; g.textBaseline = 'middle'; g.fillStyle = '#687083';
    g.fillText(note, L + 4, legend ? 10 : 6);
    legendX += g.measureText(note).width + 18;
  }
  if (ref !== null) {
    const y = Math.round(Y(ref)) + 0.5;
    g.save(); g.setLineDash([5, 4]); g.strokeStyle = '#9e9e9e';
    g.beginPath(); g.moveTo(L, y); g.lineTo(R, y); g.stroke(); g.restore();
  }
  /* the series, clipped to the plot */
  g.save();
  g.beginPath(); g.rect(L, T - 4, R - L + 4, B - T + 8); g.clip();
  for (const s of series) {
    g.strokeStyle = g.fillStyle = s.color;
    if (s.dots || s.pts.length === 1) {
      for (const p of s.pts) { g.beginPath(); g.arc(X(p.step), Y(p[s.key]), 3.5, 0, 2 * Math.PI); g.fill(); }
    } else {
      g.lineWidth = 1.5;
      g.beginPath();
      s.pts.forEach((p, i) => (i ? g.lineTo(X(p.step), Y(p[s.key])) : g.moveTo(X(p.step), Y(p[s.key]))));
      g.stroke();
    }
  }
  if (hover !== null && hover !== undefined) {
    const x = Math.round(X(hover)) + 0.5;
    g.strokeStyle = 'rgba(29,35,48,0.45)'; g.lineWidth = 1;
    g.beginPath(); g.moveTo(x, T); g.lineTo(x, B); g.stroke();
    const p = atStep(points, hover);
    for (const s of series) {
      if (!p || !ok(p[s.key])) continue;
      g.fillStyle = '#fff'; g.strokeStyle = s.color; g.lineWidth = 2;
      g.beginPath(); g.arc(X(hover), Y(p[s.key]), 4.5, 0, 2 * Math.PI); g.fill(); g.stroke();
    }
  }
  g.restore();
  if (legend) {
    g.textAlign = 'left';
    g.textBaseline = 'middle';
    let x = legendX;
    const item = (name, draw) => {
      draw(x);
      g.fillStyle = '#1d2330';
      g.fillText(name, x + 18, 10);
      x += 18 + g.measureText(name).width + 16;
    };
    for (const s of series) {
      item(s.name, (x0) => {
        g.fillStyle = s.color;
        if (s.dots) { g.beginPath(); g.arc(x0 + 7, 10, 3.5, 0, 2 * Math.PI); g.fill(); } else g.fillRect(x0, 9, 14, 3);
      });
    }
    if (ref !== null) {
      item((opts.refName || 'reference') + ' ' + fmtVal(ref), (x0) => {
        g.save(); g.setLineDash([4, 3]); g.strokeStyle = '#9e9e9e'; g.lineWidth = 1.5;
        g.beginPath(); g.moveTo(x0, 10.5); g.lineTo(x0 + 14, 10.5); g.stroke(); g.restore();
      });
    }
  }
  /* the steps that have a value, for hovering */
  const steps = [];
  for (const p of points) if (series.some((s) => ok(p[s.key]))) steps.push(p.step);
  return {
    X, T, series,
    nearest(px) { /* the logged step nearest to a pixel's x */
      if (!steps.length) return null;
      const s = xmin + (px - L) / (R - L) * (xmax - xmin);
      let lo = 0, hi = steps.length - 1;
      while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (steps[mid] < s) lo = mid; else hi = mid; }
      return Math.abs(steps[lo] - s) <= Math.abs(steps[hi] - s) ? steps[lo] : steps[hi];
    },
  };
}

/* a chart that redraws itself (new points, a new width) and shows the values of the step under
 * the pointer in a tooltip (.chart-tip, data-step). chart.points is the step-sorted array it draws. */
function chartBox(id, opts) {
  const canvas = el('canvas', {class: 'chart', id, 'aria-label': opts.label || id, role: 'img'});
  if (opts.height) canvas.style.height = opts.height + 'px';
  const tip = el('div', {class: 'chart-tip', hidden: true, 'data-for': id});
  const c = {box: el('div', {class: 'chart-box'}, canvas, tip), canvas, points: [], hover: null, geo: null};
  let pending = false;
  const draw = () => {
    c.geo = drawChart(canvas, c.points, opts, c.hover);
    const p = c.geo && c.hover !== null ? atStep(c.points, c.hover) : undefined;
    if (!p) { tip.hidden = true; return; }
    const rows = c.geo.series.filter((s) => p[s.key] !== undefined && p[s.key] !== null && isFinite(p[s.key]))
      .map((s) => {
        const sw = el('i');
        sw.style.background = s.color;
        return el('div', {'data-key': s.key}, sw, s.name + ' ', el('b', {text: fmtVal(p[s.key])}));
      });
    tip.replaceChildren(el('div', {class: 'muted', text: 'step ' + c.hover}), ...rows);
    tip.dataset.step = String(c.hover);
    tip.hidden = false;
    const x = c.geo.X(c.hover), tw = tip.offsetWidth;
    tip.style.left = (x + 14 + tw > canvas.clientWidth ? Math.max(0, x - 14 - tw) : x + 14) + 'px';
    tip.style.top = c.geo.T + 'px';
  };
  c.redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(); });
  };
  canvas.addEventListener('pointermove', (e) => {
    if (!c.geo) return;
    const s = c.geo.nearest(e.clientX - canvas.getBoundingClientRect().left);
    if (s !== c.hover) { c.hover = s; c.redraw(); }
  });
  canvas.addEventListener('pointerleave', () => { if (c.hover !== null) { c.hover = null; c.redraw(); } });
  if (window.ResizeObserver) new ResizeObserver(() => c.redraw()).observe(canvas);
  return c;
}

/* ---- the lightbox: an image at full size (a whole-number zoom, pixels kept square) over the
 * page, with a link to the PNG itself and a download; arrows page through its gallery ---- */

const lightbox = {
  dlg: null,
  items: [],
  i: 0,
  part(id) { return document.getElementById('lightbox-' + id); },
  build() {
    const btn = (id, text, fn) => el('button', {type: 'button', id: 'lightbox-' + id, text, onclick: fn});
    const dlg = el('dialog', {id: 'lightbox', 'aria-label': 'image at full size'},
      el('div', {class: 'lb-bar'},
        el('span', {id: 'lightbox-caption'}),
        el('span', {class: 'lb-actions'},
          btn('prev', '\u2039 previous', () => lightbox.show(lightbox.i - 1)),
          btn('next', 'next \u203a', () => lightbox.show(lightbox.i + 1)),
          el('a', {id: 'lightbox-open', target: '_blank', rel: 'noopener', text: 'open the PNG'}),
          el('a', {id: 'lightbox-save', text: 'download'}),
          btn('close', 'Close', () => lightbox.close()))),
      el('div', {class: 'lb-img'}, el('img', {id: 'lightbox-img', alt: ''})));
    dlg.addEventListener('click', (e) => { if (e.target === dlg || e.target.classList.contains('lb-img')) lightbox.close(); });
    dlg.addEventListener('keydown', (e) => {
      if (e.key === 'ArrowLeft') lightbox.show(lightbox.i - 1);
      else if (e.key === 'ArrowRight') lightbox.show(lightbox.i + 1);
    });
    document.body.append(dlg);
    lightbox.dlg = dlg;
    lightbox.part('img').addEventListener('load', () => lightbox.fit());
    window.addEventListener('resize', () => { if (dlg.open) lightbox.fit(); });
  },
  /* items: [{src, caption, name (the download's file name)}] */
  open(items, i) {
    if (!lightbox.dlg) lightbox.build();
    lightbox.items = items;
    if (!lightbox.dlg.open) lightbox.dlg.showModal();
    lightbox.show(i);
  },
  show(i) {
    const n = lightbox.items.length;
    if (!n) return;
    lightbox.i = ((i % n) + n) % n;
    const it = lightbox.items[lightbox.i], img = lightbox.part('img');
    lightbox.part('prev').hidden = lightbox.part('next').hidden = n < 2;
    lightbox.part('open').href = lightbox.part('save').href = it.src;
    lightbox.part('save').download = it.name;
    lightbox.part('caption').textContent = it.caption;
    img.alt = it.caption;
    if (img.getAttribute('src') !== it.src) { img.style.width = img.style.height = ''; img.src = it.src; }
    else lightbox.fit();
  },
  fit() {
    const img = lightbox.part('img'), nw = img.naturalWidth, nh = img.naturalHeight;
    if (!nw || !nh) return;
    let s = Math.min((window.innerWidth - 48) / nw, (window.innerHeight - 110) / nh);
    s = s >= 1 ? Math.floor(s) : s;
    img.style.width = Math.round(nw * s) + 'px';
    img.style.height = Math.round(nh * s) + 'px';
    img.dataset.scale = String(Number(s.toFixed(3)));
    const it = lightbox.items[lightbox.i];
    lightbox.part('caption').textContent = it.caption + ' \u2014 ' + nw + '\u00d7' + nh + ' px' +
      (s === 1 ? '' : s > 1 ? ', shown at ' + s + '\u00d7' : ', shown at ' + Math.round(100 * s) + '%');
  },
  close() { if (lightbox.dlg && lightbox.dlg.open) lightbox.dlg.close(); },
};

/* a thumbnail: a link to the PNG (a new tab or a download gets the file) that opens the lightbox
 * on a plain click; gallery() -> the items to page through. It is drawn at a whole-number zoom
 * near `size` pixels wide (opts.max caps it), never blurred */
function thumb(src, caption, name, gallery, opts) {
  opts = opts || {};
  const img = el('img', {src, alt: caption});
  img.addEventListener('load', () => {
    const nw = img.naturalWidth, size = opts.size || 256;
    let w = nw * Math.max(1, Math.round(size / nw));
    if (opts.max && w > opts.max) w = opts.max;
    img.style.width = w + 'px';
  }, {once: true});
  const a = el('a', {href: src, class: 'thumb', title: caption + ': click for full size'}, img);
  a.addEventListener('click', (e) => {
    if (e.button !== 0 || e.ctrlKey || e.metaKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    const items = gallery ? gallery() : [{src, caption, name}];
    lightbox.open(items, Math.max(0, items.findIndex((x) => x.src === src)));
  });
  return a;
}

/* ---- #/jobs ---- */

const renderJobs = guard(async (m) => {
  m.append(el('h2', {text: 'Jobs'}));
  const box = el('div');
  m.append(box);
  const signal = view.ctl.signal;
  const live = new Map(); /* job id -> the newest progress event from its stream */
  const streams = new Set();
  const MAX_STREAMS = 4; /* a browser allows 6 connections per server: keep some for requests */
  let rows = [];
  const draw = () => {
    const now = (j) => {
      const p = live.get(j.id) || {};
      return {p, step: Math.max(j.step, p.step || 0), steps: p.steps || j.steps};
    };
    const cols = [
      {h: 'job', cell: (j) => el('a', {href: (j.kind === 'sample' ? '#/sample/' : '#/job/') + j.id, class: 'mono', text: j.id})},
      {h: 'kind', cell: (j) => j.kind},
      {h: 'state', cell: (j) => stateBadge(j.state)},
      {h: 'device', cell: (j) => j.device || '-'},
      {h: 'reserved', num: true, cell: (j) => bytes(j.reserved_bytes)},
      {h: 'progress', cell: (j) => { const x = now(j); return progressBar(x.step, x.steps); }},
      {h: 'images/s', num: true, cell: (j) => { const p = now(j).p; return num(p.img_per_s !== undefined ? p.img_per_s : j.images_per_s, 1); }},
      {h: 'ETA', num: true, cell: (j) => { const p = now(j).p; return duration(p.eta_s !== undefined && j.state === 'running' ? p.eta_s : etaOf(j)); }},
      {h: 'loss', num: true, cell: (j) => { const p = now(j).p; return num(p.loss !== undefined ? p.loss : j.loss, 4); }},
      {h: 'created', cell: (j) => el('span', {class: 'muted', text: (j.created_at || '').replace('T', ' ').replace(/\..*$/, '')})},
    ];
    box.replaceChildren(rows.length ? stackTable('jobs-table', cols, rows, (j) => ({'data-job': j.id}))
      : el('p', {class: 'muted'}, 'No jobs yet. ', el('a', {href: '#/new', text: 'Submit one.'})));
  };
  const follow = (j) => {
    if (streams.has(j.id) || streams.size >= MAX_STREAMS || ENDED.has(j.state)) return;
    streams.add(j.id);
    api.events('jobs/' + j.id + '/events', (ev) => {
      if (ev.type === 'progress' && ev.data.event === 'step') { live.set(j.id, ev.data); draw(); }
      if (ev.type === 'state') load();
    }, signal).finally(() => { streams.delete(j.id); if (!signal.aborted) load(); });
  };
  const load = guard(async () => {
    const res = await api.get('jobs?limit=200', signal);
    if (!res.ok) { box.replaceChildren(); showError(box, res); return; }
    rows = res.body.jobs.slice().reverse();
    draw();
    for (const j of rows) if (j.state === 'running') follow(j);
  });
  await load();
  view.every(3000, load);
});

/* ---- #/job/ID ---- */

const renderJob = guard(async (m, id) => {
  const signal = view.ctl.signal;
  const res = await api.get('jobs/' + encodeURIComponent(id), signal);
  if (!res.ok) { m.append(el('h2', {text: 'Job ' + id})); showError(m, res); return; }
  let job = res.body;
  if (job.kind === 'sample') { location.replace('#/sample/' + id); return; }
  const head = el('div'), info = el('dl', {class: 'kv'}), planBox = el('div');
  const train = (job.spec && job.spec.train) || {};
  const loss = chartBox('loss-chart', {log: true, height: 260, label: 'loss chart', series: [
    {key: 'loss', name: 'train loss', color: COLORS[0], count: 'points'},
    {key: 'val', name: 'validation loss', color: COLORS[3], dots: true, count: 'valPoints'}]});
  const lr = chartBox('lr-chart', {height: 190, label: 'learning rate chart',
    series: [{key: 'lr', name: 'learning rate', color: COLORS[4], count: 'points'}]});
  const gn = chartBox('grad-chart', {height: 190, label: 'gradient norm chart', ref: train.clip, refName: 'clip',
    series: [{key: 'gn', name: 'gradient norm', color: COLORS[2], count: 'points'}]});
  const ips = chartBox('ips-chart', {height: 190, label: 'images per second chart',
    series: [{key: 'ips', name: 'images/s', color: COLORS[1], count: 'points'}]});
  const charts = [loss, lr, gn, ips];
  const grids = el('div', {class: 'grids', id: 'grids'});
  const ckpts = el('div', {id: 'checkpoints'});
  const sampleBox = el('div');
  const specPre = el('pre', {id: 'job-spec', text: JSON.stringify(job.spec, null, 2)});
  const logPre = el('pre', {id: 'job-log'});
  m.append(head,
    el('div', {class: 'grid2'},
      el('div', {class: 'card'}, el('h3', {text: 'Status'}), info),
      el('div', {class: 'card'}, el('h3', {text: 'Memory plan (reserved bytes by part)'}), planBox)),
    el('div', {class: 'card'}, el('h3', {text: 'Loss (log scale)'}), loss.box),
    el('div', {class: 'charts'},
      el('div', {class: 'card'}, el('h3', {text: 'Learning rate'}), lr.box),
      el('div', {class: 'card'}, el('h3', {text: 'Gradient norm (before clipping)'}), gn.box),
      el('div', {class: 'card'}, el('h3', {text: 'Images per second'}), ips.box)),
    el('div', {class: 'card'}, el('h3', {}, 'Sample grids ', el('span', {class: 'muted', text: '(click one for full size)'})), grids),
    el('div', {class: 'grid2'},
      el('div', {class: 'card'}, el('h3', {text: 'Checkpoints'}), ckpts),
      el('div', {class: 'card'}, el('h3', {text: 'Request samples'}), sampleBox)),
    el('div', {class: 'grid2'},
      el('div', {class: 'card'}, el('h3', {text: 'Spec'}), specPre),
      el('div', {class: 'card'}, el('h3', {text: 'Log'}), logPre)));
  const points = [], shown = new Set(), gridItems = [];
  for (const c of charts) c.points = points;
  let last = {};
  const drawHead = () => {
    const cancel = el('button', {class: 'danger', id: 'cancel', disabled: ENDED.has(job.state) || job.cancel_requested,
                                 text: job.cancel_requested && !ENDED.has(job.state) ? 'stopping...' : 'Cancel'});
    cancel.addEventListener('click', guard(async () => {
      cancel.disabled = true;
      const r = await api.req('POST', 'jobs/' + id + '/cancel', undefined, signal);
      if (!r.ok) showError(head, r); else { job = r.body; drawAll(); }
    }));
    /* a canceled or failed job with a checkpoint resumes from it; an ended job is deleted with
     * its files (a second click confirms) */
    const resume = ['canceled', 'failed'].includes(job.state) && job.links && job.links.checkpoint ?
      el('button', {id: 'resume', text: 'Resume'}) : null;
    if (resume) resume.addEventListener('click', guard(async () => {
      resume.disabled = true;
      const r = await api.req('POST', 'jobs/' + id + '/resume', undefined, signal);
      if (!r.ok) showError(head, r); else route();
    }));
    const del = ENDED.has(job.state) ? el('button', {class: 'danger', id: 'delete', text: 'Delete'}) : null;
    if (del) del.addEventListener('click', guard(async () => {
      if (!del.dataset.armed) { del.dataset.armed = '1'; del.textContent = 'Delete it and its files?'; return; }
      del.disabled = true;
      const r = await api.req('DELETE', 'jobs/' + id, undefined, signal);
      if (!r.ok) showError(head, r); else location.hash = '#/jobs';
    }));
    const title = job.name ? [' ', el('span', {id: 'job-name', text: job.name})] : [];
    head.replaceChildren(el('h2', {}, 'Job ', el('span', {class: 'mono', text: id}), ...title, ' ', stateBadge(job.state), ' ', cancel,
      resume ? ' ' : null, resume, del ? ' ' : null, del));
  };
  const drawInfo = () => {
    const step = Math.max(job.step, last.step || 0), steps = last.steps || job.steps;
    const eta = ENDED.has(job.state) ? null : last.eta_s !== undefined ? last.eta_s : etaOf(job);
    const rows = [['progress', progressBar(step, steps)], ['device', (job.device || 'not placed yet (plans on ' + (job.plans || []).filter((p) => p.fits).map((p) => p.device).join(', ') + ')') + (job.threads ? ' (' + job.threads + (job.threads === 1 ? ' thread)' : ' threads)') : '')],
      ['reserved', bytes(job.reserved_bytes)], ['loss', num(last.loss !== undefined ? last.loss : job.loss, 4)],
      ['images/s', num(last.img_per_s !== undefined ? last.img_per_s : job.images_per_s, 1)], ['ETA', duration(eta)],
      ['owner', job.owner], ['created', job.created_at || '-'], ['started', job.started_at || '-'], ['ended', job.ended_at || '-']];
    const labels = Object.entries(job.labels || {});
    if (labels.length) rows.push(['labels', el('span', {id: 'job-labels', text: labels.map(([k, v]) => k + ': ' + v).join(', ')})]);
    if (job.error) rows.push(['error', el('span', {class: 'error', text: job.error})]);
    info.replaceChildren(...rows.flatMap(([k, v]) => [el('dt', {text: k}), el('dd', {}, v)]));
  };
  const drawPlan = () => {
    const parts = planParts(job.plan, job.reserved_bytes);
    planBox.replaceChildren(partsBar(parts, job.reserved_bytes, {name: 'plan'}),
      el('p', {class: 'muted', text: 'total reserved ' + bytes(job.reserved_bytes) +
        (job.plan && job.plan.arena_without_reuse_bytes ? '; the arena without reuse would be ' + bytes(job.plan.arena_without_reuse_bytes) : '')}));
  };
  const drawAll = () => { drawHead(); drawInfo(); drawPlan(); };
  const loadCkpts = guard(async () => {
    const r = await api.get('jobs/' + id + '/checkpoints', signal);
    if (!r.ok) { ckpts.replaceChildren(); showError(ckpts, r); return; }
    const list = r.body.checkpoints;
    if (!list.length) { ckpts.replaceChildren(el('p', {class: 'muted', text: 'none yet'})); return; }
    ckpts.replaceChildren(el('table', {}, el('tbody', {}, list.map((c) => {
      const link = el('a', {href: 'checkpoints/' + encodeURIComponent(c.id), download: c.id + '.safetensors',
                            class: 'mono', 'data-checkpoint': c.id, text: c.id});
      if (api.token()) link.addEventListener('click', guard(async (e) => {
        e.preventDefault(); /* the token goes in a header: download through fetch */
        const u = await api.blobUrl('checkpoints/' + encodeURIComponent(c.id), signal);
        if (!u) return;
        const a = el('a', {href: u, download: c.id + '.safetensors'});
        document.body.append(a); a.click(); a.remove();
      }));
      return el('tr', {}, el('td', {}, link), el('td', {class: 'num', text: 'step ' + c.step}),
                el('td', {class: 'num', text: bytes(c.bytes)}));
    }))));
  });
  const addGrid = guard(async (step) => {
    if (shown.has(step)) return;
    shown.add(step);
    const u = await api.blobUrl('jobs/' + id + '/grids/' + step + '.png', signal);
    if (!u) { shown.delete(step); return; }
    const item = {src: u, step, caption: 'job ' + id + ', samples at step ' + step, name: id + '-grid-' + step + '.png'};
    const at = gridItems.findIndex((g) => g.step > step);
    const fig = el('figure', {'data-step': step}, thumb(u, item.caption, item.name, () => gridItems),
                   el('figcaption', {text: 'step ' + step}));
    if (at < 0) { gridItems.push(item); grids.append(fig); }
    else { grids.insertBefore(fig, grids.children[at]); gridItems.splice(at, 0, item); }
  });
  const logLines = [];
  drawAll();
  sampleBox.append(sampleForm({job: id}));
  await loadCkpts();
  for (const c of charts) c.redraw();
  const onEvent = (ev) => {
    const d = ev.data;
    if (ev.type === 'progress' && d.event === 'step') {
      last = d;
      let p = atStep(points, d.step);
      if (!p) {
        p = {step: d.step};
        points.push(p);
        if (points.length > 1 && points[points.length - 2].step > d.step) points.sort((a, b) => a.step - b.step);
      }
      p.loss = d.loss;
      if (d.val_loss !== undefined) p.val = d.val_loss;
      p.lr = d.lr;
      p.gn = d.grad_norm;
      p.ips = d.img_per_s;
      drawInfo();
      for (const c of charts) c.redraw();
    } else if (ev.type === 'sample') {
      addGrid(d.step);
    } else if (ev.type === 'checkpoint') {
      loadCkpts();
    } else if (ev.type === 'log' && d.line !== undefined) {
      logLines.push(d.line);
      if (logLines.length > 200) logLines.shift();
      logPre.textContent = logLines.join('\n');
    } else if (ev.type === 'state') {
      refresh();
    }
  };
  const refresh = guard(async () => {
    const r = await api.get('jobs/' + id, signal);
    if (r.ok) { job = r.body; drawAll(); }
  });
  view.every(5000, () => { if (!ENDED.has(job.state)) refresh(); });
  await api.events('jobs/' + id + '/events', onEvent, signal);
  await refresh();
  await loadCkpts();
  if (!signal.aborted) m.dataset.settled = 'true'; /* the job ended and its page is final */
});

/* ---- the sample request form (#/new and a job's page) ---- */

function fieldInput(path, attrs) {
  return el('span', {class: 'field', 'data-path': path},
            el('label', {for: 'sf-' + path, text: path}), el('input', Object.assign({id: 'sf-' + path, name: path}, attrs)));
}

function sampleForm(preset) {
  const msg = el('div', {class: 'form-msg'});
  const sampler = el('select', {id: 'sf-sampler', name: 'sampler'}, el('option', {value: 'ddim', text: 'ddim'}),
                     el('option', {value: 'ddpm', text: 'ddpm'}));
  const ema = el('input', {id: 'sf-ema', name: 'ema', type: 'checkbox', checked: true});
  const form = el('form', {class: 'inline', id: 'sample-form', novalidate: true},
    fieldInput('job', {value: preset.job || '', placeholder: 'j0123456789abcdef', class: 'mono'}),
    fieldInput('checkpoint', {value: preset.checkpoint || '', placeholder: 'or a checkpoint id', class: 'mono'}),
    fieldInput('n', {type: 'number', value: 16}),
    el('span', {class: 'field', 'data-path': 'sampler'}, el('label', {for: 'sf-sampler', text: 'sampler'}), sampler),
    fieldInput('steps', {type: 'number', placeholder: 'default'}),
    fieldInput('seed', {type: 'number', value: 1}),
    el('span', {class: 'field', 'data-path': 'ema'}, el('label', {for: 'sf-ema', text: 'EMA weights'}), ema),
    el('div', {}, el('button', {type: 'submit', class: 'primary', id: 'sample-submit', text: 'Request samples'})), msg);
  const jobIn = form.querySelector('#sf-job'), ckIn = form.querySelector('#sf-checkpoint');
  jobIn.style.width = ckIn.style.width = '190px';
  form.addEventListener('submit', guard(async (e) => {
    e.preventDefault();
    const req = {n: form.elements.n.value === '' ? undefined : Number(form.elements.n.value),
                 sampler: sampler.value, ema: ema.checked,
                 seed: form.elements.seed.value === '' ? undefined : Number(form.elements.seed.value)};
    if (form.elements.steps.value !== '') req.steps = Number(form.elements.steps.value);
    if (jobIn.value.trim()) req.job = jobIn.value.trim();
    if (ckIn.value.trim()) req.checkpoint = ckIn.value.trim();
    const r = await api.req('POST', 'samples', req, view.ctl.signal);
    showFieldErrors(form, r, msg);
    if (r.status === 202) location.hash = '#/sample/' + r.body.id;
  }));
  return form;
}

/* a problem's errors[] next to the form's fields (data-path), the rest in msg */
function showFieldErrors(form, res, msg) {
  for (const e of form.querySelectorAll('.field-error')) e.remove();
  msg.replaceChildren();
  if (res.ok) return;
  const errs = res.body && Array.isArray(res.body.errors) ? res.body.errors : [];
  for (const e of errs) {
    const f = form.querySelector('[data-path="' + CSS.escape(e.path) + '"]');
    const span = el('span', {class: 'field-error', 'data-error-path': e.path, text: e.message});
    if (f) f.append(span); else msg.append(el('p', {class: 'error'}, e.path ? e.path + ': ' : '', span));
  }
  if (!errs.length) showError(msg, res);
}

/* ---- #/new: a training job as fields beside the spec's JSON, the two kept in sync ---- */

/* the models the form offers; a spec's model is one of them when it matches it apart from
 * image_size and in_channels (fields of their own), else "custom" (its JSON is kept as it is) */
const MODELS = [
  {id: 'fmnist-tiny', label: 'fmnist-tiny: ddpm preset, 1.1M parameters',
   model: {preset: 'ddpm', in_channels: 1, image_size: 32, block_out_channels: [32, 64, 64],
           layers_per_block: 1, attention_resolutions: [8], norm_num_groups: 8}},
  {id: 'ddpm-cifar10', label: 'ddpm-cifar10: google/ddpm-cifar10-32, 35.7M',
   model: {preset: 'ddpm', in_channels: 3, image_size: 32, dropout: 0.1}},
  {id: 'seed-64', label: 'seed: Diffusion-Models-pytorch UNet, 23.3M',
   model: {preset: 'seed', in_channels: 3, image_size: 64}},
];

const EXAMPLE_SPEC = {
  model: MODELS[0].model,
  data: {dataset: 'fashion-mnist', validation: 64},
  diffusion: {timesteps: 100},
  train: {batch: 8, steps: 200, warmup: 10},
  output: {checkpoint_every: 50, sample_every: 50, log_every: 5, keep_last: 2, samples: 16},
};

/* kind: model | dataset | int | float | size | auto-int | enum (options[0] is the default) | bool;
 * def: the server's default, shown as the empty field's placeholder */
const SPEC_FIELDS = [
  {group: 'Model', fields: [
    {path: 'model.preset', label: 'model', kind: 'model'},
    {path: 'model.image_size', label: 'image size (px)', kind: 'int'},
    {path: 'model.in_channels', label: 'channels', kind: 'int'}]},
  {group: 'Data', fields: [
    {path: 'data.dataset', label: 'dataset', kind: 'dataset'},
    {path: 'data.validation', label: 'validation images', kind: 'int', def: '0'},
    {path: 'data.flip', label: 'random horizontal flips', kind: 'bool'}]},
  {group: 'Training', fields: [
    {path: 'train.batch', label: 'batch', kind: 'int', def: '32'},
    {path: 'train.steps', label: 'steps', kind: 'int', def: '10000'},
    {path: 'train.lr', label: 'learning rate', kind: 'float', def: '0.0002'},
    {path: 'train.threads', label: 'CPU threads', kind: 'int', hint: 'the server\'s default'}]},
  {group: 'Memory', fields: [
    {path: 'memory.vram_budget', label: 'memory budget', kind: 'size', hint: 'no limit; e.g. 512MiB'},
    {path: 'memory.precision', label: 'precision', kind: 'enum', options: ['auto', 'f32', 'bf16', 'f16']},
    {path: 'memory.micro_batch', label: 'micro-batch', kind: 'auto-int', hint: 'auto, or a number'},
    {path: 'memory.recompute', label: 'recomputation', kind: 'enum', options: ['auto', 'none', 'attention', 'resblock', 'level']},
    {path: 'memory.offload', label: 'offload to host', kind: 'enum', options: ['auto', 'off', 'on']}]},
  {group: 'Output', fields: [
    {path: 'output.sample_every', label: 'sample grid every', kind: 'int', def: '1000'},
    {path: 'output.checkpoint_every', label: 'checkpoint every', kind: 'int', def: '1000'},
    {path: 'output.log_every', label: 'log every', kind: 'int', def: '50'}]},
];

function modelOf(model) {
  if (!model || typeof model !== 'object') return 'custom';
  const rest = (o) => { const c = Object.assign({}, o); delete c.image_size; delete c.in_channels; return canonical(c); };
  const m = MODELS.find((t) => rest(t.model) === rest(model));
  return m ? m.id : 'custom';
}

function datasetLabel(d) {
  return d.id + ' (' + d.images + ' images' + (d.size ? ', ' + d.size + ' px' : '') + ', ' + d.channels +
    (d.channels === 1 ? ' channel' : ' channels') + (d.available === false ? ', not installed' : '') + ')';
}

/* one field: {f, input, wrap (.field, data-path)} */
function specField(f) {
  const id = 'f-' + f.path.replace(/[.]/g, '-');
  let input;
  if (f.kind === 'model') {
    input = el('select', {id}, MODELS.map((t) => el('option', {value: t.id, text: t.label})),
               el('option', {value: 'custom', text: 'custom: as the JSON says', disabled: true}));
  } else if (f.kind === 'dataset') {
    input = el('select', {id});
  } else if (f.kind === 'enum') {
    input = el('select', {id}, el('option', {value: '', text: f.options[0] + ' (default)'}),
               f.options.slice(1).map((o) => el('option', {value: o, text: o})));
  } else if (f.kind === 'bool') {
    input = el('input', {id, type: 'checkbox'});
  } else {
    input = el('input', {id, type: f.kind === 'int' ? 'number' : 'text', step: f.kind === 'int' ? '1' : null,
                         inputmode: f.kind === 'float' ? 'decimal' : null, spellcheck: 'false', autocomplete: 'off',
                         placeholder: f.def ? 'default ' + f.def : f.hint || ''});
  }
  input.name = f.path;
  const wrap = el('div', {class: 'field' + (f.kind === 'bool' ? ' check' : ''), 'data-path': f.path},
                  el('label', {for: id, text: f.label}), input);
  return {f, input, wrap};
}

/* the field's value for the spec (undefined: the key is removed, the server's default applies);
 * what is not a number stays text, so the server names the field in its error */
function fieldValue(x) {
  if (x.f.kind === 'bool') return x.input.checked ? true : undefined;
  const v = x.input.value.trim();
  if (v === '') return undefined;
  if (x.f.kind === 'int' || x.f.kind === 'float') return isFinite(Number(v)) ? Number(v) : v;
  if (x.f.kind === 'size' || x.f.kind === 'auto-int') return /^\d+$/.test(v) ? Number(v) : v;
  return v;
}

/* the spec -> the field; a select gains an option for a value it lacks (a dataset not listed) */
function showFieldValue(x, spec) {
  const {f, input} = x;
  if (f.kind === 'model') { input.value = modelOf(spec.model); return; }
  const v = getPath(spec, f.path);
  if (f.kind === 'bool') { input.checked = v === true; return; }
  let s = v === undefined || v === null ? '' : typeof v === 'object' ? JSON.stringify(v) : String(v);
  if (f.kind === 'enum' && s === f.options[0]) s = '';
  if (input.tagName === 'SELECT' && !Array.from(input.options).some((o) => o.value === s)) {
    input.append(el('option', {value: s, text: s + (f.kind !== 'dataset' ? ' (from the JSON)' : x.listed ? ' (not on this server)' : '')}));
  }
  input.value = s;
}

/* errors[] at the spec's own lines (paths as the server names them: train.batch,
 * model.block_out_channels[0]): the lines that have one and the objects they are in */
function specFields(spec, errs) {
  const lines = [];
  const walk = (v, path, depth) => {
    if (v && typeof v === 'object') {
      if (path) lines.push({path, depth, text: Array.isArray(v) ? '[' : '{'});
      const entries = Array.isArray(v) ? v.map((x, i) => [path + '[' + i + ']', x])
                                       : Object.entries(v).map(([k, x]) => [path ? path + '.' + k : k, x]);
      for (const [p, x] of entries) walk(x, p, depth + (path ? 1 : 0));
    } else {
      lines.push({path, depth, text: JSON.stringify(v)});
    }
  };
  walk(spec, '', 0);
  const byPath = new Map(lines.map((l) => [l.path, l]));
  const extra = [], keep = new Set();
  const parent = (p) => p.replace(/(\.[^.[\]]*|\[\d+\])$/, '');
  for (const e of errs) {
    const l = byPath.get(e.path);
    if (!l) { extra.push(e); continue; }
    (l.errs = l.errs || []).push(e);
    for (let p = e.path; p; p = parent(p)) { keep.add(p); if (parent(p) === p) break; }
  }
  const box = el('div', {class: 'fields', id: 'spec-fields'});
  for (const l of lines) {
    if (!keep.has(l.path)) continue;
    const d = el('div', {'data-path': l.path, class: l.errs ? 'has-error' : null});
    d.style.paddingLeft = (4 + 16 * l.depth) + 'px';
    d.append(el('span', {class: 'muted', text: l.path.replace(/^.*[.]/, '') + ': '}), l.text);
    for (const e of l.errs || []) d.append(el('span', {class: 'field-error', 'data-error-path': e.path, text: e.message}));
    box.append(d);
  }
  for (const e of extra) /* a field the spec lacks (a missing required one) or the whole body */
    box.append(el('div', {'data-path': e.path, class: 'has-error'}, el('span', {class: 'muted', text: (e.path || 'the spec') + ': '}),
                  el('span', {class: 'field-error', 'data-error-path': e.path, text: e.message})));
  return box;
}

const renderNew = guard(async (m, datasetArg) => {
  const signal = view.ctl.signal;
  const ta = el('textarea', {id: 'spec', spellcheck: 'false', 'aria-label': 'the spec as JSON'});
  const spec0 = JSON.parse(JSON.stringify(EXAMPLE_SPEC));
  if (datasetArg) spec0.data.dataset = datasetArg;
  ta.value = JSON.stringify(spec0, null, 2);
  const jsonNote = el('p', {class: 'error', id: 'spec-json-note', role: 'status'});
  const msg = el('div', {id: 'spec-msg'}), tree = el('div', {id: 'spec-errors'});
  const dsInfo = el('p', {class: 'muted hint', id: 'dataset-info'});
  const submit = el('button', {type: 'submit', class: 'primary', id: 'spec-submit', text: 'Submit training job'});
  const fields = [], sets = [];
  for (const g of SPEC_FIELDS) {
    const fs = el('fieldset', {'data-group': g.group.toLowerCase()}, el('legend', {text: g.group}));
    for (const f of g.fields) {
      const x = specField(f);
      fields.push(x);
      fs.append(x.wrap);
      if (f.kind === 'dataset') x.wrap.append(dsInfo);
    }
    sets.push(fs);
  }
  const byPath = (p) => fields.find((x) => x.f.path === p);
  let datasets = [];
  const drawDatasetInfo = () => {
    const d = datasets.find((x) => x.id === byPath('data.dataset').input.value);
    dsInfo.replaceChildren(d ? (d.test_images ? d.test_images + ' test images; ' : '') + 'upload more on the ' : 'not a dataset of this server; see the ',
                           el('a', {href: '#/datasets', text: 'datasets page'}));
  };
  /* the JSON -> every field but `except` (the one being typed in); null while it does not parse */
  const fromJSON = (except) => {
    let spec;
    try {
      spec = JSON.parse(ta.value);
      if (!spec || typeof spec !== 'object' || Array.isArray(spec)) throw new Error('the spec is not a JSON object');
    } catch (err) {
      jsonNote.textContent = 'The JSON does not parse (' + err.message + '); the fields wait until it does.';
      for (const fs of sets) fs.disabled = true;
      return null;
    }
    jsonNote.textContent = '';
    for (const fs of sets) fs.disabled = false;
    for (const x of fields) if (x !== except) showFieldValue(x, spec);
    drawDatasetInfo();
    return spec;
  };
  const clearErrors = (x) => {
    for (const y of x ? [x] : fields) {
      y.wrap.classList.remove('has-error');
      y.input.removeAttribute('aria-invalid');
      for (const e of y.wrap.querySelectorAll('.field-error')) e.remove();
    }
  };
  /* a field -> the JSON */
  for (const x of fields) {
    const onEdit = () => {
      const spec = fromJSON(x);
      if (!spec) return;
      if (x.f.kind === 'model') {
        const t = MODELS.find((t) => t.id === x.input.value);
        if (!t) return;
        const ch = spec.model && spec.model.in_channels;
        spec.model = JSON.parse(JSON.stringify(t.model));
        if (ch !== undefined) spec.model.in_channels = ch; /* the data's channels stay */
      } else {
        setPath(spec, x.f.path, fieldValue(x));
      }
      ta.value = JSON.stringify(spec, null, 2);
      clearErrors(x);
      fromJSON(x);
    };
    x.input.addEventListener(x.input.tagName === 'SELECT' || x.input.type === 'checkbox' ? 'change' : 'input', onEdit);
  }
  ta.addEventListener('input', () => fromJSON(null));
  const placeErrors = (r, spec) => {
    showError(msg, r);
    const b = r.body && typeof r.body === 'object' ? r.body : {};
    let errs = Array.isArray(b.errors) ? b.errors : [];
    /* a job that fits no device under its own budget: the why goes to the budget's field */
    if (!errs.length && b.type === 'urn:ddpmd:problem:never-fits' && (b.detail || '').includes('memory.vram_budget'))
      errs = [{path: 'memory.vram_budget', message: (b.plan && b.plan.why) || b.detail}];
    const rest = [];
    let first = null;
    for (const e of errs) {
      const x = byPath(e.path);
      if (!x) { rest.push(e); continue; }
      x.wrap.classList.add('has-error');
      x.input.setAttribute('aria-invalid', 'true');
      x.wrap.append(el('span', {class: 'field-error', 'data-error-path': e.path, text: e.message}));
      first = first || x;
    }
    if (rest.length) tree.append(el('h3', {text: 'Errors at lines of the JSON'}), specFields(spec, rest));
    if (first) first.wrap.scrollIntoView({block: 'nearest'});
  };
  const form = el('form', {id: 'train-form', novalidate: true},
    el('div', {class: 'grid2'},
      el('div', {class: 'card spec-form', id: 'spec-form-fields'}, el('h3', {text: 'Fields'}), ...sets),
      el('div', {class: 'card json-card'}, el('h3', {text: 'The spec as JSON'}),
        el('p', {class: 'muted', text: 'A TrainSpec (openapi.yaml, components/schemas/TrainSpec): the fields and this text are one spec; edit either.'}),
        ta, jsonNote, tree)),
    el('div', {class: 'card submit-row'}, submit, msg));
  form.addEventListener('submit', guard(async (e) => {
    e.preventDefault();
    msg.replaceChildren();
    tree.replaceChildren();
    clearErrors(null);
    const spec = fromJSON(null);
    if (!spec) {
      msg.append(el('p', {class: 'error', role: 'alert', text: 'not valid JSON: ' + jsonNote.textContent}));
      return;
    }
    submit.disabled = true;
    const r = await api.req('POST', 'train', ta.value, signal);
    submit.disabled = false;
    if (r.status === 202) { location.hash = '#/job/' + r.body.id; return; }
    placeErrors(r, spec);
  }));
  m.append(el('h2', {text: 'New training job'}), form,
           el('div', {class: 'card'}, el('h3', {text: 'Request samples from a checkpoint'}), sampleForm({})));
  fromJSON(null);
  const r = await api.get('datasets', signal);
  if (r.ok) {
    datasets = r.body.datasets;
    const x = byPath('data.dataset');
    x.input.replaceChildren(...datasets.map((d) =>
      el('option', {value: d.id, disabled: d.available === false, text: datasetLabel(d)})));
    x.listed = true;
    fromJSON(null);
  } else {
    dsInfo.replaceChildren(el('span', {class: 'error', text: 'the datasets cannot be listed: ' + problemText(r)}));
  }
  if (!signal.aborted) m.dataset.ready = 'true'; /* the dataset list is in (or its error shown) */
});

/* ---- #/samples and #/sample/ID ---- */

const renderSamples = guard(async (m) => {
  m.append(el('h2', {text: 'Samples'}));
  const box = el('div');
  m.append(box);
  const load = guard(async () => {
    const r = await api.get('samples?limit=200', view.ctl.signal);
    if (!r.ok) { box.replaceChildren(); showError(box, r); return; }
    const list = r.body.samples.slice().reverse();
    box.replaceChildren(list.length ? stackTable('samples-table', [
      {h: 'sample', cell: (s) => el('a', {href: '#/sample/' + s.id, class: 'mono', text: s.id})},
      {h: 'state', cell: (s) => stateBadge(s.state)},
      {h: 'checkpoint', cell: (s) => el('span', {class: 'mono', text: s.params.checkpoint})},
      {h: 'n', num: true, cell: (s) => s.params.n},
      {h: 'sampler', cell: (s) => s.params.sampler},
      {h: 'steps', num: true, cell: (s) => s.params.steps},
      {h: 'progress', cell: (s) => progressBar(s.step, s.steps)}], list, (s) => ({'data-job': s.id}))
      : el('p', {class: 'muted', text: 'No samples yet.'}));
  });
  await load();
  view.every(3000, load);
});

const renderSample = guard(async (m, id) => {
  const signal = view.ctl.signal;
  const head = el('div'), info = el('dl', {class: 'kv'}), out = el('div', {class: 'grids', id: 'sample-grid'});
  m.append(head, el('div', {class: 'card'}, info),
           el('div', {class: 'card'}, el('h3', {}, 'Grid ', el('span', {class: 'muted', text: '(click it for full size)'})), out));
  let s = null, shownGrid = false;
  const load = guard(async () => {
    const r = await api.get('samples/' + encodeURIComponent(id), signal);
    if (!r.ok) { head.replaceChildren(el('h2', {text: 'Sample ' + id})); showError(head, r); return; }
    s = r.body;
    const cancel = el('button', {class: 'danger', id: 'cancel', disabled: ENDED.has(s.state), text: 'Cancel'});
    cancel.addEventListener('click', guard(async () => {
      cancel.disabled = true;
      const c = await api.req('POST', 'jobs/' + id + '/cancel', undefined, signal);
      if (!c.ok) showError(head, c); else load();
    }));
    head.replaceChildren(el('h2', {}, 'Sample ', el('span', {class: 'mono', text: id}), ' ', stateBadge(s.state), ' ', cancel));
    const job = s.params.checkpoint.replace(/-\d+$/, '');
    info.replaceChildren(...[['progress', progressBar(s.step, s.steps)], ['from', el('a', {href: '#/job/' + job, class: 'mono', text: s.params.checkpoint})],
      ['params', el('code', {text: JSON.stringify(s.params)})], ['device', s.device || 'not placed yet'], ['reserved', bytes(s.reserved_bytes)],
      ['memory plan', partsBar(planParts(s.plan, s.reserved_bytes), s.reserved_bytes, {name: 'plan'})]]
      .concat(s.error ? [['error', el('span', {class: 'error', text: s.error})]] : [])
      .flatMap(([k, v]) => [el('dt', {text: k}), el('dd', {}, v)]));
    if (s.state === 'succeeded' && !shownGrid) {
      shownGrid = true;
      const u = await api.blobUrl('samples/' + id + '.png', signal);
      if (u) out.append(el('figure', {}, thumb(u, 'sample ' + id + ', ' + s.params.n + ' images', id + '.png'),
                           el('figcaption', {text: s.params.n + ' images'})));
    } else if (!ENDED.has(s.state)) {
      out.replaceChildren(el('p', {class: 'muted', text: 'the grid appears when the job has succeeded'}));
    }
  });
  await load();
  if (s && !ENDED.has(s.state)) {
    let t = 0;
    await api.events('jobs/' + id + '/events', (ev) => {
      const now = Date.now();
      if (ev.type === 'state' || now - t > 500) { t = now; load(); }
    }, signal);
    out.replaceChildren();
    await load();
  }
});

/* ---- #/datasets: the datasets a spec can name, uploads, previews, deletion ---- */

const renderDatasets = guard(async (m) => {
  const signal = view.ctl.signal;
  const file = el('input', {type: 'file', id: 'ds-file', accept: '.tar,.tgz,.gz,application/x-tar,application/gzip'});
  const send = el('button', {type: 'submit', class: 'primary', id: 'ds-upload', text: 'Upload'});
  const prog = el('progress', {id: 'ds-progress', max: 1, value: 0, hidden: true});
  const upMsg = el('div', {id: 'ds-msg', role: 'status'});
  const form = el('form', {id: 'ds-form', novalidate: true},
    el('p', {class: 'muted', text: 'A tar archive (plain or gzip) of PNG files, at most one folder deep (a.png, ' +
      'class/a.png). Its id is what a spec names in data.dataset.'}),
    el('div', {class: 'row'}, file, send, prog), upMsg);
  const list = el('div', {id: 'ds-list'}), listMsg = el('div', {id: 'ds-list-msg'});
  m.append(el('h2', {text: 'Datasets'}),
           el('div', {class: 'card'}, el('h3', {text: 'Upload a dataset'}), form),
           el('div', {class: 'card'}, el('h3', {text: 'On this server'}), list, listMsg));
  const previews = new Map(); /* id -> the preview's blob URL, fetched once */
  let rows = [];
  const gallery = () => rows.filter((d) => previews.get(d.id)).map((d) =>
    ({src: previews.get(d.id), caption: 'dataset ' + d.id + ': its first images', name: d.id + '-preview.png'}));
  const preview = (d) => {
    if (!d.links || !d.links.preview) return el('span', {class: 'muted', text: 'no preview'});
    const box = el('span', {class: 'preview', 'data-preview': d.id});
    const show = (u) => box.replaceChildren(thumb(u, 'dataset ' + d.id + ': its first images', d.id + '-preview.png',
                                                  gallery, {size: 96, max: 96}));
    if (previews.get(d.id)) show(previews.get(d.id));
    else if (!previews.has(d.id)) {
      previews.set(d.id, null);
      api.blobUrl('datasets/' + encodeURIComponent(d.id) + '/preview.png', signal).then((u) => {
        if (!u) { previews.delete(d.id); return; } /* not there yet: the next listing asks again */
        previews.set(d.id, u);
        for (const b of list.querySelectorAll('[data-preview="' + CSS.escape(d.id) + '"]')) b.replaceWith(preview(d));
      }).catch(() => { previews.delete(d.id); });
    }
    return box;
  };
  const del = (d) => {
    if (d.kind === 'builtin') return el('span', {class: 'muted', text: 'built in'});
    const b = el('button', {type: 'button', class: 'danger', 'data-delete': d.id, text: 'Delete'});
    let armed = null;
    b.addEventListener('click', guard(async () => {
      if (!armed) { /* a second click within 5 s deletes */
        b.textContent = 'Delete? click again';
        armed = setTimeout(() => { armed = null; b.textContent = 'Delete'; }, 5000);
        return;
      }
      clearTimeout(armed);
      b.disabled = true;
      const r = await api.req('DELETE', 'datasets/' + encodeURIComponent(d.id), undefined, signal);
      listMsg.replaceChildren();
      if (r.ok || r.status === 404) {
        if (previews.get(d.id)) URL.revokeObjectURL(previews.get(d.id));
        previews.delete(d.id);
        listMsg.append(el('p', {class: 'muted', text: 'deleted ' + d.id}));
      } else {
        showError(listMsg, r);
      }
      load();
    }));
    return b;
  };
  const size = (d) => {
    const z = d.sizes;
    if (d.size) return d.size + ' px';
    if (!z) return '-';
    const span = (a, b) => (a === b ? String(a) : a + '-' + b);
    return span(z.min_width, z.max_width) + ' \u00d7 ' + span(z.min_height, z.max_height) + ' px';
  };
  const load = guard(async () => {
    const r = await api.get('datasets', signal);
    if (!r.ok) { list.replaceChildren(); showError(list, r); return; }
    rows = r.body.datasets;
    list.replaceChildren(stackTable('datasets-table', [
      {h: 'preview', cell: preview},
      {h: 'dataset', cell: (d) => el('span', {class: 'mono', text: d.id})},
      {h: 'kind', cell: (d) => (d.state && d.state !== 'ready' ? el('span', {}, d.kind + ' ', stateBadge(d.state)) : d.kind)},
      {h: 'images', num: true, cell: (d) => String(d.images) + (d.test_images ? ' + ' + d.test_images + ' test' : '')},
      {h: 'size', cell: size},
      {h: 'channels', num: true, cell: (d) => d.channels},
      {h: 'bytes', num: true, cell: (d) => (d.bytes !== undefined ? bytes(d.bytes) : '-')},
      {h: 'created', cell: (d) => el('span', {class: 'muted', text: (d.created_at || '-').replace('T', ' ').replace(/\..*$/, '')})},
      {h: '', cell: (d) => el('span', {class: 'actions'},
        d.available === false ? el('span', {class: 'muted', text: d.state && d.state !== 'ready' ? d.state : 'not installed'})
          : el('a', {href: '#/new/' + encodeURIComponent(d.id), 'data-train': d.id, text: 'train on it'}), ' ', del(d))},
    ], rows, (d) => ({'data-dataset': d.id})));
  });
  form.addEventListener('submit', guard(async (e) => {
    e.preventDefault();
    upMsg.replaceChildren();
    const f = file.files[0];
    if (!f) { upMsg.append(el('p', {class: 'error', text: 'choose a .tar or .tar.gz file first'})); return; }
    const magic = new Uint8Array(await f.slice(0, 2).arrayBuffer());
    const type = magic[0] === 0x1f && magic[1] === 0x8b ? 'application/gzip' : 'application/x-tar';
    send.disabled = true;
    prog.hidden = false;
    prog.value = 0;
    upMsg.append(el('p', {class: 'muted', text: 'uploading ' + f.name + ' (' + bytes(f.size) + ')...'}));
    const r = await api.upload('datasets', f, type, (sent, total) => { prog.value = total ? sent / total : 0; }, signal);
    send.disabled = false;
    prog.hidden = true;
    upMsg.replaceChildren();
    if (r.status === 201 || r.status === 202) {
      const d = r.body;
      upMsg.append(el('p', {class: 'ok', id: 'ds-uploaded', 'data-dataset': d.id},
        'uploaded as ', el('span', {class: 'mono', text: d.id}), ': ' + d.images + ' images. ',
        el('a', {href: '#/new/' + encodeURIComponent(d.id), text: 'Train on it'})));
      form.reset();
    } else {
      showError(upMsg, r);
    }
    load();
  }));
  await load();
  view.every(5000, () => { if (rows.some((d) => d.state && d.state !== 'ready' && d.state !== 'failed')) load(); });
});

/* ---- #/devices ---- */

const renderDevices = guard(async (m) => {
  m.append(el('h2', {text: 'Devices'}));
  const box = el('div');
  m.append(box);
  const load = guard(async () => {
    const [d, run, wait] = await Promise.all([api.get('devices', view.ctl.signal),
      api.get('jobs?state=running&limit=200', view.ctl.signal), api.get('jobs?state=queued&limit=200', view.ctl.signal)]);
    if (!d.ok) { box.replaceChildren(); showError(box, d); return; }
    const running = run.ok ? run.body.jobs : [], waiting = wait.ok ? wait.body.jobs : [];
    box.replaceChildren(...d.body.devices.map((dev) => {
      const mine = running.filter((j) => j.device === dev.name);
      const parts = mine.map((j) => ({name: j.id, bytes: j.reserved_bytes}));
      const other = dev.reserved_bytes - parts.reduce((a, p) => a + p.bytes, 0);
      if (other > 0) parts.push({name: 'other tokens\' jobs', bytes: other, color: '#9e9e9e'});
      /* the queued jobs that may run here, each with its plan's reservation on this device */
      const here = (j) => (j.device ? (j.device === dev.name ? j.plan : null)
        : (j.plans || []).find((p) => p.device === dev.name && p.fits));
      const queue = waiting.filter(here).map((j, i) => ({name: j.id, bytes: here(j).reserved_bytes, color: COLORS[(i + 6) % COLORS.length]}));
      return el('div', {class: 'card', 'data-device': dev.name},
        el('h3', {}, dev.name + ' ', el('span', {class: 'muted', text: '(' + dev.kind + ')'})),
        el('dl', {class: 'kv'}, ...[['total', bytes(dev.total_bytes)], ['budget', bytes(dev.budget_bytes)],
          ['reserved', bytes(dev.reserved_bytes)], ['free', bytes(dev.free_bytes)],
          ['per-process overhead', bytes(dev.overhead_bytes)], ['running jobs', dev.running_jobs],
          ['waiting jobs', dev.waiting_jobs]].concat(dev.poisoned ? [['poisoned', dev.poisoned_by || 'yes']] : []).concat(dev.cores ? [['threads', (dev.threads_used || 0) + ' of ' + dev.cores + ' cores']] : [])
          .flatMap(([k, v]) => [el('dt', {text: k}), el('dd', {text: v})])),
        el('h3', {text: 'Budget: running jobs\' reservations'}),
        partsBar(parts, dev.budget_bytes, {name: 'budget', free: dev.free_bytes}),
        el('h3', {text: 'Waiting jobs (their reservations against the same budget)'}),
        queue.length ? partsBar(queue, dev.budget_bytes, {name: 'waiting'}) : el('p', {class: 'muted', text: 'none waiting'}));
    }));
  });
  await load();
  view.every(2000, load);
});

/* ---- routing ---- */

function route() {
  const m = view.reset();
  const h = location.hash.replace(/^#\/?/, '');
  const [page, arg] = h.split('/');
  const nav = page === 'job' ? 'jobs' : page === 'sample' ? 'samples' : page || 'jobs';
  for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', a.dataset.nav === nav);
  if (page === 'job' && arg) renderJob(m, arg);
  else if (page === 'sample' && arg) renderSample(m, arg);
  else if (page === 'samples') renderSamples(m);
  else if (page === 'devices') renderDevices(m);
  else if (page === 'datasets') renderDatasets(m);
  else if (page === 'new') renderNew(m, arg ? decodeURIComponent(arg) : null);
  else renderJobs(m);
}

async function health() {
  const r = await api.get('readyz');
  const s = document.getElementById('server-state');
  s.textContent = r.status === 0 ? 'server unreachable' : 'server ' + (r.body && r.body.status ? r.body.status : r.status);
}

window.addEventListener('hashchange', route);
window.addEventListener('DOMContentLoaded', () => {
  auth.init();
  route();
  health();
  setInterval(() => { health().catch(() => {}); }, 10000);
});

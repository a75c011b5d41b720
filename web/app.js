/* app.js - the ddpmd dashboard: hash routes (#/jobs, #/job/ID, #/sample/ID, #/samples, #/devices,
 * #/new) over the server's REST API. Every URL is relative to the page (never "/..."), so the page
 * works behind a proxy that strips a path prefix. With tokens, every request carries
 * Authorization: Bearer; event streams are read with fetch (EventSource cannot send headers) and
 * images are fetched and shown as blob: URLs, so the token never goes into a URL.
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
};

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    if (signal) signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, {once: true});
  });
}

/* ---- the token: entered in the header, kept in sessionStorage for this tab only ---- */

const auth = {
  needed(problem) {
    const f = document.getElementById('token-form');
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
  },
  show() {
    const f = document.getElementById('token-form');
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
    for (const u of view.urls) URL.revokeObjectURL(u);
    view.urls = [];
    const m = document.getElementById('view');
    m.replaceChildren();
    delete m.dataset.settled;
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

/* ---- the loss chart: canvas, log-scale y, train line and validation points ---- */

function tickText(v) {
  const r = Number(v.toPrecision(1));
  return v >= 1e-4 && v < 1e5 ? String(r) : r.toExponential(0);
}

function drawChart(canvas, points) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 600, h = canvas.clientHeight || 280;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  const g = canvas.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  g.font = '11px system-ui, sans-serif';
  const train = points.filter((p) => p.loss > 0 && isFinite(p.loss));
  const val = points.filter((p) => p.val > 0 && isFinite(p.val));
  canvas.dataset.points = String(train.length);
  canvas.dataset.valPoints = String(val.length);
  if (!train.length && !val.length) {
    g.fillStyle = '#687083';
    g.fillText('no loss logged yet', 12, 20);
    return;
  }
  const all = train.map((p) => p.loss).concat(val.map((p) => p.val));
  let lo = Math.floor(Math.log10(Math.min(...all))), hi = Math.ceil(Math.log10(Math.max(...all)));
  if (hi <= lo) hi = lo + 1;
  const steps = train.map((p) => p.step).concat(val.map((p) => p.step));
  let s0 = Math.min(...steps), s1 = Math.max(...steps);
  if (s1 <= s0) s1 = s0 + 1;
  const L = 56, R = w - 14, T = 26, B = h - 36;
  const X = (s) => L + (s - s0) / (s1 - s0) * (R - L);
  const Y = (v) => B - (Math.log10(v) - lo) / (hi - lo) * (B - T);
  g.strokeStyle = '#e3e6ec';
  g.fillStyle = '#687083';
  g.lineWidth = 1;
  g.textAlign = 'right';
  g.textBaseline = 'middle';
  for (let d = lo; d <= hi; d++) {
    for (const m of [1, 2, 5]) {
      const v = m * Math.pow(10, d);
      if (Math.log10(v) > hi + 1e-9) break;
      const y = Y(v);
      g.beginPath(); g.moveTo(L, y); g.lineTo(R, y); g.stroke();
      if (m === 1 || hi - lo <= 2) g.fillText(tickText(v), L - 6, y);
    }
  }
  g.textAlign = 'center';
  g.textBaseline = 'top';
  const nt = 6;
  for (let i = 0; i <= nt; i++) {
    const s = Math.round(s0 + (s1 - s0) * i / nt), x = X(s);
    g.beginPath(); g.moveTo(x, B); g.lineTo(x, B + 4); g.strokeStyle = '#687083'; g.stroke();
    g.fillText(String(s), x, B + 6);
  }
  g.strokeStyle = '#1d2330';
  g.beginPath(); g.moveTo(L, T); g.lineTo(L, B); g.lineTo(R, B); g.stroke();
  g.fillStyle = '#1d2330';
  g.fillText('step', (L + R) / 2, B + 20);
  g.save(); g.translate(14, (T + B) / 2); g.rotate(-Math.PI / 2);
  g.textBaseline = 'middle'; g.fillText('loss (log scale)', 0, 0); g.restore();
  g.strokeStyle = COLORS[0];
  g.lineWidth = 1.5;
  g.beginPath();
  train.forEach((p, i) => (i ? g.lineTo(X(p.step), Y(p.loss)) : g.moveTo(X(p.step), Y(p.loss))));
  g.stroke();
  if (train.length === 1) { g.fillStyle = COLORS[0]; g.fillRect(X(train[0].step) - 2, Y(train[0].loss) - 2, 4, 4); }
  g.fillStyle = COLORS[3];
  for (const p of val) { g.beginPath(); g.arc(X(p.step), Y(p.val), 3.5, 0, 2 * Math.PI); g.fill(); }
  g.textAlign = 'left';
  g.textBaseline = 'middle';
  g.fillStyle = COLORS[0]; g.fillRect(R - 200, 10, 14, 3);
  g.fillStyle = '#1d2330'; g.fillText('train loss', R - 182, 11);
  g.fillStyle = COLORS[3]; g.beginPath(); g.arc(R - 93, 11, 3.5, 0, 2 * Math.PI); g.fill();
  g.fillStyle = '#1d2330'; g.fillText('validation loss', R - 84, 11);
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
    const t = el('table', {id: 'jobs-table'},
      el('thead', {}, el('tr', {},
        ['job', 'kind', 'state', 'device', 'reserved', 'progress', 'images/s', 'ETA', 'loss', 'created']
          .map((h, i) => el('th', {class: i === 4 || i >= 6 && i <= 8 ? 'num' : null, text: h})))));
    const body = el('tbody');
    for (const j of rows) {
      const p = live.get(j.id) || {};
      const step = Math.max(j.step, p.step || 0), steps = p.steps || j.steps;
      const ips = p.img_per_s !== undefined ? p.img_per_s : j.images_per_s;
      const eta = p.eta_s !== undefined && j.state === 'running' ? p.eta_s : etaOf(j);
      const loss = p.loss !== undefined ? p.loss : j.loss;
      const href = (j.kind === 'sample' ? '#/sample/' : '#/job/') + j.id;
      body.append(el('tr', {'data-job': j.id},
        el('td', {}, el('a', {href, class: 'mono', text: j.id})), el('td', {text: j.kind}),
        el('td', {}, stateBadge(j.state)), el('td', {text: j.device || '-'}),
        el('td', {class: 'num', text: bytes(j.reserved_bytes)}), el('td', {}, progressBar(step, steps)),
        el('td', {class: 'num', text: num(ips, 1)}), el('td', {class: 'num', text: duration(eta)}),
        el('td', {class: 'num', text: num(loss, 4)}),
        el('td', {class: 'muted', text: (j.created_at || '').replace('T', ' ').replace(/\..*$/, '')})));
    }
    t.append(body);
    box.replaceChildren(rows.length ? t : el('p', {class: 'muted'}, 'No jobs yet. ',
                                                el('a', {href: '#/new', text: 'Submit one.'})));
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
  const canvas = el('canvas', {class: 'chart', id: 'loss-chart'});
  const grids = el('div', {class: 'grids', id: 'grids'});
  const ckpts = el('div', {id: 'checkpoints'});
  const sampleBox = el('div');
  const specPre = el('pre', {id: 'job-spec', text: JSON.stringify(job.spec, null, 2)});
  const logPre = el('pre', {id: 'job-log'});
  m.append(head,
    el('div', {class: 'grid2'},
      el('div', {class: 'card'}, el('h3', {text: 'Status'}), info),
      el('div', {class: 'card'}, el('h3', {text: 'Memory plan (reserved bytes by part)'}), planBox)),
    el('div', {class: 'card'}, el('h3', {text: 'Loss'}), canvas),
    el('div', {class: 'card'}, el('h3', {text: 'Sample grids'}), grids),
    el('div', {class: 'grid2'},
      el('div', {class: 'card'}, el('h3', {text: 'Checkpoints'}), ckpts),
      el('div', {class: 'card'}, el('h3', {text: 'Request samples'}), sampleBox)),
    el('div', {class: 'grid2'},
      el('div', {class: 'card'}, el('h3', {text: 'Spec'}), specPre),
      el('div', {class: 'card'}, el('h3', {text: 'Log'}), logPre)));
  const points = [], pointAt = new Map(), shown = new Set();
  let last = {};
  const drawHead = () => {
    const cancel = el('button', {class: 'danger', id: 'cancel', disabled: ENDED.has(job.state) || job.cancel_requested,
                                 text: job.cancel_requested && !ENDED.has(job.state) ? 'stopping...' : 'Cancel'});
    cancel.addEventListener('click', guard(async () => {
      cancel.disabled = true;
      const r = await api.req('POST', 'jobs/' + id + '/cancel', undefined, signal);
      if (!r.ok) showError(head, r); else { job = r.body; drawAll(); }
    }));
    head.replaceChildren(el('h2', {}, 'Job ', el('span', {class: 'mono', text: id}), ' ', stateBadge(job.state), ' ', cancel));
  };
  const drawInfo = () => {
    const step = Math.max(job.step, last.step || 0), steps = last.steps || job.steps;
    const eta = ENDED.has(job.state) ? null : last.eta_s !== undefined ? last.eta_s : etaOf(job);
    const rows = [['progress', progressBar(step, steps)], ['device', (job.device || 'not placed yet (plans on ' + (job.plans || []).filter((p) => p.fits).map((p) => p.device).join(', ') + ')') + (job.threads ? ' (' + job.threads + (job.threads === 1 ? ' thread)' : ' threads)') : '')],
      ['reserved', bytes(job.reserved_bytes)], ['loss', num(last.loss !== undefined ? last.loss : job.loss, 4)],
      ['images/s', num(last.img_per_s !== undefined ? last.img_per_s : job.images_per_s, 1)], ['ETA', duration(eta)],
      ['owner', job.owner], ['created', job.created_at || '-'], ['started', job.started_at || '-'], ['ended', job.ended_at || '-']];
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
    grids.append(el('figure', {'data-step': step}, el('img', {src: u, alt: 'samples at step ' + step}),
                    el('figcaption', {text: 'step ' + step})));
  });
  let chartPending = false;
  const redraw = () => {
    if (chartPending) return;
    chartPending = true;
    requestAnimationFrame(() => { chartPending = false; drawChart(canvas, points); });
  };
  const logLines = [];
  drawAll();
  sampleBox.append(sampleForm({job: id}));
  await loadCkpts();
  redraw();
  const onEvent = (ev) => {
    const d = ev.data;
    if (ev.type === 'progress' && d.event === 'step') {
      last = d;
      let p = pointAt.get(d.step);
      if (!p) { p = {step: d.step, loss: NaN, val: NaN}; pointAt.set(d.step, p); points.push(p); }
      p.loss = d.loss;
      if (d.val_loss !== undefined) p.val = d.val_loss;
      points.sort((a, b) => a.step - b.step);
      drawInfo();
      redraw();
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

/* ---- #/new: a training job from a spec ---- */

const EXAMPLE_SPEC = {
  model: {preset: 'ddpm', in_channels: 1, image_size: 32, block_out_channels: [32, 64, 64],
          layers_per_block: 1, attention_resolutions: [8], norm_num_groups: 8},
  data: {dataset: 'fashion-mnist', validation: 64},
  diffusion: {timesteps: 100},
  train: {batch: 8, steps: 200, threads: 1, warmup: 10},
  output: {checkpoint_every: 50, sample_every: 50, log_every: 5, keep_last: 2, samples: 16},
};

/* the spec as one line per field (paths as the server names them: train.batch,
 * model.block_out_channels[0]); errors[] go to the line of their path, or of its nearest parent */
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
  const extra = [];
  for (const e of errs) {
    let p = e.path, l = byPath.get(p);
    while (!l && p) { p = p.replace(/(\.[^.[\]]*|\[\d+\])$/, ''); if (p === e.path) break; l = byPath.get(p); }
    if (l && l.path === e.path) (l.errs = l.errs || []).push(e);
    else extra.push(e);
  }
  const box = el('div', {class: 'fields', id: 'spec-fields'});
  for (const l of lines) {
    const d = el('div', {'data-path': l.path, class: l.errs ? 'has-error' : null});
    d.style.paddingLeft = (4 + 16 * l.depth) + 'px';
    d.append(el('span', {class: 'muted', text: l.path.replace(/^.*[.]/, '') + ': '}), l.text);
    for (const e of l.errs || []) d.append(el('span', {class: 'field-error', 'data-error-path': e.path, text: e.message}));
    box.append(d);
  }
  for (const e of extra) /* a field the spec lacks (a missing required one) or an unknown path */
    box.append(el('div', {'data-path': e.path, class: 'has-error'}, el('span', {class: 'muted', text: e.path + ': '}),
                  el('span', {class: 'field-error', 'data-error-path': e.path, text: e.message})));
  return box;
}

const renderNew = guard(async (m) => {
  const ta = el('textarea', {id: 'spec', spellcheck: 'false'});
  ta.value = JSON.stringify(EXAMPLE_SPEC, null, 2);
  const msg = el('div', {id: 'spec-msg'}), fields = el('div');
  const submit = el('button', {type: 'submit', class: 'primary', id: 'spec-submit', text: 'Submit training job'});
  const form = el('form', {id: 'train-form', novalidate: true},
    el('p', {class: 'muted', text: 'A TrainSpec (openapi.yaml, components/schemas/TrainSpec). The data set is named by id.'}),
    ta, el('p', {}, submit), msg, fields);
  form.addEventListener('submit', guard(async (e) => {
    e.preventDefault();
    msg.replaceChildren();
    fields.replaceChildren();
    let spec;
    try {
      spec = JSON.parse(ta.value);
    } catch (err) {
      msg.append(el('p', {class: 'error', role: 'alert', text: 'not valid JSON: ' + err.message}));
      return;
    }
    submit.disabled = true;
    const r = await api.req('POST', 'train', ta.value, view.ctl.signal);
    submit.disabled = false;
    if (r.status === 202) { location.hash = '#/job/' + r.body.id; return; }
    showError(msg, r);
    const errs = r.body && Array.isArray(r.body.errors) ? r.body.errors : [];
    if (errs.length) fields.append(el('h3', {text: 'The server\'s errors, at their fields'}), specFields(spec, errs));
  }));
  m.append(el('h2', {text: 'New training job'}),
           el('div', {class: 'grid2'}, el('div', {class: 'card'}, form),
              el('div', {class: 'card'}, el('h3', {text: 'Request samples from a checkpoint'}), sampleForm({}))));
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
    box.replaceChildren(list.length ? el('table', {},
      el('thead', {}, el('tr', {}, ['sample', 'state', 'checkpoint', 'n', 'sampler', 'steps', 'progress'].map((h) => el('th', {text: h})))),
      el('tbody', {}, list.map((s) => el('tr', {'data-job': s.id},
        el('td', {}, el('a', {href: '#/sample/' + s.id, class: 'mono', text: s.id})), el('td', {}, stateBadge(s.state)),
        el('td', {class: 'mono', text: s.params.checkpoint}), el('td', {text: s.params.n}),
        el('td', {text: s.params.sampler}), el('td', {text: s.params.steps}),
        el('td', {}, progressBar(s.step, s.steps)))))) : el('p', {class: 'muted', text: 'No samples yet.'}));
  });
  await load();
  view.every(3000, load);
});

const renderSample = guard(async (m, id) => {
  const signal = view.ctl.signal;
  const head = el('div'), info = el('dl', {class: 'kv'}), out = el('div', {class: 'grids', id: 'sample-grid'});
  m.append(head, el('div', {class: 'card'}, info), el('div', {class: 'card'}, el('h3', {text: 'Grid'}), out));
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
      if (u) out.append(el('figure', {}, el('img', {src: u, alt: 'sample grid'}), el('figcaption', {text: s.params.n + ' images'})));
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
  for (const a of document.querySelectorAll('nav a'))
    a.classList.toggle('active', a.dataset.nav === (page === 'job' ? 'jobs' : page === 'sample' ? 'samples' : page || 'jobs'));
  if (page === 'job' && arg) renderJob(m, arg);
  else if (page === 'sample' && arg) renderSample(m, arg);
  else if (page === 'samples') renderSamples(m);
  else if (page === 'devices') renderDevices(m);
  else if (page === 'new') renderNew(m);
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

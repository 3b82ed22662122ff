// Tollgate's console: every call goes to the admin API with the admin
// token; every value is rendered as text (el() never parses HTML).
'use strict';

const TOKEN_KEY = 'tollgate.admin';
let refreshTimer = null;

// --- DOM helpers: text only, never innerHTML.

// shown spells out, as \u{FE0F}, what would draw one name as another:
// the characters drawn as nothing that the service accepts in a name
// (variation selectors and tags: emoji are made of them) and any it
// refuses; spaces other than one between two words (a name with a space,
// a no-break or an ideographic space after it: the console's own numbers
// and dates use plain spaces, plainText); in a name that is not in
// Unicode's composed form, its combining marks and the characters that
// composing changes ("zoe\u{301}" beside "zoé", the Kelvin sign beside
// "K"); and a backslash that begins such a spelling, so that a name
// typed "bob\u{FE0F}" is not drawn as bob with a variation selector.
// "alice" and "alice" with a variation selector are two callers, and a
// listing must not draw them alike (attacks 53, 56, 57). Letters of other
// scripts that look alike still draw alike.
const INVISIBLE = /[\u00AD\u034F\u061C\u115F\u1160\u17B4\u17B5\u180B-\u180F\u200B-\u200F\u2028-\u202E\u2060-\u206F\u3164\uFE00-\uFE0F\uFEFF\uFFA0\uFFF0-\uFFF8\u{1BCA0}-\u{1BCA3}\u{1D173}-\u{1D17A}\u{E0000}-\u{E0FFF}]/gu;
const SPACES = /[\u00A0\u1680\u2000-\u200A\u202F\u205F\u2800\u3000]/gu;
function spelled(c) { return '\\u{' + c.codePointAt(0).toString(16).toUpperCase() + '}'; }
function shown(s) {
  const composed = s === s.normalize('NFC');
  s = s.replace(/\\(?=u\{)/g, spelled);
  if (!composed) s = s.replace(/./gsu, c => /\p{M}/u.test(c) || c.normalize('NFC') !== c ? spelled(c) : c);
  return s.replace(INVISIBLE, spelled).replace(SPACES, spelled)
    .replace(/^ +| +$| {2,}/g, run => run.replace(/ /g, spelled));
}

// plainText is the console's own text (a number, a date) with the spaces
// a locale puts in it (no-break and narrow no-break) made plain: shown
// spells every other space out.
function plainText(s) { return s.replace(SPACES, ' '); }

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(shown(String(c))));
  }
  return e;
}

const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(shown(String(c))));
  return e;
}

function table(headers, rows) {
  return el('table', {}, el('thead', {}, el('tr', {}, headers.map(h => el('th', {}, h)))),
    el('tbody', {}, rows.length ? rows.map(r => el('tr', {}, r.map(c => el('td', {}, c))))
      : el('tr', {}, el('td', { colspan: headers.length, class: 'muted' }, 'none')))); 
}

function when(unix) { return unix ? plainText(new Date(unix * 1000).toLocaleString()) : ''; }
function fmt(n) { return typeof n === 'number' ? (Number.isInteger(n) ? plainText(n.toLocaleString()) : n.toFixed(2)) : String(n ?? ''); }

// own reads a key the data names (a tier, a page) from an object: its own
// property or undefined, never an Object.prototype member (a tier named
// "constructor" showed Object's source; #constructor broke the page).
function own(obj, key) { return obj != null && Object.hasOwn(obj, key) ? obj[key] : undefined; }

// --- the admin API

function token() { return sessionStorage.getItem(TOKEN_KEY); }

class APIError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || ('HTTP ' + status));
    this.status = status;
    this.code = e.code;
    this.field = e.details && e.details.field;
  }
}

async function api(method, path, body) {
  const headers = { 'Authorization': 'Bearer ' + token() };
  const init = { method, headers, credentials: 'omit', cache: 'no-store', redirect: 'error' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (res.status === 401) { signOut('The admin token was refused; sign in again.'); throw new APIError(401, data); }
  if (!res.ok) throw new APIError(res.status, data);
  return data;
}

// showErrors puts an API error beside the field it names (an input with a
// matching data-field), or under the form.
function showErrors(form, err) {
  form.querySelectorAll('.field-error').forEach(n => n.remove());
  const general = form.querySelector('.error');
  if (general) general.textContent = '';
  const field = err.field && form.querySelector('[data-field="' + CSS.escape(err.field) + '"]');
  if (field) field.after(el('span', { class: 'field-error', role: 'alert' }, err.message));
  else if (general) general.textContent = err.message;
}

function values(form) {
  const out = {};
  for (const input of form.querySelectorAll('[data-field]')) {
    const v = input.value.trim();
    if (v === '') continue;
    out[input.dataset.field] = input.dataset.type === 'int' ? Number(v) : (input.dataset.type === 'bool' ? v === 'true' : v);
  }
  return out;
}

function input(field, label, attrs) {
  return el('label', {}, label, el('input', Object.assign({ 'data-field': field, name: field }, attrs || {})));
}

function select(field, label, options, attrs) {
  return el('label', {}, label, el('select', Object.assign({ 'data-field': field, name: field }, attrs || {}),
    options.map(o => Array.isArray(o) ? el('option', { value: o[0] }, o[1]) : el('option', { value: o }, o))));
}

// --- sign-in and pages

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  clearInterval(refreshTimer);
  document.getElementById('nav').hidden = true;
  document.getElementById('page').hidden = true;
  document.getElementById('signin').hidden = false;
  document.getElementById('signin-error').textContent = message || '';
}

async function signIn(ev) {
  ev.preventDefault();
  const t = document.getElementById('token').value.trim();
  sessionStorage.setItem(TOKEN_KEY, t);
  try {
    await api('GET', '/admin/v1/tiers');
  } catch (e) {
    if (e.status !== 401) signOut(e.message);
    return;
  }
  document.getElementById('token').value = '';
  show();
}

const pages = { overview, rules, keys, callers, audit };

function show() {
  if (!token()) { signOut(); return; }
  document.getElementById('signin').hidden = true;
  document.getElementById('nav').hidden = false;
  const page = document.getElementById('page');
  page.hidden = false;
  clearInterval(refreshTimer);
  const name = (location.hash || '#overview').slice(1);
  const render = own(pages, name) || overview;
  document.querySelectorAll('nav a').forEach(a => a.classList.toggle('active', a.dataset.page === (own(pages, name) ? name : 'overview')));
  page.replaceChildren();
  render(page).catch(e => page.append(el('p', { class: 'error', role: 'alert' }, e.message)));
}

// --- overview

function lineChart(series, lines, label) {
  const w = 1000, h = 180, pad = 24;
  const max = Math.max(1, ...series.flatMap(p => lines.map(l => own(p, l.key) || 0)));
  const x = i => pad + (series.length > 1 ? i * (w - 2 * pad) / (series.length - 1) : 0);
  const y = v => h - pad - v * (h - 2 * pad) / max;
  const chart = svg('svg', { class: 'chart', viewBox: '0 0 ' + w + ' ' + h, role: 'img', 'aria-label': label });
  chart.append(svg('text', { x: 2, y: 12 }, fmt(max)), svg('text', { x: 2, y: h - pad }, '0'));
  for (const l of lines) {
    chart.append(svg('polyline', { class: l.cls, points: series.map((p, i) => x(i) + ',' + y(own(p, l.key) || 0)).join(' ') }));
  }
  if (series.length) {
    chart.append(svg('text', { x: pad, y: h - 6 }, new Date(series[0].at * 1000).toLocaleTimeString()),
      svg('text', { x: w - pad - 60, y: h - 6 }, new Date(series[series.length - 1].at * 1000).toLocaleTimeString()));
  }
  return chart;
}

// tiersOf lists the summary's tiers, busiest first (at most six are
// charted).
function tiersOf(s) {
  return Object.keys(s.requests_by_tier).sort((a, b) => own(s.requests_by_tier, b) - own(s.requests_by_tier, a)).slice(0, 6);
}

function tierLegend(tiers) {
  return el('div', { class: 'legend' }, tiers.map((t, i) => el('span', { class: 'tier' + (i % 6) }, '— ' + t)));
}

async function overview(page) {
  let windowName = sessionStorage.getItem('tollgate.window') || '5m';
  const body = el('div', { id: 'overview-body' });
  const picker = select('window', 'Window', ['5m', '1h', '24h'], { id: 'window' });
  picker.querySelector('select').value = windowName;
  picker.querySelector('select').addEventListener('change', e => { windowName = e.target.value; sessionStorage.setItem('tollgate.window', windowName); load(); });
  page.append(el('section', {}, el('div', { class: 'row' }, el('h2', {}, 'Overview'), picker), body));
  async function load() {
    const [s, health] = await Promise.all([
      api('GET', '/admin/v1/metrics/summary?window=' + encodeURIComponent(windowName)),
      fetch('/health', { headers: { 'Authorization': 'Bearer ' + token() }, cache: 'no-store', credentials: 'omit' }).then(r => r.json()).catch(() => ({})),
    ]);
    const comps = health.components || {};
    const badge = (name, v) => el('span', { class: 'badge ' + (v === 'healthy' || v === 'closed' || v === 'disabled' ? 'ok' : 'bad'), 'data-health': name }, name + ': ' + (v || 'unknown'));
    body.replaceChildren(
      el('div', { class: 'cards' },
        [['Requests', s.total_requests, 'total'], ['Allowed', s.allowed_requests, 'allowed'], ['Throttled', s.throttled_requests, 'throttled'],
          ['Avg check (ms)', s.avg_check_latency_ms, 'avg'], ['p95 check (ms)', s.p95_check_latency_ms, 'p95'], ['Redis errors', s.redis_errors, 'redis-errors']]
          .map(([k, v, id]) => el('div', { class: 'card' }, el('div', { class: 'v', 'data-metric': id }, fmt(v)), el('div', { class: 'k' }, k)))),
      el('p', { class: 'row' }, badge('redis', comps.redis), badge('breaker', comps.breaker), badge('rate limiter', comps.rate_limiter)),
      el('h3', {}, 'Requests and refusals'),
      el('div', { class: 'legend' }, el('span', { class: 'total' }, '— requests'), el('span', { class: 'throttled' }, '— throttled')),
      lineChart(s.series, [{ key: 'total', cls: 'total' }, { key: 'throttled', cls: 'throttled' }], 'requests and refusals over time'),
      el('h3', {}, 'Requests by tier'),
      tierLegend(tiersOf(s)),
      lineChart(s.series.map(p => Object.assign(Object.create(null), p.by_tier, { at: p.at })), tiersOf(s).map((t, i) => ({ key: t, cls: 'tier' + (i % 6) })), 'requests by tier over time'),
      el('h3', {}, 'Check latency'),
      el('div', { class: 'legend' }, el('span', { class: 'latency' }, '— average (ms)')),
      lineChart(s.series, [{ key: 'avg_check_latency_ms', cls: 'latency' }], 'average check latency over time'),
      el('h3', {}, 'By tier'),
      table(['Tier', 'Requests', 'Throttled'], Object.keys(s.requests_by_tier).sort().map(t => [t, fmt(own(s.requests_by_tier, t)), fmt(own(s.by_tier, t) || 0)])),
      el('h3', {}, 'Throttled by endpoint'),
      table(['Endpoint', 'Throttled'], Object.entries(s.by_endpoint).sort((a, b) => b[1] - a[1]).map(([e, n]) => [e, fmt(n)])),
      el('h3', {}, 'Most refused callers'),
      table(['Caller', 'Refused'], s.top_refused.map(c => [c.identity, fmt(c.refused)])),
    );
  }
  await load();
  refreshTimer = setInterval(() => load().catch(() => {}), 5000);
}

// --- rules and tiers

const algorithms = ['token_bucket', 'sliding_window', 'sliding_log', 'fixed_window', 'gcra'];
const scopes = ['identity', 'user', 'api_key', 'ip', 'tenant', 'endpoint', 'global'];

async function rules(page) {
  const [ruleList, tierList] = await Promise.all([api('GET', '/admin/v1/rate-limit-rules'), api('GET', '/admin/v1/tiers')]);
  const tiers = tierList.tiers;
  const tierOptions = [['', '(every tier)']].concat(tiers.map(t => [String(t.tier_id), t.name]));
  const form = el('form', { class: 'grid', id: 'rule-form' },
    select('tier_id', 'Tier', tierOptions, { 'data-type': 'int' }),
    input('endpoint_pattern', 'Endpoint pattern', { required: true, placeholder: '/api/v1/**' }),
    select('algorithm', 'Algorithm', algorithms),
    input('limit', 'Limit', { 'data-type': 'int', required: true, inputmode: 'numeric' }),
    input('window_seconds', 'Window (s)', { 'data-type': 'int', required: true, inputmode: 'numeric' }),
    select('scope', 'Scope', scopes),
    input('priority', 'Priority', { 'data-type': 'int', inputmode: 'numeric' }),
    el('button', { type: 'submit' }, 'Create rule'),
    el('p', { class: 'error', role: 'alert' }));
  let editing = null;
  form.addEventListener('submit', async ev => {
    ev.preventDefault();
    const v = values(form);
    try {
      if (editing) await api('PUT', '/admin/v1/rate-limit-rules/' + seg(editing), v);
      else await api('POST', '/admin/v1/rate-limit-rules', v);
      show();
    } catch (e) { showErrors(form, e); }
  });
  const rows = ruleList.rules.map(r => [
    String(r.rule_id), r.tier_name || '(every tier)', r.endpoint_pattern, r.algorithm, fmt(r.limit) + ' / ' + r.window_seconds + ' s', r.scope,
    r.is_active ? el('span', { class: 'badge ok' }, 'active') : el('span', { class: 'badge' }, 'off'),
    r.read_only ? el('span', { class: 'badge', title: 'from the config file: change it there' }, 'file (read-only)') :
      el('span', { class: 'row' },
        el('button', { type: 'button', class: 'plain', onclick: () => {
          editing = r.rule_id;
          for (const [k, val] of Object.entries({ tier_id: r.tier_id || '', endpoint_pattern: r.endpoint_pattern, algorithm: r.algorithm, limit: r.limit, window_seconds: r.window_seconds, scope: r.scope, priority: r.priority })) {
            form.querySelector('[data-field="' + k + '"]').value = val;
          }
          form.querySelector('button[type=submit]').textContent = 'Save rule ' + r.rule_id;
        } }, 'Edit'),
        el('button', { type: 'button', class: 'danger', onclick: async () => {
          if (!confirm('Delete rule ' + r.rule_id + '?')) return;
          try { await api('DELETE', '/admin/v1/rate-limit-rules/' + seg(r.rule_id)); show(); } catch (e) { alert(e.message); }
        } }, 'Delete')),
  ]);
  const tierForm = el('form', { class: 'grid', id: 'tier-form' },
    input('tier_id', 'Tier id', { 'data-type': 'int', required: true, inputmode: 'numeric' }),
    input('name', 'Name', { required: true, placeholder: 'gold' }),
    input('limit', 'Limit', { 'data-type': 'int', required: true, inputmode: 'numeric' }),
    input('window_seconds', 'Window (s)', { 'data-type': 'int', required: true, inputmode: 'numeric' }),
    input('description', 'Description'),
    el('button', { type: 'submit' }, 'Save tier'),
    el('p', { class: 'error', role: 'alert' }));
  tierForm.addEventListener('submit', async ev => {
    ev.preventDefault();
    const v = values(tierForm);
    const id = v.tier_id;
    delete v.tier_id;
    try { await api('PUT', '/admin/v1/tiers/' + seg(id), v); show(); } catch (e) { showErrors(tierForm, e); }
  });
  page.append(
    el('section', {}, el('h2', {}, 'Rules'), form,
      el('h3', {}, ruleList.rules.length + ' rules'),
      table(['Id', 'Tier', 'Pattern', 'Algorithm', 'Limit', 'Scope', 'State', ''], rows)),
    el('section', {}, el('h2', {}, 'Tiers'), tierForm,
      el('h3', {}, 'Default tier: ' + tierList.default_tier),
      table(['Id', 'Name', 'Limit', 'Algorithm', 'Description', ''], tiers.map(t => [String(t.tier_id), t.name, fmt(t.limit) + ' / ' + t.window_seconds + ' s',
        t.algorithm || '', t.description || '', t.read_only ? el('span', { class: 'badge' }, 'file (read-only)') : el('span', { class: 'badge ok' }, 'runtime')]))));
}

// --- API keys

async function keys(page) {
  const tierList = await api('GET', '/admin/v1/tiers');
  const created = el('div', { id: 'created-key' });
  const form = el('form', { class: 'grid', id: 'key-form' },
    input('user_id', 'User id', { required: true }),
    select('tier_id', 'Tier', tierList.tiers.map(t => [String(t.tier_id), t.name]), { 'data-type': 'int' }),
    input('expires_at', 'Expires (RFC 3339, optional)', { placeholder: '2027-01-01T00:00:00Z' }),
    el('button', { type: 'submit' }, 'Create key'),
    el('p', { class: 'error', role: 'alert' }));
  form.addEventListener('submit', async ev => {
    ev.preventDefault();
    try {
      const k = await api('POST', '/admin/v1/api-keys', values(form));
      const secret = el('code', { id: 'new-key' }, k.api_key);
      created.replaceChildren(el('p', {}, 'Key ' + k.key_id + ' for user ' + k.user_id + ' (' + k.tier_name + '). It is shown this once: copy it now.'),
        el('div', { class: 'secret' }, secret, el('button', { type: 'button', class: 'plain', onclick: async () => {
          try { await navigator.clipboard.writeText(k.api_key); } catch (_) { getSelection().selectAllChildren(secret); }
        } }, 'Copy')));
      await list();
    } catch (e) { showErrors(form, e); }
  });
  const filter = el('form', { class: 'grid', id: 'key-filter' },
    input('user_id', 'User id'), select('status', 'Status', [['', 'any'], 'active', 'revoked', 'expired']),
    el('button', { type: 'submit', class: 'plain' }, 'Filter'));
  filter.addEventListener('submit', ev => { ev.preventDefault(); list(); });
  const listing = el('div', { id: 'key-list' });
  const usage = el('div', { id: 'key-usage' });
  async function list() {
    const q = new URLSearchParams(Object.assign({ limit: '50' }, values(filter)));
    const page = await api('GET', '/admin/v1/api-keys?' + q);
    listing.replaceChildren(table(['Key id', 'User', 'Tier', 'Status', 'Created', ''], page.keys.map(k => [k.key_id, String(k.user_id), k.tier_name,
      el('span', { class: 'badge ' + (k.status === 'active' ? 'ok' : 'bad') }, k.status), new Date(k.created_at).toLocaleString(),
      el('span', { class: 'row' },
        el('button', { type: 'button', class: 'plain', onclick: () => showUsage(k.key_id) }, 'Usage'),
        k.status === 'active' ? el('button', { type: 'button', class: 'danger', 'data-revoke': k.key_id, onclick: async () => {
          if (!confirm('Revoke key ' + k.key_id + '? Every replica refuses it at once.')) return;
          try { await api('POST', '/admin/v1/api-keys/' + seg(k.key_id) + '/revoke'); await list(); } catch (e) { alert(e.message); }
        } }, 'Revoke') : null)])));
  }
  async function showUsage(keyID) {
    const u = await api('GET', '/admin/v1/usage/' + seg(keyID) + '?window=current');
    usage.replaceChildren(el('h3', {}, 'Usage of ' + keyID), usageChart(u));
  }
  page.append(el('section', {}, el('h2', {}, 'Create an API key'), form, created),
    el('section', {}, el('h2', {}, 'API keys'), filter, listing, usage));
  await list();
}

// usageChart draws a caller's current window against its limit.
function usageChart(u) {
  const cur = u.current_window || {};
  const day = u.last_24_hours || {};
  const used = cur.requests_made || 0, limit = cur.limit || 0;
  const w = 600, h = 40;
  const chart = svg('svg', { class: 'chart small', viewBox: '0 0 ' + w + ' ' + h, preserveAspectRatio: 'none', role: 'img', 'aria-label': 'current window used against the limit' });
  chart.append(svg('rect', { x: 0, y: 8, width: w, height: 24, fill: '#eef1f6' }),
    svg('rect', { class: 'bar', x: 0, y: 8, width: limit ? Math.min(w, w * used / limit) : 0, height: 24 }));
  return el('div', {}, chart,
    el('p', {}, 'This window: ' + fmt(used) + ' of ' + fmt(limit) + ' (' + fmt(cur.remaining ?? 0) + ' left). Last 24 hours: ' + fmt(day.total_requests || 0) + ' requests, ' + fmt(day.violations || 0) + ' refused.'));
}

// seg is one path segment of an admin URL: encodeURIComponent leaves "."
// and ".." as they are, and the browser would then resolve them, so that a
// caller named ".." or an endpoint "/../../api-keys" asked another admin
// route (attack 53). Escaped, the service reads them as typed (and refuses
// a dot segment in an endpoint).
function seg(s) {
  const e = encodeURIComponent(s);
  return e === '.' || e === '..' ? e.replace(/\./g, '%2E') : e;
}

// --- callers

async function callers(page) {
  const result = el('div', { id: 'caller-result' });
  const form = el('form', { class: 'grid', id: 'caller-form' },
    input('user_id', 'Identity or key id', { required: true, placeholder: 'user:alice, ip:192.0.2.1, key:k_...' }),
    input('endpoint', 'Endpoint', { required: true, placeholder: '/api/v1/items' }),
    el('button', { type: 'submit' }, 'Look up'),
    el('p', { class: 'error', role: 'alert' }));
  async function lookUp() {
    const v = values(form);
    const endpoint = v.endpoint.startsWith('/') ? v.endpoint : '/' + v.endpoint;
    const [st, u, ov] = await Promise.all([
      api('GET', '/admin/v1/status/' + seg(v.user_id) + endpoint.split('/').map(seg).join('/')),
      api('GET', '/admin/v1/usage/' + seg(v.user_id) + '?window=current').catch(() => null),
      api('GET', '/admin/v1/overrides'),
    ]);
    const mine = (ov.overrides || []).filter(o => o.identity === st.identity);
    const override = el('form', { class: 'grid', id: 'override-form' },
      input('limit', 'Override limit', { 'data-type': 'int', required: true, inputmode: 'numeric' }),
      input('window_seconds', 'Window (s)', { 'data-type': 'int', required: true, inputmode: 'numeric' }),
      select('strategy', 'Algorithm', algorithms),
      el('button', { type: 'submit' }, 'Set override'),
      el('p', { class: 'error', role: 'alert' }));
    override.addEventListener('submit', async ev => {
      ev.preventDefault();
      try { await api('PUT', '/v1/rate-limit/config', Object.assign({ user_id: st.identity, endpoint: st.endpoint }, values(override))); await lookUp(); } catch (e) { showErrors(override, e); }
    });
    result.replaceChildren(
      el('h3', {}, st.identity + ' on ' + st.endpoint),
      table(['Deciding rule', 'Tier', 'Limit', 'Remaining', 'Resets', 'Used'], [[st.rule_id, st.tier || '', fmt(st.limit), fmt(st.remaining), when(st.reset_at), fmt(st.usage_percentage) + ' %']]),
      el('h3', {}, 'Counters per rule'),
      table(['Rule', 'Scope', 'Algorithm', 'Limit', 'Remaining', 'Resets'], (st.rules || []).map(r => [r.rule_id, r.scope, r.strategy, fmt(r.limit) + ' / ' + r.window_seconds + ' s', fmt(r.remaining), when(r.reset_at)])),
      u ? usageChart(u) : el('p', { class: 'muted' }, 'No usage recorded.'),
      el('p', { class: 'row' },
        el('button', { type: 'button', class: 'danger', id: 'reset', onclick: async () => {
          try { const r = await api('POST', '/v1/rate-limit/reset', { user_id: st.identity, endpoint: st.endpoint }); alert(r.keys_deleted + ' counters reset'); await lookUp(); } catch (e) { alert(e.message); }
        } }, 'Reset counters'),
        mine.length ? el('button', { type: 'button', class: 'danger', onclick: async () => {
          try { await api('DELETE', '/v1/rate-limit/config', { user_id: st.identity, endpoint: st.endpoint }); await lookUp(); } catch (e) { alert(e.message); }
        } }, 'Remove override') : null),
      el('h3', {}, 'Overrides'),
      table(['Endpoint', 'Limit', 'Algorithm'], mine.map(o => [o.endpoint, fmt(o.limit) + ' / ' + o.window_seconds + ' s', o.strategy || ''])),
      override);
  }
  form.addEventListener('submit', async ev => {
    ev.preventDefault();
    try { await lookUp(); } catch (e) { showErrors(form, e); }
  });
  page.append(el('section', {}, el('h2', {}, 'Callers'), form, result));
}

// --- audit

async function audit(page) {
  const form = el('form', { class: 'grid', id: 'audit-form' },
    select('type', 'Type', [['', 'all'], 'admin', 'violation']),
    input('since', 'Since (RFC 3339)', { placeholder: '2026-11-25T00:00:00Z' }),
    el('button', { type: 'submit', class: 'plain' }, 'Show'),
    el('p', { class: 'error', role: 'alert' }));
  const listing = el('div', { id: 'audit-list' });
  const more = el('button', { type: 'button', class: 'plain', id: 'audit-more', hidden: true }, 'Next page');
  let next = '';
  async function load(reset) {
    const q = new URLSearchParams(Object.assign({ limit: '50' }, values(form)));
    if (!reset && next) q.set('since', next);
    const p = await api('GET', '/admin/v1/audit?' + q);
    const rows = p.events.map(e => [new Date(e.at).toLocaleString(), e.type, e.actor || '', e.action || '', e.target || e.identity || '', e.endpoint || e.rule_id || '']);
    const t = table(['At', 'Type', 'Actor', 'Action', 'Target', 'Detail'], rows);
    if (reset) listing.replaceChildren(t); else listing.append(t);
    next = p.next || '';
    more.hidden = !next || p.count === 0;
  }
  form.addEventListener('submit', async ev => { ev.preventDefault(); try { await load(true); } catch (e) { showErrors(form, e); } });
  more.addEventListener('click', () => load(false).catch(e => alert(e.message)));
  page.append(el('section', {}, el('h2', {}, 'Audit trail'), form, listing, more));
  await load(true);
}

document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('signin-form').addEventListener('submit', signIn);
  document.getElementById('signout').addEventListener('click', () => signOut());
  window.addEventListener('hashchange', show);
  if (token()) show();
});

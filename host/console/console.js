// The Laurel console: one page over the admin API (/admin/v1). No
// framework and no build step: what is here is what runs. Text goes into
// the page as text (textContent), never as HTML, and the admin token lives
// in sessionStorage and in Authorization headers only, never in a URL.
'use strict';

(() => {
  const TOKEN_KEY = 'laurel.admin-token';
  const REFRESH_MS = 5000;
  const session = { who: null, timer: null, samples: {} };

  // ---------------------------------------------------------------- DOM

  /** An element with attributes, listeners (`on...`) and children. */
  function h(tag, props, ...children) {
    const element = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith('on')) element.addEventListener(key.slice(2), value);
      else if (key === 'class') element.className = value;
      else element.setAttribute(key, value === true ? '' : String(value));
    }
    append(element, children);
    return element;
  }

  function append(element, children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      element.append(child instanceof Node ? child : String(child));
    }
    return element;
  }

  /** Replaces an element's children (nested lists and nulls allowed). */
  function fill(element, ...children) {
    element.replaceChildren();
    return append(element, children);
  }

  const $ = (id) => document.getElementById(id);

  function page(...children) {
    fill($('page'), children);
  }

  /** A table: `columns` are [header, cell(row), class?]. */
  function table(label, columns, rows, empty) {
    if (!rows.length) return h('p', { class: 'muted' }, empty || 'None.');
    return h('div', { class: 'table-wrap' },
      h('table', { 'aria-label': label },
        h('thead', null, h('tr', null, columns.map(([name, , cls]) => h('th', { scope: 'col', class: cls }, name)))),
        h('tbody', null, rows.map((row) => h('tr', null, columns.map(([name, cell, cls]) => h('td', { class: cls, 'data-label': name || null }, cell(row))))))));
  }

  let fieldCount = 0;
  /** A labelled input: [label element, input element]. */
  function field(label, props) {
    const id = `f-${++fieldCount}`;
    const input = h(props.tag || 'input', Object.assign({ id, type: props.tag ? null : 'text' }, props, { tag: null }));
    return [h('label', { for: id }, label), input];
  }

  const when = (iso) => (iso ? new Date(iso).toLocaleString() : '');
  const json = (value) => JSON.stringify(value);
  const counters = (c) => Object.entries(c || {}).map(([k, v]) => `${k} ${v}`).join(', ') || 'nothing';

  // ---------------------------------------------------------- messages

  function say(text, kind) {
    const box = $('message');
    box.setAttribute('role', kind === 'error' ? 'alert' : 'status');
    fill(box, h('p', { class: kind || '' }, text));
  }

  function quiet() {
    fill($('message'));
  }

  function fail(error) {
    if (error instanceof ApiError && error.status === 401) return;
    say(error.message, 'error');
  }

  /** Asks before a change; resolves true when confirmed. */
  function confirmed(question) {
    const dialog = $('confirm');
    $('confirm-text').textContent = question;
    dialog.returnValue = '';
    dialog.showModal();
    $('confirm-ok').focus();
    return new Promise((resolve) => {
      dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
    });
  }

  // --------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, message, problems) {
      super(status ? `${status}: ${message}` : message);
      this.status = status;
      this.problems = problems || [];
    }
  }

  async function call(method, path, options) {
    const { body, type } = options || {};
    const headers = { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY) || ''}` };
    let payload;
    if (body !== undefined) {
      headers['Content-Type'] = type || 'application/json';
      payload = type ? body : JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(`/admin/v1${path}`, {
        method, headers, body: payload, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer',
      });
    } catch (error) {
      throw new ApiError(0, `Laurel did not answer (${error.message})`);
    }
    const text = await response.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
    if (response.status === 401) {
      logOut(`Logged out: ${data && data.error ? data.error : 'the token was refused'}.`);
    }
    if (!response.ok) {
      throw new ApiError(response.status, (data && data.error) || response.statusText || 'failed', data && data.problems);
    }
    return data;
  }

  const get = (path) => call('GET', path);
  const enc = encodeURIComponent;

  /** This process's metrics (`/metrics`, Prometheus text) as samples. */
  async function metrics() {
    const response = await fetch('/metrics', { cache: 'no-store', credentials: 'omit' });
    const samples = [];
    for (const line of (await response.text()).split('\n')) {
      const match = /^([a-z_]+)(?:\{(.*)\})? ([0-9.eE+-]+|NaN)$/.exec(line);
      if (!match) continue;
      const labels = {};
      for (const pair of (match[2] || '').matchAll(/([a-z_]+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
      samples.push({ name: match[1], labels, value: Number(match[3]) });
    }
    return samples;
  }

  const sum = (samples, name, match) => samples
    .filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v))
    .reduce((total, s) => total + s.value, 0);

  // ------------------------------------------------------------ writes

  /** A button for a write: disabled, saying why, for a read token. */
  function writeButton(label, action, props) {
    const readOnly = session.who && session.who.role === 'read';
    const button = h('button', Object.assign({
      type: 'button',
      class: 'write',
      disabled: readOnly,
      title: readOnly ? `Token ${session.who.name} is read-only: writes are refused` : null,
      'aria-describedby': readOnly ? 'readonly' : null,
    }, props), label);
    button.addEventListener('click', async () => {
      button.setAttribute('aria-busy', 'true');
      try { await action(button); } catch (error) { fail(error); } finally { button.removeAttribute('aria-busy'); }
    });
    return button;
  }

  // ------------------------------------------------------------ log in

  function showLogin(note) {
    $('nav').hidden = true;
    $('logout').hidden = true;
    $('readonly').hidden = true;
    $('who').textContent = '';
    fill($('page'));
    $('login').hidden = false;
    if (note) say(note, 'error');
    $('token').focus();
  }

  function logOut(note) {
    sessionStorage.removeItem(TOKEN_KEY);
    session.who = null;
    stopRefresh();
    showLogin(note);
  }

  async function logIn(token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    try {
      session.who = await get('/whoami');
    } catch (error) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(error.message);
      return false;
    }
    $('login').hidden = true;
    $('nav').hidden = false;
    $('logout').hidden = false;
    $('who').textContent = `${session.who.name} (${session.who.role})`;
    const note = $('readonly');
    note.hidden = session.who.role !== 'read';
    note.textContent = `Token ${session.who.name} is read-only: write controls are disabled, and the admin API refuses writes (403).`;
    return true;
  }

  // ------------------------------------------------------------ routes

  function stopRefresh() {
    if (session.timer) clearInterval(session.timer);
    session.timer = null;
  }

  function every(refresh) {
    stopRefresh();
    session.timer = setInterval(() => refresh().catch(fail), REFRESH_MS);
  }

  const ROUTES = [
    [/^user(?:\/([^/]+))?(?:\/why\/([^/]+))?$/, (id, award) => (award ? whyPage(id, award) : userPage(id))],
    [/^awards(?:\/([^/]+))?$/, (id) => (id ? awardPage(id) : awardsPage())],
    [/^functions(?:\/([^/]+))?$/, (name) => (name ? functionPage(name) : functionsPage())],
    [/^sources$/, () => sourcesPage()],
    [/^webhooks$/, () => webhooksPage()],
    [/^pools(?:\/([^/]+))?$/, (pool) => (pool ? poolPage(pool) : poolsPage())],
    [/^audit$/, () => auditPage()],
  ];

  async function route() {
    stopRefresh();
    if (!session.who) return;
    const path = location.hash.replace(/^#\/?/, '') || 'user';
    for (const link of document.querySelectorAll('#nav a')) {
      const current = path.split('/')[0] === link.getAttribute('href').slice(2);
      if (current) link.setAttribute('aria-current', 'page'); else link.removeAttribute('aria-current');
    }
    for (const [pattern, show] of ROUTES) {
      const match = pattern.exec(path);
      if (match) {
        quiet();
        page(h('p', { class: 'muted' }, 'Loading…'));
        try {
          await show(...match.slice(1).map((part) => (part === undefined ? undefined : decodeURIComponent(part))));
        } catch (error) {
          page(h('h1', null, 'Not shown'), h('p', { class: 'bad' }, error.message));
        }
        window.scrollTo(0, 0);
        $('main').focus({ preventScroll: true });
        return;
      }
    }
    page(h('h1', null, 'No such page'), h('p', null, h('a', { href: '#/user' }, 'Back to users')));
  }

  // -------------------------------------------------------------- user

  function userSearch(value) {
    const [label, input] = field('User id', { name: 'user', value: value || '', required: true, autocomplete: 'off' });
    return h('form', {
      class: 'row card', role: 'search',
      onsubmit: (event) => {
        event.preventDefault();
        if (input.value.trim()) location.hash = `#/user/${enc(input.value.trim())}`;
      },
    }, h('div', null, label, input), h('button', { type: 'submit' }, 'Show'));
  }

  async function userPage(id) {
    if (!id) {
      page(h('h1', null, 'User'), userSearch(''));
      return;
    }
    const state = await get(`/users/${enc(id)}/state`);
    // The API shows no awards of a banned or deleted user.
    const awards = state.state === 'active' ? await get(`/users/${enc(id)}/awards`) : null;
    const log = h('div', null);
    const stateButtons = ['banned', 'deleted', 'active'].filter((s) => s !== state.state).map((target) => {
      const verb = { banned: 'Ban', deleted: 'Delete', active: 'Restore' }[target];
      const what = {
        banned: `Ban ${id}? Their events are skipped from now on.`,
        deleted: `Delete ${id}? Their events are skipped from now on.`,
        active: `Restore ${id}? New events count again.`,
      }[target];
      return writeButton(verb, async () => {
        if (!(await confirmed(what))) return;
        const now = await call('PUT', `/users/${enc(id)}/state`, { body: { state: target } });
        await userPage(id);
        say(`User ${now.user_id} is ${now.state}.`, 'ok');
      }, { class: target === 'active' ? 'write' : 'write danger' });
    });
    page(
      h('h1', null, `User ${id}`),
      userSearch(id),
      h('p', null, 'State: ', h('span', { class: `tag ${state.state === 'active' ? 'good' : 'bad'}` }, state.state), ' ', stateButtons),
      h('h2', null, 'Awards'),
      awards === null ? h('p', { class: 'muted' }, `${id} is ${state.state}: their events are skipped and their awards are not shown; restore them to see them.`) : table('Awards', [
        ['Award', (a) => [h('strong', null, a.title), h('br'), h('span', { class: 'muted' }, a.award_id)]],
        ['Progress', (a) => [h('progress', { max: a.goal, value: Math.min(a.progress, a.goal), 'aria-label': `${a.title}: ${a.progress} of ${a.goal}` }), ` ${a.progress} of ${a.goal}`]],
        ['Remaining', (a) => String(a.remaining), 'num'],
        ['Completed', (a) => (a.completed ? when(a.completed_at) || 'yes' : (a.error ? h('span', { class: 'bad' }, a.error) : 'no'))],
        ['Counters', (a) => a.objectives.map((o) => h('div', null, `${o.objective_id}: ${counters(o.counters)}`))],
        ['', (a) => h('a', { href: `#/user/${enc(id)}/why/${enc(a.award_id)}` }, 'Why?')],
      ], awards.awards, 'No awards.'),
      h('h2', null, 'Processing log'),
      log,
    );
    await logPage(id, log, null);
  }

  async function logPage(id, into, before) {
    const query = before ? `?limit=50&before=${before}` : '?limit=50';
    const answer = await get(`/users/${enc(id)}/log${query}`);
    const rows = table('Processing log', [
      ['When', (e) => when(e.logged_at)],
      ['Source', (e) => e.source],
      ['Event', (e) => e.event_id || ''],
      ['Award / objective', (e) => [e.award_id, e.objective_id].filter(Boolean).join(' / ')],
      ['Outcome', (e) => h('span', { class: `tag ${e.outcome === 'applied' ? 'good' : 'bad'}` }, e.outcome)],
      ['Why', (e) => e.reason || (e.deltas ? `changed ${json(e.deltas)}` : '')],
    ], answer.entries, 'Nothing logged for this user.');
    const more = answer.next_before
      ? h('button', { type: 'button', class: 'secondary', onclick: () => logPage(id, into, answer.next_before).catch(fail) }, 'Older entries')
      : null;
    const newest = before
      ? h('button', { type: 'button', class: 'secondary', onclick: () => logPage(id, into, null).catch(fail) }, 'Newest entries')
      : null;
    fill(into, rows, h('p', null, newest, more));
  }

  async function whyPage(id, award) {
    const why = await get(`/users/${enc(id)}/awards/${enc(award)}/explain`);
    const objectives = why.objectives.map((o) => {
      const sentences = [];
      const through = o.filters.length ? `through ${o.filters.join(', ')}, ` : '';
      sentences.push(`Events ${o.sources ? `from ${o.sources.join(', ')} ` : ''}go ${through}then rule ${o.rule}; progress is counter ${o.progress_counter}. Counters now: ${counters(o.counters)}.`);
      for (const item of o.contributing) {
        sentences.push(`${item.content_id} (${item.source}) counts ${counters(item.counters)}${item.dedup_key ? `, once with others keyed ${item.dedup_key}` : ''}.`);
      }
      if (o.contributing_truncated) sentences.push('More items count than are listed here.');
      for (const item of o.not_contributing) {
        sentences.push(`${item.content_id} (${item.source}) counts nothing: ${item.why}.`);
      }
      return h('section', { class: 'objective', 'aria-label': `Objective ${o.objective_id}` },
        h('h3', null, `Objective ${o.objective_id}`),
        h('ul', { class: 'sentences' }, sentences.map((s) => h('li', null, s))));
    });
    const held = [];
    for (const event of why.recent_events_evaluated) {
      for (const o of event.objectives) {
        if (o.verdict.kind === 'held') held.push(`${event.event_id} (${event.type}) is held for ${o.objective_id}: ${o.verdict.reason}.`);
      }
    }
    const status = why.completed
      ? `Completed${why.completed_at ? ` on ${when(why.completed_at)}` : ''}.`
      : `${why.progress} of ${why.goal}: ${why.remaining} to go.`;
    page(
      h('p', null, h('a', { href: `#/user/${enc(id)}` }, `← ${id}`)),
      h('h1', null, `Why ${why.title} stands where it does for ${id}`),
      h('p', null, h('progress', { max: why.goal, value: Math.min(why.progress, why.goal), 'aria-label': `${why.progress} of ${why.goal}` }), ` ${status}`),
      why.error ? h('p', { class: 'bad' }, `The strategy could not compute it: ${why.error}`) : null,
      objectives,
      h('h2', null, 'Held'),
      held.length ? h('ul', { class: 'sentences' }, held.map((s) => h('li', null, s))) : h('p', { class: 'muted' }, 'Nothing held for this award.'),
      h('h2', null, 'Recent events, as each objective sees them now'),
      why.recent_events_note ? h('p', { class: 'muted' }, why.recent_events_note) : null,
      table('Recent events', [
        ['When', (e) => when(e.occurred_at)],
        ['Event', (e) => `${e.event_id} (${e.type})`],
        ['Item', (e) => [e.content_id, e.status].filter(Boolean).join(' ')],
        ['Objectives', (e) => e.objectives.map((o) => h('div', null, `${o.objective_id}: ${o.outcome}`))],
      ], why.recent_events_evaluated, 'No recent events read.'),
      h('h2', null, 'Log entries for this award'),
      table('Log entries', [
        ['When', (e) => when(e.logged_at)],
        ['Event', (e) => e.event_id || ''],
        ['Outcome', (e) => e.outcome],
        ['Why', (e) => e.reason || (e.deltas ? `changed ${json(e.deltas)}` : '')],
      ], why.recent_events, 'No log entries.'),
    );
  }

  // ------------------------------------------------------------ awards

  async function awardsPage() {
    const { awards } = await get('/awards');
    page(
      h('h1', null, 'Awards'),
      h('p', null, h('a', { href: '#/awards/new' }, 'New award')),
      table('Awards', [
        ['Award', (a) => h('a', { href: `#/awards/${enc(a.id)}` }, a.id)],
        ['Title', (a) => a.definition.title || ''],
        ['Version', (a) => String(a.version), 'num'],
        ['Enabled', (a) => h('span', { class: `tag ${a.enabled ? 'good' : ''}` }, a.enabled ? 'enabled' : 'disabled')],
        ['Backfill', (a) => backfillText(a.backfill)],
        ['Updated', (a) => when(a.updated_at)],
      ], awards, 'No awards yet.'),
    );
  }

  function backfillText(b) {
    if (!b) return '';
    const done = b.items_total ? Math.floor((100 * (b.items_done || 0)) / b.items_total) : 100;
    return `${b.state} ${done}% (${b.items_done || 0} of ${b.items_total || 0} items)`;
  }

  /** What in `value` the JSON Schema `schema` (of `root`) does not allow:
   * the keywords Laurel's schemas use (type, enum, required, properties,
   * additionalProperties, items, minItems, minLength, pattern, $ref). */
  function schemaProblems(schema, value, path, root, out) {
    if (schema.$ref) {
      return schemaProblems(root.$defs[schema.$ref.replace('#/$defs/', '')], value, path, root, out);
    }
    const where = path || 'the definition';
    const kind = Array.isArray(value) ? 'array' : value === null ? 'null' : Number.isInteger(value) ? 'integer' : typeof value;
    if (schema.type && !(schema.type === kind || (schema.type === 'number' && kind === 'integer'))) {
      out.push({ path, message: `${where} must be ${schema.type === 'array' || schema.type === 'object' ? 'an' : 'a'} ${schema.type}, not ${kind}` });
      return out;
    }
    if (schema.enum && !schema.enum.some((e) => json(e) === json(value))) {
      out.push({ path, message: `${where} must be one of ${schema.enum.map(json).join(', ')}, not ${json(value)}` });
    }
    if (kind === 'string') {
      if (schema.minLength && value.length < schema.minLength) out.push({ path, message: `${where} must not be empty` });
      if (schema.pattern && !new RegExp(schema.pattern, 'u').test(value)) {
        out.push({ path, message: `${where} (${json(value)}) does not match ${schema.pattern}${schema.description ? `: ${schema.description}` : ''}` });
      }
    }
    if (kind === 'array') {
      if (schema.minItems && value.length < schema.minItems) out.push({ path, message: `${where} needs at least ${schema.minItems} item(s)` });
      if (schema.items) value.forEach((item, i) => schemaProblems(schema.items, item, `${path}/${i}`, root, out));
    }
    if (kind === 'object') {
      for (const key of schema.required || []) {
        if (!(key in value)) out.push({ path, message: `${where} needs ${key}` });
      }
      for (const [key, item] of Object.entries(value)) {
        const known = schema.properties && schema.properties[key];
        if (known) schemaProblems(known, item, `${path}/${key}`, root, out);
        else if (schema.additionalProperties === false) out.push({ path, message: `${where} has ${key}, which is not a field of it` });
      }
    }
    return out;
  }

  /** Schema problems in the shape of the API's refusals: with the
   * objective (and function) each is about. */
  async function awardSchemaProblems(award) {
    if (!session.awardSchema) {
      const response = await fetch('/schemas/award.json', { cache: 'no-store', credentials: 'omit' });
      session.awardSchema = await response.json();
    }
    const schema = session.awardSchema;
    const objectives = award && Array.isArray(award.objectives) ? award.objectives : [];
    return schemaProblems(schema, award, '', schema, []).map((problem) => {
      const at = /^\/objectives\/(\d+)(\/(filters\/(\d+)|rule))?/.exec(problem.path);
      const objective = at && objectives[Number(at[1])];
      const use = objective && at[2] ? (at[4] !== undefined ? (objective.filters || [])[Number(at[4])] : objective.rule) : null;
      return {
        objective: objective && typeof objective.id === 'string' ? objective.id : null,
        function: use && typeof use.name === 'string' ? use.name : null,
        message: problem.message,
      };
    });
  }

  const NEW_AWARD = {
    id: 'new-award', title: 'New award', description: '',
    objectives: [{ id: 'photos', filters: [{ name: 'SourceFilter', config: { sources: ['photos'] } }], rule: { name: 'CountRule', config: { counter: 'count' } }, progress_counter: 'count' }],
    strategy: { goal: 10, strategy: [{ objective_id: 'photos' }] },
  };

  async function awardPage(id) {
    const stored = id === 'new' ? null : await get(`/awards/${enc(id)}`);
    const definition = stored ? stored.definition : NEW_AWARD;
    const [label, editor] = field('Definition (JSON)', { tag: 'textarea', spellcheck: 'false', class: 'mono' });
    editor.value = JSON.stringify(definition, null, 2);
    const outline = h('div', { class: 'card', 'aria-label': 'The award, drawn' });
    const result = h('div', { 'aria-live': 'polite' });
    const parsed = () => {
      try {
        return JSON.parse(editor.value);
      } catch (error) {
        throw new ApiError(0, `The definition is not JSON: ${error.message}`);
      }
    };
    const draw = (problems) => {
      try { fill(outline, awardOutline(parsed(), problems || [])); } catch (error) { fill(outline, h('p', { class: 'bad' }, error.message)); }
    };
    let typing = null;
    /** Schema problems, drawn beside what they name; true when none. A
     * check of the typing still due is dropped: this one is newer. */
    const checked = async () => {
      clearTimeout(typing);
      const award = parsed();
      const problems = await awardSchemaProblems(award);
      draw(problems);
      if (problems.length) {
        fill(result, h('div', { class: 'problems', role: 'alert' },
          h('p', null, `Not sent: ${problems.length} problem(s) against /schemas/award.json, shown beside what they name.`)));
      }
      return problems.length === 0;
    };
    editor.addEventListener('input', () => {
      clearTimeout(typing);
      typing = setTimeout(() => {
        let award;
        try { award = JSON.parse(editor.value); } catch (_) { draw([]); return; }
        awardSchemaProblems(award).then(draw).catch(fail);
      }, 300);
    });
    draw([]);
    const targetId = () => parsed().id || id;
    const refusedShown = (error) => {
      if (error instanceof ApiError && error.problems.length) {
        draw(error.problems);
        fill(result, h('div', { class: 'problems', role: 'alert' }, h('p', null, error.message)));
        return;
      }
      throw error;
    };
    const apply = writeButton('Apply', async () => {
      const body = parsed();
      if (!(await checked())) return;
      try {
        const applied = await call('PUT', `/awards/${enc(targetId())}`, { body });
        fill(result, h('p', { class: 'good' }, `Applied ${applied.id} v${applied.version}.`));
        say(`Applied ${applied.id} v${applied.version}.`, 'ok');
        draw([]);
      } catch (error) { refusedShown(error); }
    });
    const dry = writeButton('Dry run', async () => {
      const body = parsed();
      if (!(await checked())) return;
      fill(result, h('p', { class: 'muted' }, 'Comparing with recent events…'));
      try {
        const answer = await call('POST', `/awards/${enc(targetId())}/dry-run`, { body });
        draw([]);
        fill(result, h('h2', null, 'Dry run: nothing written'),
          h('p', null, `${answer.events} recent events and ${answer.items} stored items compared.`),
          answer.note ? h('p', { class: 'muted' }, `Not read: ${answer.note}`) : null,
          awardDiffs(answer.awards));
      } catch (error) { refusedShown(error); }
    }, { class: 'write secondary' });
    const toggles = [];
    if (stored) {
      toggles.push(writeButton(stored.enabled ? 'Disable' : 'Enable', async () => {
        const verb = stored.enabled ? 'Disable' : 'Enable';
        if (!(await confirmed(`${verb} ${id}? ${stored.enabled ? 'Its progress stops moving.' : 'Its progress moves again.'}`))) return;
        const body = Object.assign({}, stored.definition, { enabled: !stored.enabled });
        const applied = await call('PUT', `/awards/${enc(id)}`, { body });
        await awardPage(id);
        say(`${verb}d ${applied.id} (v${applied.version}).`, 'ok');
      }, { class: 'write secondary' }));
      toggles.push(writeButton('Delete', async () => {
        if (!(await confirmed(`Delete award ${id}? Its definition is removed; users' progress on it is no longer shown.`))) return;
        await call('DELETE', `/awards/${enc(id)}`);
        location.hash = '#/awards';
        say(`Deleted ${id}.`, 'ok');
      }, { class: 'write danger' }));
    }
    page(
      h('p', null, h('a', { href: '#/awards' }, '← Awards')),
      h('h1', null, stored ? `Award ${id} (v${stored.version}, ${stored.enabled ? 'enabled' : 'disabled'})` : 'New award'),
      stored && stored.backfill ? h('p', null, `Backfill: ${backfillText(stored.backfill)}`) : null,
      h('div', { class: 'row' }, dry, apply, toggles),
      result,
      h('h2', null, 'The award'),
      outline,
      h('div', null, label, editor),
    );
  }

  /** The award as a reader sees it: objectives, and the strategy as a tree,
   * with each problem beside the objective and function it names. */
  function awardOutline(award, problems) {
    const about = (objective) => problems.filter((p) => p.objective === objective);
    const problemBox = (list) => (list.length
      ? h('div', { class: 'problems', role: 'alert' }, list.map((p) => h('p', null, p.function ? `${p.function}: ${p.message}` : p.message)))
      : null);
    const objectives = (award.objectives || []).map((o) => {
      const own = about(o.id);
      const fn = (use, what) => {
        if (!use) return null;
        const wrong = own.some((p) => p.function === use.name);
        return h('li', null, `${what} `, h('strong', { class: wrong ? 'bad' : null }, use.name), ` ${json(use.config || {})}`);
      };
      return h('section', { class: `objective${own.length ? ' has-problem' : ''}`, 'aria-label': `Objective ${o.id}` },
        h('h3', null, `Objective ${o.id}`),
        h('ul', null, (o.filters || []).map((f) => fn(f, 'filter')), fn(o.rule, 'rule'),
          h('li', null, `progress: counter ${o.progress_counter || '(none)'}`)),
        problemBox(own));
    });
    const general = problemBox(problems.filter((p) => !p.objective));
    return [
      h('p', null, h('strong', null, award.title || award.id || ''), award.description ? ` — ${award.description}` : ''),
      general,
      objectives,
      h('h3', null, 'Strategy'),
      h('div', { class: 'tree' }, strategyTree(award.strategy)),
    ];
  }

  function strategyTree(node) {
    if (!node || typeof node !== 'object') return h('span', { class: 'muted' }, 'no strategy');
    if (node.objective_id) {
      const extra = Object.entries(node).filter(([k]) => k !== 'objective_id').map(([k, v]) => `${k} ${json(v)}`).join(', ');
      return h('span', { class: 'node' }, `objective ${node.objective_id}${extra ? ` (${extra})` : ''}`);
    }
    const words = [];
    if (node.name) words.push(`strategy ${node.name}`);
    if (node.operation) words.push(node.operation);
    if (node.goal !== undefined) words.push(`goal ${node.goal}`);
    for (const key of ['cap', 'max', 'min', 'weight', 'normalize', 'normalization']) {
      if (node[key] !== undefined) words.push(`${key} ${json(node[key])}`);
    }
    if (node.config) words.push(`config ${json(node.config)}`);
    const children = Array.isArray(node.strategy) ? node.strategy : (node.strategy ? [node.strategy] : []);
    return h('span', null, h('span', { class: 'node' }, words.join(', ') || 'strategy'),
      children.length ? h('ul', null, children.map((child) => h('li', null, strategyTree(child)))) : null);
  }

  /** Per award, what would change for whom (a dry run or a diff). */
  function awardDiffs(awards) {
    if (!awards.length) return h('p', { class: 'muted' }, 'No award is affected.');
    return awards.map((a) => h('section', { class: 'card', 'aria-label': `Changes to ${a.award_id}` },
      h('h3', null, a.award_id),
      h('ul', { class: 'sentences' },
        h('li', null, `${a.events_changed} events decided differently, over ${a.users_seen} users seen.`),
        h('li', null, a.would_complete.length ? `Would complete: ${a.would_complete.join(', ')}.` : 'Nobody would newly complete it.'),
        h('li', null, a.would_lose_completion.length ? `Would lose the completion: ${a.would_lose_completion.join(', ')}.` : 'Nobody would lose a completion.'),
        a.progress_changed.length ? h('li', null, `Progress would change for: ${a.progress_changed.join(', ')}.`) : null,
        a.counters_changed.length ? h('li', null, `Counters would change for: ${a.counters_changed.join(', ')}.`) : null),
      table(`Examples for ${a.award_id}`, [
        ['User', (e) => e.user_id],
        ['Event', (e) => e.event_id],
        ['Objective', (e) => e.objective_id],
        ['Now', (e) => e.live],
        ['Would be', (e) => e.candidate],
      ], a.examples, 'No examples.')));
  }

  // --------------------------------------------------------- functions

  /** Every version, grouped per name: live and the newest shadow. */
  function byName(lines) {
    const names = new Map();
    for (const line of lines) {
      const entry = names.get(line.name) || { name: line.name, kind: line.kind, versions: [] };
      entry.versions.push(line);
      names.set(line.name, entry);
    }
    for (const entry of names.values()) {
      entry.live = entry.versions.find((v) => v.live) || null;
      entry.shadow = entry.versions.find((v) => !v.live && (!entry.live || v.version > entry.live.version)) || null;
    }
    return [...names.values()];
  }

  async function functionsPage() {
    const [{ functions }, samples] = await Promise.all([get('/functions?all=true'), metrics().catch(() => [])]);
    const rows = byName(functions);
    const stat = (name) => {
      const calls = sum(samples, 'laurel_function_calls_total', { function: name });
      const errors = sum(samples, 'laurel_function_errors_total', { function: name });
      const seconds = sum(samples, 'laurel_function_call_seconds_sum', { function: name });
      const timed = sum(samples, 'laurel_function_call_seconds_count', { function: name });
      return { calls, errors, mean: timed ? (1000 * seconds) / timed : null };
    };
    page(
      h('h1', null, 'Functions'),
      uploadForm(''),
      table('Functions', [
        ['Name', (f) => h('a', { href: `#/functions/${enc(f.name)}` }, f.name)],
        ['Kind', (f) => f.kind],
        ['Live', (f) => (f.live ? `v${f.live.version}` : 'none')],
        ['Shadow', (f) => (f.shadow ? `v${f.shadow.version}` : '')],
        ['Size', (f) => (f.live || f.versions[0]).size.toLocaleString(), 'num'],
        ['State', (f) => {
          const q = (f.live || f.versions[0]).quarantined;
          return q ? h('span', { class: 'tag bad', title: q }, 'quarantined') : h('span', { class: 'tag good' }, 'serving');
        }],
        ['Calls', (f) => stat(f.name).calls.toLocaleString(), 'num'],
        ['Errors', (f) => stat(f.name).errors.toLocaleString(), 'num'],
        ['Mean call', (f) => { const m = stat(f.name).mean; return m === null ? '' : `${m.toFixed(2)} ms`; }, 'num'],
      ], rows, 'No functions.'),
      h('p', { class: 'muted' }, 'Calls, errors and latency are this process\'s, since it started (its /metrics).'),
    );
  }

  function uploadForm(name) {
    const [nameLabel, nameInput] = field('Name', { value: name, required: true, autocomplete: 'off' });
    const [fileLabel, fileInput] = field('Component (.wasm)', { type: 'file', accept: '.wasm,application/wasm', required: true });
    const [modeLabel, mode] = field('Push as', { tag: 'select' });
    append(mode, [h('option', { value: 'shadow' }, 'shadow (compare first, then promote)'), h('option', { value: 'live' }, 'live (serves at once)')]);
    const answer = h('div', { 'aria-live': 'polite' });
    const push = writeButton('Push', async () => {
      const file = fileInput.files[0];
      if (!nameInput.value.trim() || !file) throw new ApiError(0, 'Give the function a name and pick its .wasm file.');
      const query = mode.value === 'shadow' ? '?shadow=true' : '';
      const bytes = await file.arrayBuffer();
      const pushed = await call('PUT', `/functions/${enc(nameInput.value.trim())}${query}`, { body: bytes, type: 'application/wasm' });
      const words = `${pushed.name} v${pushed.version} (${pushed.kind}) ${pushed.created ? 'pushed' : 'unchanged'}, ${pushed.live ? 'live' : 'as a shadow'}; limits ${pushed.limits.cpu_ms} ms CPU, ${pushed.limits.memory_mib} MiB.`;
      fill(answer, h('p', { class: 'good' }, words), h('p', null, h('a', { href: `#/functions/${enc(pushed.name)}` }, `Open ${pushed.name}`)));
      say(words, 'ok');
    });
    return h('form', { class: 'card', 'aria-label': 'Push a version', onsubmit: (e) => e.preventDefault() },
      h('h2', null, 'Push a version'),
      h('div', { class: 'row' }, h('div', null, nameLabel, nameInput), h('div', null, fileLabel, fileInput), h('div', null, modeLabel, mode), push),
      answer);
  }

  async function functionPage(name) {
    const { functions } = await get('/functions?all=true');
    const entry = byName(functions).find((f) => f.name === name);
    if (!entry) throw new ApiError(404, `no function named ${name}`);
    const diff = h('div', { 'aria-live': 'polite' });
    const actions = [];
    if (entry.shadow) {
      actions.push(h('button', {
        type: 'button', class: 'secondary',
        onclick: async () => {
          fill(diff, h('p', { class: 'muted' }, 'Comparing with recent events…'));
          try {
            const d = await get(`/functions/${enc(name)}/diff?version=${entry.shadow.version}`);
            fill(diff, h('h2', null, `Diff: v${d.candidate_version} against live v${d.live_version}`),
              h('p', null, `${d.events} recent events and ${d.items} stored items compared.`),
              d.note ? h('p', { class: 'muted' }, `Not read: ${d.note}`) : null,
              awardDiffs(d.awards));
          } catch (error) { fill(diff); fail(error); }
        },
      }, `Diff v${entry.shadow.version} against live`));
      actions.push(writeButton(`Promote v${entry.shadow.version}`, async () => {
        if (!(await confirmed(`Promote ${name} v${entry.shadow.version}? It serves every award that names ${name} within seconds.`))) return;
        const changed = await call('POST', `/functions/${enc(name)}/promote`, { body: { version: entry.shadow.version } });
        await functionPage(name);
        say(`${changed.name}: v${changed.to} serves now (was v${changed.from}).`, 'ok');
      }));
    }
    if (entry.live && entry.versions.some((v) => v.version < entry.live.version)) {
      actions.push(writeButton('Roll back', async () => {
        if (!(await confirmed(`Roll ${name} back from v${entry.live.version} to the version before it?`))) return;
        const changed = await call('POST', `/functions/${enc(name)}/rollback`);
        await functionPage(name);
        say(`${changed.name}: v${changed.to} serves now (was v${changed.from}).`, 'ok');
      }, { class: 'write danger' }));
    }
    page(
      h('p', null, h('a', { href: '#/functions' }, '← Functions')),
      h('h1', null, `Function ${name} (${entry.kind})`),
      h('p', null, entry.live ? `Live: v${entry.live.version}.` : 'No version serves.', entry.shadow ? ` Shadow: v${entry.shadow.version}.` : ''),
      h('div', { class: 'row' }, actions),
      diff,
      h('h2', null, 'Versions'),
      table('Versions', [
        ['Version', (v) => `v${v.version}`],
        ['State', (v) => (v.live ? h('span', { class: 'tag good' }, 'live') : (entry.shadow && v.version === entry.shadow.version ? h('span', { class: 'tag' }, 'shadow') : ''))],
        ['Size', (v) => v.size.toLocaleString(), 'num'],
        ['Limits', (v) => `${v.limits.cpu_ms} ms, ${v.limits.memory_mib} MiB`],
        ['Quarantined', (v) => (v.quarantined ? h('span', { class: 'bad' }, v.quarantined) : '')],
        ['Pushed', (v) => when(v.created_at)],
        ['sha256', (v) => h('span', { class: 'mono' }, v.sha256.slice(0, 12))],
      ], entry.versions),
      uploadForm(name),
    );
  }

  // ----------------------------------------------------------- sources

  /** Per source, applied / held / dead-lettered per minute from the last
   * two samples of this process's counters. */
  function rates(samples, sources) {
    const now = Date.now();
    for (const source of sources) {
      const totals = {
        applied: sum(samples, 'laurel_events_applied_total', { source }),
        held: sum(samples, 'laurel_events_held_total', { source }),
        dead: sum(samples, 'laurel_events_dead_lettered_total', { source }),
      };
      const history = session.samples[source] || (session.samples[source] = []);
      const last = history[history.length - 1];
      if (last) {
        const minutes = Math.max((now - last.at) / 60000, 1 / 600);
        history.push({ at: now, totals, rate: {
          applied: Math.max(0, (totals.applied - last.totals.applied) / minutes),
          held: Math.max(0, (totals.held - last.totals.held) / minutes),
          dead: Math.max(0, (totals.dead - last.totals.dead) / minutes),
        } });
      } else {
        history.push({ at: now, totals, rate: null });
      }
      while (history.length > 25) history.shift();
    }
  }

  function rateChart(source) {
    const history = (session.samples[source] || []).filter((s) => s.rate);
    const width = 240;
    const height = 48;
    const top = Math.max(1, ...history.map((s) => s.rate.applied + s.rate.held + s.rate.dead));
    const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
    svg.setAttribute('class', 'chart');
    svg.setAttribute('width', width);
    svg.setAttribute('height', height);
    svg.setAttribute('role', 'img');
    const latest = history[history.length - 1];
    svg.setAttribute('aria-label', latest
      ? `${source}: ${Math.round(latest.rate.applied)} applied, ${Math.round(latest.rate.held)} held, ${Math.round(latest.rate.dead)} dead-lettered per minute`
      : `${source}: no rate yet`);
    const step = width / 24;
    history.forEach((s, i) => {
      let y = height;
      for (const kind of ['applied', 'held', 'dead']) {
        const bar = (s.rate[kind] / top) * (height - 4);
        if (bar <= 0) continue;
        const rect = document.createElementNS('http://www.w3.org/2000/svg', 'rect');
        rect.setAttribute('x', i * step + 1);
        rect.setAttribute('y', y - bar);
        rect.setAttribute('width', step - 2);
        rect.setAttribute('height', bar);
        rect.setAttribute('class', kind);
        svg.append(rect);
        y -= bar;
      }
    });
    return svg;
  }

  async function sourcesPage() {
    const sourcesBox = h('div');
    const pipelinesBox = h('div');
    const letters = h('div');
    const render = async () => {
      const [{ sources }, { pipelines }, samples] = await Promise.all([get('/sources'), get('/pipelines'), metrics().catch(() => [])]);
      rates(samples, sources.map((s) => s.name));
      fill(sourcesBox, table('Sources', [
        ['Source', (s) => s.name],
        ['Topic', (s) => s.topic],
        ['State', (s) => h('span', { class: `tag ${s.state === 'running' ? 'good' : 'bad'}` }, s.state)],
        ['Lag', (s) => (s.lag === null ? h('span', { class: 'muted', title: s.lag_error || '' }, s.lag_error || 'unknown') : String(s.lag)), 'num'],
        ['Per minute (applied, held, dead-lettered)', (s) => {
          const history = session.samples[s.name] || [];
          const latest = history[history.length - 1];
          const words = latest && latest.rate
            ? `${Math.round(latest.rate.applied)} applied, ${Math.round(latest.rate.held)} held, ${Math.round(latest.rate.dead)} dead-lettered`
            : `${latest ? latest.totals.applied : 0} applied so far`;
          return [rateChart(s.name), h('div', { class: 'muted' }, words)];
        }],
        ['', (s) => [
          s.paused
            ? writeButton(`Resume ${s.name}`, async () => { await call('POST', `/sources/${enc(s.name)}/resume`); say(`${s.name} resumed.`, 'ok'); await render(); })
            : writeButton(`Pause ${s.name}`, async () => {
              if (!(await confirmed(`Pause ${s.name}? Its events wait in Kafka until it is resumed.`))) return;
              await call('POST', `/sources/${enc(s.name)}/pause`);
              say(`${s.name} paused.`, 'ok');
              await render();
            }, { class: 'write secondary' }),
          h('button', { type: 'button', class: 'secondary', onclick: () => deadLetters(s.name, letters, null).catch(fail) }, `Dead letters of ${s.name}`),
        ]],
      ], sources, 'No sources.'));
      fill(pipelinesBox, table('Pipelines', [
        ['Pipeline', (p) => p.name],
        ['Input → source', (p) => `${p.input_topic} → ${p.source}`],
        ['Transform', (p) => `${p.transform.name} v${p.version}`],
        ['State', (p) => h('span', { class: `tag ${p.state === 'running' ? 'good' : 'bad'}` }, p.state)],
        ['Lag', (p) => (p.lag === null ? h('span', { class: 'muted' }, p.lag_error || 'unknown') : String(p.lag)), 'num'],
        ['', (p) => [
          p.paused
            ? writeButton(`Resume ${p.name}`, async () => { await call('POST', `/pipelines/${enc(p.name)}/resume`); say(`${p.name} resumed.`, 'ok'); await render(); })
            : writeButton(`Pause ${p.name}`, async () => {
              if (!(await confirmed(`Pause pipeline ${p.name}?`))) return;
              await call('POST', `/pipelines/${enc(p.name)}/pause`);
              say(`${p.name} paused.`, 'ok');
              await render();
            }, { class: 'write secondary' }),
          writeButton(`Replay ${p.name}'s dead letters`, async () => {
            if (!(await confirmed(`Put ${p.name}'s dead letters back on ${p.input_topic}?`))) return;
            const r = await call('POST', `/pipelines/${enc(p.name)}/dead-letters/replay`);
            say(`${r.pipeline}: ${r.replayed} replayed from ${r.dead_topic}.`, 'ok');
          }, { class: 'write secondary' }),
        ]],
      ], pipelines, 'No pipelines.'));
    };
    page(h('h1', null, 'Sources and pipelines'), h('h2', null, 'Sources'), sourcesBox, h('h2', null, 'Pipelines'), pipelinesBox, letters,
      h('p', { class: 'muted' }, `Refreshed every ${REFRESH_MS / 1000} s; rates are this process's.`));
    await render();
    every(render);
  }

  async function deadLetters(source, into, before) {
    const answer = await get(`/sources/${enc(source)}/dead-letters?limit=50${before ? `&before=${before}` : ''}`);
    const replay = writeButton(`Replay ${source}'s dead letters`, async () => {
      if (!(await confirmed(`Replay ${source}'s open dead letters? Each is applied once per objective; those that still fail stay.`))) return;
      const r = await call('POST', `/sources/${enc(source)}/dead-letters/replay`, { body: {} });
      const words = `${r.source}: ${r.replayed} replayed, ${r.still_failing} still failing, ${r.counters_changed} counters changed.`;
      say(words, r.still_failing ? 'error' : 'ok');
      await deadLetters(source, into, null);
      append(into, [h('ul', { class: 'sentences' }, r.failures.map((f) => h('li', null, `#${f.id}: ${f.reason}`)))]);
    });
    fill(into,
      h('h2', null, `Dead letters of ${source}`),
      h('div', { class: 'row' }, replay),
      table(`Dead letters of ${source}`, [
        ['#', (d) => String(d.id), 'num'],
        ['When', (d) => when(d.dead_at)],
        ['Where', (d) => `${d.topic} [${d.partition}] @${d.offset}`],
        ['Event / user', (d) => [d.event_id, d.user_id].filter(Boolean).join(' / ')],
        ['Held for', (d) => (d.award_id ? `${d.award_id} / ${d.objective_id}` : 'the whole event')],
        ['Reason', (d) => d.reason],
        ['Tries', (d) => String(d.attempts), 'num'],
      ], answer.dead_letters, 'No open dead letters.'),
      answer.next_before ? h('button', { type: 'button', class: 'secondary', onclick: () => deadLetters(source, into, answer.next_before).catch(fail) }, 'Older') : null,
    );
  }

  // ---------------------------------------------------------- webhooks

  async function webhooksPage() {
    const { webhooks } = await get('/webhooks');
    const [nameLabel, name] = field('Name', { autocomplete: 'off' });
    const [urlLabel, url] = field('URL', { type: 'url', autocomplete: 'off' });
    const [eventsLabel, events] = field('Events (comma-separated)', { value: 'award.completed' });
    const [poolLabel, pool] = field('Proxy pool (optional)', { autocomplete: 'off' });
    const edit = (w) => { name.value = w.name; url.value = w.url; events.value = (w.events || []).join(', '); pool.value = w.proxy_pool || ''; name.focus(); };
    const save = writeButton('Save webhook', async () => {
      const body = { url: url.value.trim(), events: events.value.split(',').map((e) => e.trim()).filter(Boolean) };
      if (pool.value.trim()) body.proxy_pool = pool.value.trim();
      const saved = await call('PUT', `/webhooks/${enc(name.value.trim())}`, { body });
      say(`Webhook ${saved.name || name.value} saved.`, 'ok');
      await webhooksPage();
    });
    page(
      h('h1', null, 'Webhooks'),
      table('Webhooks', [
        ['Name', (w) => w.name],
        ['URL', (w) => w.url],
        ['Events', (w) => (w.events || []).join(', ')],
        ['Proxy pool', (w) => w.proxy_pool || ''],
        ['', (w) => [
          h('button', { type: 'button', class: 'secondary', onclick: () => edit(w) }, `Edit ${w.name}`),
          writeButton(`Delete ${w.name}`, async () => {
            if (!(await confirmed(`Delete webhook ${w.name}? Its pending notifications are given up.`))) return;
            await call('DELETE', `/webhooks/${enc(w.name)}`);
            say(`Webhook ${w.name} deleted.`, 'ok');
            await webhooksPage();
          }, { class: 'write danger' }),
        ]],
      ], webhooks, 'No webhooks.'),
      h('form', { class: 'card', 'aria-label': 'Add or change a webhook', onsubmit: (e) => e.preventDefault() },
        h('h2', null, 'Add or change a webhook'),
        h('div', { class: 'row' }, h('div', null, nameLabel, name), h('div', null, urlLabel, url), h('div', null, eventsLabel, events), h('div', null, poolLabel, pool), save)),
    );
  }

  // ------------------------------------------------------- proxy pools

  async function poolsPage() {
    const { pools } = await get('/proxy-pools');
    page(
      h('h1', null, 'Proxy pools'),
      table('Proxy pools', [
        ['Pool', (p) => h('a', { href: `#/pools/${enc(p.pool)}` }, p.pool)],
        ['Policy', (p) => p.config.policy],
        ['Check URL', (p) => p.config.check_url],
        ['Schemes', (p) => p.config.schemes.join(', ')],
        ['Re-check', (p) => `every ${p.config.recheck_every_s} s`],
      ], pools, 'No proxy pools (laurel proxies pool set NAME --check-url URL).'),
    );
  }

  /** Horizontal bars, one a row: its name, its bar, its value. */
  function barChart(label, entries) {
    const svgNs = 'http://www.w3.org/2000/svg';
    const [names, bars, row] = [220, 220, 18];
    const top = Math.max(1, ...entries.map(([, v]) => v));
    const svg = document.createElementNS(svgNs, 'svg');
    svg.setAttribute('class', 'chart');
    svg.setAttribute('width', names + bars + 60);
    svg.setAttribute('height', Math.max(row, entries.length * row));
    svg.setAttribute('role', 'img');
    svg.setAttribute('aria-label', `${label}: ${entries.map(([k, v]) => `${k} ${v}`).join(', ') || 'none'}`);
    entries.forEach(([name, value], i) => {
      const width = Math.max(1, (value / top) * bars);
      const text = (x, words) => {
        const t = document.createElementNS(svgNs, 'text');
        t.setAttribute('x', x);
        t.setAttribute('y', i * row + row - 5);
        t.textContent = words;
        return t;
      };
      const rect = document.createElementNS(svgNs, 'rect');
      rect.setAttribute('x', names);
      rect.setAttribute('y', i * row + 3);
      rect.setAttribute('width', width);
      rect.setAttribute('height', row - 6);
      rect.setAttribute('class', 'bar');
      svg.append(text(4, name), rect, text(names + width + 4, String(value)));
    });
    return svg;
  }

  async function poolPage(pool) {
    const view = await get(`/proxy-pools/${enc(pool)}`);
    const [listLabel, list] = field('Candidates, one scheme://host:port a line', { tag: 'textarea', rows: 6, class: 'mono short' });
    const report = h('div', { 'aria-live': 'polite' });
    const importButton = writeButton('Import and check', async () => {
      fill(report, h('p', { class: 'muted' }, 'Checking each candidate…'));
      const r = await call('PUT', `/proxy-pools/${enc(pool)}/candidates`, { body: list.value, type: 'text/plain' });
      const refused = (r.refused || []).map((x) => h('li', null, `${x.proxy}: ${x.reason}`));
      const junk = (r.junk || []).map((x) => h('li', null, `line ${x.line}: ${x.reason}`));
      fill(report, h('p', { class: 'good' }, `${(r.admitted || []).length} admitted, ${(r.refused || []).length} refused, ${(r.dropped || []).length} dropped, ${(r.junk || []).length} lines not understood.`),
        refused.length ? h('ul', { class: 'sentences', 'aria-label': 'Refused' }, refused) : null,
        junk.length ? h('ul', { class: 'sentences', 'aria-label': 'Not understood' }, junk) : null);
    });
    const allocate = writeButton('Allocate once', async () => {
      const taken = await call('POST', `/proxy-pools/${enc(pool)}/allocate`);
      say(taken && taken.proxy ? `Allocated ${taken.proxy}.` : `Nothing allocated: ${json(taken)}.`, 'ok');
      await poolPage(pool);
    }, { class: 'write secondary' });
    page(
      h('p', null, h('a', { href: '#/pools' }, '← Proxy pools')),
      h('h1', null, `Proxy pool ${pool}`),
      h('p', null, `${view.eligible} of ${view.members.length} members eligible.`, view.config ? ` Policy ${view.config.policy}; checked against ${view.config.check_url}.` : ' Not configured.'),
      h('div', { class: 'row' }, allocate),
      h('h2', null, 'Allocations'),
      barChart(`Allocations in ${pool}`, view.members.filter((m) => m.eligible).map((m) => [m.proxy, m.allocations])),
      h('h2', null, 'Members'),
      table('Members', [
        ['Proxy', (m) => h('span', { class: 'mono' }, m.proxy)],
        ['Eligible', (m) => (m.eligible ? h('span', { class: 'tag good' }, 'eligible') : h('span', { class: 'tag bad' }, 'not eligible'))],
        ['Why not', (m) => m.reason || ''],
        ['Allocations', (m) => String(m.allocations), 'num'],
        ['In flight', (m) => String(m.in_flight), 'num'],
        ['Latency', (m) => (m.latency_ms === null ? '' : `${m.latency_ms} ms`), 'num'],
        ['Checked', (m) => when(m.checked_at)],
      ], view.members, 'No members.'),
      h('form', { class: 'card', 'aria-label': 'Import candidates', onsubmit: (e) => e.preventDefault() },
        h('h2', null, 'Import candidates'), listLabel, list, importButton, report),
    );
  }

  // ------------------------------------------------------------- audit

  async function auditPage(before) {
    const answer = await get(`/audit?limit=50${before ? `&before=${before}` : ''}`);
    page(
      h('h1', null, 'Audit'),
      h('p', { class: 'muted' }, 'Every admin write, done or refused, newest first.'),
      table('Audit', [
        ['When', (e) => when(e.at)],
        ['Who', (e) => e.token],
        ['What', (e) => h('span', { class: 'mono' }, `${e.method} ${e.path}`)],
        ['Status', (e) => h('span', { class: `tag ${e.status < 400 ? 'good' : 'bad'}` }, String(e.status))],
        ['Changed', (e) => (e.target ? `${e.target}${e.version_after ? ` v${e.version_before || '–'} → v${e.version_after}` : ''}` : '')],
      ], answer.entries, 'No writes yet.'),
      h('p', null,
        before ? h('button', { type: 'button', class: 'secondary', onclick: () => auditPage(null).catch(fail) }, 'Newest') : null,
        answer.next_before ? h('button', { type: 'button', class: 'secondary', onclick: () => auditPage(answer.next_before).catch(fail) }, 'Older') : null),
    );
  }

  // ------------------------------------------------------------- start

  document.addEventListener('DOMContentLoaded', async () => {
    $('login').addEventListener('submit', async (event) => {
      event.preventDefault();
      const input = $('token');
      const token = input.value.trim();
      input.value = '';
      if (await logIn(token)) {
        quiet();
        await route();
      }
    });
    $('logout').addEventListener('click', () => logOut(null));
    window.addEventListener('hashchange', () => route());
    if (sessionStorage.getItem(TOKEN_KEY) && await logIn(sessionStorage.getItem(TOKEN_KEY))) {
      await route();
    } else {
      showLogin(null);
    }
  });
})();

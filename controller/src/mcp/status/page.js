// The status page: renders each snapshot the server sends over
// /status/events, and keeps each host's chart points for the last hour.
// Data goes in as text nodes only, never as markup.
'use strict';

const HOUR = 3600;
const points = {};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  for (const child of children) node.append(child ?? '');
  return node;
}

// A 0-100 % series over the last hour as a small line chart.
function chart(label, series, now, color) {
  const width = 220, height = 44, ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('width', width);
  svg.setAttribute('height', height);
  const line = document.createElementNS(ns, 'polyline');
  line.setAttribute('fill', 'none');
  line.setAttribute('stroke', color);
  line.setAttribute('stroke-width', '1.5');
  const xy = series
    .filter(([, v]) => v >= 0)
    .map(([t, v]) => [width * (1 - (now - t) / HOUR), height - 2 - (height - 4) * Math.min(v, 100) / 100]);
  line.setAttribute('points', xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(' '));
  svg.append(line);
  if (xy.length) {
    // The newest point, visible while the hour fills.
    const dot = document.createElementNS(ns, 'circle');
    const [x, y] = xy[xy.length - 1];
    dot.setAttribute('cx', Math.min(x, width - 2.5).toFixed(1));
    dot.setAttribute('cy', y.toFixed(1));
    dot.setAttribute('r', '2.5');
    dot.setAttribute('fill', color);
    svg.append(dot);
  }
  const last = series.length ? series[series.length - 1][1] : -1;
  return el('figure', {}, el('figcaption', {}, `${label} ${last >= 0 ? last.toFixed(0) + ' %' : '—'}`), svg);
}

function ttl(expiresAt) {
  const left = (Date.parse(expiresAt) - Date.now()) / 1000;
  if (!(left > 0)) return 'expired';
  return left > 3600 ? `${(left / 3600).toFixed(1)} h` : left > 60 ? `${Math.round(left / 60)} min` : `${Math.round(left)} s`;
}

function limits(sandbox) {
  const l = sandbox.limits || {};
  const parts = Object.entries(l).map(([k, v]) => `${k} ${v}`);
  if (sandbox.gpus && sandbox.gpus.length) parts.push(`gpus ${sandbox.gpus.join(',')}`);
  return parts.join(', ') || '—';
}

function hostCard(host, now) {
  const card = el('section', { class: 'host', 'data-host': host.name });
  card.append(el('h2', {}, host.name, el('span', { class: 'address' }, host.address),
    el('span', { class: host.alive ? 'badge' : 'badge down' }, host.alive ? 'connected' : 'unreachable')));
  if (host.error) card.append(el('p', { class: 'muted' }, host.error));
  const r = host.resources;
  if (r) {
    card.append(el('div', { class: 'muted' },
      `${r.cpus} CPUs, load ${r.load.toFixed(2)} · memory ${(r.mem_used_mb / 1024).toFixed(1)} of ${(r.mem_total_mb / 1024).toFixed(1)} GiB`));
    const series = points[host.name] || [];
    const charts = el('div', { class: 'charts' },
      chart('CPU', series.map((p) => [p[0], p[1]]), now, '#2a6fdb'),
      chart('memory', series.map((p) => [p[0], p[2]]), now, '#7b2cbf'));
    r.gpus.forEach((gpu, i) => {
      charts.append(chart(`GPU ${gpu.index} ${gpu.name}`, series.map((p) => [p[0], (p[3][i] || [-1])[0]]), now, '#2b9348'));
      charts.append(chart(`GPU ${gpu.index} memory`, series.map((p) => [p[0], (p[3][i] || [0, -1])[1]]), now, '#e76f51'));
    });
    card.append(charts);
  }
  if (host.sandboxes.length) {
    const table = el('table', {}, el('tr', {}, ...['sandbox', 'state', 'TTL left', 'isolation', 'network', 'limits'].map((h) => el('th', {}, h))));
    for (const s of host.sandboxes) {
      table.append(el('tr', { 'data-sandbox': s.name }, el('td', {}, s.name), el('td', {}, s.state), el('td', {}, ttl(s.expires_at)),
        el('td', {}, s.isolation), el('td', {}, s.network ? 'yes' : 'no'), el('td', {}, limits(s))));
    }
    card.append(el('h3', {}, 'Sandboxes'), table);
  }
  if (host.jobs.length) {
    card.append(el('h3', {}, 'Jobs'));
    for (const job of host.jobs) {
      const state = job.state + (job.exit_code != null ? ` (exit ${job.exit_code})` : '');
      const row = el('div', { 'data-job': job.name, 'data-state': job.state },
        el('strong', {}, job.name), ' ', el('span', { class: 'muted' }, state), ' ', el('code', {}, job.command));
      if (job.tail) row.append(el('pre', {}, job.tail));
      card.append(row);
    }
  }
  return card;
}

function render(snapshot) {
  const hosts = document.getElementById('hosts');
  hosts.replaceChildren(...snapshot.hosts.map((h) => hostCard(h, snapshot.time)));
  const audit = document.getElementById('audit');
  audit.replaceChildren(el('tr', {}, ...['time', 'client', 'tool', 'sandbox', 'outcome', 'ms'].map((h) => el('th', {}, h))),
    ...snapshot.audit.slice().reverse().map((a) => el('tr', {}, el('td', {}, (a.time || '').slice(11, 19)), el('td', {}, a.client),
      el('td', {}, a.tool), el('td', {}, typeof a.sandbox === 'string' ? a.sandbox : JSON.stringify(a.sandbox ?? '')),
      el('td', {}, a.outcome + (a.error ? `: ${a.error}` : '')), el('td', {}, a.duration_ms))));
  document.getElementById('updated').textContent = `updated ${new Date(snapshot.time * 1000).toLocaleTimeString()}`;
}

const events = new EventSource('/status/events');
events.addEventListener('history', (e) => Object.assign(points, JSON.parse(e.data)));
events.addEventListener('snapshot', (e) => {
  const snapshot = JSON.parse(e.data);
  for (const host of snapshot.hosts) {
    if (!host.point) continue;
    const series = (points[host.name] ||= []);
    if (!series.length || series[series.length - 1][0] !== host.point[0]) series.push(host.point);
    while (series.length && series[0][0] + HOUR < snapshot.time) series.shift();
  }
  render(snapshot);
});
events.onerror = () => { document.getElementById('updated').textContent = 'reconnecting…'; };

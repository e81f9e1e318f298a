// Sortable, filterable tables, and the Tables view: op table (like key_averages), device
// work by name, per-lane breakdown, per-engine breakdown; each exportable.
import { getJSON, href } from "./api.js";
import { cell, esc } from "./format.js";

// A column name as a heading: `calls[naive_fp32 · 20261201_205625]` (a compared profile's
// column) becomes "calls" over the profile's label; `delta_device_ns[a→b]` likewise; snake
// case reads as words. `labels` maps a raw label to the name shown (compare: the tab's name).
export function columnTitle(c, labels) {
  const m = /^([^[]+)\[(.*)\]$/.exec(c);
  const words = (x) => esc(x.replace(/_ns$/, "").replace(/_/g, " "));
  if (!m) return words(c);
  const sub = labels && labels[m[2]] !== undefined ? labels[m[2]] : m[2];
  return `${words(m[1])}<div class="sub">${esc(sub)}</div>`;
}

// table: {columns, rows}; opts: {sort, desc, textCols, onRow(row), limit, testid, labels, rowTitle}
export class DataTable {
  constructor(table, opts = {}) {
    this.t = table;
    this.opts = opts;
    this.sortCol = opts.sort ?? null;
    this.desc = opts.desc ?? true;
    this.filter = "";
    this.limit = opts.limit || 500;
    this.el = document.createElement("div");
    this.render();
  }

  isText(ci) {
    const c = this.t.columns[ci];
    if (this.opts.textCols && this.opts.textCols.includes(c)) return true;
    return this.t.rows.some((r) => typeof r[ci] === "string");
  }

  rows() {
    let rows = this.t.rows;
    if (this.filter) {
      const f = this.filter.toLowerCase();
      rows = rows.filter((r) => r.some((v) => typeof v === "string" && v.toLowerCase().includes(f)));
    }
    const ci = this.t.columns.indexOf(this.sortCol);
    if (ci >= 0) {
      const d = this.desc ? -1 : 1;
      rows = [...rows].sort((a, b) => {
        const x = a[ci], y = b[ci];
        if (x === y) return 0;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * d;
      });
    }
    return rows;
  }

  render() {
    const rows = this.rows();
    const cols = this.t.columns;
    const head = cols.map((c, i) => `<th data-ci="${i}" data-col="${esc(c)}" title="${esc(c)}" class="${this.isText(i) ? "text" : ""} ${c === this.sortCol ? (this.desc ? "sorted-desc" : "sorted-asc") : ""}">${columnTitle(c, this.opts.labels)}</th>`).join("");
    const shown = rows.slice(0, this.limit);
    const body = shown.map((r, ri) => `<tr data-ri="${ri}"${this.opts.rowTitle ? ` title="${esc(this.opts.rowTitle)}" class="clickable"` : ""}>${r.map((v, i) => `<td class="${this.isText(i) ? "text" : ""}" title="${esc(v)}">${esc((this.opts.format && this.opts.format(r, i, v)) ?? cell(cols[i], v))}</td>`).join("")}</tr>`).join("");
    const more = rows.length > shown.length ? `<p class="muted">${rows.length - shown.length} more rows <button data-act="more">show all</button></p>` : "";
    this.el.innerHTML = `<table class="data" data-testid="${this.opts.testid || "table"}"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>${more}`;
    this.el.querySelectorAll("th").forEach((th) => th.addEventListener("click", () => {
      const c = cols[Number(th.dataset.ci)];
      if (this.sortCol === c) this.desc = !this.desc; else { this.sortCol = c; this.desc = !this.isText(Number(th.dataset.ci)); }
      this.render();
    }));
    const m = this.el.querySelector("[data-act=more]");
    if (m) m.addEventListener("click", () => { this.limit = Infinity; this.render(); });
    if (this.opts.onRow) {
      this.el.querySelectorAll("tbody tr").forEach((tr) => tr.addEventListener("click", () => {
        this.el.querySelectorAll("tr.sel").forEach((x) => x.classList.remove("sel"));
        tr.classList.add("sel");
        this.opts.onRow(shown[Number(tr.dataset.ri)]);
      }));
    }
  }

  setFilter(f) { this.filter = f; this.render(); }
}

const TABS = [
  ["ops", "Op table"], ["kernels", "Device work by name"], ["lanes", "Lanes"], ["engines", "Engines"],
];

export class TablesView {
  constructor(app, profile, meta, params = {}, signal) {
    this.app = app; this.profile = profile; this.meta = meta; this.signal = signal;
    this.base = `/api/p/${profile.id}`;
    this.tab = TABS.some(([k]) => k === params.tab) ? params.tab : "ops";
    this.byShape = params.by_shape === "1";
    this.filter = params.filter || "";  // kept across re-renders (another tab, by input shape) and in the URL
    this.el = document.createElement("div");
    this.el.className = "page";
  }

  urlState() { return { tab: this.tab !== "ops" ? this.tab : null, by_shape: this.byShape ? 1 : null, filter: this.filter || null }; }

  async mount(main) {
    main.appendChild(this.el);
    await this.render();
  }

  // An op or kernel row opens the trace on its events: the first one selected and zoomed to,
  // every one highlighted, Enter for the next.
  showEvents(name) {
    this.app.go(`#/${this.profile.id}/trace?q=${encodeURIComponent(name)}&exact=1&find=1`);
  }

  async render() {
    const tabs = TABS.filter(([k]) => k !== "engines" || this.meta.modeled)
      .map(([k, l]) => `<a data-tab="${k}" class="${k === this.tab ? "active" : ""}">${l}</a>`).join("");
    this.el.innerHTML = `<div class="tabs" data-testid="table-tabs">${tabs}</div><div class="toolbar" style="padding-left:0">
      <input type="search" placeholder="filter rows…" data-testid="filter" size="28" value="${esc(this.filter)}">
      ${this.tab === "ops" ? `<label><input type="checkbox" data-testid="by-shape" ${this.byShape ? "checked" : ""}> by input shape</label>` : ""}
      <span data-role="note" class="muted"></span>
      <span class="hint">${this.exportLink()}</span></div><div data-role="body"><div class="loading">Loading…</div></div>`;
    this.el.querySelectorAll("[data-tab]").forEach((a) => a.addEventListener("click", () => { this.tab = a.dataset.tab; this.app.saveState(); this.render(); }));
    const bs = this.el.querySelector("[data-testid=by-shape]");
    if (bs) bs.addEventListener("change", () => { this.byShape = bs.checked; this.app.saveState(); this.render(); });
    const body = this.el.querySelector("[data-role=body]");
    const note = this.el.querySelector("[data-role=note]");
    const tab = this.tab, gen = this._gen = (this._gen || 0) + 1;
    let tables = [];
    const rowTitle = "click: show its events in the system trace";
    const byName = (t) => (row) => this.showEvents(row[t.columns.indexOf("name")]);
    if (tab === "ops") {
      const r = await getJSON(`${this.base}/ops`, { by_shape: this.byShape ? 1 : 0 }, this.signal);
      note.textContent = `one row per op${this.byShape ? " and input shapes" : ""}, like key_averages(); device time is ${this.meta.modeled ? "modeled" : "measured"} · click a row for its events`;
      tables = [["", r.table, { sort: "device_total_ns", testid: "op-table", textCols: ["name", "shapes"], onRow: byName(r.table), rowTitle }]];
    } else if (tab === "kernels") {
      const r = await getJSON(`${this.base}/kernels`, undefined, this.signal);
      note.textContent = `device work (kernels, copies, ${this.meta.modeled ? "modeled executions" : "memsets"}) by name · click a row for its events`;
      tables = [["", r.table, { sort: "total_ns", testid: "kernel-table", onRow: byName(r.table), rowTitle }]];
    } else if (tab === "lanes") {
      const r = await getJSON(`${this.base}/breakdown`, undefined, this.signal);
      note.textContent = "busy time per lane (overlaps counted once)";
      tables = [["Device lanes", r.device, { sort: "busy_ns", testid: "device-lanes" }], ["Host lanes", r.host, { sort: "busy_ns", testid: "host-lanes" }]];
    } else if (tab === "engines") {
      const r = await getJSON(`${this.base}/engines`, undefined, this.signal);
      note.textContent = "per engine over every instruction trace (modeled)";
      tables = [["", r.table, { sort: "busy_ns", testid: "engine-table" }]];
    }
    if (gen !== this._gen || this.signal.aborted) return;  // rendered again meanwhile (another tab, by shape)
    body.innerHTML = "";
    this.dts = [];
    for (const [title, t, opts] of tables) {
      if (title) { const h = document.createElement("h3"); h.textContent = title; body.appendChild(h); }
      const dt = new DataTable(t, opts);
      if (this.filter) dt.setFilter(this.filter);
      this.dts.push(dt);
      body.appendChild(dt.el);
      if (!t.rows.length) { const p = document.createElement("p"); p.className = "muted"; p.textContent = "no rows"; body.appendChild(p); }
    }
    this.el.querySelector("[data-testid=filter]").addEventListener("input", (e) => {
      this.filter = e.target.value;
      this.dts.forEach((d) => d.setFilter(this.filter));
      this.app.saveState();
    });
  }

  exportLink() {
    if (this.tab === "ops") return `<a href="${href(`${this.base}/export/ops.csv`)}" download>export CSV</a>`;
    if (this.tab === "kernels") return `<a href="${href(`${this.base}/export/kernels.csv`)}" download>export CSV</a>`;
    return "";
  }

  destroy() { this.el.remove(); }
}

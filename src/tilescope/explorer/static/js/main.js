// The explorer app: profile tabs, view tabs, routing, banners, status, keys.
//
// The URL holds the view: #/p0/trace?t0=&t1=&sel=&group=&color=&q=, #/p0/device?hash=&run=&t0=&t1=&i=,
// #/p0/ops?tab=&by_shape=&filter=, #/p0/summary, #/p0/roofline, #/p0/files, #/compare?ids=p0,p1&t0=&t1=.
// A view reports its state (zoom, selection, grouping, ...) with app.saveState(); the app writes
// it into the current history entry (replaceState), so Back, reload and a shared link restore it.
// Each route gets an AbortController: leaving a view aborts its requests (the server cancels
// their work) and nothing it was waiting for reaches the next view.
//
// The first paint needs the trace view only: the other views' modules load when first opened
// (index.html preloads the trace view's modules beside this one); a view's module and its
// profile's meta are asked for together.
import { getJSON, isAbort } from "./api.js";
import { esc } from "./format.js";
import { TraceView } from "./trace.js";

const VIEWS = {
  trace: async () => TraceView,
  device: async () => (await import("./device.js")).DeviceView,
  ops: async () => (await import("./tables.js")).TablesView,
  summary: async () => (await import("./summary.js")).SummaryView,
  roofline: async () => (await import("./roofline.js")).RooflineView,
  files: async () => (await import("./files.js")).FilesView,
};
const compareView = async () => (await import("./compare.js")).CompareView;

export const KEYS = [
  ["W / S", "zoom in / out at the pointer (ctrl+wheel too)"],
  ["A / D", "pan left / right (drag, shift+wheel too)"],
  ["0", "the whole trace"],
  ["click", "an event: its details and lifecycle; a bucket: zoom into it"],
  ["double-click", "zoom to an event"],
  ["shift+drag", "select a box: a summary of what it covers"],
  ["Enter / Shift+Enter", "next / previous event matching the search (in the search box, or after a search)"],
  ["m", "mark the selected event's span (or the box) across all lanes; m again removes it"],
  ["Esc", "clear the selection, the box and the mark"],
  ["/", "go to the search box"],
  ["?", "this list"],
];

class App {
  constructor() {
    this.main = document.getElementById("main");
    this.metas = new Map();
    this.view = null;
    this.dismissed = new Set();
    this.errors = [];
    this.ac = null;
    this._routed = [];  // go()s waiting for their view
    this.ready = this.start();
  }

  async start() {
    window.addEventListener("unhandledrejection", (e) => {
      if (isAbort(e.reason)) { e.preventDefault(); return; }
    });
    document.addEventListener("keydown", (e) => this.key(e));
    const r = await getJSON("/api/profiles");
    this.profiles = r.profiles;
    this.renderProfiles();
    document.querySelectorAll("#views a").forEach((a) => a.addEventListener("click", (e) => {
      e.preventDefault();
      const v = a.dataset.view;
      if (v === "compare") this.go(`#/compare?ids=${this.profiles.filter((p) => p.ok).slice(0, 8).map((p) => p.id).join(",")}`);
      else this.go(`#/${this.current || this.firstOk()}/${v}`);
    }));
    window.addEventListener("hashchange", () => this.route());
    await this.route();
  }

  firstOk() { const p = this.profiles.find((x) => x.ok); return p ? p.id : this.profiles[0].id; }

  go(hash) {
    if (this._saveTimer) { clearTimeout(this._saveTimer); this._saveTimer = null; this._writeState(); }
    if (location.hash === hash) return this.route();
    location.hash = hash;
    return new Promise((res) => { this._routed.push(res); });
  }

  // ---- the URL holds the view ---------------------------------------------------------------
  // A view calls saveState() when its state changes; the current history entry is rewritten
  // (debounced: a drag is one entry, not hundreds).
  saveState() {
    clearTimeout(this._saveTimer);
    this._saveTimer = setTimeout(() => { this._saveTimer = null; this._writeState(); }, 120);
  }

  _writeState() {
    const v = this.view;
    if (!v || !v.urlState || v !== this._stateView) return;
    const params = v.urlState();
    const q = new URLSearchParams();
    for (const [k, val] of Object.entries(params)) if (val !== undefined && val !== null && val !== "") q.set(k, String(val));
    const qs = q.toString();
    const path = this.viewName === "compare" ? "#/compare" : `#/${this.current}/${this.viewName}`;
    const hash = qs ? `${path}?${qs}` : path;
    if (hash !== location.hash) history.replaceState(history.state, "", hash);
  }

  renderProfiles() {
    const nav = document.getElementById("profiles");
    nav.innerHTML = this.profiles.map((p) => `<a data-pid="${p.id}" class="${p.ok ? "" : "bad"}" title="${esc(p.path)}">${esc(p.label)}` +
      `${p.ok ? "" : " ⚠"}</a>`).join("");
    nav.querySelectorAll("a").forEach((a) => a.addEventListener("click", () => {
      const v = this.viewName && this.viewName !== "compare" ? this.viewName : "trace";
      this.go(`#/${a.dataset.pid}/${v}`);
    }));
  }

  async meta(id, signal) {
    if (!this.metas.has(id)) {
      const p = getJSON(`/api/p/${id}/meta`, undefined, signal);
      this.metas.set(id, p);
      p.catch(() => this.metas.delete(id));  // an aborted or failed load is asked again next time
    }
    return this.metas.get(id);
  }

  parse() {
    const h = location.hash.replace(/^#\/?/, "");
    const i = h.indexOf("?");
    const path = i >= 0 ? h.slice(0, i) : h, query = i >= 0 ? h.slice(i + 1) : "";
    const params = Object.fromEntries(new URLSearchParams(query));
    const parts = path.split("/").filter(Boolean);
    if (parts[0] === "compare") return { view: "compare", params };
    return { pid: parts[0] || this.firstOk(), view: parts[1] || "trace", params };
  }

  async route() {
    const r = this.parse();
    if (this.ac) this.ac.abort();
    const ac = this.ac = new AbortController();
    if (this.view) { this.view.destroy(); this.view = null; }
    this.main.innerHTML = "";
    this.status("");
    this.viewName = r.view;
    this.help(false);
    document.querySelectorAll("#views a").forEach((a) => a.classList.toggle("active", a.dataset.view === r.view));
    try {
      if (r.view === "compare") {
        this.current = null;
        this.markProfile(null);
        this.setWhat(null);
        this.banners(null);
        const V = await compareView();
        if (ac.signal.aborted) return;
        this.view = new V(this, r.params, ac.signal);
      } else {
        const p = this.profiles.find((x) => x.id === r.pid);
        if (!p) throw new Error(`no profile ${r.pid}`);
        this.current = p.id;
        this.markProfile(p.id);
        if (!p.ok) return this.refusal(p);
        const [meta, V] = await Promise.all([this.meta(p.id, ac.signal), (VIEWS[r.view] || VIEWS.trace)()]);
        if (ac.signal.aborted) return;
        this.setWhat(meta);
        this.banners(meta);
        this.view = new V(this, p, meta, r.params, ac.signal);
      }
      this._stateView = this.view;
      await this.view.mount(this.main);
    } catch (e) {
      this.report(e, ac.signal);
    } finally {
      // go() answers once the view it asked for is drawn: a route left before it finished
      // (another click came) leaves its callers to the route that replaced it
      if (ac === this.ac) { const ws = this._routed; this._routed = []; ws.forEach((f) => f()); }
    }
  }

  // An error of a view: shown unless it is an abort or the view is gone already.
  report(e, signal) {
    if (isAbort(e) || (signal && signal.aborted)) return;
    this.error(e);
  }

  // ---- keys ---------------------------------------------------------------------------------
  key(e) {
    const t = e.target;
    const typing = t && (t.tagName === "INPUT" || t.tagName === "SELECT" || t.tagName === "TEXTAREA");
    if (e.key === "?" && !typing) { this.help(!this._help); e.preventDefault(); return; }
    if (e.key === "Escape" && this._help) { this.help(false); e.preventDefault(); return; }
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (this.view && this.view.key && this.view.key(e, typing)) e.preventDefault();
  }

  help(show) {
    const old = document.querySelector("[data-testid=help]");
    if (old) old.remove();
    this._help = !!show;
    if (!show) return;
    const div = document.createElement("div");
    div.className = "help";
    div.dataset.testid = "help";
    div.innerHTML = `<h3>Keys <span class="muted">(as in Perfetto)</span> <button title="close (Esc)">×</button></h3><table class="kv">` +
      KEYS.map(([k, d]) => `<tr><td><kbd>${esc(k)}</kbd></td><td>${esc(d)}</td></tr>`).join("") + `</table>
      <p class="muted">The address bar holds the view (profile, tab, time window, selection, grouping): Back, reload and a shared link bring it back.</p>`;
    div.querySelector("button").addEventListener("click", () => this.help(false));
    document.body.appendChild(div);
  }

  markProfile(id) {
    document.querySelectorAll("#profiles a").forEach((a) => a.classList.toggle("active", a.dataset.pid === id));
  }

  setWhat(meta) {
    const el = document.getElementById("what");
    if (!meta) { el.innerHTML = ""; return; }
    el.innerHTML = meta.modeled
      ? `<span class="badge modeled" data-testid="modeled-badge">MODELED</span> ${esc(meta.what)}`
      : `<span class="badge measured">MEASURED</span> ${esc(meta.what)}`;
  }

  banners(meta) {
    const el = document.getElementById("banners");
    el.innerHTML = "";
    if (!meta) return;
    const items = [
      ...meta.doctor.map((d) => ({ sev: d.severity, code: d.code, msg: d.message, fix: d.fix })),
      ...meta.warnings.map((w) => ({ sev: "warning", code: "trace", msg: w, fix: "" })),
    ];
    for (const it of items) {
      const key = `${meta.id}:${it.code}:${it.msg}`;
      if (this.dismissed.has(key)) continue;
      const div = document.createElement("div");
      div.className = `banner ${it.sev}`;
      div.dataset.testid = "banner";
      div.innerHTML = `<b>${esc(it.sev)}</b><span>${esc(it.code)}: ${esc(it.msg)}</span>` +
        (it.fix ? `<span class="fix">fix: ${esc(it.fix)}</span>` : "") + `<button title="hide">×</button>`;
      div.querySelector("button").addEventListener("click", () => { this.dismissed.add(key); div.remove(); });
      el.appendChild(div);
    }
  }

  refusal(p) {
    this.setWhat(null);
    this.banners(null);
    this.main.innerHTML = `<div class="error-card" data-testid="refusal"><h2>Cannot open ${esc(p.label)}</h2>
      <p class="mono">${esc(p.path)}</p><p>${esc(p.error)}</p><p><b>Fix:</b> ${esc(p.fix)}</p>
      <p class="muted">The explorer opens tilescope profile directories, Kineto traces (.json / .json.gz), directories of
      per-rank traces, and EXEC.json+ITRACE.json pairs.</p></div>`;
  }

  status(text) { document.getElementById("status").textContent = text; }

  error(e) {
    this.errors.push(String(e && e.message ? e.message : e));
    const div = document.createElement("div");
    div.className = "error-card";
    div.dataset.testid = "error";
    div.innerHTML = `<h2>Something went wrong</h2><p>${esc(e.message || e)}</p>${e.fix ? `<p><b>Fix:</b> ${esc(e.fix)}</p>` : ""}`;
    this.main.prepend(div);
  }
}

const app = new App();
window.tilescope = { app };

// The explorer app: profile tabs, view tabs, hash routing (#/p0/trace, #/p0/device?hash=&run=,
// #/p0/ops, #/p0/summary, #/p0/roofline, #/p0/files, #/compare?ids=p0,p1), banners, status.
import { getJSON } from "./api.js";
import { esc } from "./format.js";
import { TraceView } from "./trace.js";
import { DeviceView } from "./device.js";
import { TablesView } from "./tables.js";
import { SummaryView } from "./summary.js";
import { RooflineView } from "./roofline.js";
import { CompareView } from "./compare.js";
import { FilesView } from "./files.js";

const VIEWS = { trace: TraceView, device: DeviceView, ops: TablesView, summary: SummaryView, roofline: RooflineView, files: FilesView };

class App {
  constructor() {
    this.main = document.getElementById("main");
    this.metas = new Map();
    this.view = null;
    this.dismissed = new Set();
    this.errors = [];
    this.ready = this.start();
  }

  async start() {
    const r = await getJSON("/api/profiles");
    this.profiles = r.profiles;
    this.renderProfiles();
    document.querySelectorAll("#views a").forEach((a) => a.addEventListener("click", (e) => {
      e.preventDefault();
      const v = a.dataset.view;
      if (v === "compare") this.go(`#/compare?ids=${this.profiles.filter((p) => p.ok).map((p) => p.id).join(",")}`);
      else this.go(`#/${this.current || this.firstOk()}/${v}`);
    }));
    window.addEventListener("hashchange", () => this.route());
    await this.route();
  }

  firstOk() { const p = this.profiles.find((x) => x.ok); return p ? p.id : this.profiles[0].id; }

  go(hash) {
    if (location.hash === hash) return this.route();
    location.hash = hash;
    return new Promise((res) => { this._routed = res; });
  }

  renderProfiles() {
    const nav = document.getElementById("profiles");
    nav.innerHTML = this.profiles.map((p) => `<a data-pid="${p.id}" class="${p.ok ? "" : "bad"}" title="${esc(p.path)}">${esc(p.label)}` +
      `${p.ok ? "" : " ⚠"}</a>`).join("");
    nav.querySelectorAll("a").forEach((a) => a.addEventListener("click", () => {
      const v = this.viewName && this.viewName !== "compare" ? this.viewName : "trace";
      this.go(`#/${a.dataset.pid}/${v === "device" ? "device" : v}`);
    }));
  }

  async meta(id) {
    if (!this.metas.has(id)) this.metas.set(id, await getJSON(`/api/p/${id}/meta`));
    return this.metas.get(id);
  }

  parse() {
    const h = location.hash.replace(/^#\/?/, "");
    const [path, query] = h.split("?");
    const params = Object.fromEntries(new URLSearchParams(query || ""));
    const parts = path.split("/").filter(Boolean);
    if (parts[0] === "compare") return { view: "compare", params };
    return { pid: parts[0] || this.firstOk(), view: parts[1] || "trace", params };
  }

  async route() {
    const r = this.parse();
    if (this.view) { this.view.destroy(); this.view = null; }
    this.main.innerHTML = "";
    this.status("");
    this.viewName = r.view;
    document.querySelectorAll("#views a").forEach((a) => a.classList.toggle("active", a.dataset.view === r.view));
    try {
      if (r.view === "compare") {
        this.current = null;
        this.markProfile(null);
        this.setWhat(null);
        this.banners(null);
        this.view = new CompareView(this, r.params);
      } else {
        const p = this.profiles.find((x) => x.id === r.pid);
        if (!p) throw new Error(`no profile ${r.pid}`);
        this.current = p.id;
        this.markProfile(p.id);
        if (!p.ok) return this.refusal(p);
        const meta = await this.meta(p.id);
        this.setWhat(meta);
        this.banners(meta);
        const V = VIEWS[r.view] || TraceView;
        this.view = new V(this, p, meta, r.params);
      }
      await this.view.mount(this.main);
    } catch (e) {
      this.error(e);
    } finally {
      if (this._routed) { const f = this._routed; this._routed = null; f(); }
    }
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

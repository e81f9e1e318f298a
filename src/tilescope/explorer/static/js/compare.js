// Compare two or more profiles: their timelines on one shared time scale — aligned on their
// device work (each one's first device event at 0; a simulated device's host waits collapsed),
// at the first profiler step, or at each trace's start — plus the diff: summary per profile,
// the fusion findings ("6 aten ops became 1 execution"), ops and regions side by side.
import { getJSON, Gone } from "./api.js";
import { bytes, esc, ns as fmtNs } from "./format.js";
import { Timeline } from "./timeline.js";
import { DataTable } from "./tables.js";

const ALIGN = { device: "device work", step: "first profiler step", start: "trace start" };

// The finding in the explorer's units (µs, MiB), from its fields.
export function fusionText(f) {
  const ops = (d) => Object.entries(d).sort().map(([k, v]) => (v !== 1 ? `${k} x${v}` : k)).join(", ");
  const n = Object.values(f.before_ops).reduce((a, b) => a + b, 0);
  const sign = (v, fmt) => (v >= 0 ? "+" : "−") + fmt(Math.abs(v));
  const parts = [`${sign(f.after_executions - f.before_executions, (v) => String(v))} executions`];
  if (f.before_bytes !== null && f.after_bytes !== null) parts.push(`${sign(f.after_bytes - f.before_bytes, bytes)} HBM traffic`);
  parts.push(`${sign(f.after_device_ns - f.before_device_ns, fmtNs)} device time`);
  const where = { "(step)": "Per step", "(trace)": "In the trace" }[f.region] || `In ${f.region}`;
  return `${where}: ${n} ops (${ops(f.before_ops)}) ran as ${f.before_executions} device executions in ${f.base}; ` +
    `in ${f.other} they became ${f.after_executions} (${ops(f.after_ops)}): ${parts.join(", ")}${f.modeled ? " (modeled)" : ""}`;
}

export class CompareView {
  constructor(app, params, signal) {
    this.app = app;
    this.signal = signal;
    this.params = params;
    const ok = app.profiles.filter((p) => p.ok).map((p) => p.id);
    this.ids = [...new Set((params.ids ? params.ids.split(",") : ok).filter((i) => ok.includes(i)))].slice(0, 8);
    this.align = ALIGN[params.align] ? params.align : "device";
    this.el = document.createElement("div");
    this.el.className = "split compare";
    this.el.dataset.testid = "compare";
    this.timelines = [];
  }

  urlState() {
    const tl = this.timelines[0];
    return { ids: this.ids.join(","), align: this.align !== "device" ? this.align : null,
      t0: tl ? Math.round(tl.t0) : this.params.t0, t1: tl ? Math.round(tl.t1) : this.params.t1 };
  }

  _alive() { if (this.signal.aborted || this.dead) throw new Gone(); }

  async mount(main) {
    main.appendChild(this.el);
    const picks = this.app.profiles.map((p) => `<label><input type="checkbox" value="${p.id}" ${this.ids.includes(p.id) ? "checked" : ""} ${p.ok ? "" : "disabled"}> ${esc(p.label)}</label>`).join(" ");
    this.el.innerHTML = `<div class="toolbar"><label>profiles</label>${picks}
      <label>align at</label><select data-testid="align">${Object.entries(ALIGN).map(([k, v]) => `<option value="${k}">${v}</option>`).join("")}</select>
      <button data-act="reset">whole traces</button><button data-act="device">device work</button><span class="hint">one zoom and pan for all; same scale</span></div>
      <div data-role="lanes" class="compare-lanes"></div>
      <div class="panel compare-diff" data-role="diff"><div class="loading">Comparing…</div></div>`;
    this.el.querySelector("[data-testid=align]").value = this.align;
    this.el.querySelector("[data-testid=align]").addEventListener("change", (e) => this.app.go(`#/compare?ids=${this.ids.join(",")}&align=${e.target.value}`));
    this.el.querySelectorAll("input[type=checkbox]").forEach((c) => c.addEventListener("change", () => {
      const ids = [...this.el.querySelectorAll("input[type=checkbox]:checked")].map((x) => x.value);
      this.app.go(`#/compare?ids=${ids.join(",")}&align=${this.align}`);
    }));
    this.el.querySelector("[data-act=reset]").addEventListener("click", () => this.resetAll());
    this.el.querySelector("[data-act=device]").addEventListener("click", () => this.start &&
      Promise.all(this.timelines.map((tl) => tl.setRange(this.start[0], this.start[1], { fromLink: true }))).then(() => this.app.saveState()));
    const diffEl = this.el.querySelector("[data-role=diff]");
    if (this.ids.length < 2) {
      diffEl.innerHTML = `<p class="muted" data-testid="compare-need-two">Open two or more profiles (tilescope explore A B ...) and tick at least two to compare.</p>`;
      return;
    }
    // the timelines first (their metadata is at hand), the diff when it is computed
    const metas = await Promise.all(this.ids.map((id) => this.app.meta(id, this.signal)));
    this._alive();
    this.buildTimelines(metas);
    const cmpP = getJSON("/api/compare", { ids: this.ids.join(",") }, this.signal);
    const drawn = Promise.all(this.timelines.map((tl) => tl.setRange(this.first[0], this.first[1], { fromLink: true })));
    const cmp = await cmpP;
    this._alive();
    this.cmp = cmp;
    this.renderDiff(diffEl, cmp);
    await drawn;
  }

  offsetOf(m) {
    if (this.align === "device") return m.first_device_ns ?? m.first_step_ns ?? 0;
    if (this.align === "step") return m.first_step_ns ?? 0;
    return 0;
  }

  buildTimelines(metas) {
    const lanesEl = this.el.querySelector("[data-role=lanes]");
    const labels = this.ids.map((id) => this.app.profiles.find((p) => p.id === id));
    // every profile's lanes on screen: the lanes area is shared out, each gets what it needs up to its share
    const avail = Math.max(240, lanesEl.clientHeight || window.innerHeight * 0.5);
    const per = Math.max(70, Math.floor(avail / this.ids.length) - 52);
    const tls = metas.map((m, i) => {
      const p = labels[i];
      const box = document.createElement("div");
      box.className = "compare-box";
      box.dataset.testid = "compare-profile";
      lanesEl.appendChild(box);
      const tl = new Timeline(box, {
        base: `/api/p/${p.id}`, meta: m, offset: this.offsetOf(m), aligned: true, signal: this.signal, compact: true,
        title: `${esc(p.label)} <span class="badge ${m.modeled ? "modeled" : "measured"}">${m.modeled ? "modeled" : "measured"}</span> <span class="muted">${esc(m.what)}</span>`,
        onRange: (t0, t1, src) => this.sync(t0, t1, src),
        onStatus: (t) => this.app.status(`${p.label}: ${t}`),
        onError: (e) => this.app.report(e, this.signal),
        onChange: () => this.app.saveState(),
      });
      tl.root.style.flex = "none";
      tl.tracks.style.flex = "none";
      tl.tracks.style.height = `${Math.min(tl.totalH, per)}px`;
      return tl;
    });
    this.timelines = tls;
    // one scale for all: the union of their (collapsed) ranges
    const lo = Math.min(...tls.map((tl) => tl.wholeRange()[0])), hi = Math.max(...tls.map((tl) => tl.wholeRange()[1]));
    const pad = 0.02 * (hi - lo);
    tls.forEach((tl) => { tl.opts.bounds = [lo - pad, hi + pad]; });
    this.range = [lo, hi];
    // open on the device work: from the first device event to the last one of any profile
    const ends = tls.map((tl, i) => (metas[i].device_end_ns !== null && metas[i].device_end_ns !== undefined ? tl.viewOf(metas[i].device_end_ns) : -Infinity));
    const starts = tls.map((tl, i) => (metas[i].first_device_ns !== null && metas[i].first_device_ns !== undefined ? tl.viewOf(metas[i].first_device_ns) : Infinity));
    const a = Math.min(...starts), b = Math.max(...ends);
    this.start = Number.isFinite(a) && Number.isFinite(b) && b > a ? [a - 0.03 * (b - a), b + 0.03 * (b - a)] : this.range;
    const t0 = Number(this.params.t0), t1 = Number(this.params.t1);
    this.first = this.params.t0 !== undefined && Number.isFinite(t0) && Number.isFinite(t1) && t1 > t0 ? [t0, t1] : this.start;
  }

  sync(t0, t1, src) {
    for (const tl of this.timelines) if (tl !== src) tl.setRange(t0, t1, { fromLink: true });
  }

  resetAll() {
    if (!this.range) return Promise.resolve();
    return Promise.all(this.timelines.map((tl) => tl.setRange(this.range[0], this.range[1], { fromLink: true }))).then(() => this.app.saveState());
  }

  key(e, typing) {
    if (typing || !this.timelines.length) return false;
    const k = e.key.toLowerCase();
    const src = this.timelines.find((tl) => tl.pointerX !== null) || this.timelines[0];
    if (!["w", "s", "a", "d", "0"].includes(k)) return false;
    if (k === "0") { this.resetAll(); return true; }
    return src.key(e);  // its onRange moves the others
  }

  renderDiff(el, cmp) {
    const labels = Object.fromEntries(cmp.profiles.map((p) => [p.label, p.label]));
    const findings = (cmp.diff.fusion || []).map((f) => `<div class="finding" data-testid="fusion-finding">${esc(fusionText(f))}</div>`).join("");
    el.innerHTML = `<h3>Diff ${cmp.diff.per_step ? "<span class=muted>(per profiler step)</span>" : ""}</h3>
      ${findings || `<p class="muted">No fusion finding: the compared profiles run the same ops in each region.</p>`}
      <div class="compare-tables"><div data-role="summary"><h4>Summary</h4></div><div data-role="regions"><h4>Regions</h4></div></div>
      <h3>Ops</h3><div data-role="ops" class="scroll-x"></div>`;
    // a summary row's unit is in its metric's name ("span ns"): its cells are times
    const asTime = (row) => /(^|\W)ns(\W|$)/.test(String(row[0]));
    el.querySelector("[data-role=summary]").appendChild(new DataTable(cmp.summary, { testid: "compare-summary", labels,
      format: (row, ci, v) => (ci > 0 && typeof v === "number" && asTime(row) ? fmtNs(v) : null) }).el);
    el.querySelector("[data-role=regions]").appendChild(new DataTable(cmp.regions, { testid: "compare-regions", labels }).el);
    const deltaCol = cmp.ops.columns.find((c) => c.startsWith("delta_device_ns"));
    el.querySelector("[data-role=ops]").appendChild(new DataTable(cmp.ops, { testid: "compare-ops", sort: deltaCol, desc: false, labels }).el);
  }

  destroy() { this.dead = true; this.timelines.forEach((t) => t.destroy()); this.el.remove(); }
}

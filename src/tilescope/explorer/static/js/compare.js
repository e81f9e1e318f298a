// Compare two or more profiles: their timelines on one shared time scale (aligned at the first
// profiler step, or at each trace's start), plus the diff: summary per profile, the fusion
// findings ("6 aten ops became 1 execution"), ops and regions side by side.
import { getJSON } from "./api.js";
import { esc } from "./format.js";
import { Timeline } from "./timeline.js";
import { DataTable } from "./tables.js";

export class CompareView {
  constructor(app, params) {
    this.app = app;
    const ok = app.profiles.filter((p) => p.ok).map((p) => p.id);
    this.ids = (params.ids ? params.ids.split(",") : ok).filter((i) => ok.includes(i));
    this.align = params.align || "step";
    this.el = document.createElement("div");
    this.el.className = "split";
    this.el.dataset.testid = "compare";
    this.timelines = [];
  }

  async mount(main) {
    main.appendChild(this.el);
    const picks = this.app.profiles.map((p) => `<label><input type="checkbox" value="${p.id}" ${this.ids.includes(p.id) ? "checked" : ""} ${p.ok ? "" : "disabled"}> ${esc(p.label)}</label>`).join(" ");
    this.el.innerHTML = `<div class="toolbar"><label>profiles</label>${picks}
      <label>align at</label><select data-testid="align"><option value="step">first profiler step</option><option value="start">trace start</option></select>
      <button data-act="reset">whole traces</button><button data-act="device">device work</button><span class="hint">one zoom and pan for all; same scale</span></div>
      <div class="split" data-role="lanes" style="flex:1.3;overflow:auto"></div>
      <div class="panel" style="height:40%" data-role="diff"><div class="loading">Comparing…</div></div>`;
    this.el.querySelector("[data-testid=align]").value = this.align;
    this.el.querySelector("[data-testid=align]").addEventListener("change", (e) => this.app.go(`#/compare?ids=${this.ids.join(",")}&align=${e.target.value}`));
    this.el.querySelectorAll("input[type=checkbox]").forEach((c) => c.addEventListener("change", () => {
      const ids = [...this.el.querySelectorAll("input[type=checkbox]:checked")].map((x) => x.value);
      this.app.go(`#/compare?ids=${ids.join(",")}&align=${this.align}`);
    }));
    this.el.querySelector("[data-act=reset]").addEventListener("click", () => this.resetAll());
    this.el.querySelector("[data-act=device]").addEventListener("click", () => this.start &&
      Promise.all(this.timelines.map((tl) => tl.setRange(this.start[0], this.start[1], { fromLink: true }))));
    const diffEl = this.el.querySelector("[data-role=diff]");
    if (this.ids.length < 2) {
      diffEl.innerHTML = `<p class="muted" data-testid="compare-need-two">Open two or more profiles (tilescope explore A B ...) and tick at least two to compare.</p>`;
      return;
    }
    const cmp = await getJSON("/api/compare", { ids: this.ids.join(",") });
    this.cmp = cmp;
    const metas = await Promise.all(this.ids.map((id) => this.app.meta(id)));
    const useStep = this.align === "step" && cmp.profiles.every((p) => p.first_step_ns !== null);
    const lanesEl = this.el.querySelector("[data-role=lanes]");
    const maxSpan = Math.max(...cmp.profiles.map((p) => p.span_ns - (useStep ? p.first_step_ns : 0)));
    this.range = [useStep ? -Math.max(...cmp.profiles.map((p) => p.first_step_ns)) : 0, maxSpan];
    // open on the device work: up to the last device event of any profile (host waits can be long)
    const devEnd = Math.max(...metas.map((m, i) => {
      const ends = m.lanes.filter((l) => l.side === "device").map((l) => l.last_ns - m.origin_ns);
      return ends.length ? Math.max(...ends) - (useStep ? cmp.profiles[i].first_step_ns : 0) : -Infinity;
    }));
    this.start = Number.isFinite(devEnd) && devEnd > this.range[0] ? [this.range[0], devEnd * 1.05] : this.range;
    for (const [i, id] of this.ids.entries()) {
      const p = cmp.profiles[i];
      const box = document.createElement("div");
      box.style.flex = "none";
      box.style.display = "flex";
      box.style.flexDirection = "column";
      lanesEl.appendChild(box);
      const tl = new Timeline(box, {
        base: `/api/p/${id}`, meta: metas[i], offset: useStep ? p.first_step_ns : 0, aligned: useStep,
        bounds: [this.range[0] - 0.02 * (this.range[1] - this.range[0]), this.range[1] + 0.02 * (this.range[1] - this.range[0])],
        title: `${esc(p.label)} <span class="badge ${p.modeled ? "modeled" : "measured"}">${p.modeled ? "modeled" : "measured"}</span> <span class="muted">${esc(p.what)}</span>`,
        onRange: (t0, t1, src) => this.sync(t0, t1, src),
        onStatus: (t) => this.app.status(`${p.label}: ${t}`),
        onError: (e) => this.app.error(e),
      });
      tl.root.style.flex = "none";
      tl.tracks.style.flex = "none";
      tl.tracks.style.height = `${Math.min(tl.totalH, 260)}px`;
      this.timelines.push(tl);
    }
    this.renderDiff(diffEl, cmp);
    await Promise.all(this.timelines.map((tl) => tl.setRange(this.start[0], this.start[1], { fromLink: true })));
  }

  sync(t0, t1, src) {
    for (const tl of this.timelines) if (tl !== src) tl.setRange(t0, t1, { fromLink: true });
  }

  resetAll() {
    if (!this.range) return Promise.resolve();
    return Promise.all(this.timelines.map((tl) => tl.setRange(this.range[0], this.range[1], { fromLink: true })));
  }

  renderDiff(el, cmp) {
    const findings = (cmp.diff.fusion || []).map((f) => `<div class="finding" data-testid="fusion-finding">${esc(f.text)}</div>`).join("");
    el.innerHTML = `<h3>Diff ${cmp.diff.per_step ? "<span class=muted>(per profiler step)</span>" : ""}</h3>
      ${findings || `<p class="muted">No fusion finding: the compared profiles run the same ops in each region.</p>`}
      <div class="cols"><div data-role="summary"></div><div data-role="regions"></div></div>
      <h3>Ops</h3><div data-role="ops"></div>`;
    el.querySelector("[data-role=summary]").appendChild(new DataTable(cmp.summary, { testid: "compare-summary" }).el);
    el.querySelector("[data-role=regions]").appendChild(new DataTable(cmp.regions, { testid: "compare-regions" }).el);
    const deltaCol = cmp.ops.columns.find((c) => c.startsWith("delta_device_ns"));
    el.querySelector("[data-role=ops]").appendChild(new DataTable(cmp.ops, { testid: "compare-ops", sort: deltaCol, desc: false }).el);
  }

  destroy() { this.timelines.forEach((t) => t.destroy()); this.el.remove(); }
}

// The system trace view: toolbar (grouping, colour, search), the timeline, and the panel below
// it (event details, the event's lifecycle chain, or a box selection's summary).
import { getJSON } from "./api.js";
import { esc, laneTimesModeled, ns as fmtNs, pct } from "./format.js";
import { GROUPINGS, Timeline } from "./timeline.js";

export class TraceView {
  constructor(app, profile, meta) {
    this.app = app;
    this.profile = profile;
    this.meta = meta;
    this.base = `/api/p/${profile.id}`;
    this.el = document.createElement("div");
    this.el.className = "split";
    this.el.innerHTML = `
      <div class="toolbar">
        <label>group</label><select data-testid="group">${Object.entries(GROUPINGS).map(([k, g]) => `<option value="${k}">${esc(g.label)}</option>`).join("")}</select>
        <label>colour by</label><select data-testid="color"><option value="op">op</option><option value="name">name</option><option value="kind">kind</option></select>
        <input type="search" placeholder="highlight names…" data-testid="search" size="22">
        <button data-act="in" title="zoom in (W, ctrl+wheel)">+</button><button data-act="out" title="zoom out (S)">−</button>
        <button data-act="reset" title="whole trace (0)">whole trace</button>
        <span class="hint">ctrl+wheel / W S zoom · drag / A D pan · shift+drag select · click an event for its lifecycle</span>
      </div>
      <div class="split" data-role="tl"></div>
      <div class="panel" data-testid="panel"><span class="muted">Click an event to see its details and its whole chain (framework op → runtime → hardware → instructions). Shift+drag to summarise a region.</span></div>`;
    this.panel = this.el.querySelector("[data-testid=panel]");
    this.timeline = new Timeline(this.el.querySelector("[data-role=tl]"), {
      base: this.base, meta,
      onSelect: (ref) => this.showEvent(ref),
      onBox: (b) => this.showBox(b),
      onStatus: (t) => app.status(t),
      onError: (e) => app.error(e),
    });
    const q = (s) => this.el.querySelector(s);
    q("[data-testid=group]").addEventListener("change", (e) => this.timeline.setGrouping(e.target.value));
    q("[data-testid=color]").addEventListener("change", (e) => this.timeline.setColor(e.target.value));
    q("[data-testid=search]").addEventListener("input", (e) => this.search(e.target.value));
    this.el.querySelectorAll("button[data-act]").forEach((b) => b.addEventListener("click", () => {
      const a = b.dataset.act;
      if (a === "in") this.timeline.zoom(0.5);
      else if (a === "out") this.timeline.zoom(2);
      else this.timeline.reset();
    }));
  }

  mount(main) {
    if (!this.meta.lanes.length) {
      // an executable + instruction trace pair has no system trace: its execution is the device view
      this.timeline.destroy();
      this.el.innerHTML = `<div class="page" data-testid="no-lanes"><h2>No system trace in ${esc(this.profile.label)}</h2>
        <p class="muted">This source holds ${this.meta.executions} modeled execution(s) and no framework / runtime / hardware lanes
        (an executable + instruction-trace pair). <a href="#/${this.profile.id}/device">Open the device view →</a></p></div>`;
      main.appendChild(this.el);
      return Promise.resolve();
    }
    main.appendChild(this.el);
    // the keys (W/S zoom, A/D pan, 0 reset) work at once, without a click on the timeline first
    this.timeline.canvas.focus({ preventScroll: true });
    return this.timeline.refresh();
  }

  async search(text) {
    clearTimeout(this._st);
    this._st = setTimeout(async () => {
      if (!text) return this.timeline.setSearch(null);
      const r = await getJSON(`${this.base}/search`, { q: text });
      this.timeline.setSearch(r.ids);
      this.app.status(`${r.ids.length} names match “${text}”`);
    }, 150);
  }

  laneName(lane) {
    const l = this.meta.lanes.find((x) => x.lane === lane);
    return l ? `${l.subsystem}/${l.identifier}` : `lane ${lane}`;
  }

  async selectEid(eid) {
    const ev = await getJSON(`${this.base}/event`, { eid });
    if (ev.ref !== null) {
      this.timeline.select(ev.ref);
      this.timeline.scrollToLane(ev.lane, ev.depth || 0);
      await this.timeline.zoomTo(ev.start_ns, ev.dur_ns || 0);
    }
    return this.showEvent(ev.ref, ev);
  }

  async showEvent(ref, evGiven) {
    if (ref === null || ref === undefined) {
      this.timeline.setChain([]);
      return;
    }
    this.panel.innerHTML = `<span class="muted">Loading the event and its lifecycle…</span>`;
    const [ev, lin] = await Promise.all([evGiven ? Promise.resolve(evGiven) : getJSON(`${this.base}/event`, { ref }),
      getJSON(`${this.base}/lineage`, { ref })]);
    this.timeline.setChain(lin.hops.filter((h) => h.hop !== "parent" && h.lane !== undefined));
    const modeled = laneTimesModeled(this.meta, this.meta.lanes.find((x) => x.lane === ev.lane) || { side: ev.side });
    const args = Object.entries(ev.args || {}).slice(0, 40).map(([k, v]) =>
      `<tr><td>${esc(k)}</td><td class="mono">${esc(typeof v === "object" ? JSON.stringify(v) : v)}</td></tr>`).join("");
    const hops = this.renderHops(lin.hops);
    this.panel.innerHTML = `
      <div class="cols">
        <div data-testid="details">
          <h3>${esc(ev.name)} ${modeled ? '<span class="badge modeled">modeled</span>' : ""}</h3>
          <table class="kv">
            <tr><td>lane</td><td>${esc(this.laneName(ev.lane))}</td></tr>
            <tr><td>kind / category</td><td>${esc(ev.kind)} / ${esc(ev.cat ?? "–")}</td></tr>
            <tr><td>start</td><td>${fmtNs(ev.start_ns)} from trace start</td></tr>
            <tr><td>duration</td><td>${fmtNs(ev.dur_ns)}</td></tr>
            <tr><td>eid</td><td class="mono">${ev.eid}</td></tr>
            ${args}
          </table>
        </div>
        <div data-testid="lifecycle">
          <h3>Lifecycle <span class="muted">(${lin.hops.filter((h) => h.hop !== "parent").length} hops)</span></h3>
          ${hops}
        </div>
      </div>`;
    this.panel.querySelectorAll("[data-hop]").forEach((li) => li.addEventListener("click", (e) => {
      if (e.target.dataset.device) return;
      const h = lin.hops[Number(li.dataset.hop)];
      if (h.lane !== undefined && h.lane !== null) this.timeline.scrollToLane(h.lane, h.depth || 0);
      if (h.start_ns !== undefined && h.start_ns !== null) this.timeline.zoomTo(h.start_ns, h.dur_ns || 0);
    }));
    this.panel.querySelectorAll("[data-device]").forEach((b) => b.addEventListener("click", () => {
      const [hash, run] = b.dataset.device.split(":");
      this.app.go(`#/${this.profile.id}/device?hash=${hash}&run=${run}`);
    }));
  }

  renderHops(hops) {
    let prev = null;
    const items = hops.map((h, i) => {
      if (h.hop === "instructions") {
        const link = h.device_view ? `<button data-device="${h.device_view.hash}:${h.device_view.run}" data-testid="open-device">device view →</button>` : "";
        return `<li data-hop="${i}" data-kind="instructions"><span class="hop">instructions</span>${h.instructions.toLocaleString()} instructions on ${h.engines} engines, ` +
          `${fmtNs(h.span_ns)} <span class="badge modeled">modeled</span> ${link}</li>`;
      }
      const lane = this.laneName(h.lane);
      let delta = "";
      if (prev && h.hop !== "parent" && prev.start_ns !== undefined) {
        delta = `<span class="delta">+${fmtNs(h.start_ns - prev.start_ns)} after the ${esc(prev.hop)} started` +
          (prev.dur_ns !== null && h.start_ns >= prev.start_ns + prev.dur_ns ? `, ${fmtNs(h.start_ns - prev.start_ns - prev.dur_ns)} after it ended` : "") + "</span>";
      }
      if (h.hop !== "parent") prev = h;
      const dev = h.device_view ? ` <button data-device="${h.device_view.hash}:${h.device_view.run}" data-testid="open-device">device view →</button>` : "";
      const hopLane = this.meta.lanes.find((x) => x.lane === h.lane);
      const modeled = h.hop !== "parent" && laneTimesModeled(this.meta, hopLane) ? ' <span class="badge modeled">modeled</span>' : "";
      return `<li data-hop="${i}" data-kind="${esc(h.hop)}" data-lane-subsystem="${esc((hopLane || {}).subsystem || "")}">` +
        `<span class="hop">${esc(h.hop)}</span><b>${esc(h.name)}</b> <span class="muted">${esc(lane)}</span><br>` +
        `${fmtNs(h.start_ns)} · ${fmtNs(h.dur_ns)}${modeled}${delta}${dev}</li>`;
    });
    return `<ul class="hops" data-testid="hops">${items.join("")}</ul>`;
  }

  async showBox(b) {
    const r = await getJSON(`${this.base}/select`, { t0: b.t0, t1: b.t1, lanes: b.lanes.join(",") });
    const names = r.by_name.map((n) => `<tr><td class="text">${esc(n.name)}</td><td>${n.count.toLocaleString()}</td><td>${fmtNs(n.time_ns)}</td></tr>`).join("");
    const lanes = r.by_lane.map((l) => `<tr><td class="text">${esc(this.laneName(l.lane))}</td><td>${l.events.toLocaleString()}</td><td>${fmtNs(l.busy_ns)}</td><td>${pct(l.busy_share)}</td></tr>`).join("");
    this.panel.innerHTML = `
      <div data-testid="box-summary">
        <h3>Selection: ${fmtNs(r.t1 - r.t0)} (${fmtNs(r.t0)} – ${fmtNs(r.t1)}), ${r.events.toLocaleString()} events
          ${this.meta.modeled ? '<span class="badge modeled">device and runtime times modeled</span>' : ""} <button data-act="clear">clear</button></h3>
        <div class="cols">
          <div><table class="data"><tr><th class="text">name</th><th>events</th><th>time in selection</th></tr>${names}</table></div>
          <div><table class="data"><tr><th class="text">lane</th><th>events</th><th>busy (top level)</th><th>busy share</th></tr>${lanes}</table></div>
        </div>
      </div>`;
    this.panel.querySelector("[data-act=clear]").addEventListener("click", () => { this.timeline.clearBox(); this.panel.innerHTML = ""; });
  }

  destroy() { this.timeline.destroy(); this.el.remove(); }
}

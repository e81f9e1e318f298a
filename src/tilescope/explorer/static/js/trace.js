// The system trace view: toolbar (grouping, colour, search, waits), the timeline, and the panel
// below it (event details, the event's lifecycle, or a box selection's summary). Its state —
// time window, selection, grouping, colour, search, mark, collapsed waits — lives in the URL.
import { getJSON, isAbort } from "./api.js";
import { esc, laneTimesModeled, ns as fmtNs, pct } from "./format.js";
import { GROUPINGS, Timeline } from "./timeline.js";

const num = (v) => (v === undefined || v === null || v === "" || Number.isNaN(Number(v)) ? null : Number(v));

export class TraceView {
  constructor(app, profile, meta, params = {}, signal) {
    this.app = app;
    this.profile = profile;
    this.meta = meta;
    this.params = params;
    this.signal = signal;
    this.base = `/api/p/${profile.id}`;
    this.ev = null;            // the selected event (details)
    this.page = num(params.page) || 0;
    this.query = params.q || "";
    this.exact = params.exact === "1";
    this.match = null;         // {index, total, ref, start} of the last match jumped to
    const waits = (meta.waits || []).length > 0;
    this.el = document.createElement("div");
    this.el.className = "split";
    this.el.innerHTML = `
      <div class="toolbar">
        <label>group</label><select data-testid="group">${Object.entries(GROUPINGS).map(([k, g]) => `<option value="${k}">${esc(g.label)}</option>`).join("")}</select>
        <label>colour by</label><select data-testid="color"><option value="op">op</option><option value="name">name</option><option value="kind">kind</option></select>
        <input type="search" placeholder="find names… (Enter: next)" data-testid="search" size="24">
        <span data-role="matches" class="muted"></span>
        <button data-act="in" title="zoom in (W)">+</button><button data-act="out" title="zoom out (S)">−</button>
        <button data-act="reset" title="whole trace (0)">whole trace</button>
        ${waits ? `<label title="the host's waits for the simulator's numerics after the modeled device work was done"><input type="checkbox" data-testid="collapse-waits"> collapse host waits</label>` : ""}
        <span class="hint">W/S zoom · A/D pan · shift+drag select · m mark · Esc clear · <a href="#" data-act="help">? keys</a></span>
      </div>
      <div class="split" data-role="tl"></div>
      <div class="panel" data-testid="panel"><span class="muted">Click an event to see its details and its whole chain (framework op → runtime → hardware → instructions). Shift+drag to summarise a region.</span></div>`;
    this.panel = this.el.querySelector("[data-testid=panel]");
    this.timeline = new Timeline(this.el.querySelector("[data-role=tl]"), {
      base: this.base, meta, signal,
      collapse: waits ? params.waits !== "show" : false,
      onSelect: (ref) => this.showEvent(ref),
      onBox: (b) => this.showBox(b),
      onStatus: (t) => app.status(t),
      onError: (e) => app.report(e, signal),
      onChange: () => app.saveState(),
      onWait: () => this.setCollapse(!this.timeline.collapse),
    });
    const q = (s) => this.el.querySelector(s);
    const group = GROUPINGS[params.group] ? params.group : "instance";
    const color = ["op", "name", "kind"].includes(params.color) ? params.color : "op";
    this.timeline.group = group;
    this.timeline.color = color;
    this.timeline.layout();
    q("[data-testid=group]").value = group;
    q("[data-testid=color]").value = color;
    q("[data-testid=search]").value = this.query;
    q("[data-testid=group]").addEventListener("change", (e) => this.timeline.setGrouping(e.target.value));
    q("[data-testid=color]").addEventListener("change", (e) => this.timeline.setColor(e.target.value));
    q("[data-testid=search]").addEventListener("input", (e) => { this.exact = false; this.search(e.target.value); });
    const cw = q("[data-testid=collapse-waits]");
    if (cw) {
      cw.checked = this.timeline.collapse;
      cw.addEventListener("change", () => this.setCollapse(cw.checked));
    }
    this.el.querySelectorAll("[data-act]").forEach((b) => b.addEventListener("click", (e) => {
      const a = b.dataset.act;
      if (a === "in") this.timeline.zoom(0.5);
      else if (a === "out") this.timeline.zoom(2);
      else if (a === "reset") this.timeline.reset();
      else if (a === "help") { e.preventDefault(); this.app.help(true); }
    }));
    if (params.mark && /^\d+-\d+$/.test(params.mark)) this.timeline.mark = params.mark.split("-").map(Number);
  }

  setCollapse(on) {
    const cw = this.el.querySelector("[data-testid=collapse-waits]");
    if (cw) cw.checked = on;
    return this.timeline.setCollapse(on);
  }

  urlState() {
    const tl = this.timeline;
    return {
      t0: Math.round(tl.realOf(tl.t0)), t1: Math.round(tl.realOf(tl.t1)),
      sel: this.ev ? this.ev.eid : null,
      page: this.ev && this.page ? this.page : null,
      group: tl.group !== "instance" ? tl.group : null,
      color: tl.color !== "op" ? tl.color : null,
      q: this.query || null, exact: this.query && this.exact ? 1 : null,
      waits: (this.meta.waits || []).length && !tl.collapse ? "show" : null,
      mark: tl.mark ? `${Math.round(tl.mark[0])}-${Math.round(tl.mark[1])}` : null,
    };
  }

  async mount(main) {
    if (!this.meta.lanes.length) {
      // an executable + instruction trace pair has no system trace: its execution is the device view
      this.timeline.destroy();
      this.el.innerHTML = `<div class="page" data-testid="no-lanes"><h2>No system trace in ${esc(this.profile.label)}</h2>
        <p class="muted">This source holds ${this.meta.executions} modeled execution(s) and no framework / runtime / hardware lanes
        (an executable + instruction-trace pair). <a href="#/${this.profile.id}/device">Open the device view →</a></p></div>`;
      main.appendChild(this.el);
      return;
    }
    main.appendChild(this.el);
    // the keys (W/S zoom, A/D pan, 0 reset) work at once, without a click on the timeline first
    this.timeline.canvas.focus({ preventScroll: true });
    const p = this.params, tl = this.timeline;
    const t0 = num(p.t0), t1 = num(p.t1);
    const restore = [];
    if (t0 !== null && t1 !== null && t1 > t0) [tl.t0, tl.t1] = tl.clampRange(tl.viewOf(t0), tl.viewOf(t1));
    if (this.query) restore.push(this.search(this.query, { now: true }));
    if (p.sel) restore.push(this.selectEid(Number(p.sel), { zoom: t0 === null }));
    else if (this.query && p.find === "1") restore.push(this.nextMatch(1, { from: -Infinity }));
    await Promise.all([tl.refresh(), ...restore]);
  }

  // ---- keys ---------------------------------------------------------------------------------
  key(e, typing) {
    const search = this.el.querySelector("[data-testid=search]");
    if (typing) {
      if (e.target !== search) return false;
      if (e.key === "Enter") { this.query = search.value; this.nextMatch(e.shiftKey ? -1 : 1); return true; }
      if (e.key === "Escape") { search.blur(); this.timeline.canvas.focus({ preventScroll: true }); return true; }
      return false;
    }
    if (e.key === "Enter" && this.query) { this.nextMatch(e.shiftKey ? -1 : 1); return true; }
    if (e.key === "Escape") { this.clear(); return true; }
    if (e.key === "/") { search.focus(); return true; }
    if (e.key === "m" || e.key === "M") { this.toggleMark(); return true; }
    return this.timeline.key(e);
  }

  clear() {
    const tl = this.timeline;
    tl.selected = null;
    tl.setChain([]);
    tl.clearBox();
    tl.setMark(null);
    this.ev = null;
    this.page = 0;
    if (this._evAc) this._evAc.abort();
    this.panel.innerHTML = `<span class="muted">Selection cleared. Click an event for its lifecycle; ? lists the keys.</span>`;
    this.app.saveState();
  }

  toggleMark() {
    const tl = this.timeline;
    let span = null;
    if (this.ev) span = [this.ev.start_ns, this.ev.start_ns + (this.ev.dur_ns || 0)];
    else if (tl.boxSel) span = [tl.boxSel.t0, tl.boxSel.t1];
    if (!span || (tl.mark && tl.mark[0] === span[0] && tl.mark[1] === span[1])) tl.setMark(null);
    else tl.setMark(span);
    this.app.status(tl.mark ? `marked ${fmtNs(tl.mark[1] - tl.mark[0])} (${fmtNs(tl.mark[0])} – ${fmtNs(tl.mark[1])}); m again removes it` : "mark removed");
  }

  // ---- search -------------------------------------------------------------------------------
  search(text, opts = {}) {
    clearTimeout(this._st);
    this.query = text;
    this.match = null;
    const run = async () => {
      if (!text) { this.timeline.setSearch(null); this._matches(""); this.app.saveState(); return; }
      try {
        const r = await getJSON(`${this.base}/search`, { q: text, exact: this.exact ? 1 : 0 }, this.signal);
        if (this.query !== text) return;
        this.timeline.setSearch(r.ids);
        // a match already found (a row opened from a table) keeps its "i of n"
        if (!this.match) this._matches(`${r.ids.length.toLocaleString()} name${r.ids.length === 1 ? "" : "s"} · Enter: next`);
        this.app.saveState();
      } catch (e) { this.app.report(e, this.signal); }
    };
    if (opts.now) return run();
    this._st = setTimeout(run, 150);
    return Promise.resolve();
  }

  _matches(text) { this.el.querySelector("[data-role=matches]").textContent = text; }

  // Jumps to the next (dir 1) or previous (-1) event whose name matches the search, after the
  // last match (or the view's start), and selects it.
  async nextMatch(dir, opts = {}) {
    if (!this.query) return null;
    const tl = this.timeline;
    const from = opts.from !== undefined ? opts.from : this.match ? this.match.start : (dir > 0 ? tl.realOf(tl.t0) : tl.realOf(tl.t1));
    const params = { q: this.query, dir, exact: this.exact ? 1 : 0 };
    if (Number.isFinite(from)) params.t = Math.round(from);
    if (this.match && opts.from === undefined) params.ref = this.match.ref;
    try {
      const r = await getJSON(`${this.base}/match`, params, this.signal);
      if (!r.match) { this._matches(`no event matches “${this.query}”`); return null; }
      const m = r.match;
      this.match = { ref: m.ref, start: m.start, index: r.index, total: r.total };
      this._matches(`${(r.index + 1).toLocaleString()} of ${r.total.toLocaleString()} · Enter / Shift+Enter`);
      tl.select(m.ref);
      tl.scrollToLane(m.lane, m.depth);
      const inView = tl.viewOf(m.start) >= tl.t0 && tl.viewOf(m.start + m.dur) <= tl.t1;
      const moves = [];
      if (!inView || opts.from !== undefined) moves.push(tl.zoomTo(m.start, m.dur));
      moves.push(this.showEvent(m.ref));
      await Promise.all(moves);
      return m;
    } catch (e) { this.app.report(e, this.signal); return null; }
  }

  laneName(lane) {
    const l = this.meta.lanes.find((x) => x.lane === lane);
    return l ? `${l.subsystem}/${l.identifier}` : `lane ${lane}`;
  }

  async selectEid(eid, opts = {}) {
    try {
      const ev = await getJSON(`${this.base}/event`, { eid }, this.signal);
      if (ev.ref !== null) {
        this.timeline.select(ev.ref);
        this.timeline.scrollToLane(ev.lane, ev.depth || 0);
        if (opts.zoom !== false) await this.timeline.zoomTo(ev.start_ns, ev.dur_ns || 0);
      }
      return await this.showEvent(ev.ref, ev);
    } catch (e) { this.app.report(e, this.signal); return null; }
  }

  // ---- the panel ----------------------------------------------------------------------------
  async showEvent(ref, evGiven, page = null) {
    if (this._evAc) this._evAc.abort();  // the previous click's requests: cancelled on the server too
    if (ref === null || ref === undefined) {
      this.timeline.setChain([]);
      this.ev = null;
      this.app.saveState();
      return;
    }
    const ac = this._evAc = new AbortController();
    const signal = ac.signal;
    this.signal.addEventListener("abort", () => ac.abort(), { once: true });
    if (page === null) page = evGiven && this.ev === null ? this.page : 0;
    this.page = page;
    this.panel.innerHTML = `<span class="muted">Loading the event and its lifecycle…</span>`;
    let ev, lin;
    try {
      [ev, lin] = await Promise.all([evGiven ? Promise.resolve(evGiven) : getJSON(`${this.base}/event`, { ref }, signal),
        getJSON(`${this.base}/lineage`, { ref, page }, signal)]);
    } catch (e) {
      if (!isAbort(e)) this.app.report(e, this.signal);
      return;
    }
    if (signal.aborted) return;
    this.ev = ev;
    this.page = lin.page;
    this.app.saveState();
    const drawn = lin.hops.map((h, i) => [h, i]).filter(([h]) => h.hop !== "parent" && h.hop !== "instructions" && h.lane !== undefined);
    const at = new Map(drawn.map(([, i], k) => [i, k]));
    this.timeline.setChain(drawn.map(([h]) => ({ ...h, after_pt: h.after !== undefined ? at.get(h.after) : undefined })));
    const modeled = laneTimesModeled(this.meta, this.meta.lanes.find((x) => x.lane === ev.lane) || { side: ev.side });
    const args = Object.entries(ev.args || {}).slice(0, 40).map(([k, v]) =>
      `<tr><td>${esc(k)}</td><td class="mono">${esc(typeof v === "object" ? JSON.stringify(v) : v)}</td></tr>`).join("");
    const rows = lin.hops.length;
    let heading;
    if (lin.shape === "launches") {
      const a = lin.page * lin.per_page + 1, b = Math.min(lin.total, (lin.page + 1) * lin.per_page);
      heading = `Lifecycle <span class="muted" data-testid="lifecycle-count">(${lin.total.toLocaleString()} launches inside on this thread; ${a}–${b} shown, ${rows} rows)</span>`;
    } else {
      heading = `Lifecycle <span class="muted" data-testid="lifecycle-count">(${rows} ${rows === 1 ? "row" : "rows"}${lin.total > lin.per_page ? `; device work ${lin.page * lin.per_page + 1}–${Math.min(lin.total, (lin.page + 1) * lin.per_page)} of ${lin.total}` : ""})</span>`;
    }
    const pager = lin.pages > 1 ? `<div class="pager" data-testid="pager"><button data-page="${lin.page - 1}" ${lin.page === 0 ? "disabled" : ""}>‹ previous</button>
      page ${lin.page + 1} of ${lin.pages} <button data-page="${lin.page + 1}" ${lin.page + 1 >= lin.pages ? "disabled" : ""}>next ›</button></div>` : "";
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
          <h3>${heading}</h3>
          ${this.renderHops(lin.hops)}
          ${pager}
        </div>
      </div>`;
    this.panel.querySelectorAll("[data-page]").forEach((b) => b.addEventListener("click", () => this.showEvent(ref, ev, Number(b.dataset.page))));
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

  // One row per hop; each says how long after its cause (the hop that made it) it started.
  renderHops(hops) {
    const items = hops.map((h, i) => {
      const link = h.device_view ? ` <button data-device="${h.device_view.hash}:${h.device_view.run}" data-testid="open-device">device view →</button>` : "";
      if (h.hop === "instructions") {
        const engines = `${h.engines} engine${h.engines === 1 ? "" : "s"}` + (h.dma_queues ? ` and ${h.dma_queues} DMA queue${h.dma_queues === 1 ? "" : "s"}` : "");
        return `<li data-hop="${i}" data-kind="instructions"><span class="hop">instructions</span>${h.instructions.toLocaleString()} instructions on ${engines}, ` +
          `${fmtNs(h.span_ns)} <span class="badge modeled">modeled</span>${link}</li>`;
      }
      const lane = this.laneName(h.lane);
      let delta = "";
      if (h.after !== undefined && h.after !== null && hops[h.after]) {
        const c = hops[h.after];
        const what = c.hop === "self" ? "selected event" : c.hop;
        const d = h.delay_ns;
        delta = `<span class="delta" data-testid="delay">${d >= 0 ? `${fmtNs(d)} after` : `${fmtNs(-d)} before`} the ${esc(what)} started` +
          (h.gap_ns >= 0 ? `, ${fmtNs(h.gap_ns)} after it ended` : d >= 0 ? ", while it ran" : "") + "</span>";
      }
      const hopLane = this.meta.lanes.find((x) => x.lane === h.lane);
      const modeled = h.hop !== "parent" && laneTimesModeled(this.meta, hopLane) ? ' <span class="badge modeled">modeled</span>' : "";
      const label = h.hop === "self" ? "selected" : h.hop === "parent" ? "enclosing" : h.hop;
      return `<li data-hop="${i}" data-kind="${esc(h.hop)}" data-lane-subsystem="${esc((hopLane || {}).subsystem || "")}" class="hop-${esc(h.hop)}">` +
        `<span class="hop">${esc(label)}</span><b>${esc(h.name)}</b> <span class="muted">${esc(lane)}</span><br>` +
        `${fmtNs(h.start_ns)} · ${fmtNs(h.dur_ns)}${modeled}${delta}${link}</li>`;
    });
    return `<ul class="hops" data-testid="hops">${items.join("")}</ul>`;
  }

  async showBox(b) {
    let r;
    try {
      r = await getJSON(`${this.base}/select`, { t0: b.t0, t1: b.t1, lanes: b.lanes.join(",") }, this.signal);
    } catch (e) { this.app.report(e, this.signal); return; }
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

  destroy() {
    clearTimeout(this._st);
    if (this._evAc) this._evAc.abort();
    this.timeline.destroy();
    this.el.remove();
  }
}

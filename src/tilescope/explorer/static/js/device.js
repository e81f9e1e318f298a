// The device view of one execution: a row per engine and DMA queue, instructions coloured by the
// op / kernel line / kind / engine they came from, warning bands (small DMAs, spills), SBUF and
// PSUM usage over time, summaries of the whole run / current view / box selection, operator
// table, code view, per-instruction details with dependencies, CSV export. Every time is modeled.
import { getJSON, getPacked, href } from "./api.js";
import { KeyColors } from "./colors.js";
import { bytes, esc, flops, ns as fmtNs, num, pct } from "./format.js";
import { DataTable } from "./tables.js";

const LABEL_W = 200, ROW_H = 22, BAND_H = 4, AXIS_H = 22, MEM_H = 90;

export class DeviceView {
  constructor(app, profile, meta, params = {}, signal) {
    this.app = app; this.profile = profile; this.meta = meta; this.params = params; this.signal = signal;
    this.base = `/api/p/${profile.id}`;
    this.colorMode = ["op", "line", "kind", "engine"].includes(params.color) ? params.color : "op";
    this.userColor = !!params.color;
    this.tab = ["summary", "instruction", "operators", "code", "warnings"].includes(params.tab) ? params.tab : "summary";
    this.scope = "whole";
    this.el = document.createElement("div");
    this.el.className = "split";
    this.el.dataset.testid = "device-view";
    this.highlight = null;      // Set of instruction indices, or null
    this.selected = null;       // row in the arrays
    this.detail = null;
  }

  async mount(main) {
    main.appendChild(this.el);
    const ex = await getJSON(`${this.base}/executions`, undefined, this.signal);
    this.executions = ex.executions;
    if (!this.executions.length) {
      this.el.innerHTML = `<div class="page"><h2>No device execution with an instruction trace</h2>
        <p class="muted">${this.meta.kind === "tilescope" ? "This profile recorded no instruction traces (ProfileConfig modes without DEVICE, or the ring buffer dropped them)." :
          "Device views show tilescope executions (modeled instruction timelines). This trace comes from a real device; its kernels are in the system trace and the tables."}</p></div>`;
      return;
    }
    let cur = this.executions.find((e) => e.program_hash === this.params.hash && String(e.run) === String(this.params.run ?? 0));
    if (!cur) cur = this.executions[0];
    await this.load(cur);
    const t0 = Number(this.params.t0), t1 = Number(this.params.t1);
    if (this.params.t0 !== undefined && Number.isFinite(t0) && Number.isFinite(t1) && t1 > t0) this.setRange(t0, t1);
    if (this.params.i !== undefined && this.byIndex.has(Number(this.params.i))) await this.selectRow(this.byIndex.get(Number(this.params.i)), false);
  }

  urlState() {
    if (!this.ex) return { hash: this.params.hash, run: this.params.run };
    return { hash: this.ex.program_hash, run: this.ex.run, t0: Math.round(this.t0), t1: Math.round(this.t1),
      i: this.selected !== null && this.selected !== undefined ? this.a.index[this.selected] : null,
      tab: this.tab !== "summary" ? this.tab : null, color: this.userColor ? this.colorMode : null };
  }

  // W/S zoom at the pointer, A/D pan, 0 the whole run, Esc clears the selection and highlights.
  key(e, typing) {
    if (typing || !this.canvas) return false;
    const k = e.key.toLowerCase();
    if (k === "w") this.zoom(0.7, this.pointerX);
    else if (k === "s") this.zoom(1 / 0.7, this.pointerX);
    else if (k === "a") this.pan(-0.2);
    else if (k === "d") this.pan(0.2);
    else if (k === "0") this.setRange(0, this.h.span_ns * 1.02);
    else if (e.key === "Escape") {
      this.box = null; this.boxSel = null; this.highlight = null;
      if (this.scope === "box") this.scope = "whole";
      this.selectRow(null);
      this.renderTab();
    } else return false;
    return true;
  }

  async load(ex) {
    this.ex = ex;
    this.el.innerHTML = `<div class="loading">Loading the instruction trace…</div>`;
    const { header, arrays } = await getPacked(`${this.base}/device`, { hash: ex.program_hash, run: ex.run }, this.signal);
    this.h = header; this.a = arrays;
    this.n = arrays.index.length;
    this.t0 = 0; this.t1 = Math.max(1, header.span_ns) * 1.02;
    this.rowOf = new Map();
    header.engines.forEach((e, i) => this.rowOf.set(i, i));
    this.byIndex = new Map();
    for (let r = 0; r < this.n; r++) this.byIndex.set(arrays.index[r], r);
    this.mem = await getJSON(`${this.base}/memory`, { hash: ex.program_hash, run: ex.run }, this.signal);
    if (!this.userColor) {
      // a tile kernel (one op, many source lines) reads best by source line
      const ops = new Set(), lines = new Set();
      for (const p of header.provenance) { if (p.op) ops.add(p.op); if (p.file) lines.add(`${p.file}:${p.line}`); }
      this.colorMode = ops.size <= 1 && lines.size > 1 ? "line" : "op";
    }
    this.setColor(this.colorMode, false);
    this.render();
  }

  // ---- colours ------------------------------------------------------------------------------
  keyOf(r) {
    const p = this.h.provenance[this.a.prov[r]] || {};
    switch (this.colorMode) {
      case "line": return p.file ? `${p.file}:${p.line}` : p.text;
      case "kind": return this.h.kinds[this.a.kind[r]];
      case "engine": return this.h.engines[this.a.engine[r]];
      default: return p.op || p.label || p.text;
    }
  }

  setColor(mode, redraw = true) {
    this.colorMode = mode;
    this.keys = new Array(this.n);
    const names = [];
    const ids = new Map();
    for (let r = 0; r < this.n; r++) {
      const k = this.keyOf(r) || "-";
      let id = ids.get(k);
      if (id === undefined) { id = names.length; names.push(k); ids.set(k, id); }
      this.keys[r] = id;
    }
    this.keyNames = names;
    this.colors = new KeyColors(names);
    if (redraw) { this.drawLegend(); this.draw(); }
  }

  // ---- layout -------------------------------------------------------------------------------
  render() {
    const ex = this.ex;
    const options = this.executions.map((e, i) => `<option value="${i}" ${e === ex ? "selected" : ""}>` +
      `${esc(e.name)}${e.start_ns !== null ? ` @ ${fmtNs(e.start_ns)}` : ""} · ${e.instructions} instr · ${esc(e.program_hash.slice(0, 8))}/${e.run}</option>`).join("");
    this.el.innerHTML = `
      <div class="toolbar">
        <label>execution</label><select data-testid="execution">${options}</select>
        <label>colour by</label><select data-testid="device-color">
          <option value="op">op / kernel</option><option value="line">source line</option><option value="kind">instruction kind</option><option value="engine">engine</option></select>
        <button data-act="in" title="zoom in (W)">+</button><button data-act="out" title="zoom out (S)">−</button><button data-act="reset">whole run</button>
        <span class="badge modeled" data-testid="device-modeled">MODELED</span>
        <span class="muted">${esc(this.h.program || "")} · preset ${esc(this.h.preset || "?")} · ${this.n.toLocaleString()} instructions · ${fmtNs(this.h.span_ns)}
        ${ex.own_trace ? "" : ` · <b>instruction trace of another execution of this executable (run ${ex.run})</b>`}</span>
        <span class="hint">ctrl+wheel / W S zoom · drag pan · shift+drag select · click an instruction</span>
      </div>
      <div class="legend" data-role="legend" style="padding:4px 10px"></div>
      <canvas class="axis" data-role="axis"></canvas>
      <div class="tracks" style="flex:none" data-role="tracks"><canvas data-testid="device-canvas"></canvas></div>
      <canvas data-role="mem" data-testid="memory-chart" style="display:block;border-top:1px solid #e5e7eb"></canvas>
      <div class="panel" style="flex:1" data-testid="device-panel">
        <div class="tabs">${["summary", "instruction", "operators", "code", "warnings"].map((t) =>
          `<a data-tab="${t}" class="${t === this.tab ? "active" : ""}">${t}</a>`).join("")}
          <span style="margin-left:auto">export CSV:
            <a data-testid="csv-whole" href="${href(`${this.base}/export/instructions.csv`, { hash: ex.program_hash, run: ex.run })}" download>whole run</a> ·
            <a data-role="csv-view" download>current view</a> · <a data-role="csv-box" download>selection</a></span></div>
        <div data-role="tab"></div>
      </div>`;
    const q = (s) => this.el.querySelector(s);
    q("[data-testid=execution]").addEventListener("change", (e) => {
      const x = this.executions[Number(e.target.value)];
      this.app.go(`#/${this.profile.id}/device?hash=${x.program_hash}&run=${x.run}`);
    });
    q("[data-testid=device-color]").value = this.colorMode;
    q("[data-testid=device-color]").addEventListener("change", (e) => { this.userColor = true; this.setColor(e.target.value); this.app.saveState(); });
    this.el.querySelectorAll("button[data-act]").forEach((b) => b.addEventListener("click", () => {
      if (b.dataset.act === "in") this.zoom(0.5); else if (b.dataset.act === "out") this.zoom(2); else this.setRange(0, this.h.span_ns * 1.02);
    }));
    this.el.querySelectorAll("[data-tab]").forEach((a) => a.addEventListener("click", () => {
      this.tab = a.dataset.tab;
      this.el.querySelectorAll("[data-tab]").forEach((x) => x.classList.toggle("active", x.dataset.tab === this.tab));
      this.renderTab();
      this.app.saveState();
    }));
    this.canvas = q("[data-testid=device-canvas]");
    this.axis = q("[data-role=axis]");
    this.memc = q("[data-role=mem]");
    this.tracks = q("[data-role=tracks]");
    const cv = this.canvas;
    cv.tabIndex = 0;
    cv.addEventListener("wheel", (e) => {
      if (!(e.ctrlKey || e.metaKey || e.altKey || e.shiftKey)) return;
      e.preventDefault();
      if (e.shiftKey) this.pan(e.deltaY / this.plotW);
      else this.zoom(Math.exp(Math.max(-1, Math.min(1, e.deltaY * 0.01))), this._pos(e)[0]);
    }, { passive: false });
    cv.addEventListener("mousemove", (e) => { const x = this._pos(e)[0]; this.pointerX = x >= LABEL_W ? x : null; this._move(e); });
    cv.addEventListener("mouseleave", () => { document.getElementById("tooltip").hidden = true; this.pointerX = null; });
    cv.addEventListener("mousedown", (e) => this._down(e));
    this._ro = new ResizeObserver(() => this.draw());
    this._ro.observe(this.tracks);
    this.drawLegend();
    this.draw();
    this.renderTab();
  }

  get width() { return Math.max(300, this.tracks.clientWidth); }
  get plotW() { return this.width - LABEL_W; }
  xOf(t) { return LABEL_W + ((t - this.t0) / (this.t1 - this.t0)) * this.plotW; }
  tOf(x) { return this.t0 + ((x - LABEL_W) / this.plotW) * (this.t1 - this.t0); }

  setRange(t0, t1) {
    const w = Math.max(5, t1 - t0);
    const max = this.h.span_ns * 1.05;
    t0 = Math.max(-0.02 * max, Math.min(t0, max - w));
    this.t0 = t0; this.t1 = t0 + w;
    this.draw();
    if (this.tab === "summary" && this.scope === "view") this.renderTab();
    this._csvLinks();
    this.app.saveState();
  }

  zoom(f, x) {
    const ax = x === undefined || x === null ? LABEL_W + this.plotW / 2 : Math.max(LABEL_W, x);
    const t = this.tOf(ax);
    this.setRange(t - (t - this.t0) * f, t + (this.t1 - t) * f);
  }

  pan(frac) { const d = (this.t1 - this.t0) * frac; this.setRange(this.t0 + d, this.t1 + d); }

  drawLegend() {
    const el = this.el.querySelector("[data-role=legend]");
    if (!el) return;
    const busy = new Map();
    for (let r = 0; r < this.n; r++) busy.set(this.keys[r], (busy.get(this.keys[r]) || 0) + this.a.end[r] - this.a.start[r]);
    const top = [...busy.entries()].sort((x, y) => y[1] - x[1]).slice(0, 14);
    el.innerHTML = top.map(([k]) => `<span data-key="${k}" style="cursor:pointer"><i style="background:${this.colors.get(k)}"></i>${esc(this.keyNames[k])}</span>`).join("") +
      (busy.size > top.length ? `<span class="muted">+${busy.size - top.length} more</span>` : "");
    el.querySelectorAll("[data-key]").forEach((s) => s.addEventListener("click", () => {
      const k = Number(s.dataset.key);
      const set = new Set();
      for (let r = 0; r < this.n; r++) if (this.keys[r] === k) set.add(this.a.index[r]);
      this.setHighlight(this.highlight && this.highlightKey === k ? null : set, k);
    }));
  }

  setHighlight(set, key = null) { this.highlight = set; this.highlightKey = key; this.draw(); }

  // ---- drawing ------------------------------------------------------------------------------
  draw() {
    if (!this.canvas) return;
    const dpr = window.devicePixelRatio || 1;
    const W = this.width;
    const rows = this.h.engines.length;
    const H = rows * ROW_H + 4;
    for (const [cv, h] of [[this.canvas, H], [this.axis, AXIS_H], [this.memc, MEM_H]]) {
      cv.style.width = `${W}px`; cv.style.height = `${h}px`;
      cv.width = Math.floor(W * dpr); cv.height = Math.floor(h * dpr);
    }
    this.tracks.style.height = `${Math.min(H, Math.max(160, window.innerHeight * 0.45))}px`;
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    const a = this.a, k = this.plotW / (this.t1 - this.t0);
    const busy = new Float64Array(rows);
    for (let r = 0; r < this.n; r++) busy[a.engine[r]] += a.end[r] - a.start[r];
    for (let i = 0; i < rows; i++) {
      const y = i * ROW_H;
      ctx.fillStyle = i % 2 ? "#fafafa" : "#fff";
      ctx.fillRect(0, y, W, ROW_H);
      ctx.fillStyle = "#111";
      const name = this.h.engines[i];
      ctx.fillText(name, 6, y + ROW_H / 2 - 1);
      ctx.fillStyle = busy[i] ? "#6b7280" : "#b45309";
      ctx.textAlign = "right";
      ctx.fillText(busy[i] ? pct(busy[i] / this.h.span_ns) : "idle", LABEL_W - 6, y + ROW_H / 2 - 1);
      ctx.textAlign = "left";
    }
    ctx.save();
    ctx.beginPath(); ctx.rect(LABEL_W, 0, W - LABEL_W, H); ctx.clip();
    let lastX = -1, lastRow = -1;
    for (let r = 0; r < this.n; r++) {
      const x = LABEL_W + (a.start[r] - this.t0) * k;
      let w = (a.end[r] - a.start[r]) * k;
      if (x > W || x + w < LABEL_W) continue;
      const row = a.engine[r];
      const y = row * ROW_H + 2;
      if (w < 1) { const px = Math.floor(x); if (px === lastX && row === lastRow) continue; lastX = px; lastRow = row; w = 1; }
      const dim = this.highlight && !this.highlight.has(a.index[r]);
      ctx.globalAlpha = dim ? 0.15 : 1;
      ctx.fillStyle = this.colors.get(this.keys[r]);
      ctx.fillRect(x, y, w, ROW_H - 4 - BAND_H);
      const f = a.flags[r];
      if (f & 1) { ctx.fillStyle = "#dc2626"; ctx.fillRect(x, y + ROW_H - 4 - BAND_H, Math.max(w, 2), BAND_H); }
      else if (f & 6) { ctx.fillStyle = "#f97316"; ctx.fillRect(x, y + ROW_H - 4 - BAND_H, Math.max(w, 2), BAND_H); }
      if (w > 40 && !dim) {
        ctx.fillStyle = "#111";
        const label = this.h.kinds[a.kind[r]];
        const n = Math.floor((w - 6) / 6.1);
        ctx.fillText(label.length > n ? label.slice(0, Math.max(1, n - 1)) + "…" : label, Math.max(x, LABEL_W) + 3, y + (ROW_H - 4 - BAND_H) / 2);
      }
    }
    ctx.globalAlpha = 1;
    if (this.selected !== null) this._drawDeps(ctx);
    if (this.box) {
      const b = this.box;
      ctx.fillStyle = "rgba(37,99,235,0.12)"; ctx.strokeStyle = "#2563eb";
      ctx.fillRect(Math.min(b.x0, b.x1), Math.min(b.y0, b.y1), Math.abs(b.x1 - b.x0), Math.abs(b.y1 - b.y0));
      ctx.strokeRect(Math.min(b.x0, b.x1), Math.min(b.y0, b.y1), Math.abs(b.x1 - b.x0), Math.abs(b.y1 - b.y0));
    }
    ctx.restore();
    ctx.fillStyle = "#e5e7eb"; ctx.fillRect(LABEL_W - 1, 0, 1, H);
    this._drawAxis(dpr);
    this._drawMemory(dpr);
  }

  _center(r) {
    const y = this.a.engine[r] * ROW_H + 2 + (ROW_H - 4 - BAND_H) / 2;
    return [this.xOf(this.a.start[r]), this.xOf(this.a.end[r]), y];
  }

  _drawDeps(ctx) {
    const r = this.selected;
    const [sx, ex, y] = this._center(r);
    ctx.strokeStyle = "#111"; ctx.lineWidth = 2;
    ctx.strokeRect(sx, y - (ROW_H - 4 - BAND_H) / 2, Math.max(2, ex - sx), ROW_H - 4 - BAND_H);
    if (!this.detail || this.detail.index !== this.a.index[r]) return;
    ctx.lineWidth = 1.2;
    const arrow = (x0, y0, x1, y1, color) => {
      ctx.strokeStyle = color; ctx.fillStyle = color;
      ctx.beginPath(); ctx.moveTo(x0, y0); ctx.lineTo(x1, y1); ctx.stroke();
      const ang = Math.atan2(y1 - y0, x1 - x0);
      ctx.beginPath(); ctx.moveTo(x1, y1);
      ctx.lineTo(x1 - 7 * Math.cos(ang - 0.4), y1 - 7 * Math.sin(ang - 0.4));
      ctx.lineTo(x1 - 7 * Math.cos(ang + 0.4), y1 - 7 * Math.sin(ang + 0.4)); ctx.fill();
    };
    for (const p of this.detail.predecessors) {
      const pr = this.byIndex.get(p.index);
      if (pr === undefined) continue;
      const [, pex, py] = this._center(pr);
      arrow(pex, py, sx, y, "#2563eb");
    }
    for (const s of this.detail.successors) {
      const sr = this.byIndex.get(s.index);
      if (sr === undefined) continue;
      const [ssx, , sy] = this._center(sr);
      arrow(ex, y, ssx, sy, "#16a34a");
    }
  }

  _drawAxis(dpr) {
    const ctx = this.axis.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, this.width, AXIS_H);
    ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle";
    ctx.fillStyle = "#6b7280"; ctx.fillText("modeled time", 4, AXIS_H / 2);
    const span = this.t1 - this.t0;
    const raw = span / Math.max(2, this.plotW / 110);
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw);
    for (let t = Math.ceil(this.t0 / step) * step; t <= this.t1; t += step) {
      const x = this.xOf(t);
      if (x < LABEL_W) continue;
      ctx.fillStyle = "#374151"; ctx.fillText(fmtNs(t), x + 3, AXIS_H / 2);
      ctx.fillStyle = "#d1d5db"; ctx.fillRect(x, AXIS_H - 6, 1, 6);
    }
  }

  _drawMemory(dpr) {
    const ctx = this.memc.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const W = this.width;
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, MEM_H);
    ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle";
    const cap = this.mem.capacity || {};
    const series = [["sbuf", "#2563eb"], ["psum", "#ea580c"]];
    ctx.fillStyle = "#111"; ctx.fillText("on-chip memory in use", 6, 12);
    series.forEach(([m, c], i) => {
      const s = this.mem.series[m];
      ctx.fillStyle = c;
      ctx.fillText(`${m.toUpperCase()} peak ${bytes(s.peak)}` + (cap[m] ? ` (${pct(s.peak / cap[m])})` : ""), 6, 30 + i * 16);
    });
    ctx.fillStyle = "#6b7280"; ctx.fillText(`per partition, of ${bytes(cap.sbuf || 0)} / ${bytes(cap.psum || 0)}; modeled`, 6, 30 + 2 * 16 + 4);
    const top = 8, bot = MEM_H - 8;
    // y: share of each memory's capacity; the scale fits the larger peak (a dashed line marks 100%)
    const share = (m) => (cap[m] ? this.mem.series[m].peak / cap[m] : 1);
    const ymax = Math.max(0.05, 1.15 * Math.max(share("sbuf"), share("psum")));
    const yOf = (f) => bot - (f / ymax) * (bot - top);
    ctx.save(); ctx.beginPath(); ctx.rect(LABEL_W, 0, W - LABEL_W, MEM_H); ctx.clip();
    ctx.strokeStyle = "#e5e7eb"; ctx.beginPath(); ctx.moveTo(LABEL_W, bot); ctx.lineTo(W, bot); ctx.stroke();
    if (ymax >= 1) {
      ctx.setLineDash([4, 3]); ctx.strokeStyle = "#b91c1c"; ctx.beginPath(); ctx.moveTo(LABEL_W, yOf(1)); ctx.lineTo(W, yOf(1)); ctx.stroke(); ctx.setLineDash([]);
    }
    ctx.fillStyle = "#9ca3af"; ctx.fillText(`top: ${pct(ymax)} of capacity`, LABEL_W + 6, top + 6);
    for (const [m, c] of series) {
      const s = this.mem.series[m];
      const capm = cap[m] || Math.max(1, s.peak);
      ctx.strokeStyle = c; ctx.lineWidth = 1.5; ctx.beginPath();
      let y = bot;
      ctx.moveTo(LABEL_W, bot);
      for (let i = 0; i < s.t.length; i++) {
        const x = this.xOf(s.t[i]);
        ctx.lineTo(x, y);
        y = yOf(s.bytes[i] / capm);
        ctx.lineTo(x, y);
      }
      ctx.lineTo(W, y);
      ctx.stroke();
    }
    ctx.restore();
  }

  // ---- interaction --------------------------------------------------------------------------
  _pos(e) { const r = this.canvas.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; }

  hit(x, y) {
    if (x < LABEL_W) return null;
    const row = Math.floor(y / ROW_H);
    const t = this.tOf(x), tol = (3 * (this.t1 - this.t0)) / this.plotW;
    let best = null, bd = Infinity;
    for (let r = 0; r < this.n; r++) {
      if (this.a.engine[r] !== row) continue;
      const s = this.a.start[r], e = this.a.end[r];
      if (t < s - tol || t > e + tol) continue;
      const d = t < s ? s - t : t > e ? t - e : 0;
      if (d < bd) { bd = d; best = r; if (d === 0) break; }
    }
    return best;
  }

  _move(e) {
    const [x, y] = this._pos(e);
    const tip = document.getElementById("tooltip");
    if (this.drag) return this._dragMove(x, y);
    const r = this.hit(x, y);
    if (r === null) { tip.hidden = true; return; }
    const a = this.a, p = this.h.provenance[a.prov[r]] || {};
    const warn = (a.flags[r] & 1 ? " · <b>small DMA</b>" : "") + (a.flags[r] & 2 ? " · <b>spill store</b>" : "") + (a.flags[r] & 4 ? " · <b>spill reload</b>" : "");
    tip.innerHTML = `<div class="t">#${a.index[r]} ${esc(this.h.kinds[a.kind[r]])} on ${esc(this.h.engines[a.engine[r]])}</div>` +
      `<div class="d">${fmtNs(a.start[r])} → ${fmtNs(a.end[r])} (${fmtNs(a.end[r] - a.start[r])}, modeled)` +
      `${a.bytes[r] ? ` · ${bytes(a.bytes[r])}` : ""}${a.flops[r] ? ` · ${flops(a.flops[r])}` : ""}${warn}</div><div class="d">${esc(p.text || "")}</div>`;
    tip.hidden = false;
    tip.style.left = `${Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8)}px`;
    tip.style.top = `${Math.min(e.clientY + 14, window.innerHeight - tip.offsetHeight - 8)}px`;
  }

  _down(e) {
    this.canvas.focus();
    const [x, y] = this._pos(e);
    this.drag = { x0: x, y0: y, t0: this.t0, t1: this.t1, moved: false, box: e.shiftKey };
    const up = () => {
      window.removeEventListener("mouseup", up);
      const d = this.drag; this.drag = null;
      if (!d.moved) return this.selectRow(this.hit(x, y));
      if (d.box) {
        const b = this.box;
        const t0 = this.tOf(Math.min(b.x0, b.x1)), t1 = this.tOf(Math.max(b.x0, b.x1));
        const r0 = Math.max(0, Math.floor(Math.min(b.y0, b.y1) / ROW_H)), r1 = Math.min(this.h.engines.length - 1, Math.floor(Math.max(b.y0, b.y1) / ROW_H));
        this.boxSel = { t0, t1, engines: new Set(Array.from({ length: r1 - r0 + 1 }, (_, i) => r0 + i)) };
        this.scope = "box"; this.tab = "summary";
        this.el.querySelectorAll("[data-tab]").forEach((a) => a.classList.toggle("active", a.dataset.tab === "summary"));
        this.renderTab();
        this._csvLinks();
      }
    };
    window.addEventListener("mouseup", up);
  }

  _dragMove(x, y) {
    const d = this.drag;
    if (Math.abs(x - d.x0) + Math.abs(y - d.y0) > 3) d.moved = true;
    if (!d.moved) return;
    if (d.box) { this.box = { x0: Math.max(LABEL_W, d.x0), y0: d.y0, x1: Math.max(LABEL_W, x), y1: y }; this.draw(); return; }
    const dt = ((x - d.x0) / this.plotW) * (d.t1 - d.t0);
    this.setRange(d.t0 - dt, d.t1 - dt);
  }

  async selectRow(r, switchTab = true) {
    this.selected = r;
    this.detail = null;
    this.draw();
    this.app.saveState();
    if (r === null) return;
    if (switchTab) {
      this.tab = "instruction";
      this.el.querySelectorAll("[data-tab]").forEach((a) => a.classList.toggle("active", a.dataset.tab === "instruction"));
    }
    if (this._insAc) this._insAc.abort();
    const ac = this._insAc = new AbortController();
    this.signal.addEventListener("abort", () => ac.abort(), { once: true });
    try {
      this.detail = await getJSON(`${this.base}/instruction`, { hash: this.ex.program_hash, run: this.ex.run, index: this.a.index[r] }, ac.signal);
    } catch (e) { this.app.report(e, ac.signal); return; }
    this.draw();
    this.renderTab();
  }

  selectIndex(i) {
    const r = this.byIndex.get(i);
    if (r === undefined) return;
    const s = this.a.start[r], e = this.a.end[r];
    if (s < this.t0 || e > this.t1) { const w = this.t1 - this.t0; this.setRange(s - w / 2, s + w / 2); }
    this.selectRow(r);
  }

  _csvLinks() {
    const v = this.el.querySelector("[data-role=csv-view]"), b = this.el.querySelector("[data-role=csv-box]");
    if (!v) return;
    const base = { hash: this.ex.program_hash, run: this.ex.run };
    v.href = href(`${this.base}/export/instructions.csv`, { ...base, t0: Math.floor(Math.max(0, this.t0)), t1: Math.ceil(this.t1) });
    if (this.boxSel) {
      b.href = href(`${this.base}/export/instructions.csv`, { ...base, t0: Math.floor(Math.max(0, this.boxSel.t0)), t1: Math.ceil(this.boxSel.t1),
        engines: [...this.boxSel.engines].map((i) => this.h.engines[i]).join(",") });
      b.removeAttribute("aria-disabled");
    } else { b.removeAttribute("href"); b.setAttribute("aria-disabled", "true"); }
  }

  // ---- panels -------------------------------------------------------------------------------
  summarize(t0, t1, engines) {
    const a = this.a, rows = this.h.engines.length;
    const per = Array.from({ length: rows }, () => ({ busy: 0, n: 0, bytes: 0, flops: 0 }));
    let dmaBytes = 0, dmaN = 0, small = 0, spill = 0;
    for (let r = 0; r < this.n; r++) {
      const e = a.engine[r];
      if (engines && !engines.has(e)) continue;
      const s = Math.max(a.start[r], t0), en = Math.min(a.end[r], t1);
      const d = a.end[r] - a.start[r];
      if (en <= s && !(d === 0 && a.start[r] >= t0 && a.start[r] <= t1)) continue;
      const frac = d > 0 ? (en - s) / d : 1;
      const p = per[e];
      p.busy += Math.max(0, en - s); p.n += 1; p.bytes += a.bytes[r] * frac; p.flops += a.flops[r] * frac;
      if (this.h.engines[e].startsWith("DMA")) {
        dmaBytes += a.bytes[r] * frac; dmaN += 1;
        if (a.flags[r] & 1) small += 1;
        if (a.flags[r] & 6) spill += a.bytes[r] * frac;
      }
    }
    return { per, dmaBytes, dmaN, small, spill, dur: t1 - t0 };
  }

  renderTab() {
    const el = this.el.querySelector("[data-role=tab]");
    if (!el) return;
    const t = this.tab;
    if (t === "summary") return this.renderSummary(el);
    if (t === "instruction") return this.renderInstruction(el);
    if (t === "operators") return this.renderOperators(el);
    if (t === "code") return this.renderCode(el);
    return this.renderWarnings(el);
  }

  renderSummary(el) {
    let t0 = 0, t1 = this.h.span_ns, engines = null, what = "whole run";
    if (this.scope === "view") { t0 = Math.max(0, this.t0); t1 = Math.min(this.h.span_ns, this.t1); what = `current view (${fmtNs(t0)} – ${fmtNs(t1)})`; }
    if (this.scope === "box" && this.boxSel) {
      t0 = this.boxSel.t0; t1 = this.boxSel.t1; engines = this.boxSel.engines;
      what = `selection (${fmtNs(t0)} – ${fmtNs(t1)}, ${engines.size} rows)`;
    }
    const s = this.summarize(t0, t1, engines);
    const rows = this.h.engines.map((e, i) => {
      if (engines && !engines.has(i)) return "";
      const p = s.per[i];
      return `<tr><td class="text">${esc(e)}</td><td>${fmtNs(p.busy)}</td><td class="barcell"><div class="bar" style="width:${Math.min(100, (100 * p.busy) / Math.max(1, s.dur)).toFixed(1)}%"></div></td>` +
        `<td>${pct(p.busy / Math.max(1, s.dur))}</td><td>${num(p.n)}</td><td>${bytes(p.bytes)}</td><td>${flops(p.flops)}</td></tr>`;
    }).join("");
    el.innerHTML = `<div data-testid="device-summary">
      <div class="toolbar" style="padding-left:0"><label>summary of</label>
        ${["whole", "view", "box"].map((k) => `<label><input type="radio" name="scope" value="${k}" ${this.scope === k ? "checked" : ""} ${k === "box" && !this.boxSel ? "disabled" : ""}> ${k === "box" ? "box selection" : k === "view" ? "current view" : "whole run"}</label>`).join("")}
        <span class="badge modeled">modeled</span></div>
      <p><b>${esc(what)}</b>: DMA ${bytes(s.dmaBytes)} in ${num(s.dmaN)} transfers — bandwidth ${num(s.dmaBytes / Math.max(1, s.dur), 1)} GB/s,
        average ${bytes(s.dmaN ? s.dmaBytes / s.dmaN : 0)}, ${num(s.small)} under ${bytes(this.h.small_dma_bytes)}, spills ${bytes(s.spill)}.</p>
      <table class="data" data-testid="engine-summary"><tr><th class="text">engine / queue</th><th>busy</th><th></th><th>utilisation</th><th>instructions</th><th>bytes</th><th>FLOPs</th></tr>${rows}</table></div>`;
    el.querySelectorAll("input[name=scope]").forEach((r) => r.addEventListener("change", () => { this.scope = r.value; this.renderTab(); }));
  }

  renderInstruction(el) {
    const d = this.detail;
    if (!d) { el.innerHTML = `<p class="muted">Click an instruction to see its operands, provenance and dependencies.</p>`; return; }
    const ops = Object.entries(d.operands).map(([k, v]) => `<tr><td>${esc(k)}</td><td class="mono">${esc(v.buffer)} (${esc(v.memory || "?")}, ${esc(v.role || "")}) ${esc(v.dtype)} offset ${v.offset} dims ${esc(JSON.stringify(v.dims))}</td></tr>`).join("");
    const fields = Object.entries(d.fields).map(([k, v]) => `<tr><td>${esc(k)}</td><td class="mono">${esc(typeof v === "object" ? JSON.stringify(v) : v)}</td></tr>`).join("");
    const hop = (h, pred) => `<li data-index="${h.index}"><span class="hop">${pred ? "needs" : "feeds"}</span>#${h.index} ${esc(h.kind)} on ${esc(h.engine || "?")}` +
      ` <span class="delta">${h.slack_ns === undefined ? "" : pred ? `ended ${fmtNs(h.slack_ns)} before this started` : `starts ${fmtNs(h.slack_ns)} after this ended`}</span></li>`;
    el.innerHTML = `<div class="cols" data-testid="instruction-detail">
      <div><h3>#${d.index} ${esc(d.kind)} on ${esc(d.engine)} <span class="badge modeled">modeled</span></h3>
        <table class="kv"><tr><td>time</td><td>${fmtNs(d.start_ns)} → ${fmtNs(d.end_ns)} (${fmtNs(d.end_ns - d.start_ns)})</td></tr>
        <tr><td>bytes / FLOPs</td><td>${bytes(d.bytes)} / ${flops(d.flops)}</td></tr>
        <tr><td>provenance</td><td>${esc(d.provenance_text)}</td></tr>${ops}${fields}</table></div>
      <div><h3>Dependencies</h3>
        <p class="muted">${d.predecessors.length} predecessor(s) (blue arrows), ${d.successors.length} successor(s) (green)</p>
        <ul class="hops" data-testid="deps">${d.predecessors.map((h) => hop(h, true)).join("")}${d.successors.map((h) => hop(h, false)).join("")}</ul></div></div>`;
    el.querySelectorAll("[data-index]").forEach((li) => li.addEventListener("click", () => this.selectIndex(Number(li.dataset.index))));
  }

  renderOperators(el) {
    const agg = new Map();
    const a = this.a;
    for (let r = 0; r < this.n; r++) {
      const p = this.h.provenance[a.prov[r]] || {};
      const key = p.text || "-";
      let g = agg.get(key);
      if (!g) { g = { key, op: p.op || "", source: p.file ? `${p.file}:${p.line}` : "", n: 0, busy: 0, bytes: 0, flops: 0, engines: new Set(), idx: new Set() }; agg.set(key, g); }
      g.n += 1; g.busy += a.end[r] - a.start[r]; g.bytes += a.bytes[r]; g.flops += a.flops[r];
      g.engines.add(this.h.engines[a.engine[r]]); g.idx.add(a.index[r]);
    }
    const groups = [...agg.values()];
    const table = { columns: ["provenance", "op", "source", "instructions", "busy_ns", "bytes", "flops", "engines"],
      rows: groups.map((g) => [g.key, g.op, g.source, g.n, g.busy, g.bytes, g.flops, [...g.engines].join(" ")]) };
    const dt = new DataTable(table, { sort: "busy_ns", testid: "operator-table", onRow: (row) => {
      const g = agg.get(row[0]);
      this.setHighlight(g.idx);
    } });
    el.innerHTML = `<p class="muted">Instructions grouped by the op / kernel line they came from (busy time summed over engines, modeled). Click a row to highlight its instructions.</p>`;
    el.appendChild(dt.el);
  }

  async renderCode(el) {
    el.innerHTML = `<div class="loading">Loading…</div>`;
    let c;
    try {
      c = await getJSON(`${this.base}/code`, { hash: this.ex.program_hash, run: this.ex.run }, this.signal);
    } catch (e) { this.app.report(e, this.signal); return; }
    if (this.tab !== "code") return;
    const parts = [];
    const byFile = new Map();
    for (const l of c.lines) {
      if (!byFile.has(l.file)) byFile.set(l.file, []);
      byFile.get(l.file).push(l);
    }
    const heat = (l) => `${l.instructions} instr · ${fmtNs(Object.values(l.busy_ns).reduce((x, y) => x + y, 0))}`;
    for (const [file, lines] of byFile) {
      const f = file ? c.files[file] : null;
      if (f && f.text !== null) {
        const at = new Map(lines.map((l) => [l.line, l]));
        const src = f.text.split("\n").map((t, i) => {
          const l = at.get(i + 1);
          return `<div class="ln ${l ? "hot" : ""}" ${l ? `data-line="${i + 1}" data-file="${esc(file)}"` : ""}><span class="no">${i + 1}</span>` +
            `<span class="heat">${l ? esc(heat(l)) : ""}</span><span>${esc(t)}</span></div>`;
        }).join("");
        parts.push(`<h3>${esc(file)} <span class="muted">(${esc(f.found_at)})</span></h3><div class="code" data-testid="code-text">${src}</div>`);
      } else {
        const list = lines.map((l) => `<div class="ln hot" data-line="${l.line ?? ""}" data-file="${esc(file ?? "")}" data-label="${esc(l.label ?? "")}"><span class="no">${l.line ?? ""}</span>` +
          `<span class="heat">${esc(heat(l))}</span><span>${esc(l.label || "")}</span></div>`).join("");
        parts.push(`<h3>${esc(file || "instructions without a source line (built-in or lowered ops)")}</h3>` +
          (f && f.note ? `<p class="muted">${esc(f.note)}</p>` : "") + `<div class="code" data-testid="code-lines">${list}</div>`);
      }
    }
    el.innerHTML = `<p class="muted">Source lines and the instructions they emitted (click a line to highlight them; modeled busy time).</p>${parts.join("")}`;
    el.querySelectorAll(".ln[data-line]").forEach((d) => d.addEventListener("click", () => {
      const l = c.lines.find((x) => String(x.line ?? "") === d.dataset.line && String(x.file ?? "") === d.dataset.file &&
        (d.dataset.label === undefined || String(x.label ?? "") === d.dataset.label));
      el.querySelectorAll(".ln.sel").forEach((x) => x.classList.remove("sel"));
      d.classList.add("sel");
      if (l) this.setHighlight(new Set(l.indices));
    }));
  }

  renderWarnings(el) {
    const a = this.a;
    let small = 0, smallBytes = 0, spills = 0, spillBytes = 0;
    for (let r = 0; r < this.n; r++) {
      if (a.flags[r] & 1) { small++; smallBytes += a.bytes[r]; }
      if (a.flags[r] & 6) { spills++; spillBytes += a.bytes[r]; }
    }
    const s = this.summarize(0, this.h.span_ns, null);
    const idle = this.h.engines.filter((e, i) => !e.startsWith("DMA") && s.per[i].busy / Math.max(1, this.h.span_ns) < 0.05);
    let dmaN = 0, dmaBusy = 0, smallBusy = 0;
    for (let r = 0; r < this.n; r++) {
      if (!this.h.engines[a.engine[r]].startsWith("DMA")) continue;
      dmaN += 1; dmaBusy += a.end[r] - a.start[r];
      if (a.flags[r] & 1) smallBusy += a.end[r] - a.start[r];
    }
    const items = [];
    if (small) items.push(`${small} of ${dmaN} DMA transfers under ${bytes(this.h.small_dma_bytes)} (${bytes(smallBytes)} in all, ${pct(smallBusy / Math.max(1, dmaBusy))} of DMA queue time; red bands): each pays the DMA's fixed cost for little data — move larger, contiguous tiles. The summary's small-dma rule fires when the average transfer is under ${bytes(this.h.small_dma_bytes)} or most transfers are small.`);
    if (spills) items.push(`${spills} spill transfer(s) to/from HBM scratch (${bytes(spillBytes)}; orange bands): the working set did not fit on chip.`);
    if (idle.length) items.push(`engines idle or under 5% busy: ${idle.join(", ")}.`);
    el.innerHTML = items.length ? `<ul class="warnlist" data-testid="device-warnings">${items.map((x) => `<li>${esc(x)}</li>`).join("")}</ul>`
      : `<p class="muted" data-testid="device-warnings">No small DMAs, no spills, no idle compute engine.</p>`;
  }

  destroy() {
    if (this._ro) this._ro.disconnect();
    if (this._insAc) this._insAc.abort();
    this.canvas = null;
    document.getElementById("tooltip").hidden = true;
    this.el.remove();
  }
}

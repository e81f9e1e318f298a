// The system-trace timeline: lanes grouped by instance/pid/subsystem (or core, thread, process,
// CPU vs device), events and level-of-detail buckets drawn on a canvas from windowed, packed
// data; zoom, pan, hover, click to select, shift-drag to box-select, a highlighted chain.
import { getPacked } from "./api.js";
import { KeyColors } from "./colors.js";
import { ns as fmtNs, esc, laneTimesModeled } from "./format.js";

const ROW = 16;          // px per nesting level
const GROUP_H = 20;      // group header
const LANE_PAD = 4;
const LABEL_W = 230;
const AXIS_H = 24;
const MAX_ROWS = 8;      // nesting levels shown before a lane is expanded

export const GROUPINGS = {
  instance: { label: "instance / pid / subsystem", key: (l) => `${l.instance} / ${l.pid} / ${l.subsystem}`, name: (l) => l.identifier },
  core: { label: "core / device", key: (l) => l.core, name: (l) => `${l.subsystem} ${l.identifier}` },
  thread: { label: "thread / stream", key: (l) => (l.side === "device" ? `stream ${l.tid}` : `thread ${l.tid}`), name: (l) => `${l.process_name || l.pid} ${l.identifier}` },
  process: { label: "process", key: (l) => l.process_name || `pid ${l.pid}`, name: (l) => l.identifier },
  side: { label: "CPU vs device", key: (l) => (l.side === "device" ? "device" : "CPU (host)"), name: (l) => `${l.subsystem} ${l.identifier}` },
};

function niceStep(range, target) {
  const raw = range / Math.max(1, target);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (raw <= m * p) return m * p;
  return 10 * p;
}

export class Timeline {
  // opts: {base (API base "/api/p/p0"), meta, offset (ns added to view times), onSelect(ref, ev),
  //        onBox({t0,t1,lanes}), onStatus(text), title, showAxis}
  constructor(container, opts) {
    this.opts = opts;
    this.meta = opts.meta;
    this.base = opts.base;
    this.offset = opts.offset || 0;
    this.aligned = !!(opts.aligned || this.offset);  // compared at a common point (first step), even when it is 0
    this.group = "instance";
    this.color = "op";
    this.collapsed = new Set();
    this.expanded = new Set();
    this.search = null;        // Set of name ids, or null
    this.selected = null;      // ref
    this.chain = [];           // lineage hops to highlight
    this.data = null;          // last window answer
    this.t0 = -this.offset;
    this.t1 = this.meta.span_ns - this.offset;
    this.wantSeq = 0;
    this.doneSeq = 0;
    this.waiters = [];
    this.running = false;
    this.lastFetch = null;
    this.firstDraw = null;
    this.keyColors = new KeyColors(this.meta.names);
    this.kindColors = new KeyColors(this.meta.kinds);
    this._build(container);
    this.layout();
  }

  // ---- DOM --------------------------------------------------------------------------------
  _build(container) {
    this.root = document.createElement("div");
    this.root.className = "split";
    if (this.opts.title) {
      const t = document.createElement("div");
      t.className = "compare-lane-title";
      t.innerHTML = this.opts.title;
      this.root.appendChild(t);
    }
    this.axis = document.createElement("canvas");
    this.axis.className = "axis";
    this.axis.dataset.testid = "axis";
    this.tracks = document.createElement("div");
    this.tracks.className = "tracks";
    this.canvas = document.createElement("canvas");
    this.canvas.dataset.testid = "timeline";
    this.canvas.tabIndex = 0;
    this.tracks.appendChild(this.canvas);
    if (this.opts.showAxis !== false) this.root.appendChild(this.axis);
    this.root.appendChild(this.tracks);
    container.appendChild(this.root);
    this.tooltip = document.getElementById("tooltip");
    this.tracks.addEventListener("scroll", () => this.draw());
    this.canvas.addEventListener("wheel", (e) => this._wheel(e), { passive: false });
    this.canvas.addEventListener("mousedown", (e) => this._down(e));
    this.canvas.addEventListener("mousemove", (e) => this._move(e));
    this.canvas.addEventListener("mouseleave", () => { this.tooltip.hidden = true; });
    this.canvas.addEventListener("dblclick", (e) => this._dbl(e));
    this.canvas.addEventListener("keydown", (e) => this._key(e));
    this._resizeObs = new ResizeObserver(() => { this.layout(); this.refresh(); });
    this._resizeObs.observe(this.tracks);
  }

  destroy() {
    this._resizeObs.disconnect();
    if (this._raf) cancelAnimationFrame(this._raf);
    (this._afterPaint || []).forEach((f) => f());  // nobody waits for a view that is gone
    this._afterPaint = [];
    this.root.remove();
    this.tooltip.hidden = true;
  }

  get width() { return Math.max(200, this.tracks.clientWidth); }
  get plotW() { return this.width - LABEL_W; }
  xOf(t) { return LABEL_W + ((t - this.t0 - this.offset) / (this.t1 - this.t0)) * this.plotW; }
  tOf(x) { return this.t0 + this.offset + ((x - LABEL_W) / this.plotW) * (this.t1 - this.t0); }

  // ---- layout -----------------------------------------------------------------------------
  layout() {
    const g = GROUPINGS[this.group];
    const groups = new Map();
    for (const l of this.meta.lanes) {
      const k = g.key(l);
      if (!groups.has(k)) groups.set(k, []);
      groups.get(k).push(l);
    }
    const rows = [];
    let y = 0;
    this.laneY = new Map();
    this.laneRows = new Map();
    for (const [key, lanes] of groups) {
      const collapsed = this.collapsed.has(key);
      rows.push({ type: "group", key, y, h: GROUP_H, collapsed, n: lanes.length });
      y += GROUP_H;
      if (collapsed) continue;
      for (const l of lanes) {
        const depth = l.max_depth + 1;
        const shown = this.expanded.has(l.lane) ? depth : Math.min(depth, MAX_ROWS);
        const h = shown * ROW + LANE_PAD;
        rows.push({ type: "lane", lane: l.lane, y, h, shown, depth, name: g.name(l), info: l });
        this.laneY.set(l.lane, y + 2);
        this.laneRows.set(l.lane, shown);
        y += h;
      }
    }
    this.rows = rows;
    this.totalH = y + 8;
    const dpr = window.devicePixelRatio || 1;
    const w = this.width;
    const visH = Math.min(this.totalH, 32000);
    this.canvas.style.width = `${w}px`;
    this.canvas.style.height = `${visH}px`;
    this.canvas.width = Math.floor(w * dpr);
    this.canvas.height = Math.floor(visH * dpr);
    this.axis.style.width = `${w}px`;
    this.axis.style.height = `${AXIS_H}px`;
    this.axis.width = Math.floor(w * dpr);
    this.axis.height = Math.floor(AXIS_H * dpr);
    this.dpr = dpr;
  }

  visibleLanes() { return this.rows.filter((r) => r.type === "lane").map((r) => r.lane); }

  setGrouping(mode) { this.group = mode; this.collapsed.clear(); this.layout(); this.draw(); return this.refresh(); }
  setColor(mode) { this.color = mode; return this.refresh(true); }
  setSearch(ids) { this.search = ids ? new Set(ids) : null; this.draw(); }
  setChain(hops) { this.chain = hops || []; this.draw(); }
  select(ref) { this.selected = ref; this.draw(); }

  // ---- range & data -------------------------------------------------------------------------
  clampRange(t0, t1) {
    // opts.bounds (view time) lets linked timelines of different lengths share one scale
    const [min, max] = this.opts.bounds ||
      [-this.offset - 0.02 * this.meta.span_ns, this.meta.span_ns - this.offset + 0.02 * this.meta.span_ns];
    let w = Math.max(t1 - t0, 50);
    w = Math.min(w, max - min);
    t0 = Math.max(min, Math.min(t0, max - w));
    return [t0, t0 + w];
  }

  setRange(t0, t1, opts = {}) {
    [this.t0, this.t1] = this.clampRange(t0, t1);
    this.draw();
    if (this.opts.onRange && !opts.fromLink) this.opts.onRange(this.t0, this.t1, this);
    return this.refresh(opts.force);
  }

  reset() { return this.setRange(-this.offset, this.meta.span_ns - this.offset); }

  _params() {
    const w = this.t1 - this.t0;
    const a = Math.max(0, Math.floor(this.t0 + this.offset - 0.5 * w));
    const b = Math.min(this.meta.span_ns + 1, Math.ceil(this.t1 + this.offset + 0.5 * w));
    return { t0: a, t1: Math.max(b, a + 1), px: Math.round(this.plotW * 2), lanes: this.visibleLanes().join(","), color: this.color };
  }

  _covers(p) {
    const d = this.data;
    if (!d) return false;
    if (d.params.lanes !== p.lanes || d.params.color !== p.color) return false;
    const vt0 = this.t0 + this.offset, vt1 = this.t1 + this.offset;
    if (d.header.t0 > Math.max(0, vt0) || d.header.t1 < Math.min(this.meta.span_ns, vt1)) return false;
    if (d.header.exact) return true;
    const have = (d.header.t1 - d.header.t0) / d.params.px;
    const want = (p.t1 - p.t0) / p.px;
    return have <= want * 1.5 && have >= want / 1.5;
  }

  // Resolves once data covering the current range is drawn.
  refresh(force = false) {
    const seq = ++this.wantSeq;
    if (force) this.forceSeq = seq;
    const p = new Promise((res, rej) => this.waiters.push({ seq, res, rej }));
    // set before the call: _run may finish synchronously (nothing to fetch)
    if (!this.running) { this.running = true; this._run(); }
    return p;
  }

  async _run() {
    try {
      while (this.doneSeq < this.wantSeq) {
        const seq = this.wantSeq;
        const p = this._params();
        const force = this.forceSeq && this.forceSeq <= seq && this.forceSeq > this.doneSeq;
        if (force || !this._covers(p)) {
          const t = performance.now();
          const { header, arrays } = await getPacked(`${this.base}/window`, p);
          const tf = performance.now();
          this.data = { header, arrays, params: p };
          await this.afterPaint();
          const td = performance.now();
          this.lastFetch = { ms: td - t, fetch_ms: tf - t, draw_ms: td - tf, events: arrays.ev_ref.length,
                             buckets: arrays.bk_lane.length, exact: header.exact, total: header.total };
          if (!this.firstDraw) this.firstDraw = td;
          this._status();
        } else {
          await this.afterPaint();
          this._status();
        }
        this.doneSeq = seq;
        const ready = this.waiters.filter((w) => w.seq <= seq);
        this.waiters = this.waiters.filter((w) => w.seq > seq);
        ready.forEach((w) => w.res(this.lastFetch));
      }
    } catch (e) {
      const all = this.waiters;
      this.waiters = [];
      all.forEach((w) => w.rej(e));
      if (this.opts.onError) this.opts.onError(e);
    } finally {
      this.running = false;
    }
  }

  _status() {
    const f = this.lastFetch;
    if (!f || !this.opts.onStatus) return;
    const mode = f.exact ? "exact" : `level of detail (${fmtNs(this.data.header.bucket_ns)} buckets)`;
    this.opts.onStatus(`window ${fmtNs(this.t1 - this.t0)} · ${f.events.toLocaleString()} events` +
      (f.buckets ? ` + ${f.buckets.toLocaleString()} buckets` : "") + ` of ~${f.total.toLocaleString()} · ${mode} · ` +
      `request+draw ${f.ms.toFixed(1)} ms`);
  }

  // ---- drawing ------------------------------------------------------------------------------
  // draw() asks for a frame: several calls within one frame paint once (the canvas is
  // rasterised once per frame anyway). afterPaint() resolves once the frame was painted and
  // the next one began, so timings include rasterisation.
  draw() {
    if (document.hidden) return this._paint();
    if (this._raf) return;
    this._raf = requestAnimationFrame(() => {
      this._raf = 0;
      this._paint();
      const ws = this._afterPaint || [];
      this._afterPaint = [];
      if (ws.length) requestAnimationFrame(() => ws.forEach((f) => f()));
    });
  }

  afterPaint() {
    if (document.hidden) { this._paint(); return Promise.resolve(); }
    return new Promise((res) => { (this._afterPaint = this._afterPaint || []).push(res); this.draw(); });
  }

  _paint() {
    if (!this.rows) return;
    const ctx = this.canvas.getContext("2d");
    const dpr = this.dpr;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const W = this.width, H = this.canvas.height / dpr;
    ctx.clearRect(0, 0, W, H);
    const top = this.tracks.scrollTop, bottom = top + this.tracks.clientHeight;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    // lane backgrounds
    for (const r of this.rows) {
      if (r.y + r.h < top || r.y > bottom) continue;
      if (r.type === "group") {
        ctx.fillStyle = "#eef0f3";
        ctx.fillRect(0, r.y, W, r.h);
      } else {
        ctx.fillStyle = r.info.side === "device" ? "#fbfbfe" : "#ffffff";
        ctx.fillRect(LABEL_W, r.y, W - LABEL_W, r.h);
        ctx.fillStyle = "#e5e7eb";
        ctx.fillRect(0, r.y + r.h - 1, W, 1);
      }
    }
    ctx.save();
    ctx.beginPath();
    ctx.rect(LABEL_W, 0, W - LABEL_W, H);
    ctx.clip();
    if (this.data) this._drawData(ctx, top, bottom);
    this._drawChain(ctx);
    this._drawBox(ctx);
    ctx.restore();
    this._drawLabels(ctx, top, bottom);
    this._drawAxis();
  }

  _rowY(lane, depth) {
    const y = this.laneY.get(lane);
    if (y === undefined || depth >= this.laneRows.get(lane)) return undefined;
    return y + depth * ROW;
  }

  // Draws buckets, then events, grouped by fill style (colour and shade): tens of thousands of
  // rectangles cost a few style changes instead of one each.
  _drawData(ctx, top, bottom) {
    const a = this.data.arrays;
    const colors = this.color === "kind" ? this.kindColors : this.keyColors;
    const x0 = this.t0 + this.offset, span = this.t1 - this.t0, pw = this.plotW;
    const k = pw / span, right = LABEL_W + pw;
    const names = this.meta.names;
    const search = this.search;
    const batches = new Map();  // style id -> flat [x, y, w, ...]
    const add = (style, x, y, w) => {
      let b = batches.get(style);
      if (!b) { b = []; batches.set(style, b); }
      b.push(x, y, w);
    };
    const SHADES = [0.35, 0.55, 0.75, 1];
    const bn = this.data.header.bucket_ns || 1, bo = this.data.header.bk_origin || 0;
    const bw = Math.max(bn * k, 1);
    for (let i = 0; i < a.bk_lane.length; i++) {
      const y = this._rowY(a.bk_lane[i], a.bk_depth[i]);
      if (y === undefined || y + ROW < top || y > bottom) continue;
      const x = LABEL_W + (bo + a.bk_pos[i] * bn - x0) * k;
      if (x + bw < LABEL_W || x > right) continue;
      const shade = Math.min(3, a.bk_fill[i] >> 6);
      add(a.bk_key[i] * 8 + shade, x, y, bw);
    }
    const labels = [];
    let sel = null, lastX = -1, lastY = -1;
    for (let i = 0; i < a.ev_ref.length; i++) {
      const y = this._rowY(a.ev_lane[i], a.ev_depth[i]);
      if (y === undefined || y + ROW < top || y > bottom) continue;
      const x = LABEL_W + (a.ev_start[i] - x0) * k;
      let w = a.ev_dur[i] * k;
      if (x > right || x + w < LABEL_W) continue;
      if (w < 1) {
        // sub-pixel events: one 1-px column per pixel and row is enough
        const px = Math.floor(x);
        if (px === lastX && y === lastY) continue;
        lastX = px; lastY = y;
        w = a.ev_dur[i] === 0 ? 2 : 1;
      }
      const dim = search && !search.has(a.ev_name[i]) ? 4 : 3;
      add(a.ev_key[i] * 8 + dim, x, y, w);
      if (w > 34) labels.push(i, x, y, w);
      if (a.ev_ref[i] === this.selected) sel = [x, y, w];
    }
    for (const [style, b] of batches) {
      const shade = style % 8;
      ctx.globalAlpha = shade === 4 ? 0.18 : SHADES[shade];
      ctx.fillStyle = colors.get(Math.floor(style / 8));
      // fillRect, not one path of many rects: a rectangle fill is a fast path when rasterised
      for (let j = 0; j < b.length; j += 3) ctx.fillRect(b[j], b[j + 1], b[j + 2], ROW - 1);
    }
    ctx.globalAlpha = 1;
    ctx.fillStyle = "#111";
    for (let j = 0; j < labels.length; j += 4) {
      const i = labels[j], x = labels[j + 1], y = labels[j + 2], w = labels[j + 3];
      const xs = Math.max(x, LABEL_W) + 3;
      const room = Math.min(x + w, right) - xs - 2;
      if (room <= 20) continue;
      const label = names[a.ev_name[i]] || "";
      const n = Math.floor(room / 6.1);
      ctx.fillText(label.length > n ? label.slice(0, Math.max(1, n - 1)) + "…" : label, xs, y + ROW / 2);
    }
    if (sel) {
      ctx.strokeStyle = "#111";
      ctx.lineWidth = 2;
      ctx.strokeRect(sel[0], sel[1], Math.max(sel[2], 2), ROW - 1);
    }
  }

  _drawChain(ctx) {
    if (!this.chain.length) return;
    const pts = [];
    for (const h of this.chain) {
      if (h.lane === undefined || h.lane === null || h.start_ns === undefined || h.start_ns === null) continue;
      const y = this._rowY(h.lane, Math.min(h.depth || 0, (this.laneRows.get(h.lane) || 1) - 1));
      if (y === undefined) continue;
      const x = this.xOf(h.start_ns), w = Math.max(2, (h.dur_ns || 0) * this.plotW / (this.t1 - this.t0));
      ctx.strokeStyle = "#dc2626";
      ctx.lineWidth = 2;
      ctx.strokeRect(x, y, w, ROW - 1);
      pts.push([x, y + ROW / 2]);
    }
    ctx.strokeStyle = "#dc2626";
    ctx.fillStyle = "#dc2626";
    ctx.lineWidth = 1.5;
    for (let i = 1; i < pts.length; i++) {
      const [ax, ay] = pts[i - 1], [bx, by] = pts[i];
      if (ay === by) continue;
      ctx.beginPath(); ctx.moveTo(ax, ay); ctx.lineTo(bx, by); ctx.stroke();
      const ang = Math.atan2(by - ay, bx - ax);
      ctx.beginPath();
      ctx.moveTo(bx, by);
      ctx.lineTo(bx - 8 * Math.cos(ang - 0.4), by - 8 * Math.sin(ang - 0.4));
      ctx.lineTo(bx - 8 * Math.cos(ang + 0.4), by - 8 * Math.sin(ang + 0.4));
      ctx.fill();
    }
  }

  _drawBox(ctx) {
    const b = this.box;
    if (!b) return;
    ctx.fillStyle = "rgba(37, 99, 235, 0.12)";
    ctx.strokeStyle = "#2563eb";
    ctx.lineWidth = 1;
    const x = Math.min(b.x0, b.x1), y = Math.min(b.y0, b.y1);
    ctx.fillRect(x, y, Math.abs(b.x1 - b.x0), Math.abs(b.y1 - b.y0));
    ctx.strokeRect(x, y, Math.abs(b.x1 - b.x0), Math.abs(b.y1 - b.y0));
  }

  _drawLabels(ctx, top, bottom) {
    ctx.fillStyle = "#fafafa";
    ctx.fillRect(0, top, LABEL_W, bottom - top);
    ctx.fillStyle = "#e5e7eb";
    ctx.fillRect(LABEL_W - 1, top, 1, bottom - top);
    for (const r of this.rows) {
      if (r.y + r.h < top || r.y > bottom) continue;
      if (r.type === "group") {
        ctx.fillStyle = "#eef0f3";
        ctx.fillRect(0, r.y, LABEL_W, r.h);
        ctx.fillStyle = "#111";
        ctx.font = "600 11px system-ui, sans-serif";
        const t = `${r.collapsed ? "▸" : "▾"} ${r.key}`;
        ctx.fillText(t.length > 36 ? t.slice(0, 35) + "…" : t, 6, r.y + r.h / 2);
        if (r.collapsed) {
          ctx.fillStyle = "#6b7280";
          ctx.font = "11px system-ui, sans-serif";
          ctx.fillText(`${r.n} lane${r.n > 1 ? "s" : ""} hidden`, LABEL_W + 8, r.y + r.h / 2);
        }
      } else {
        ctx.font = "11px system-ui, sans-serif";
        ctx.fillStyle = "#111";
        let t = r.name || "";
        if (t.length > 30) t = t.slice(0, 29) + "…";
        ctx.fillText(t, 14, r.y + 9);
        ctx.fillStyle = "#6b7280";
        const tags = [];
        if (laneTimesModeled(this.meta, r.info)) tags.push("modeled");
        if (r.depth > r.shown) tags.push(`+${r.depth - r.shown} levels (click)`);
        if (tags.length) ctx.fillText(tags.join(" · "), 14, r.y + 9 + 13);
      }
    }
  }

  _drawAxis() {
    const ctx = this.axis.getContext("2d");
    const dpr = this.dpr;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const W = this.width;
    ctx.clearRect(0, 0, W, AXIS_H);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, W, AXIS_H);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    ctx.fillStyle = "#6b7280";
    ctx.fillText(this.aligned ? "aligned time" : "time from trace start", 6, AXIS_H / 2);
    const span = this.t1 - this.t0;
    const step = niceStep(span, Math.max(2, this.plotW / 110));
    const first = Math.ceil(this.t0 / step) * step;
    ctx.strokeStyle = "#d1d5db";
    for (let t = first; t <= this.t1; t += step) {
      const x = LABEL_W + ((t - this.t0) / span) * this.plotW;
      ctx.beginPath(); ctx.moveTo(x, AXIS_H - 6); ctx.lineTo(x, AXIS_H); ctx.stroke();
      ctx.fillStyle = "#374151";
      ctx.fillText(fmtNs(t), x + 3, AXIS_H / 2 - 2);
    }
  }

  // ---- hit testing & interaction ------------------------------------------------------------------
  _pos(e) {
    const r = this.canvas.getBoundingClientRect();
    return [e.clientX - r.left, e.clientY - r.top];
  }

  rowAt(y) { return this.rows.find((r) => y >= r.y && y < r.y + r.h); }

  hit(x, y) {
    if (!this.data || x < LABEL_W) return null;
    const row = this.rowAt(y);
    if (!row || row.type !== "lane") return null;
    const depth = Math.floor((y - row.y - 2) / ROW);
    const a = this.data.arrays;
    const t = this.tOf(x);
    const tol = (3 * (this.t1 - this.t0)) / this.plotW;
    let best = null;
    for (let i = a.ev_ref.length - 1; i >= 0; i--) {
      if (a.ev_lane[i] !== row.lane || a.ev_depth[i] !== depth) continue;
      if (t >= a.ev_start[i] - tol && t <= a.ev_start[i] + a.ev_dur[i] + tol) {
        const d = t < a.ev_start[i] ? a.ev_start[i] - t : t > a.ev_start[i] + a.ev_dur[i] ? t - a.ev_start[i] - a.ev_dur[i] : 0;
        if (!best || d < best.d) best = { kind: "event", i, d };
        if (d === 0) break;
      }
    }
    if (best) return best;
    const bn = this.data.header.bucket_ns, bo = this.data.header.bk_origin || 0;
    for (let i = 0; i < a.bk_lane.length; i++) {
      const s = bo + a.bk_pos[i] * bn;
      if (a.bk_lane[i] === row.lane && a.bk_depth[i] === depth && t >= s && t < s + bn) {
        return { kind: "bucket", i };
      }
    }
    return null;
  }

  _tip(e, html) {
    const t = this.tooltip;
    t.innerHTML = html;
    t.hidden = false;
    const x = Math.min(e.clientX + 14, window.innerWidth - t.offsetWidth - 8);
    const y = Math.min(e.clientY + 14, window.innerHeight - t.offsetHeight - 8);
    t.style.left = `${x}px`;
    t.style.top = `${y}px`;
  }

  _move(e) {
    const [x, y] = this._pos(e);
    if (this.drag) return this._dragMove(e, x, y);
    const h = this.hit(x, y);
    if (!h) {
      const row = this.rowAt(y);
      if (row && x < LABEL_W) {
        const l = row.info;
        this._tip(e, row.type === "group" ? `<div class="t">${esc(row.key)}</div><div class="d">click to ${row.collapsed ? "expand" : "collapse"}</div>`
          : `<div class="t">${esc(l.instance)} / ${esc(l.pid)} / ${esc(l.subsystem)} / ${esc(l.identifier)}</div>` +
            `<div class="d">${esc(l.process_name || "")} · ${l.events.toLocaleString()} events · ${esc(l.side)}` +
            `${laneTimesModeled(this.meta, l) ? " · times modeled" : ""}</div>`);
      } else this.tooltip.hidden = true;
      this.canvas.style.cursor = "default";
      return;
    }
    this.canvas.style.cursor = "pointer";
    const a = this.data.arrays;
    if (h.kind === "event") {
      const name = this.meta.names[a.ev_name[h.i]];
      const key = this.color === "kind" ? this.meta.kinds[a.ev_key[h.i]] : this.meta.names[a.ev_key[h.i]];
      this._tip(e, `<div class="t">${esc(name)}</div><div class="d">start ${fmtNs(a.ev_start[h.i])} · duration ${fmtNs(a.ev_dur[h.i])}` +
        `${key !== name ? ` · ${this.color}: ${esc(key)}` : ""}${this._laneModeled(a.ev_lane[h.i]) ? " · modeled" : ""}</div>`);
    } else {
      const bn = this.data.header.bucket_ns;
      this._tip(e, `<div class="t">${a.bk_count[h.i].toLocaleString()} events in ${fmtNs(bn)}</div>` +
        `<div class="d">busy ≈ ${fmtNs((a.bk_fill[h.i] / 255) * bn)} · longest: ${esc(this.color === "kind" ? this.meta.kinds[a.bk_key[h.i]] : this.meta.names[a.bk_key[h.i]])}` +
        ` · zoom in for each event</div>`);
    }
  }

  _laneModeled(lane) {
    return laneTimesModeled(this.meta, this.meta.lanes.find((x) => x.lane === lane));
  }

  _down(e) {
    this.canvas.focus();
    const [x, y] = this._pos(e);
    if (x < LABEL_W) {
      const row = this.rowAt(y);
      if (!row) return;
      if (row.type === "group") {
        if (this.collapsed.has(row.key)) this.collapsed.delete(row.key); else this.collapsed.add(row.key);
      } else if (row.depth > MAX_ROWS) {
        if (this.expanded.has(row.lane)) this.expanded.delete(row.lane); else this.expanded.add(row.lane);
      }
      this.layout();
      this.draw();
      this.refresh();
      return;
    }
    this.drag = { x0: x, y0: y, t0: this.t0, t1: this.t1, moved: false, box: e.shiftKey };
    const up = (ev) => {
      window.removeEventListener("mouseup", up);
      const d = this.drag;
      this.drag = null;
      if (d.box && d.moved) return this._finishBox();
      if (!d.moved) this._click(ev, x, y);
      else this.refresh();
    };
    window.addEventListener("mouseup", up);
  }

  _dragMove(e, x, y) {
    const d = this.drag;
    if (Math.abs(x - d.x0) + Math.abs(y - d.y0) > 3) d.moved = true;
    if (!d.moved) return;
    this.tooltip.hidden = true;
    if (d.box) {
      this.box = { x0: Math.max(LABEL_W, d.x0), y0: d.y0, x1: Math.max(LABEL_W, x), y1: y };
      this.draw();
      return;
    }
    const dt = ((x - d.x0) / this.plotW) * (d.t1 - d.t0);
    [this.t0, this.t1] = this.clampRange(d.t0 - dt, d.t1 - dt);
    this.draw();
    if (this.opts.onRange) this.opts.onRange(this.t0, this.t1, this);
    this.refresh();
  }

  _finishBox() {
    const b = this.box;
    const t0 = this.tOf(Math.min(b.x0, b.x1)), t1 = this.tOf(Math.max(b.x0, b.x1));
    const ya = Math.min(b.y0, b.y1), yb = Math.max(b.y0, b.y1);
    const lanes = this.rows.filter((r) => r.type === "lane" && r.y + r.h > ya && r.y < yb).map((r) => r.lane);
    if (this.opts.onBox && lanes.length && t1 > t0) this.opts.onBox({ t0: Math.max(0, Math.floor(t0)), t1: Math.ceil(t1), lanes });
  }

  clearBox() { this.box = null; this.draw(); }

  _click(e, x, y) {
    this.box = null;
    const h = this.hit(x, y);
    if (h && h.kind === "event") {
      const ref = this.data.arrays.ev_ref[h.i];
      this.selected = ref;
      this.draw();
      if (this.opts.onSelect) this.opts.onSelect(ref);
    } else if (h && h.kind === "bucket") {
      const a = this.data.arrays, bn = this.data.header.bucket_ns;
      const c = (this.data.header.bk_origin || 0) + a.bk_pos[h.i] * bn + bn / 2 - this.offset;
      this.setRange(c - bn * 20, c + bn * 20);
    } else {
      this.selected = null;
      this.draw();
      if (this.opts.onSelect) this.opts.onSelect(null);
    }
  }

  _dbl(e) {
    const [x, y] = this._pos(e);
    const h = this.hit(x, y);
    if (h && h.kind === "event") this.zoomTo(this.data.arrays.ev_start[h.i], this.data.arrays.ev_dur[h.i]);
  }

  // Scrolls the lane area so that ``lane`` (at ``depth``) is in view.
  scrollToLane(lane, depth = 0) {
    const y = this._rowY(lane, Math.min(depth, (this.laneRows.get(lane) || 1) - 1));
    if (y === undefined) return;
    const top = this.tracks.scrollTop, h = this.tracks.clientHeight;
    if (y < top + 4 || y + ROW > top + h - 4) this.tracks.scrollTop = Math.max(0, y - h / 3);
    this.draw();
  }

  zoomTo(start, dur) {
    const pad = Math.max(dur * 0.25, 100);
    return this.setRange(start - this.offset - pad, start - this.offset + dur + pad);
  }

  zoom(factor, x) {
    const ax = x === undefined ? LABEL_W + this.plotW / 2 : x;
    const t = this.t0 + ((ax - LABEL_W) / this.plotW) * (this.t1 - this.t0);
    return this.setRange(t - (t - this.t0) * factor, t + (this.t1 - t) * factor);
  }

  pan(fraction) {
    const d = (this.t1 - this.t0) * fraction;
    return this.setRange(this.t0 + d, this.t1 + d);
  }

  _wheel(e) {
    if (e.ctrlKey || e.metaKey || e.altKey) {
      e.preventDefault();
      const [x] = this._pos(e);
      this.zoom(Math.exp(Math.max(-1, Math.min(1, e.deltaY * 0.01))), Math.max(LABEL_W, x));
    } else if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
      e.preventDefault();
      const d = e.shiftKey ? e.deltaY : e.deltaX;
      this.pan(d / this.plotW);
    }
  }

  _key(e) {
    const k = e.key.toLowerCase();
    if (k === "w") this.zoom(0.7);
    else if (k === "s") this.zoom(1 / 0.7);
    else if (k === "a") this.pan(-0.2);
    else if (k === "d") this.pan(0.2);
    else if (k === "0") this.reset();
    else return;
    e.preventDefault();
  }
}

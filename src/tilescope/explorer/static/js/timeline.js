// The system-trace timeline: lanes grouped by instance/pid/subsystem (or core, thread, process,
// CPU vs device), events and level-of-detail buckets drawn on a canvas from windowed, packed
// data; zoom at the pointer, pan, hover, click to select, shift-drag to box-select, a mark, a
// highlighted chain.
//
// One time axis that tells the truth: on a simulated-device profile the host's waits for the
// simulator (the part of a synchronize after the modeled work was done, /meta "waits") are
// drawn as waits and, by default, collapsed to a narrow hatched band, so the modeled work fills
// the view. The axis is then piecewise linear: "display time" u = D(t) removes each collapsed
// wait but a sliver; the axis labels stay real times and show the break.
import { getPacked, isAbort } from "./api.js";
import { KeyColors } from "./colors.js";
import { bucketStrip } from "./strip.js";
import { ns as fmtNs, esc, laneTimesModeled } from "./format.js";

const ROW = 16;          // px per nesting level
const GROUP_H = 20;      // group header
const LANE_PAD = 4;
const LABEL_W = 230;
const AXIS_H = 24;
const MAX_ROWS = 8;      // nesting levels shown before a lane is expanded
const CUT_SHARE = 0.02;  // a collapsed wait keeps this share of the collapsed trace's span

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

// The piecewise-linear map between real time t (ns from the trace start) and display time u.
export class Axis {
  constructor(waits, span, collapse) {
    this.cuts = [];
    if (collapse && waits && waits.length) {
      const total = waits.reduce((s, w) => s + (w.end_ns - w.start_ns), 0);
      const g = Math.max(1, CUT_SHARE * Math.max(1, span - total));
      let removed = 0;
      for (const w of waits) {
        const len = w.end_ns - w.start_ns;
        if (len <= g) continue;
        this.cuts.push({ a: w.start_ns, b: w.end_ns, g, ua: w.start_ns - removed, removed, name: w.name, ns: len });
        removed += len - g;
      }
      this.removed = removed;
    } else this.removed = 0;
  }

  get identity() { return this.cuts.length === 0; }

  D(t) {
    const c = this.cuts;
    if (!c.length) return t;
    let lo = 0, hi = c.length - 1, k = -1;
    while (lo <= hi) { const m = (lo + hi) >> 1; if (c[m].a <= t) { k = m; lo = m + 1; } else hi = m - 1; }
    if (k < 0) return t;
    const x = c[k];
    if (t < x.b) return x.ua + ((t - x.a) * x.g) / (x.b - x.a);
    return t - x.removed - (x.b - x.a - x.g);
  }

  Dinv(u) {
    const c = this.cuts;
    if (!c.length) return u;
    let k = -1;
    for (let i = 0; i < c.length; i++) if (c[i].ua <= u) k = i; else break;
    if (k < 0) return u;
    const x = c[k];
    if (u < x.ua + x.g) return x.a + ((u - x.ua) * (x.b - x.a)) / x.g;
    return u + x.removed + (x.b - x.a - x.g);
  }

  // Visible real-time segments of a display range, the collapsed waits left out.
  segments(u0, u1) {
    const out = [];
    let cur = u0;
    for (const x of this.cuts) {
      const ca = x.ua, cb = x.ua + x.g;
      if (cb <= cur) continue;
      if (ca >= u1) break;
      if (ca > cur) out.push([cur, ca]);
      cur = Math.max(cur, cb);
    }
    if (cur < u1) out.push([cur, u1]);
    return out;
  }
}

export class Timeline {
  // opts: {base (API base "/api/p/p0"), meta, offset (real ns shown as 0), aligned, bounds ([u0, u1]
  //        view limits), title, showAxis, signal, collapse (host waits), onSelect(ref), onBox({t0,t1,lanes}),
  //        onRange(t0, t1, src), onStatus(text), onError(e), onChange()}
  constructor(container, opts) {
    this.opts = opts;
    this.meta = opts.meta;
    this.base = opts.base;
    this.signal = opts.signal;
    this.offsetReal = opts.offset || 0;
    this.aligned = !!(opts.aligned || this.offsetReal);  // compared at a common point, even when it is 0
    this.group = "instance";
    this.color = "op";
    this.collapsed = new Set();
    this.expanded = new Set();
    this.search = null;        // Set of name ids, or null
    this.selected = null;      // ref
    this.chain = [];           // lineage hops to highlight
    this.mark = null;          // [t0, t1] in real ns, or null
    this.data = null;          // last window answer (merged segments)
    this.pointerX = null;      // the pointer over the plot (W/S zoom there)
    this.setCollapse(opts.collapse !== undefined ? opts.collapse : (this.meta.waits || []).length > 0, false);
    [this.t0, this.t1] = this.wholeRange();
    this.wantSeq = 0;
    this.doneSeq = 0;
    this.waiters = [];
    this.running = false;
    this.dropped = 0;          // window requests cancelled because the view moved past them
    this.lastFetch = null;
    this.firstDraw = null;
    this.keyColors = new KeyColors(this.meta.names);
    this.kindColors = new KeyColors(this.meta.kinds);
    this._build(container);
    this.layout();
  }

  // ---- the axis ---------------------------------------------------------------------------
  setCollapse(on, redraw = true) {
    const keep = this.t0 !== undefined ? [this.realOf(this.t0), this.realOf(this.t1)] : null;
    this.collapse = !!on;
    this.axisMap = new Axis(this.meta.waits || [], this.meta.span_ns, this.collapse);
    this.offD = this.axisMap.D(this.offsetReal);
    if (keep) {
      this.t0 = this.viewOf(keep[0]);
      this.t1 = this.viewOf(keep[1]);
    }
    if (redraw) { this.draw(); this._changed(); return this.refresh(true); }
    return Promise.resolve();
  }

  viewOf(t) { return this.axisMap.D(t) - this.offD; }          // real ns -> view time
  realOf(v) { return this.axisMap.Dinv(v + this.offD); }        // view time -> real ns
  wholeRange() { return [this.viewOf(0), this.viewOf(this.meta.span_ns)]; }

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
    this.canvas.addEventListener("mouseleave", () => { this.tooltip.hidden = true; this.pointerX = null; });
    this.canvas.addEventListener("dblclick", (e) => this._dbl(e));
    this.axis.addEventListener("click", (e) => {  // a click on a collapsed wait's band expands the waits
      const x = e.clientX - this.axis.getBoundingClientRect().left;
      if (this.opts.onWait && this.waitAt(x)) this.opts.onWait();
    });
    this._resizeObs = new ResizeObserver(() => { if (this.dead) return; this.layout(); this.refresh(); });
    this._resizeObs.observe(this.tracks);
  }

  destroy() {
    this.dead = true;
    this._resizeObs.disconnect();
    if (this._raf) cancelAnimationFrame(this._raf);
    if (this._wheelRaf) cancelAnimationFrame(this._wheelRaf);
    if (this._inflight) this._inflight.ac.abort();
    (this._afterPaint || []).forEach((f) => f());  // nobody waits for a view that is gone
    this._afterPaint = [];
    const all = this.waiters;
    this.waiters = [];
    all.forEach((w) => w.res(this.lastFetch));
    this.root.remove();
    this.tooltip.hidden = true;
  }

  // The tracks' width, read once per layout (the ResizeObserver lays out again on a resize):
  // reading clientWidth while a frame is drawn forces the page's layout each time.
  get width() {
    if (this._w !== undefined) return this._w;
    const w = Math.max(200, this.tracks.clientWidth);
    if (this.root.isConnected) this._w = w;  // before the view is shown its width is not known yet
    return w;
  }
  get plotW() { return Math.max(1, this.width - LABEL_W); }
  xOf(t) { return LABEL_W + ((this.viewOf(t) - this.t0) / (this.t1 - this.t0)) * this.plotW; }   // real ns -> x
  tOf(x) { return this.realOf(this.vOf(x)); }                                                    // x -> real ns
  vOf(x) { return this.t0 + ((x - LABEL_W) / this.plotW) * (this.t1 - this.t0); }                // x -> view time

  // ---- layout -----------------------------------------------------------------------------
  layout() {
    this._w = undefined;
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
    // compact (compare): no group headers, fewer nesting levels, lanes named by subsystem
    const compact = !!this.opts.compact, maxRows = compact ? 3 : MAX_ROWS;
    for (const [key, lanes] of groups) {
      const collapsed = !compact && this.collapsed.has(key);
      if (!compact) {
        rows.push({ type: "group", key, y, h: GROUP_H, collapsed, n: lanes.length });
        y += GROUP_H;
      }
      if (collapsed) continue;
      for (const l of lanes) {
        const depth = l.max_depth + 1;
        const shown = this.expanded.has(l.lane) ? depth : Math.min(depth, maxRows);
        const h = shown * ROW + LANE_PAD;
        rows.push({ type: "lane", lane: l.lane, y, h, shown, depth, name: compact ? `${l.subsystem} ${l.identifier}` : g.name(l), info: l });
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

  setGrouping(mode) {
    if (!GROUPINGS[mode]) return Promise.resolve();
    this.group = mode; this.collapsed.clear(); this.layout(); this.draw(); this._changed(); return this.refresh();
  }
  setColor(mode) { this.color = mode; this._changed(); return this.refresh(true); }
  setSearch(ids) { this.search = ids ? new Set(ids) : null; this.draw(); }
  setChain(hops) { this.chain = hops || []; this.draw(); }
  select(ref) { this.selected = ref; this.draw(); }
  setMark(m) { this.mark = m; this.draw(); this._changed(); }
  _changed() { if (this.opts.onChange) this.opts.onChange(this); }

  // ---- range & data -------------------------------------------------------------------------
  clampRange(t0, t1) {
    // opts.bounds (view time) lets linked timelines of different lengths share one scale
    const [a, b] = this.wholeRange();
    const [min, max] = this.opts.bounds || [a - 0.02 * (b - a), b + 0.02 * (b - a)];
    let w = Math.max(t1 - t0, 50);
    w = Math.min(w, max - min);
    t0 = Math.max(min, Math.min(t0, max - w));
    return [t0, t0 + w];
  }

  setRange(t0, t1, opts = {}) {
    [this.t0, this.t1] = this.clampRange(t0, t1);
    this.draw();
    if (this.opts.onRange && !opts.fromLink) this.opts.onRange(this.t0, this.t1, this);
    this._changed();
    return this.refresh(opts.force);
  }

  reset() { const [a, b] = this.wholeRange(); return this.setRange(a, b); }

  // The window requests for the view (with half a view of margin each side): one per visible
  // stretch of real time between collapsed waits, each with its share of the pixels.
  // margin: of the view each side; detail: pixels asked per pixel of the plot.
  _params(margin = 0.5, detail = 1) {
    const w = this.t1 - this.t0;
    const u0 = this.t0 + this.offD - margin * w, u1 = this.t1 + this.offD + margin * w;
    const pxPerU = (this.plotW * (1 + 2 * margin) * detail) / (u1 - u0);
    const segs = [];
    for (const [a, b] of this.axisMap.segments(u0, u1)) {
      const r0 = Math.max(0, Math.floor(this.axisMap.Dinv(a)));
      const r1 = Math.min(this.meta.span_ns + 1, Math.ceil(this.axisMap.Dinv(b)));
      if (r1 <= r0) continue;
      segs.push({ t0: r0, t1: r1, px: Math.max(1, Math.min(100000, Math.round((b - a) * pxPerU))) });
    }
    if (!segs.length) segs.push({ t0: 0, t1: Math.max(1, this.meta.span_ns), px: Math.max(1, Math.round(this.plotW)) });
    return { segs, lanes: this.visibleLanes().join(","), color: this.color };
  }

  // Whether answer ``d`` (the data drawn, or a request in flight: {params, segs}) holds
  // ``p`` (the view without margins: same lanes and colour, its stretch, and a level of detail
  // within 1.5x). A pan within the margins fetched around the view needs no request.
  _covers(p, d = this.data) {
    if (!d) return false;
    if (d.params.lanes !== p.lanes || d.params.color !== p.color) return false;
    return p.segs.every((s) => {
      // the part of the wanted stretch that lies inside the trace must be fetched already
      const a = Math.max(0, s.t0), b = Math.min(this.meta.span_ns, s.t1);
      if (b <= a) return true;
      return d.segs.some((f) => {
        if (f.t0 > a || f.t1 < b) return false;
        if (f.exact) return true;
        const have = (f.t1 - f.t0) / f.px, want = (s.t1 - s.t0) / s.px;
        return have <= want * 1.5 && have >= want / 1.5;
      });
    });
  }

  // Resolves once data covering the current range is drawn.
  refresh(force = false) {
    if (this.dead) return Promise.resolve(this.lastFetch);
    const seq = ++this.wantSeq;
    if (force) this.forceSeq = seq;
    const p = new Promise((res, rej) => this.waiters.push({ seq, res, rej }));
    // set before the call: _run may finish synchronously (nothing to fetch)
    if (!this.running) { this.running = true; this._run(); } else this._dropStale(force);
    return p;
  }

  // A window request in flight that will not cover the view any more (the view moved past its
  // margin, or changed lanes, colour or level of detail) is cancelled -- the server stops its
  // query too -- so that the request for the view starts at once instead of after it.
  _dropStale(force) {
    const f = this._inflight;
    if (!f || f.ac.signal.aborted) return;
    if (force || !this._covers(this._params(0), { params: f.p, segs: f.p.segs })) f.ac.abort();
  }

  async _fetch(p, signal) {
    const parts = await Promise.all(p.segs.map((s) => getPacked(`${this.base}/window`,
      { t0: s.t0, t1: s.t1, px: s.px, lanes: p.lanes, color: p.color }, signal)));
    return this._merge(parts, p);
  }

  // _fetch under its own AbortController (and the view's signal): null when _dropStale
  // cancelled it.
  async _fetchLatest(p) {
    const ac = new AbortController();
    const f = this._inflight = { p, ac };
    try {
      return await this._fetch(p, this.signal ? AbortSignal.any([this.signal, ac.signal]) : ac.signal);
    } catch (e) {
      if (ac.signal.aborted && !this.dead && !(this.signal && this.signal.aborted)) { this.dropped += 1; return null; }
      throw e;
    } finally {
      if (this._inflight === f) this._inflight = null;
    }
  }

  // One drawable answer from the segments' answers: buckets get their own start and width.
  _merge(parts, p) {
    const cat = (name, Ctor) => {
      let n = 0;
      for (const x of parts) n += x.arrays[name].length;
      const out = new Ctor(n);
      let o = 0;
      for (const x of parts) { out.set(x.arrays[name], o); o += x.arrays[name].length; }
      return out;
    };
    const arrays = {};
    for (const [k, C] of [["ev_ref", Uint32Array], ["ev_lane", Uint32Array], ["ev_depth", Uint16Array], ["ev_start", Float64Array],
      ["ev_dur", Float64Array], ["ev_key", Uint32Array], ["ev_name", Uint32Array], ["bk_lane", Uint16Array], ["bk_depth", Uint8Array],
      ["bk_fill", Uint8Array], ["bk_count", Uint32Array], ["bk_key", Uint32Array]]) arrays[k] = cat(k, C);
    let nb = 0;
    for (const x of parts) nb += x.arrays.bk_pos.length;
    arrays.bk_start = new Float64Array(nb);
    arrays.bk_w = new Float64Array(nb);
    let o = 0, bucket = 0, total = 0, exact = true;
    for (const x of parts) {
      const bn = x.header.bucket_ns || 1, bo = x.header.bk_origin || 0, pos = x.arrays.bk_pos;
      for (let i = 0; i < pos.length; i++) { arrays.bk_start[o + i] = bo + pos[i] * bn; arrays.bk_w[o + i] = bn; }
      o += pos.length;
      bucket = Math.max(bucket, x.header.bucket_ns || 0);
      total += x.header.total;
      exact = exact && x.header.exact;
    }
    const segs = parts.map((x, i) => ({ ...p.segs[i], exact: x.header.exact }));
    return { header: { exact, bucket_ns: bucket, total, t0: segs[0].t0, t1: segs[segs.length - 1].t1 }, arrays, params: p, segs };
  }

  async _run() {
    try {
      while (this.doneSeq < this.wantSeq && !this.dead) {
        const seq = this.wantSeq;
        const p = this._params();
        const force = this.forceSeq && this.forceSeq <= seq && this.forceSeq > this.doneSeq;
        if (!this.firstDraw && !this.data) {
          await this._firstCoarse();
          continue;  // the view may have moved meanwhile, and a coarse answer that is exact covers it
        }
        if (force || !this._covers(this._params(0))) {  // the view itself; the request adds margins
          const t = performance.now();
          const data = await this._fetchLatest(p);
          if (this.dead) break;
          if (!data) continue;  // superseded: ask for the view as it is now
          const tf = performance.now();
          this.data = data;
          await this.afterPaint();
          const td = performance.now();
          this.lastFetch = { ms: td - t, fetch_ms: tf - t, draw_ms: td - tf, events: data.arrays.ev_ref.length,
                             buckets: data.arrays.bk_lane.length, exact: data.header.exact, total: data.header.total };
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
      if (isAbort(e) || this.dead) all.forEach((w) => w.res(this.lastFetch));  // left: nothing to report
      else {
        all.forEach((w) => w.rej(e));
        if (this.opts.onError) this.opts.onError(e);
      }
    } finally {
      this.running = false;
    }
  }

  // The very first view paints from a coarse level of detail: the view alone (no margin) at a
  // quarter of the plot's pixels, about an eighth of the full answer's buckets. The full
  // answer is asked for at once after and replaces it.
  async _firstCoarse() {
    const t = performance.now();
    const data = await this._fetch(this._params(0, 0.25), this.signal);
    if (this.dead) return;
    const tf = performance.now();
    this.data = data;
    await this.afterPaint();
    const td = performance.now();
    this.firstDraw = td;
    this.firstFetch = { ms: td - t, fetch_ms: tf - t, draw_ms: td - tf, events: data.arrays.ev_ref.length,
                        buckets: data.arrays.bk_lane.length, exact: data.header.exact, total: data.header.total, coarse: true };
    this.lastFetch = this.firstFetch;
    this._status();
  }

  _status() {
    const f = this.lastFetch;
    if (!f || !this.opts.onStatus || this.dead) return;
    const mode = f.exact ? "exact" : `level of detail (${fmtNs(this.data.header.bucket_ns)} buckets)`;
    const cut = this.axisMap.cuts.length ? ` · ${this.axisMap.cuts.length} host wait(s) collapsed (${fmtNs(this.axisMap.removed)})` : "";
    this.opts.onStatus(`window ${fmtNs(this.realOf(this.t1) - this.realOf(this.t0))} · ${f.events.toLocaleString()} events` +
      (f.buckets ? ` + ${f.buckets.toLocaleString()} buckets` : "") + ` of ~${f.total.toLocaleString()} · ${mode}${cut} · ` +
      `request+draw ${f.ms.toFixed(1)} ms`);
  }

  // ---- drawing ------------------------------------------------------------------------------
  // draw() asks for a frame: several calls within one frame paint once (the canvas is
  // rasterised once per frame anyway). afterPaint() resolves once the frame was painted and
  // the next one began, so timings include rasterisation.
  draw() {
    if (this.dead) return undefined;
    if (document.hidden) return this._paint();
    if (this._raf) return undefined;
    this._raf = requestAnimationFrame(() => {
      this._raf = 0;
      this._paint();
      const ws = this._afterPaint || [];
      this._afterPaint = [];
      if (ws.length) requestAnimationFrame(() => ws.forEach((f) => f()));
    });
    return undefined;
  }

  afterPaint() {
    if (document.hidden || this.dead) { if (!this.dead) this._paint(); return Promise.resolve(); }
    return new Promise((res) => { (this._afterPaint = this._afterPaint || []).push(res); this.draw(); });
  }

  _paint() {
    if (!this.rows || this.dead) return;
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
    this._drawWaits(ctx, top, bottom);
    if (this.data) this._drawData(ctx, top, bottom);
    this._drawMark(ctx, top, bottom);
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

  // x of a real time, fast when nothing is collapsed
  _xFn() {
    const k = this.plotW / (this.t1 - this.t0), base = LABEL_W - (this.t0 + this.offD) * k;
    if (this.axisMap.identity) return (t) => base + t * k;
    const m = this.axisMap;
    return (t) => base + m.D(t) * k;
  }

  // Waits of the host on the simulator: hatched, collapsed or not, with what they are.
  _drawWaits(ctx, top, bottom) {
    const waits = this.meta.waits || [];
    if (!waits.length) return;
    const x = this._xFn();
    for (const w of waits) {
      const a = x(w.start_ns), b = x(w.end_ns);
      if (b < LABEL_W || a > this.width) continue;
      ctx.fillStyle = "rgba(148, 163, 184, 0.18)";
      ctx.fillRect(a, top, Math.max(2, b - a), bottom - top);
      ctx.strokeStyle = "rgba(100, 116, 139, 0.35)";
      ctx.lineWidth = 1;
      ctx.save();
      ctx.beginPath(); ctx.rect(a, top, Math.max(2, b - a), bottom - top); ctx.clip();
      for (let y = top - (b - a); y < bottom; y += 8) { ctx.beginPath(); ctx.moveTo(a, y); ctx.lineTo(b, y + (b - a)); ctx.stroke(); }
      ctx.restore();
    }
  }

  _drawMark(ctx, top, bottom) {
    if (!this.mark) return;
    const a = this.xOf(this.mark[0]), b = this.xOf(this.mark[1]);
    ctx.fillStyle = "rgba(234, 179, 8, 0.16)";
    ctx.fillRect(a, top, Math.max(1, b - a), bottom - top);
    ctx.strokeStyle = "#ca8a04";
    ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(a, top); ctx.lineTo(a, bottom); ctx.moveTo(b, top); ctx.lineTo(b, bottom); ctx.stroke();
  }

  // Draws buckets, then events, grouped by fill style (colour and shade): tens of thousands of
  // rectangles cost a few style changes instead of one each.
  _drawData(ctx, top, bottom) {
    const a = this.data.arrays;
    const colors = this.color === "kind" ? this.kindColors : this.keyColors;
    const X = this._xFn();
    const right = LABEL_W + this.plotW;
    const names = this.meta.names;
    const search = this.search;
    const batches = new Map();  // style id -> flat [x, y, w, ...]
    const add = (style, x, y, w) => {
      let b = batches.get(style);
      if (!b) { b = []; batches.set(style, b); }
      b.push(x, y, w);
    };
    this._drawBuckets(ctx, top, bottom);
    const labels = [];
    let sel = null, lastX = -1, lastY = -1;
    for (let i = 0; i < a.ev_ref.length; i++) {
      const y = this._rowY(a.ev_lane[i], a.ev_depth[i]);
      if (y === undefined || y + ROW < top || y > bottom) continue;
      const x = X(a.ev_start[i]);
      let w = X(a.ev_start[i] + a.ev_dur[i]) - x;
      if (x > right || x + w < LABEL_W) continue;
      if (w < 1) {
        // sub-pixel events: one 1-px column per pixel and row is enough
        const px = Math.floor(x);
        if (px === lastX && y === lastY && a.ev_ref[i] !== this.selected) continue;
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
      ctx.globalAlpha = shade === 4 ? 0.18 : 1;
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

  // Buckets are rasterised once per window answer into a strip: one pixel row per (lane,
  // depth) and one column per device pixel the answer was asked for, each bucket's alpha its
  // shade (how full it is). A frame then draws each visible row's stretch of the strip,
  // stretched to the row's height and scaled to the view: tens of thousands of buckets cost a
  // few dozen drawImage calls per frame, and a zoom or pan shows the data already loaded at
  // once, scaled, while the next answer is on its way. Cached per answer, axis and colours.
  _strip() {
    const d = this.data, colors = this.color === "kind" ? this.kindColors : this.keyColors;
    const c = this._stripCache;
    if (c && c.data === d && c.axis === this.axisMap && c.colors === colors && c.dpr === this.dpr) return c.strip;
    const strip = d ? bucketStrip(d, this.axisMap, colors, this.dpr, c && c.strip ? c.strip.canvas : undefined) : null;
    this._stripCache = { data: d, axis: this.axisMap, colors, dpr: this.dpr, strip };
    return strip;
  }

  _drawBuckets(ctx, top, bottom) {
    const s = this._strip();
    if (!s) return;
    const k = this.plotW / (this.t1 - this.t0);             // CSS px per display ns
    const x0 = LABEL_W + (s.u0 - this.offD - this.t0) * k;   // CSS x of the strip's column 0
    const sc = k / s.k;                                       // CSS px per strip column
    const c0 = Math.max(0, Math.floor((LABEL_W - x0) / sc));
    const c1 = Math.min(s.width, Math.ceil((LABEL_W + this.plotW - x0) / sc));
    if (c1 <= c0) return;
    ctx.imageSmoothingEnabled = false;  // a bucket's pixels stay its own (no blur into the gaps)
    for (let r = 0; r < s.rows.length; r++) {
      const y = this._rowY(s.rows[r] >> 8, s.rows[r] & 255);
      if (y === undefined || y + ROW < top || y > bottom) continue;
      ctx.drawImage(s.canvas, c0, r, c1 - c0, 1, x0 + c0 * sc, y, (c1 - c0) * sc, ROW - 1);
    }
    ctx.imageSmoothingEnabled = true;
  }

  _drawChain(ctx) {
    if (!this.chain.length) return;
    const pts = [];
    const X = this._xFn();
    for (const h of this.chain) {
      if (h.lane === undefined || h.lane === null || h.start_ns === undefined || h.start_ns === null) continue;
      const y = this._rowY(h.lane, Math.min(h.depth || 0, (this.laneRows.get(h.lane) || 1) - 1));
      if (y === undefined) continue;
      const x = X(h.start_ns), w = Math.max(2, X(h.start_ns + (h.dur_ns || 0)) - x);
      ctx.strokeStyle = "#dc2626";
      ctx.lineWidth = 2;
      ctx.strokeRect(x, y, w, ROW - 1);
      pts.push({ x, y: y + ROW / 2, after: h.after_pt });
    }
    ctx.strokeStyle = "#dc2626";
    ctx.fillStyle = "#dc2626";
    ctx.lineWidth = 1.5;
    // an arrow from each hop's cause to it (the chain's own order when none is given)
    for (let i = 1; i < pts.length; i++) {
      const from = pts[i].after !== undefined && pts[i].after !== null ? pts[pts[i].after] : pts[i - 1];
      if (!from) continue;
      const { x: ax, y: ay } = from, { x: bx, y: by } = pts[i];
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
        const max = r.shown > 1 ? 30 : 18;
        if (t.length > max) t = t.slice(0, max - 1) + "…";
        ctx.fillText(t, 14, r.y + 9);
        ctx.fillStyle = "#6b7280";
        const tags = [];
        if (laneTimesModeled(this.meta, r.info)) tags.push("modeled");
        if (r.depth > r.shown) tags.push(`+${r.depth - r.shown} levels (click)`);
        if (tags.length) {
          // a one-row lane has no second line: its tags go right-aligned on the first
          if (r.shown > 1) ctx.fillText(tags.join(" · "), 14, r.y + 9 + 13);
          else { ctx.textAlign = "right"; ctx.fillText(tags.join(" · "), LABEL_W - 6, r.y + 9); ctx.textAlign = "left"; }
        }
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
    // ticks in real time, per visible stretch between collapsed waits
    const span = this.t1 - this.t0;
    const step = niceStep(span, Math.max(2, this.plotW / 110));
    ctx.save();
    ctx.beginPath(); ctx.rect(LABEL_W, 0, W - LABEL_W, AXIS_H); ctx.clip();
    for (const [ua, ub] of this.axisMap.segments(this.t0 + this.offD, this.t1 + this.offD)) {
      const ra = this.axisMap.Dinv(ua) - this.offsetReal, rb = this.axisMap.Dinv(ub) - this.offsetReal;
      for (let t = Math.ceil(ra / step) * step; t <= rb; t += step) {
        const x = this.xOf(t + this.offsetReal);
        ctx.strokeStyle = "#d1d5db";
        ctx.beginPath(); ctx.moveTo(x, AXIS_H - 6); ctx.lineTo(x, AXIS_H); ctx.stroke();
        ctx.fillStyle = "#374151";
        ctx.fillText(fmtNs(t), x + 3, AXIS_H / 2 - 2);
      }
    }
    for (const c of this.axisMap.cuts) {  // the break: what was collapsed, and how long it was
      const a = this.xOf(c.a), b = this.xOf(c.b);
      if (b < LABEL_W || a > W) continue;
      ctx.fillStyle = "#e2e8f0";
      ctx.fillRect(a, 0, Math.max(3, b - a), AXIS_H);
      ctx.fillStyle = "#334155";
      const text = `host waits ${fmtNs(c.ns)} (collapsed) ⋯`;
      const tw = ctx.measureText(text).width;
      // beside the band, on the side with room (a band at the right edge gets its label on its left)
      const tx = a + tw + 6 <= W || a - tw - 6 < LABEL_W ? Math.max(LABEL_W, a) + 3 : a - tw - 3;
      ctx.fillStyle = "rgba(255,255,255,0.85)";
      ctx.fillRect(tx - 2, 2, tw + 4, AXIS_H - 4);
      ctx.fillStyle = "#334155";
      ctx.fillText(text, tx, AXIS_H / 2);
    }
    if (this.mark) {
      const a = this.xOf(this.mark[0]), b = this.xOf(this.mark[1]);
      ctx.fillStyle = "#ca8a04";
      ctx.fillText(`◆ ${fmtNs(this.mark[1] - this.mark[0])}`, Math.max(LABEL_W, (a + b) / 2 - 20), AXIS_H / 2 + 5);
    }
    ctx.restore();
  }

  // ---- hit testing & interaction ------------------------------------------------------------------
  _pos(e) {
    const r = this.canvas.getBoundingClientRect();
    return [e.clientX - r.left, e.clientY - r.top];
  }

  rowAt(y) { return this.rows.find((r) => y >= r.y && y < r.y + r.h); }

  waitAt(x) {
    for (const w of this.meta.waits || []) if (x >= this.xOf(w.start_ns) - 2 && x <= this.xOf(w.end_ns) + 2) return w;
    return null;
  }

  hit(x, y) {
    if (!this.data || x < LABEL_W) return null;
    const row = this.rowAt(y);
    if (!row || row.type !== "lane") return null;
    const depth = Math.floor((y - row.y - 2) / ROW);
    const a = this.data.arrays;
    const X = this._xFn();
    let best = null;
    for (let i = a.ev_ref.length - 1; i >= 0; i--) {
      if (a.ev_lane[i] !== row.lane || a.ev_depth[i] !== depth) continue;
      const xa = X(a.ev_start[i]), xb = X(a.ev_start[i] + a.ev_dur[i]);
      if (x >= xa - 3 && x <= xb + 3) {
        const d = x < xa ? xa - x : x > xb ? x - xb : 0;
        if (!best || d < best.d) best = { kind: "event", i, d };
        if (d === 0) break;
      }
    }
    if (best) return best;
    for (let i = 0; i < a.bk_lane.length; i++) {
      if (a.bk_lane[i] !== row.lane || a.bk_depth[i] !== depth) continue;
      const xa = X(a.bk_start[i]), xb = Math.max(xa + 1, X(a.bk_start[i] + a.bk_w[i]));
      if (x >= xa && x < xb) return { kind: "bucket", i };
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
    this.pointerX = x >= LABEL_W ? x : null;
    if (this.drag) return this._dragMove(e, x, y);
    const h = this.hit(x, y);
    if (!h) {
      const row = this.rowAt(y);
      const w = x >= LABEL_W ? this.waitAt(x) : null;
      if (row && x < LABEL_W) {
        const l = row.info;
        this._tip(e, row.type === "group" ? `<div class="t">${esc(row.key)}</div><div class="d">click to ${row.collapsed ? "expand" : "collapse"}</div>`
          : `<div class="t">${esc(l.instance)} / ${esc(l.pid)} / ${esc(l.subsystem)} / ${esc(l.identifier)}</div>` +
            `<div class="d">${esc(l.process_name || "")} · ${l.events.toLocaleString()} events · ${esc(l.side)}` +
            `${laneTimesModeled(this.meta, l) ? " · times modeled" : ""}</div>`);
      } else if (w) {
        this._tip(e, `<div class="t">host waits ${fmtNs(w.end_ns - w.start_ns)} for the simulator</div>` +
          `<div class="d">${esc(w.name)} returned ${fmtNs(w.end_ns - w.start_ns)} after the modeled device work was done: the wall-clock time ` +
          `of the simulator's numerics, which hardware would not spend. ${this.collapse ? "Collapsed on the axis" : "Drawn at its length"} ` +
          `(toggle: "collapse host waits").</div>`);
      } else this.tooltip.hidden = true;
      this.canvas.style.cursor = "default";
      return undefined;
    }
    this.canvas.style.cursor = "pointer";
    const a = this.data.arrays;
    if (h.kind === "event") {
      const name = this.meta.names[a.ev_name[h.i]];
      const key = this.color === "kind" ? this.meta.kinds[a.ev_key[h.i]] : this.meta.names[a.ev_key[h.i]];
      this._tip(e, `<div class="t">${esc(name)}</div><div class="d">start ${fmtNs(a.ev_start[h.i])} · duration ${fmtNs(a.ev_dur[h.i])}` +
        `${key !== name ? ` · ${this.color}: ${esc(key)}` : ""}${this._laneModeled(a.ev_lane[h.i]) ? " · modeled" : ""}</div>`);
    } else {
      const bn = a.bk_w[h.i];
      this._tip(e, `<div class="t">${a.bk_count[h.i].toLocaleString()} events in ${fmtNs(bn)}</div>` +
        `<div class="d">busy ≈ ${fmtNs((a.bk_fill[h.i] / 255) * bn)} · longest: ${esc(this.color === "kind" ? this.meta.kinds[a.bk_key[h.i]] : this.meta.names[a.bk_key[h.i]])}` +
        ` · zoom in for each event</div>`);
    }
    return undefined;
  }

  _laneModeled(lane) {
    return laneTimesModeled(this.meta, this.meta.lanes.find((x) => x.lane === lane));
  }

  _down(e) {
    this.canvas.focus({ preventScroll: true });
    const [x, y] = this._pos(e);
    if (x < LABEL_W) {
      const row = this.rowAt(y);
      if (!row) return;
      if (row.type === "group") {
        if (this.collapsed.has(row.key)) this.collapsed.delete(row.key); else this.collapsed.add(row.key);
      } else if (row.depth > row.shown || this.expanded.has(row.lane)) {
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
      if (!d || this.dead) return undefined;
      if (d.box && d.moved) return this._finishBox();
      if (!d.moved) this._click(ev, x, y);
      else this.refresh();
      return undefined;
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
    this._changed();
    this.refresh();
  }

  _finishBox() {
    const b = this.box;
    const t0 = this.tOf(Math.min(b.x0, b.x1)), t1 = this.tOf(Math.max(b.x0, b.x1));
    const ya = Math.min(b.y0, b.y1), yb = Math.max(b.y0, b.y1);
    const lanes = this.rows.filter((r) => r.type === "lane" && r.y + r.h > ya && r.y < yb).map((r) => r.lane);
    this.boxSel = { t0: Math.max(0, Math.floor(t0)), t1: Math.ceil(t1), lanes };
    if (this.opts.onBox && lanes.length && t1 > t0) this.opts.onBox(this.boxSel);
  }

  clearBox() { this.box = null; this.boxSel = null; this.draw(); }

  _click(e, x, y) {
    this.box = null;
    this.boxSel = null;
    const h = this.hit(x, y);
    if (h && h.kind === "event") {
      const ref = this.data.arrays.ev_ref[h.i];
      this.selected = ref;
      this.draw();
      if (this.opts.onSelect) this.opts.onSelect(ref);
    } else if (h && h.kind === "bucket") {
      const a = this.data.arrays, bn = a.bk_w[h.i];
      const c = this.viewOf(a.bk_start[h.i] + bn / 2), w = this.viewOf(a.bk_start[h.i] + bn) - this.viewOf(a.bk_start[h.i]);
      this.setRange(c - w * 20, c + w * 20);
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

  // Zooms so that the event (real start, duration) fills most of the view.
  zoomTo(start, dur) {
    const a = this.viewOf(start), b = this.viewOf(start + dur);
    const pad = Math.max((b - a) * 0.25, 100);
    return this.setRange(a - pad, b + pad);
  }

  // Zooms by ``factor`` keeping the time under x (the pointer; the centre without one) in place.
  zoom(factor, x) {
    const ax = x === undefined || x === null ? LABEL_W + this.plotW / 2 : x;
    const t = this.vOf(ax);
    return this.setRange(t - (t - this.t0) * factor, t + (this.t1 - t) * factor);
  }

  pan(fraction) {
    const d = (this.t1 - this.t0) * fraction;
    return this.setRange(this.t0 + d, this.t1 + d);
  }

  // Wheel events come faster than frames (a trackpad sends one every few ms): they are summed
  // and applied once per animation frame, one range change and one request for all of them.
  _wheel(e) {
    let zoom = 1, pan = 0, x = null;
    if (e.ctrlKey || e.metaKey || e.altKey) {
      zoom = Math.exp(Math.max(-1, Math.min(1, e.deltaY * 0.01)));
      x = Math.max(LABEL_W, this._pos(e)[0]);
    } else if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
      pan = (e.shiftKey ? e.deltaY : e.deltaX) / this.plotW;
    } else return;
    e.preventDefault();
    const w = this._wheelSum || (this._wheelSum = { zoom: 1, pan: 0, x: null, events: 0 });
    w.zoom *= zoom;
    w.pan += pan;
    w.events += 1;
    if (x !== null) w.x = x;
    if (!this._wheelRaf) this._wheelRaf = requestAnimationFrame(() => this._applyWheel());
  }

  _applyWheel() {
    const w = this._wheelSum;
    this._wheelRaf = 0;
    this._wheelSum = null;
    if (!w || this.dead) return undefined;
    this.wheelFrames = (this.wheelFrames || 0) + 1;
    const c = this.vOf(w.x === null ? LABEL_W + this.plotW / 2 : w.x);
    const d = (this.t1 - this.t0) * w.pan;
    return this.setRange(c - (c - this.t0) * w.zoom + d, c + (this.t1 - c) * w.zoom + d);
  }

  // W/S zoom at the pointer, A/D pan, 0 whole trace. Returns true when the key was used.
  key(e) {
    const k = e.key.toLowerCase();
    if (k === "w") this.zoom(0.7, this.pointerX);
    else if (k === "s") this.zoom(1 / 0.7, this.pointerX);
    else if (k === "a") this.pan(-0.2);
    else if (k === "d") this.pan(0.2);
    else if (k === "0") this.reset();
    else return false;
    return true;
  }
}

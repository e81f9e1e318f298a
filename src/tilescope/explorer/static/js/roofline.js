// Roofline: attained TFLOP/s against arithmetic intensity (log-log), with the compute roof and
// the memory-bandwidth slope of the device (preset for tilescope, datasheet for GPUs).
import { getJSON } from "./api.js";
import { esc, num } from "./format.js";
import { colorOf } from "./colors.js";
import { DataTable } from "./tables.js";

export class RooflineView {
  constructor(app, profile, meta, params, signal) {
    this.profile = profile; this.meta = meta; this.signal = signal;
    this.el = document.createElement("div");
    this.el.className = "page";
  }

  async mount(main) {
    main.appendChild(this.el);
    const r = await getJSON(`/api/p/${this.profile.id}/roofline`, undefined, this.signal);
    this.r = r;
    const cols = r.table.columns;
    const ix = (c) => cols.indexOf(c);
    this.points = r.table.rows.map((row) => ({ name: row[ix("name")], ai: row[ix("intensity")], tf: row[ix("tflops")], ns: row[ix("device_ns")] }))
      .filter((p) => p.ai > 0 && p.tf > 0);
    const label = r.modeled ? '<span class="badge modeled">modeled</span>' : '<span class="badge est">FLOPs and bytes estimated from shapes</span>';
    this.el.innerHTML = `<h2>Roofline ${label}</h2>
      <p class="muted">${r.peak_tflops ? `peak ${num(r.peak_tflops, 1)} TFLOP/s, ${num(r.peak_gbps, 0)} GB/s (${esc(r.peak_source)})` : "no peak known for this device: points only"}
      · one point per ${r.modeled ? "executable" : "op with a FLOP rule"}, size by device time · ${esc(r.what)}</p>
      <canvas data-testid="roofline" width="900" height="460" style="width:900px;height:460px;background:#fff;border:1px solid #e5e7eb"></canvas>
      <div data-role="table"></div>`;
    this.draw();
    const dt = new DataTable(r.table, { sort: "device_ns", testid: "roofline-table" });
    this.el.querySelector("[data-role=table]").appendChild(dt.el);
    if (!this.points.length) {
      const p = document.createElement("p");
      p.className = "muted";
      p.textContent = "No op with both FLOPs and bytes: nothing to place on the roofline.";
      this.el.querySelector("[data-role=table]").prepend(p);
    }
  }

  draw() {
    const cv = this.el.querySelector("canvas");
    const dpr = window.devicePixelRatio || 1;
    cv.width = 900 * dpr; cv.height = 460 * dpr;
    const ctx = cv.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const L = 70, R = 880, T = 20, B = 420;
    const pts = this.points;
    const pf = this.r.peak_tflops, pb = this.r.peak_gbps;
    const ais = pts.map((p) => p.ai), tfs = pts.map((p) => p.tf);
    let x0 = Math.min(0.01, ...ais) / 2, x1 = Math.max(1000, ...ais) * 2;
    let y0 = Math.min(...(tfs.length ? tfs : [0.001]), pf ? pf / 1e4 : 1e-3) / 2, y1 = Math.max(...(tfs.length ? tfs : [1]), pf || 1) * 2;
    const lx = (v) => L + ((Math.log10(v) - Math.log10(x0)) / (Math.log10(x1) - Math.log10(x0))) * (R - L);
    const ly = (v) => B - ((Math.log10(v) - Math.log10(y0)) / (Math.log10(y1) - Math.log10(y0))) * (B - T);
    ctx.font = "11px system-ui, sans-serif";
    ctx.strokeStyle = "#e5e7eb";
    ctx.fillStyle = "#6b7280";
    for (let e = Math.ceil(Math.log10(x0)); e <= Math.floor(Math.log10(x1)); e++) {
      const x = lx(10 ** e); ctx.beginPath(); ctx.moveTo(x, T); ctx.lineTo(x, B); ctx.stroke(); ctx.fillText(`1e${e}`, x - 10, B + 14);
    }
    for (let e = Math.ceil(Math.log10(y0)); e <= Math.floor(Math.log10(y1)); e++) {
      const y = ly(10 ** e); ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(R, y); ctx.stroke(); ctx.fillText(`1e${e}`, L - 34, y + 4);
    }
    ctx.fillStyle = "#111";
    ctx.fillText("arithmetic intensity (FLOP/byte)", (L + R) / 2 - 80, B + 32);
    ctx.save(); ctx.translate(16, (T + B) / 2 + 40); ctx.rotate(-Math.PI / 2); ctx.fillText("attained TFLOP/s", 0, 0); ctx.restore();
    if (pf && pb) {
      const knee = (pf * 1e12) / (pb * 1e9);
      ctx.strokeStyle = "#111"; ctx.lineWidth = 2;
      ctx.beginPath();
      ctx.moveTo(lx(x0), ly(Math.max(y0, (x0 * pb) / 1e3)));
      ctx.lineTo(lx(knee), ly(pf));
      ctx.lineTo(lx(x1), ly(pf));
      ctx.stroke();
      ctx.fillText(`${num(pf, 1)} TFLOP/s`, lx(x1) - 90, ly(pf) - 6);
      ctx.fillText(`${num(pb, 0)} GB/s`, lx(Math.max(x0 * 2, knee / 100)) + 4, ly(Math.max(y0, (Math.max(x0 * 2, knee / 100) * pb) / 1e3)) - 8);
    }
    const maxNs = Math.max(1, ...pts.map((p) => p.ns || 0));
    const placed = [];  // label boxes already drawn: a label goes where it overlaps none, or is left out
    const overlaps = (b) => placed.some((o) => b.x < o.x + o.w && o.x < b.x + b.w && b.y < o.y + o.h && o.y < b.y + b.h);
    const inside = (b) => b.x >= L && b.x + b.w <= R + 20 && b.y >= 0 && b.y + b.h <= B;
    for (const p of pts) {
      const rr = 3 + 9 * Math.sqrt((p.ns || 0) / maxNs);
      ctx.fillStyle = colorOf(p.name);
      ctx.globalAlpha = 0.8;
      ctx.beginPath(); ctx.arc(lx(p.ai), ly(p.tf), rr, 0, 2 * Math.PI); ctx.fill();
      ctx.globalAlpha = 1;
      placed.push({ x: lx(p.ai) - rr, y: ly(p.tf) - rr, w: 2 * rr, h: 2 * rr });  // labels keep off the points too
    }
    this.labels = [];
    this.hidden = 0;
    ctx.fillStyle = "#111";
    for (const p of [...pts].sort((a, b) => (b.ns || 0) - (a.ns || 0))) {  // the biggest points are labelled first
      const rr = 3 + 9 * Math.sqrt((p.ns || 0) / maxNs);
      const text = String(p.name).length > 28 ? String(p.name).slice(0, 27) + "…" : String(p.name);
      const w = ctx.measureText(text).width, h = 12, x = lx(p.ai), y = ly(p.tf);
      const spots = [[x + rr + 2, y - h / 2], [x - rr - 2 - w, y - h / 2], [x - w / 2, y - rr - 2 - h], [x - w / 2, y + rr + 2]];
      const spot = spots.map(([bx, by]) => ({ x: bx, y: by, w, h })).find((b) => inside(b) && !overlaps(b));
      if (!spot) { this.hidden += 1; continue; }
      placed.push(spot);
      this.labels.push({ name: p.name, ...spot });
      ctx.fillText(text, spot.x, spot.y + h - 3);
    }
    if (this.hidden) {
      ctx.fillStyle = "#6b7280";
      ctx.fillText(`${this.hidden} label(s) left out where they would overlap: the table below names every point`, L + 4, T + 12);
    }
  }

  destroy() { this.el.remove(); }
}

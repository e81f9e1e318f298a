// The summary page: totals, HFU / MFU / MBU, arithmetic intensity, DMA sizes, spill bytes,
// per-engine active time, idle-gap classes, recommendations (rule table) and doctor findings.
import { getJSON, href } from "./api.js";
import { bytes, esc, flops, ns, num, pct } from "./format.js";

function card(k, v, title = "") {
  return `<div class="card" title="${esc(title)}"><div class="v">${v}</div><div class="k">${esc(k)}</div></div>`;
}

// HTA's analyses (same data as `tilescope report`): one small table each, columns as given.
function rowsTable(title, rows, cols, testid) {
  if (!rows || !rows.length) return "";
  const cell = (c, r) => c[2] ? c[2](r[c[0]]) : esc(String(r[c[0]] ?? "–"));
  return `<h3>${esc(title)}</h3><table class="data" data-testid="${testid}"><tr>${cols.map((c) => `<th class="text">${esc(c[1])}</th>`).join("")}</tr>
    ${rows.map((r) => `<tr>${cols.map((c) => `<td>${cell(c, r)}</td>`).join("")}</tr>`).join("")}</table>`;
}

function analysesHtml(a) {
  if (!a) return "";
  const p = (v) => (v === null || v === undefined ? "–" : `${num(v, 1)}%`);
  const share = (v) => pct(v);
  return [
    rowsTable("Temporal breakdown (of the device span)", a.temporal, [["rank", "rank"], ["span_ns", "device span", ns],
      ["idle_pct", "idle", p], ["compute_pct", "compute", p], ["non_compute_pct", "non-compute", p]], "temporal"),
    rowsTable("Device time by kernel type, with overlaps", a.kernel_types, [["rank", "rank"], ["kernel_type", "kernel type"],
      ["time_ns", "time", ns], ["share", "share", share]], "kernel-types"),
    rowsTable("Communication overlapped by computation", a.comm_comp_overlap, [["rank", "rank"],
      ["communication_ns", "communication", ns], ["overlapped_ns", "overlapped", ns], ["overlap_ratio", "ratio", share]], "comm-overlap"),
    rowsTable("Launches: host launch call vs device work", a.launch_stats, [["rank", "rank"], ["launches", "launches", num],
      ["mean_cpu_duration_ns", "mean launch", ns], ["mean_gpu_duration_ns", "mean device", ns],
      ["mean_launch_delay_ns", "mean delay", ns], ["short_kernels", "device < launch", num],
      ["long_launches", "long launches", num], ["long_delays", "long delays", num]], "launch-stats"),
    rowsTable("Queue length per device lane", a.queue_length, [["rank", "rank"], ["identifier", "lane"],
      ["time_weighted_mean", "mean (time-weighted)", (v) => num(v, 2)], ["max", "max", num], ["time_at_max_ns", "time at max", ns]], "queue-length"),
    rowsTable("Memory copies: bandwidth", a.memory_bandwidth, [["rank", "rank"], ["copy_type", "copy type"], ["copies", "copies", num],
      ["bytes", "bytes", bytes], ["achieved_gbps", "achieved GB/s", (v) => num(v, 1)], ["series_max_gbps", "peak GB/s", (v) => num(v, 1)]], "memory-bw"),
    rowsTable("Critical path (first rank)", a.critical_path, [["kind", "kind"], ["ns", "time", ns], ["share", "share", share]], "critical-path"),
    rowsTable(`Frequent kernel sequences of ${a.kernel_sequences.op || "–"}`, a.kernel_sequences.sequences,
      [["pattern", "sequence", (v) => esc(v.split("|").slice(1).join(" > "))], ["count", "count", num], ["device_ns", "device time", ns]], "kernel-sequences"),
  ].join("");
}

export class SummaryView {
  constructor(app, profile, meta, params, signal) {
    this.app = app; this.profile = profile; this.meta = meta; this.signal = signal;
    this.el = document.createElement("div");
    this.el.className = "page";
    this.el.dataset.testid = "summary";
  }

  async mount(main) {
    main.appendChild(this.el);
    this.el.innerHTML = `<div class="loading">Computing the summary…</div>`;
    // HTA's analyses come apart (long on a large trace): the figures and rules show first
    const base = `/api/p/${this.profile.id}/summary`;
    const hta = getJSON(base, { part: "analyses" }, this.signal);
    hta.catch(() => {});  // reported below, once the page it goes into is drawn
    const s = await getJSON(base, { part: "core" }, this.signal);
    const m = s.metrics;
    const badge = s.modeled ? '<span class="badge modeled">MODELED</span>' : '<span class="badge measured">MEASURED</span>';
    let cards = "";
    if (s.modeled) {
      cards = [
        card("device time (modeled)", ns(m.device_ns), "sum of the device executions' modeled durations"),
        card("executions", num(m.executions)),
        card("generic lowering", pct(m.generic_share), "share of modeled kernel time in ops without a specific lowering: " +
             "each is one GpSimd routine at an assumed cycle per element, an estimate rather than the engines the hardware would use"),
        card("HFU", pct(m.hfu), "hardware FLOPs utilisation: all TensorE FLOPs (transposes included) / (peak x device time)"),
        card("MFU", pct(m.mfu), "model FLOPs utilisation: matmul FLOPs = 2*MACs / (2*rows*cols*clock*time)"),
        card("MBU", pct(m.mbu), "memory bandwidth utilisation: HBM bytes / (HBM bandwidth x device time)"),
        card("arithmetic intensity", m.arithmetic_intensity === null ? "–" : `${num(m.arithmetic_intensity, 2)} FLOP/B`),
        card("FLOPs", flops(m.flops)),
        card("HBM traffic", bytes(m.hbm_bytes)),
        card("average DMA size", bytes(m.average_dma_bytes), `${num(m.dma_transfers)} transfers, ${num(m.small_dma_transfers)} under 4 KiB`),
        card("spill bytes", bytes(m.spill_bytes), `stores ${bytes(m.spill_store_bytes)}, reloads ${bytes(m.spill_reload_bytes)}`),
        s.span_ns ? card("span", ns(s.span_ns)) : card("span", "–", "no system trace: a standalone executable + instruction trace"),
      ].join("");
    } else {
      cards = [
        card("span", ns(s.span_ns)),
        card("device active", ns(m.device_active_ns), "union of device activity over all device lanes"),
        card("device idle", pct(m.idle_share), "share of the device span with no kernel, copy or memset"),
        card("kernels", num(m.kernels)),
        card("median kernel", ns(m.median_kernel_ns)),
        card("memcpy share", pct(m.memcpy_share)),
        card("MFU (estimated)", pct(m.mfu), "FLOPs estimated from op input shapes / (datasheet peak x device time of those ops)"),
        card("MBU (estimated)", pct(m.mbu)),
        card("arithmetic intensity (est.)", m.arithmetic_intensity === null ? "–" : `${num(m.arithmetic_intensity, 2)} FLOP/B`),
        card("events", num(s.events)),
      ].join("");
    }
    let engines = "";
    if (s.modeled && m.engines.length) {
      const rows = m.engines.map((e) => `<tr><td class="text">${esc(e.engine)}</td><td>${ns(e.busy_ns)}</td>
        <td class="barcell"><div class="bar" style="width:${Math.min(100, 100 * (e.active_share || 0)).toFixed(1)}%"></div></td>
        <td>${pct(e.active_share)}</td><td>${num(e.instructions)}</td><td>${bytes(e.bytes)}</td><td>${flops(e.flops)}</td></tr>`).join("");
      engines = `<h3>Per-engine active time <span class="badge modeled">modeled</span></h3>
        <table class="data" data-testid="engine-active"><tr><th class="text">engine</th><th>busy</th><th></th><th>of device time</th><th>instructions</th><th>bytes</th><th>FLOPs</th></tr>${rows}</table>`;
    }
    let generic = "";
    if (s.modeled && m.generic && m.generic.top.length) {
      const shape = (sh) => (sh || []).map((d) => d.join("x") || "scalar").join(", ") || "–";
      const rows = m.generic.top.map((t) => `<tr><td class="text">${esc(t.op)}</td><td class="text mono">${esc(shape(t.shapes))}</td>
        <td>${num(t.executions)}</td><td>${ns(t.device_ns)}</td><td>${pct(t.share)}</td></tr>`).join("");
      generic = `<h3>Ops modeled by the generic lowering <span class="badge modeled">modeled</span></h3>
        <p class="muted">no specific lowering: one GpSimd routine each, an estimate of their time; ${pct(m.generic_share)} of modeled kernel time</p>
        <table class="data" data-testid="generic-ops"><tr><th class="text">op</th><th class="text">shapes</th><th>executions</th><th>time</th><th>of kernel time</th></tr>${rows}</table>`;
    }
    const gaps = Object.entries(s.gaps || {}).map(([k, v]) => `<tr><td class="text">${esc(k.replaceAll("_", " "))}</td><td>${num(v.gaps)}</td><td>${ns(v.ns)}</td></tr>`).join("");
    const obs = (s.observations || []).map((o) => `<div class="rec note" data-testid="observation"><span class="code">${esc(o.code)} (below threshold)</span> ${esc(o.message)}</div>`).join("");
    const recs = s.recommendations.length
      ? s.recommendations.map((r) => `<div class="rec" data-testid="recommendation"><span class="code">${esc(r.code)}</span> ${esc(r.message)}<div class="fix">→ ${esc(r.fix)}</div></div>`).join("") + obs
      : obs ? `<p class="muted" data-testid="no-rule">No rule reached its threshold; the device view's warnings, below them:</p>${obs}`
        : `<p class="muted" data-testid="no-rule">No rule fired: nothing in the known list of problems applies to this profile.</p>`;
    const doc = this.meta.doctor.length
      ? this.meta.doctor.map((d) => `<div class="rec"><span class="code">${esc(d.severity)} · ${esc(d.code)}</span> ${esc(d.message)}<div class="fix">→ ${esc(d.fix)}</div></div>`).join("")
      : "";

    this.el.innerHTML = `
      <h2>${esc(this.profile.label)} ${badge}</h2>
      <p class="muted" data-testid="label">${esc(s.label)}</p>
      <div class="cards" data-testid="cards">${cards}</div>
      <h3>Recommendations</h3>${recs}
      ${doc ? `<h3>Profile doctor</h3>${doc}` : ""}
      ${generic}
      ${engines}
      <div data-testid="analyses"><p class="loading muted">Computing HTA's analyses (temporal breakdown, kernel types, launches, queues, critical path)…</p></div>
      ${gaps ? `<h3>Idle gaps by class</h3><p class="muted">each device lane (a stream, a core) has its own gaps; totals add the lanes up, so they can exceed the span</p><table class="data" style="max-width:600px"><tr><th class="text">class</th><th>gaps</th><th>total</th></tr>${gaps}</table>` : ""}
      <p class="muted">Export: <a href="${href(`/api/p/${this.profile.id}/export/summary.json`)}" download>summary.json</a> ·
      same data on the command line: <span class="mono">tilescope explore PATH --json /api/p/${this.profile.id}/summary</span></p>`;
    this.analysesShown = hta.then((a) => {
      if (this.signal.aborted) return;
      this.el.querySelector("[data-testid=analyses]").innerHTML = analysesHtml(a.analyses);
    }, (e) => this.app.report(e, this.signal));
  }

  destroy() { this.el.remove(); }
}

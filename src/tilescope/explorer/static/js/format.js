// Number formatting shared by every view.
export function ns(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e9) return `${(v / 1e9).toFixed(3)} s`;
  if (a >= 1e6) return `${(v / 1e6).toFixed(3)} ms`;
  if (a >= 1e3) return `${(v / 1e3).toFixed(2)} µs`;
  return `${v.toFixed(a < 10 && v % 1 ? 1 : 0)} ns`;
}
export function bytes(v) {
  if (v === null || v === undefined) return "–";
  const a = Math.abs(v);
  if (a >= 1 << 30) return `${(v / (1 << 30)).toFixed(2)} GiB`;
  if (a >= 1 << 20) return `${(v / (1 << 20)).toFixed(2)} MiB`;
  if (a >= 1 << 10) return `${(v / 1024).toFixed(1)} KiB`;
  return `${Math.round(v)} B`;
}
export function pct(v) { return v === null || v === undefined ? "–" : `${(100 * v).toFixed(1)}%`; }
export function num(v, digits = 0) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (Math.abs(v) >= 1e12) return v.toExponential(2);
  return v.toLocaleString("en-US", { maximumFractionDigits: digits });
}
export function flops(v) {
  if (v === null || v === undefined) return "–";
  const a = Math.abs(v);
  if (a >= 1e12) return `${(v / 1e12).toFixed(2)} TFLOP`;
  if (a >= 1e9) return `${(v / 1e9).toFixed(2)} GFLOP`;
  if (a >= 1e6) return `${(v / 1e6).toFixed(2)} MFLOP`;
  return `${num(v)} FLOP`;
}
export function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
// Formats a cell by its column name (the API's naming: *_ns, *bytes*, *share*, mfu...).
export function cell(col, v) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  const c = col.toLowerCase();
  if (c.endsWith("_ns") || c.includes("_ns[") || c === "ns") return ns(v);
  if (c.includes("bytes")) return bytes(v);
  if (c.includes("share") || c === "mfu" || c === "mbu" || c === "hfu" || c.startsWith("pct")) return pct(v);
  if (c.includes("flops") && !c.includes("tflops")) return flops(v);
  return num(v, Math.abs(v) < 10 ? 3 : 1);
}

// Whether a lane's times come from the device model: a modeled profile's device lanes, and its
// runtime lanes (each `execute` lasts the preset's assumed runtime cost)
export function laneTimesModeled(meta, lane) {
  return !!(lane && meta.modeled && (lane.side === "device" || lane.subsystem === "runtime"));
}

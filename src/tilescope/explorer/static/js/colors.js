// Stable colours: a name always gets the same colour (in every profile, so compare lines up).
const PALETTE = [
  "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
  "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
  "#3b82f6", "#10b981", "#f59e0b", "#ef4444", "#8b5cf6", "#06b6d4", "#84cc16", "#f97316",
];

export function hashString(s) {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); }
  return h >>> 0;
}

export function colorOf(name) {
  return PALETTE[hashString(String(name)) % PALETTE.length];
}

// Cache of colours per key id for one list of key names.
export class KeyColors {
  constructor(names) { this.names = names; this.cache = new Map(); }
  get(id) {
    let c = this.cache.get(id);
    if (c === undefined) { c = colorOf(this.names[id] ?? id); this.cache.set(id, c); }
    return c;
  }
}

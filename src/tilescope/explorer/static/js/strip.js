// A window answer's level-of-detail buckets as one small image, the "strip": one pixel row per
// (lane, depth) that has buckets and one column per device pixel the answer was asked for, in
// display time (the axis with collapsed waits, see timeline.js's Axis). Each bucket is a run of
// columns in its colour, its alpha its shade (how full the bucket is); the image is transparent
// where there is none. The timeline draws each visible row of it stretched to the row's height.
//
// Rasterising tens of thousands of buckets once per answer, as runs of one row each, costs a
// few milliseconds; a frame then costs a drawImage per visible row however many buckets there
// are, and a zoom or pan before the next answer only scales the image.

// alpha of a bucket by how full it is (its busy time over its width, in quarters)
export const SHADES = [0.35, 0.55, 0.75, 1];
const MAX_COLUMNS = 16384;  // a canvas this wide is cheap; wider views are scaled down

// "#rrggbb" -> 0xAABBGGRR without alpha (little-endian RGBA words of an ImageData)
function rgbWord(hex) {
  return parseInt(hex.slice(5, 7), 16) << 16 | parseInt(hex.slice(3, 5), 16) << 8 | parseInt(hex.slice(1, 3), 16);
}

// The strip of answer ``d`` (timeline.js's merged window answer: arrays bk_lane, bk_depth,
// bk_start, bk_w, bk_fill, bk_key and segs [{t0, t1, px}] in real ns) under ``axis`` (D: real
// ns -> display ns), coloured by ``colors`` (KeyColors), ``dpr`` device pixels per CSS pixel.
// ``canvas``: one to reuse. Returns null without buckets, else
// {canvas, width, rows: [lane * 256 + depth per row], u0 (display ns of column 0), k (columns per display ns)}.
export function bucketStrip(d, axis, colors, dpr, canvas) {
  const a = d.arrays, n = a.bk_lane.length;
  if (!n || !d.segs.length) return null;
  const u0 = axis.D(d.segs[0].t0), u1 = axis.D(d.segs[d.segs.length - 1].t1);
  if (!(u1 > u0)) return null;
  let px = 0;
  for (const s of d.segs) px += s.px;
  const width = Math.max(1, Math.min(MAX_COLUMNS, Math.ceil(px * dpr)));
  const k = width / (u1 - u0);
  // the answer lists buckets group by group: consecutive buckets mostly share their row
  const rowOf = new Map(), rows = [], rowIx = new Uint32Array(n);
  let lastKey = -1, last = -1;
  for (let i = 0; i < n; i++) {
    const key = a.bk_lane[i] * 256 + a.bk_depth[i];
    if (key !== lastKey) {
      lastKey = key;
      last = rowOf.get(key);
      if (last === undefined) { last = rows.length; rowOf.set(key, last); rows.push(key); }
    }
    rowIx[i] = last;
  }
  const img = new ImageData(width, rows.length);
  const words = new Uint32Array(img.data.buffer);
  const rgb = new Map();
  for (let i = 0; i < n; i++) {
    const xa = Math.max(0, Math.floor((axis.D(a.bk_start[i]) - u0) * k));
    const xb = Math.min(width, Math.max(xa + 1, Math.round((axis.D(a.bk_start[i] + a.bk_w[i]) - u0) * k)));
    if (xb <= xa) continue;
    const key = a.bk_key[i];
    let c = rgb.get(key);
    if (c === undefined) { c = rgbWord(colors.get(key)); rgb.set(key, c); }
    const v = ((Math.round(SHADES[Math.min(3, a.bk_fill[i] >> 6)] * 255) << 24) | c) >>> 0;  // alpha in the top byte
    const o = rowIx[i] * width;
    words.fill(v, o + xa, o + xb);
  }
  const c = canvas || document.createElement("canvas");
  c.width = width;
  c.height = rows.length;
  c.getContext("2d").putImageData(img, 0, 0);
  return { canvas: c, width, rows, u0, k };
}

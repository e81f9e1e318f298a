// Fetch helpers: JSON and packed bodies; an API error becomes an Error with message and fix.
// Every fetch can take an AbortSignal: a view aborts its requests when it goes away (the
// server then cancels their work), and an aborted fetch is not an error anyone sees.
import { unpack } from "./binary.js";

export class ApiError extends Error {
  constructor(status, message, fix) {
    super(message);
    this.status = status;
    this.fix = fix || "";
  }
}

function url(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null) q.set(k, String(v));
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

async function check(r) {
  if (r.ok) return r;
  let body = { error: `${r.status} ${r.statusText}`, fix: "" };
  try { body = await r.json(); } catch (e) { /* not JSON */ }
  throw new ApiError(r.status, body.error, body.fix);
}

export async function getJSON(path, params, signal) {
  const r = await check(await fetch(url(path, params), { signal, credentials: "same-origin" }));
  return r.json();
}

export async function getPacked(path, params, signal) {
  const r = await check(await fetch(url(path, params), { signal, credentials: "same-origin" }));
  return unpack(await r.arrayBuffer());
}

export function href(path, params) { return url(path, params); }

// True for the rejection of a fetch (or of work waiting on one) that was aborted on purpose.
export function isAbort(e) {
  return !!e && (e.name === "AbortError" || e.aborted === true);
}

// The error a view raises when it learns, after an await, that it was closed meanwhile.
export class Gone extends Error {
  constructor() { super("the view was closed"); this.name = "AbortError"; this.aborted = true; }
}

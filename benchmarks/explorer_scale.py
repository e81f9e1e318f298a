"""Explorer at scale: a 5-million-event trace and real CUDA traces in headless Chromium.

    .venv/bin/python benchmarks/explorer_scale.py [--events 5000000] [--workdir DIR] [--moves 40]
        [--kineto DIR] [--sim PROFILE_DIR ...] [--clicks 30] [--repeats 5] [--reference-static DIR]

1. Writes a Kineto-style Chrome trace with ``--events`` events (host threads running aten ops
   that launch kernels, GPU streams running them, correlation ids linking both; about 140 bytes
   per event) and ingests it: ``tilescope.trace.open`` (the Parquet cache) and the explorer's
   timeline index (built once, then memory-mapped from the cache).
2. Starts the explorer's server and Debian's headless Chromium (fresh profile) and measures
   * **first paint**: from navigation start to the first frame of the timeline with data
     (the page's own clock, ``performance.now()``), target <= 2 s;
   * **zoom / pan**: ``--moves`` zooms and pans, each a forced window request (HTTP, server-side
     query, packed transfer, decode) plus the redraw, timed in the page; target p95 <= 100 ms.
     The same moves are also timed as a user gets them (a move served from the data already
     loaded needs no request);
   * **every interaction**, on the synthetic trace, on each ``cuda_*`` trace of ``--kineto``
     (the real HTA traces) and on ``--sim`` profiles: opening the trace, clicks on random
     events and on step parents (event + lifecycle), the lifecycle's next pages, search, next
     match, summary, the tables, the device view (sim), compare -- each run through the page's
     own handlers; p50 / p95 of the server time (``Server-Timing`` of the slowest answer it
     waited for; target p95 <= 200 ms) and of the time on the page. ``first`` is the first run
     (an analysis the session had not warmed yet is computed then).
3. Re-opens the trace in a new session to time a start with the index from the cache.

With ``--reference-static DIR`` (another version's ``explorer/static``, e.g. main's:
``git archive main src/tilescope/explorer/static | tar -x -C /tmp/ref``), a second server on the
same session serves that front end, and first paint and zoom / pan are measured side by side:
one page each, the same moves in alternating blocks, while the analyses run and after.

Every figure is wall-clock time measured on the machine running this script (printed first).
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import random
import re
import resource
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
KINETO_DEFAULT = next((d for d in (os.path.join(ROOT, "..", "shared", "traces", "kineto"), "/work/shared/traces/kineto",
                       os.path.join(ROOT, "tests", "data", "kineto")) if os.path.isdir(d)), "")
TARGET_PAINT_S = 2.0
TARGET_MOVE_MS = 100.0
TARGET_SERVER_MS = 200.0  # p95 server time of an interaction
STEP_OPS = 2000  # ops of the synthetic trace's first thread under one ProfilerStep parent


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", load average %.1f %.1f %.1f (1/5/15 min)" % os.getloadavg() if hasattr(os, "getloadavg") else ""
    return f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}{load}"


def fmt_ns(v: float) -> str:
    for unit, div in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if v >= div:
            return f"{v / div:,.1f} {unit}"
    return f"{v:,.0f} ns"


def write_trace(path: str, n_events: int, seed: int = 0, threads: int = 4, streams: int = 4) -> int:
    """A Kineto-like trace: per host thread, back-to-back aten ops each holding one
    cudaLaunchKernel; per stream, the kernels they launch (same correlation id); on the first
    thread, a ``ProfilerStep#k`` parent over every ``STEP_OPS`` ops."""
    rnd = random.Random(seed)
    ops = [f"aten::op{i}" for i in range(40)]
    kernels = [f"void kernel_{i}<float, 128>(float*, float const*, int)" for i in range(60)]
    clock = [1000.0 + i for i in range(threads)]
    stream_end = [0.0] * streams
    n = corr = 0
    step, step_ops, step_start = 0, 0, None  # ProfilerStep#k parents on thread 0, each over STEP_OPS ops
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "synthetic GPU (benchmark)"}],\n'
                '"traceEvents": [\n')
        f.write('{"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"python"}},\n')
        f.write('{"ph":"M","name":"process_name","pid":0,"tid":0,"args":{"name":"GPU 0","labels":"GPU 0"}}')
        buf = []
        while n < n_events:
            i, s = corr % threads, corr % streams
            corr += 1
            ts, d = clock[i], rnd.uniform(2, 12)
            tid, st = 100 + i, 7 + s
            buf.append(f',\n{{"ph":"X","cat":"cpu_op","name":"{ops[corr % 40]}","pid":1,"tid":{tid},"ts":{ts:.3f},'
                       f'"dur":{d:.3f},"args":{{"External id":{corr}}}}}')
            buf.append(f',\n{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":{tid},'
                       f'"ts":{ts + 0.5:.3f},"dur":{d - 1:.3f},"args":{{"correlation":{corr},"External id":{corr}}}}}')
            ks, kd = max(stream_end[s], ts + 5), rnd.uniform(1, 12)
            stream_end[s] = ks + kd
            buf.append(f',\n{{"ph":"X","cat":"kernel","name":"{kernels[corr % 60]}","pid":0,"tid":{st},"ts":{ks:.3f},'
                       f'"dur":{kd:.3f},"args":{{"correlation":{corr},"stream":{st},"device":0}}}}')
            n += 3
            if i == 0:
                step_start = ts - 0.05 if step_start is None else step_start
                step_ops += 1
                if step_ops == STEP_OPS:
                    buf.append(f',\n{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{step}","pid":1,"tid":{tid},'
                               f'"ts":{step_start:.3f},"dur":{ts + d + 0.05 - step_start:.3f},"args":{{}}}}')
                    n += 1
                    step, step_ops, step_start = step + 1, 0, None
            clock[i] = ts + d + rnd.uniform(0.2, 3)
            if len(buf) >= 30000:
                f.write("".join(buf))
                buf.clear()
        f.write("".join(buf))
        f.write("\n]}\n")
    return n


MOVES_JS = """async ([moves, force, seed]) => {
  // From the whole trace: zoom in 2.5x and pan 30% in turn, down to a few microseconds (exact
  // events), then zoom out and pan back up: every level of detail and the exact path.
  const tl = window.tilescope.app.view.timeline;
  let s = seed;
  const rnd = () => { s = (s * 1103515245 + 12345) % 2147483648; return s / 2147483648; };
  const out = [];
  await Promise.race([tl.reset(), new Promise((_, rej) => setTimeout(() => rej(new Error("reset got no answer")), 60000))]);
  const half = Math.floor(moves / 2);
  for (let k = 0; k < moves; k++) {
    const w = tl.t1 - tl.t0;
    let a, b;
    if (k % 2 === 1) {                                          // pan by 30% of the view
      const d = (rnd() < 0.5 ? -0.3 : 0.3) * w; a = tl.t0 + d; b = tl.t1 + d;
    } else if (k < half) {                                      // zoom in around a random point
      const c = tl.t0 + (0.25 + 0.5 * rnd()) * w; a = c - w / 5; b = c + w / 5;
    } else {                                                    // zoom out
      const c = (tl.t0 + tl.t1) / 2; a = c - 1.25 * w; b = c + 1.25 * w;
    }
    const t = performance.now();
    await Promise.race([tl.setRange(a, b, {force}),
      new Promise((_, rej) => setTimeout(() => rej(new Error(`move ${k} got no answer within 60 s`)), 60000))]);
    out.push({ms: performance.now() - t, events: tl.lastFetch.events, buckets: tl.lastFetch.buckets,
              exact: tl.lastFetch.exact, width: tl.t1 - tl.t0, fetch_ms: tl.lastFetch.fetch_ms, draw_ms: tl.lastFetch.draw_ms});
  }
  return out;
}"""


ACT_JS = """async ([what, arg, ms]) => {
  // One interaction as the page runs it (the handlers a click, a key or a link calls), timed
  // on the page's clock; a promise that never settles fails the benchmark instead of hanging it.
  const app = window.tilescope.app;
  const act = async () => {
    const v = app.view;
    if (what === "go") { await app.go(arg); if (app.view && app.view.analysesShown) await app.view.analysesShown; return; }
    if (what === "click") { v.timeline.select(arg); return v.showEvent(arg); }
    if (what === "page") return v.showEvent(arg[0], v.ev, arg[1]);
    if (what === "search") { v.exact = false; return v.search(arg, {now: true}); }
    if (what === "match") return v.nextMatch(arg);
    throw new Error("unknown interaction " + what);
  };
  const t = performance.now();
  await Promise.race([act(), new Promise((_, rej) => setTimeout(() => rej(new Error(`${what} got no answer within ${ms} ms`)), ms))]);
  const pager = document.querySelector("[data-testid=pager]"), m = pager && pager.innerText.match(/of (\\d+)/);
  return {ms: performance.now() - t, pages: m ? Number(m[1]) : null};
}"""


class Recorder:
    """Server time (the ``Server-Timing`` header) of every API answer, tagged with the
    interaction that asked for it; an interaction's server time is its slowest answer (the
    page sends its requests together)."""

    def __init__(self, page):
        self.tag = None
        self.n = 0  # interactions so far (tags are unique over the whole run)
        self.answers: list[tuple] = []  # (tag, endpoint, server ms, status)
        page.on("response", self._on)

    def _on(self, r):
        if self.tag is None or "/api/" not in r.url:
            return
        timing = r.headers.get("server-timing", "")
        ms = float(timing.split("dur=")[1]) if "dur=" in timing else None
        part = re.search(r"[?&]part=(\w+)", r.url)
        self.answers.append((self.tag, r.url.split("?")[0].rsplit("/", 1)[-1] + (f"?part={part.group(1)}" if part else ""),
                             ms, r.status))


def wait_warm(session, timeout_s: float) -> tuple[float, list]:
    """Seconds until each source's analyses computed in the background at start (summary,
    tables, roofline) are done, at most ``timeout_s``; and what was still running then."""
    t = time.perf_counter()
    pools = [(s.label, s.results) for s in session.sources if s.ok and s.results is not None]
    while any(r._jobs for _, r in pools) and time.perf_counter() - t < timeout_s:
        time.sleep(0.2)
    return time.perf_counter() - t, [f"{label}: {k}" for label, r in pools for k in list(r._jobs)]


def interactions(page, rec: Recorder, src, pid: str, others: list[str], clicks: int, repeats: int, seed: int,
                 timeout_s: float = 120) -> list[dict]:
    """Every kind of interaction on one source, each run several times; returns one row per run:
    ``{"what", "page_ms", "server_ms", "endpoints", "errors"}``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ix = src.index
    rows = []

    gave_up = set()

    def run(what, kind, arg):
        if what in gave_up:  # it ran out of time once here: its repeats would only wait again
            return {"pages": None}
        rec.n += 1
        tag = (rec.n, what)
        rec.tag = tag
        try:
            r = page.evaluate(ACT_JS, [kind, arg, timeout_s * 1000])
        except Exception as e:  # noqa: BLE001 - playwright's Error: the interaction took longer than timeout_s
            if "no answer within" not in str(e):
                raise
            r = {"ms": timeout_s * 1000.0, "pages": None, "timed_out": True}
            gave_up.add(what)
        rec.tag = None
        mine = [a for a in rec.answers if a[0] == tag]
        rows.append({"what": tag[1], "page_ms": r["ms"], "server_ms": max((a[2] or 0.0) for a in mine) if mine else None,
                     "endpoints": sorted({a[1] for a in mine}), "errors": [a for a in mine if a[3] >= 400],
                     "pages": r["pages"], "timed_out": r.get("timed_out", False)})
        # compare's lanes paint without waiting for the diff; the summary's figures without HTA's analyses
        splits = {"compare": (("compare: lanes", lambda e: e != "compare"), ("compare: diff", lambda e: e == "compare")),
                  "summary": (("summary: figures", lambda e: e != "summary?part=analyses"),
                              ("summary: HTA analyses", lambda e: e == "summary?part=analyses"))}
        whole = rows[-1]
        for part, sel in splits.get(what, ()):
            ms = [a[2] or 0.0 for a in mine if sel(a[1])]
            rows.append({**whole, "what": part, "server_ms": max(ms) if ms else None, "page_ms": None})
        return whole

    run("open trace", "go", f"#/{pid}/trace")
    page.wait_for_function("() => window.tilescope.app.view.timeline && window.tilescope.app.view.timeline.lastFetch",
                           timeout=120_000)
    for ref in rng.choice(ix.n, size=min(clicks, ix.n), replace=False).tolist():
        run("click event", "click", int(ref))
    steps = [i for i, n in enumerate(ix.names) if n.startswith("ProfilerStep")]
    parents = np.flatnonzero(np.isin(ix.name, steps)) if steps else np.argsort(ix.dur)[::-1][:clicks // 3]
    paged = []
    for ref in rng.permutation(parents)[:max(3, clicks // 3)].tolist():
        r = run("click step parent" if steps else "click longest event", "click", int(ref))
        if r["pages"] and r["pages"] > 1:
            paged.append((int(ref), r["pages"]))
    for ref, pages in paged[:3]:
        for p in range(1, min(pages, 4)):
            run("lifecycle, next page", "page", [ref, p])
    names = [n for n in ix.names if len(n) >= 6]
    for q in rng.permutation(names)[:repeats].tolist():
        run("search", "search", q[:8])
        for _ in range(3):
            run("next match (Enter)", "match", 1)
    for _ in range(repeats):
        run("summary", "go", f"#/{pid}/summary")
        for tab in ("ops", "kernels", "lanes"):
            run("tables", "go", f"#/{pid}/ops?tab={tab}")
        if src.facts.get("modeled"):
            run("device view", "go", f"#/{pid}/device")
        for o in others:
            run("compare", "go", f"#/compare?ids={pid},{o}")
    return rows


def open_page(ctx, url: str) -> tuple:
    """A new page on the synthetic trace, once its first frame with data is drawn:
    (page, first paint on the page's clock in ms, the first window's figures)."""
    page = ctx.new_page()
    page.goto(url + "#/p0/trace")
    page.wait_for_function("() => window.tilescope && window.tilescope.app.view && "
                           "window.tilescope.app.view.timeline && window.tilescope.app.view.timeline.firstDraw",
                           timeout=120_000)
    first = page.evaluate("""() => {
      const tl = window.tilescope.app.view.timeline;
      return {paint_ms: tl.firstDraw, fetch: tl.firstFetch || tl.lastFetch, hidden: document.hidden};
    }""")
    return page, first["paint_ms"], first


def side_by_side(ctx, urls: dict, moves: int, rounds: int = 2) -> dict:
    """Each front end of ``urls`` ({label: server url}) in turn, ``rounds`` times, the order
    reversed each round: a fresh page (its first paint, the trace's server state already warm),
    the same forced moves, the page closed -- one page open at a time, so both meet the same
    load and neither runs as a background tab: {label: {"paint_ms": [...], "moves": [ms...]}}."""
    out = {label: {"paint_ms": [], "moves": [], "hidden": False} for label in urls}
    order = list(urls)
    for k in range(rounds):
        for label in (order if k % 2 == 0 else order[::-1]):
            pg, paint, first = open_page(ctx, urls[label])
            out[label]["paint_ms"].append(paint)
            out[label]["hidden"] |= bool(first["hidden"])
            out[label]["moves"] += [m["ms"] for m in pg.evaluate(MOVES_JS, [moves, True, 7])]
            pg.close()
    return out


def measure_browser(url: str, moves: int, session, clicks: int, repeats: int, pairs: dict, warm_timeout: float,
                    timeout_s: float, ref_url: str | None = None) -> dict:
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="tilescope-bench-chromium-")
    try:
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=ARGS,
                                                        viewport={"width": 1600, "height": 900})
            page = ctx.new_page()
            errors = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            rec = Recorder(page)
            t0 = time.perf_counter()
            page.goto(url + "#/p0/trace")
            page.wait_for_function("() => window.tilescope && window.tilescope.app.view && "
                                   "window.tilescope.app.view.timeline && window.tilescope.app.view.timeline.firstDraw",
                                   timeout=120_000)
            wall = time.perf_counter() - t0
            first = page.evaluate("""() => {
              const tl = window.tilescope.app.view.timeline;
              return {paint_ms: tl.firstDraw, fetch: tl.firstFetch || tl.lastFetch};
            }""")
            rec.tag = (0, "zoom/pan")  # each window answer's server time
            forced = page.evaluate(MOVES_JS, [moves, True, 7])
            rec.tag = None
            move_server = [a[2] for a in rec.answers if a[0] == (0, "zoom/pan") and a[1] == "window" and a[2] is not None]
            user = page.evaluate(MOVES_JS, [moves, False, 7])
            urls = {"reference": ref_url, "this": url} if ref_url else {}
            ab = side_by_side(ctx, urls, moves) if ref_url else None
            # the analyses are computed once, in the background from the start, and kept on disk:
            # interactions are measured once they are (how long that takes is printed)
            warm_s = time.perf_counter() - session.t_start
            waited, running = wait_warm(session, warm_timeout)
            warm_s += waited
            rec.tag = (0, "zoom/pan, warm")  # the same moves once nothing runs in the background
            settled = page.evaluate(MOVES_JS, [moves, True, 7])
            rec.tag = None
            settled_server = [a[2] for a in rec.answers if a[0] == (0, "zoom/pan, warm") and a[1] == "window"
                              and a[2] is not None]
            ab_settled = side_by_side(ctx, urls, moves) if ref_url else None
            per_source = {}
            for k, src in enumerate(session.sources):
                if src.ok:
                    per_source[src.id] = interactions(page, rec, src, src.id, pairs.get(src.id, []), clicks, repeats, k,
                                                      timeout_s)
            ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return {"wall_first_paint_s": wall, "first": first, "forced": forced, "user": user, "errors": errors,
            "interactions": per_source, "warm_s": warm_s, "still_running": running, "move_server": move_server, "settled": settled,
            "settled_server": settled_server, "ab": ab, "ab_settled": ab_settled}


def pct(xs, q):
    """Percentile ``q`` (linear interpolation, as numpy's default)."""
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=float), q))


def report_interactions(session, per_source: dict) -> bool:
    """Prints p50 / p95 per interaction and source (server time, and time on the page);
    returns whether every interaction's server p95 is within the budget."""
    ok = True
    print(f"\ninteractions, ms: server time (Server-Timing of the slowest answer an interaction waited for) and "
          f"time on the page (request + render), p50 / p95 over every run; 'first' is the first run, apart "
          f"(an analysis not computed yet is computed then); target p95 server <= {TARGET_SERVER_MS:.0f} ms")
    print(f"{'source':<28} {'interaction':<24} {'n':>3} {'first':>8} {'p50':>8} {'p95':>8} {'max':>8}   "
          f"{'page p50':>8} {'page p95':>8}  verdict")
    for src in session.sources:
        rows = per_source.get(src.id)
        if not rows:
            continue
        name = f"{src.label} ({src.index.n:,} ev)"
        for what in dict.fromkeys(r["what"] for r in rows):
            mine = [r for r in rows if r["what"] == what]
            if any(r.get("timed_out") for r in mine):
                ok = False
                print(f"{name[:28]:<28} {what:<24} {len(mine):>3}  no answer within the limit (--timeout; "
                      f"further runs skipped)  MISS")
                continue
            srv = [r["server_ms"] for r in mine if r["server_ms"] is not None]
            pg = [r["page_ms"] for r in mine if r["page_ms"] is not None] or [float("nan")]
            bad = sum(len(r["errors"]) for r in mine)
            if not srv:
                continue
            p95 = pct(srv, 95)
            good = p95 <= TARGET_SERVER_MS and not bad
            ok &= good
            # a miss from the first run alone (an analysis computed then, kept after) is told apart
            later = srv[1:]
            verdict = "ok" if good else ("MISS (first run only: later p95 "
                                         f"{pct(later, 95):.1f})" if later and pct(later, 95) <= TARGET_SERVER_MS
                                         and not bad else "MISS")
            print(f"{name[:28]:<28} {what:<24} {len(srv):>3} {srv[0]:>8.1f} {pct(srv, 50):>8.1f} {p95:>8.1f} "
                  f"{max(srv):>8.1f}   {pct(pg, 50):>8.1f} {pct(pg, 95):>8.1f}  {verdict}"
                  f"{f' ({bad} HTTP errors)' if bad else ''}")
    return ok


def report_side_by_side(r: dict, ref_dir: str | None) -> None:
    """Prints the front ends measured side by side (``--reference-static``), if any."""
    for name, ab in (("while the analyses run", r["ab"]), ("once they are done", r["ab_settled"])):
        if ab:
            ref_, new_ = ab["reference"], ab["this"]
            print(f"side by side, {name} (same session and load, a page each in turn; reference: "
                  f"{ref_dir}):")
            for label, x in (("reference", ref_), ("this", new_)):
                paint = sum(x["paint_ms"]) / len(x["paint_ms"]) / 1e3
                print(f"  {label:<9} first paint (server warm, mean of {len(x['paint_ms'])}) {paint:.3f} s (ratio {paint / TARGET_PAINT_S:.2f}); "
                      f"zoom/pan p50 {pct(x['moves'], 50):.1f} ms, p95 {pct(x['moves'], 95):.1f} ms "
                      f"(ratio {pct(x['moves'], 95) / TARGET_MOVE_MS:.2f}), mean {sum(x['moves']) / len(x['moves']):.1f} ms"
                      f"{' (page hidden: drawn without frames)' if x['hidden'] else ''}")
            print(f"  this / reference: zoom/pan p95 {pct(new_['moves'], 95) / pct(ref_['moves'], 95):.2f}x, "
                  f"mean {sum(new_['moves']) / sum(ref_['moves']):.2f}x")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--workdir", default=None, help="where the trace and caches go (default: a temporary directory)")
    ap.add_argument("--moves", type=int, default=40)
    ap.add_argument("--clicks", type=int, default=30, help="random events clicked per source")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each view interaction (summary, tables, compare, ...)")
    ap.add_argument("--kineto", default=KINETO_DEFAULT,
                    help="directory of real Kineto traces: its cuda_*.json.gz are measured too (default: %(default)s)")
    ap.add_argument("--sim", action="append", default=[], metavar="PROFILE_DIR",
                    help="a tilescope profile directory of the simulated device (its device view is measured; "
                         "two or more are compared); repeatable")
    ap.add_argument("--warm-timeout", type=float, default=900,
                    help="seconds to wait for the background analyses before measuring interactions (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds one interaction may take (default %(default)s)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    ap.add_argument("--reference-static", default=None, metavar="DIR",
                    help="another front end's static/ directory (e.g. main's, from `git archive`): its first paint and "
                         "zoom/pan are measured side by side with this one's, on the same session and load")
    args = ap.parse_args(argv)
    work = args.workdir or tempfile.mkdtemp(prefix="tilescope-explorer-bench-")
    os.makedirs(work, exist_ok=True)
    os.environ["TILESCOPE_CACHE_DIR"] = os.path.join(work, "cache")
    print(f"machine: {machine()}")
    trace = os.path.join(work, f"trace_{args.events}.json")
    if not os.path.exists(trace):
        t = time.perf_counter()
        n = write_trace(trace, args.events)
        print(f"wrote {n:,} events ({os.path.getsize(trace) / 1e6:,.0f} MB) in {time.perf_counter() - t:.1f} s: {trace}")
    else:
        print(f"reusing {trace}")

    import tilescope.trace as tt
    from tilescope.explorer import Session
    from tilescope.explorer._server import GIL_SWITCH_S, make_server

    t = time.perf_counter()
    tr = tt.open(trace)
    ingest = time.perf_counter() - t
    print(f"ingest (tilescope.trace.open: the Parquet cache): {ingest:.1f} s")
    del tr
    real = sorted(glob.glob(os.path.join(args.kineto, "cuda_*.json*"))) if args.kineto else []
    specs = [f"synthetic={trace}"] + [f"{os.path.basename(p).split('.')[0]}={p}" for p in real] + \
            [f"sim{i}={p}" for i, p in enumerate(args.sim)]
    t = time.perf_counter()
    session = Session(specs)
    session.t_start = t
    src = session.sources[0]
    if not src.ok:
        print(f"cannot open the trace: {src.error}")
        return 1
    build = time.perf_counter() - t
    st = src.index.stats()
    print(f"explorer index: {st['events']:,} events, {len(st['levels'])} LOD levels, built in {build:.1f} s "
          f"({'from cache' if st['loaded_from_cache'] else 'new'}; with {len(specs) - 1} other source(s)), "
          f"{st['bytes'] / 1e6:,.0f} MB")
    for s_ in session.sources[1:]:
        print(f"  also: {s_.id} {s_.label}: {s_.index.n:,} events" if s_.ok else f"  also: {s_.id} failed: {s_.error}")
    ids = {s_.label: s_.id for s_ in session.sources if s_.ok}
    pairs = {}  # what each source is compared with: the real pair with each other, the synthetic with a real one
    ctl, tst = ids.get("cuda_trace_diff_control"), ids.get("cuda_trace_diff_test")
    if ctl and tst:
        pairs[ctl] = [tst]
    if ctl:
        pairs["p0"] = [ctl]
    sims = [ids[f"sim{i}"] for i in range(len(args.sim)) if f"sim{i}" in ids]
    if len(sims) > 1:
        pairs[sims[0]] = [",".join(sims[1:])]
    server = make_server(session, "127.0.0.1", 0)
    server.serve_in_thread()
    ref = make_server(session, "127.0.0.1", 0, static_dir=args.reference_static) if args.reference_static else None
    if ref:
        ref.serve_in_thread()
    sys.setswitchinterval(GIL_SWITCH_S)  # as `tilescope explore` does
    session.warm_up()
    try:
        r = measure_browser(server.url.rstrip("/") + "/", args.moves, session, args.clicks, args.repeats, pairs,
                            args.warm_timeout, args.timeout, ref.url.rstrip("/") + "/" if ref else None)
    finally:
        for srv in (server, ref):
            if srv:
                srv.shutdown()
                srv.server_close()
    paint_s = r["first"]["paint_ms"] / 1e3
    f = r["first"]["fetch"]
    print(f"\nfirst paint after ingest ({src.index.n:,} events): {paint_s:.3f} s from navigation start "
          f"(target <= {TARGET_PAINT_S:.0f} s, ratio {paint_s / TARGET_PAINT_S:.2f}); {r['wall_first_paint_s']:.3f} s "
          f"wall-clock from page.goto; first window{' (coarse: the full detail follows)' if f.get('coarse') else ''}: "
          f"{f['events']:,} events + {f['buckets']:,} LOD buckets of ~{f['total']:,}, request+draw {f['ms']:.1f} ms")
    forced = [m["ms"] for m in r["forced"]]
    user = [m["ms"] for m in r["user"]]
    p50, p95 = pct(forced, 50), pct(forced, 95)
    lod = sum(1 for m in r["forced"] if not m["exact"])
    widths = [m["width"] for m in r["forced"]]
    print(f"zoom/pan, request + redraw ({len(forced)} moves over views from {fmt_ns(max(widths))} to "
          f"{fmt_ns(min(widths))} wide, each a new window request: {lod} answered from the LOD summary, "
          f"{len(forced) - lod} with exact events): p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {max(forced):.1f} ms "
          f"(target <= {TARGET_MOVE_MS:.0f} ms, p95 ratio {p95 / TARGET_MOVE_MS:.2f})")
    ms = r["move_server"]
    if ms:
        fetch = [m["fetch_ms"] for m in r["forced"]]
        draw = [m["draw_ms"] for m in r["forced"]]
        print(f"  of which server time (window answers' Server-Timing): p50 {pct(ms, 50):.1f} ms, p95 {pct(ms, 95):.1f} ms; "
              f"request + decode in the page p50 {pct(fetch, 50):.1f} ms, p95 {pct(fetch, 95):.1f} ms; "
              f"draw until the next frame p50 {pct(draw, 50):.1f} ms, p95 {pct(draw, 95):.1f} ms")
    st = [m["ms"] for m in r["settled"]]
    p95_settled = pct(st, 95)
    print(f"zoom/pan once the background analyses are done (same moves): p50 {pct(st, 50):.1f} ms, p95 "
          f"{p95_settled:.1f} ms (ratio {p95_settled / TARGET_MOVE_MS:.2f}); server p50 {pct(r['settled_server'], 50):.1f} ms, "
          f"p95 {pct(r['settled_server'], 95):.1f} ms")
    report_side_by_side(r, args.reference_static)
    print(f"zoom/pan as the user gets them (moves within loaded data need no request): p50 "
          f"{pct(user, 50):.1f} ms, p95 {pct(user, 95):.1f} ms")
    print(f"analyses computed in the background (summary, tables, roofline): "
          + (f"all done {r['warm_s']:.1f} s after the session started" if not r["still_running"] else
             f"still running {r['warm_s']:.1f} s after the session started (interactions measured meanwhile): "
             + ", ".join(r["still_running"])))
    inter_ok = report_interactions(session, r["interactions"])
    print(f"machine at the end: {machine()}")
    print(f"server peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB (this process: "
          f"engine + index + server)")
    if r["errors"]:
        print(f"browser console errors: {r['errors'][:5]}")
    t = time.perf_counter()
    again = Session([trace])
    print(f"re-open with the index from the cache: {time.perf_counter() - t:.2f} s "
          f"(index {'from cache' if again.sources[0].index.loaded_from_cache else 'rebuilt'})")
    ok = paint_s <= TARGET_PAINT_S and max(p95, p95_settled) <= TARGET_MOVE_MS and inter_ok and not r["errors"]
    print(f"\n{'PASS' if ok else 'MISS'}: first paint {paint_s:.2f} s (<= {TARGET_PAINT_S:.0f} s), "
          f"zoom/pan p95 {p95:.1f} ms while the analyses run, {p95_settled:.1f} ms after "
          f"(<= {TARGET_MOVE_MS:.0f} ms), every interaction's server p95 "
          f"{'within' if inter_ok else 'NOT all within'} {TARGET_SERVER_MS:.0f} ms")
    if not args.workdir and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""What the timeline does per frame, in headless Chromium on a real CUDA trace (HTA's
``cuda_trace_diff_control``, 75k events: its whole view is drawn from level-of-detail buckets):

* buckets are rasterised once per window answer into a strip image and each frame draws its
  rows: every bucket lands on its pixels, in its colour, right after the answer and after a pan
  drawn from the data already loaded (before the next answer);
* a window request the view moved past is cancelled (and the view's answer is the latest one);
* wheel events are summed and applied once per animation frame;
* a window answer decodes in the page to the arrays the server packed;
* a small trace's first (coarse) answer, exact, is the whole first view: no second request.
"""

from __future__ import annotations

import os
import urllib.request

import numpy as np
import pytest

from test_explorer_browser import CUDA, call, chromium_context

pytestmark = pytest.mark.slow

TL = "window.tilescope.app.view.timeline"
ALEXNET = os.path.join(os.path.dirname(CUDA), "cuda_alexnet_small.json.gz")  # 870 events


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    old = os.environ.get("TILESCOPE_CACHE_DIR")
    os.environ["TILESCOPE_CACHE_DIR"] = str(tmp_path_factory.mktemp("frames-cache"))
    from tilescope.explorer import Session
    from tilescope.explorer._server import make_server

    srv = make_server(Session([f"cuda={CUDA}", f"alexnet={ALEXNET}"]), "127.0.0.1", 0)
    srv.serve_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()
    if old is None:
        os.environ.pop("TILESCOPE_CACHE_DIR", None)
    else:
        os.environ["TILESCOPE_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def browser():
    with chromium_context() as ctx:
        yield ctx


@pytest.fixture
def page(browser, server):
    pg = browser.new_page()
    pg.set_default_timeout(30_000)
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    pg.goto(server.url.rstrip("/") + "/#/p0/trace")
    pg.wait_for_function(f"() => window.tilescope && window.tilescope.app.view && {TL} && {TL}.lastFetch")
    call(pg, f"() => {TL}.refresh()")
    yield pg
    pg.close()
    assert not errors, errors


# Where buckets of one colour and shade cover the time under [x - 2, x + 2] px of a visible
# row (and no event is drawn there), the canvas pixel at x must be that colour composited over
# the lane's background at that shade. Checks up to 300 such places, one per bucket; returns
# [checked, [mismatches...]].
CHECK_BUCKETS = """() => {
  const tl = window.tilescope.app.view.timeline, a = tl.data.arrays;
  const ctx = tl.canvas.getContext("2d"), dpr = tl.dpr, X = tl._xFn();
  const colors = tl.color === "kind" ? tl.kindColors : tl.keyColors;
  const SHADES = [0.35, 0.55, 0.75, 1];
  const byRow = new Map();
  for (let i = 0; i < a.bk_lane.length; i++) {
    const k = a.bk_lane[i] * 256 + a.bk_depth[i];
    if (!byRow.has(k)) byRow.set(k, []);
    byRow.get(k).push(i);
  }
  const evAt = (lane, depth, xa, xb) => {
    for (let i = 0; i < a.ev_ref.length; i++) {
      if (a.ev_lane[i] !== lane || a.ev_depth[i] !== depth) continue;
      if (X(a.ev_start[i] + a.ev_dur[i]) + 2 > xa && X(a.ev_start[i]) - 2 < xb) return true;
    }
    return false;
  };
  const top = tl.tracks.scrollTop, bottom = top + tl.tracks.clientHeight;
  let checked = 0;
  const bad = [];
  for (const [key, list] of byRow) {
    const lane = key >> 8, depth = key & 255, y = tl._rowY(lane, depth);
    if (y === undefined || y < top || y + 16 > bottom) continue;
    const row = tl.rows.find((r) => r.type === "lane" && r.lane === lane);
    const bg = row.info.side === "device" ? [0xfb, 0xfb, 0xfe] : [0xff, 0xff, 0xff];
    for (let n = 0; n < list.length && checked < 300; n++) {
      const i = list[n], x = (X(a.bk_start[i]) + X(a.bk_start[i] + a.bk_w[i])) / 2;
      if (x < 236 || x > tl.width - 4) continue;
      const shade = a.bk_fill[i] >> 6;
      let cover = x - 2, same = true;  // walk the row's buckets from the one under x - 2 px
      for (let m = Math.max(0, n - 40); m < list.length && cover < x + 2; m++) {
        const j = list[m], ja = X(a.bk_start[j]), jb = X(a.bk_start[j] + a.bk_w[j]);
        if (jb <= cover) continue;
        if (ja > cover + 1e-9) break;  // a gap
        if (a.bk_key[j] !== a.bk_key[i] || (a.bk_fill[j] >> 6) !== shade) { same = false; break; }
        cover = jb;
      }
      if (!same || cover < x + 2 || evAt(lane, depth, x - 2, x + 2)) continue;
      const px = ctx.getImageData(Math.floor(x * dpr), Math.floor((y + 7) * dpr), 1, 1).data;
      const h = colors.get(a.bk_key[i]), al = SHADES[Math.min(3, shade)];
      const want = [1, 3, 5].map((o, c) => al * parseInt(h.slice(o, o + 2), 16) + (1 - al) * bg[c]);
      checked += 1;
      if (want.some((v, c) => Math.abs(v - px[c]) > 4)) bad.push({i, want, got: Array.from(px.slice(0, 3)), x, y});
    }
  }
  return [checked, bad.slice(0, 5)];
}"""


def test_buckets_land_on_their_pixels_after_an_answer_and_after_a_pan(page):
    assert page.evaluate(f"{TL}.lastFetch.exact") is False  # the whole trace: drawn from buckets
    call(page, f"() => new Promise((res) => {{ {TL}.draw(); requestAnimationFrame(() => requestAnimationFrame(res)); }})")
    checked, bad = page.evaluate(CHECK_BUCKETS)
    assert checked >= 50 and not bad, (checked, bad)
    # a pan of a tenth of the view, drawn from the answer already loaded (no new answer yet):
    # the strip is drawn shifted, and every bucket is still where its time is
    data = page.evaluate(f"""() => {{
      const tl = {TL}, d = (tl.t1 - tl.t0) * 0.1;
      tl.t0 += d; tl.t1 += d; tl._paint();
      return tl.data === tl._stripCache.data;
    }}""")
    assert data
    checked, bad = page.evaluate(CHECK_BUCKETS)
    assert checked >= 50 and not bad, (checked, bad)
    # and zoomed in 1.5x around the middle: the same strip scaled
    page.evaluate(f"""() => {{
      const tl = {TL}, c = (tl.t0 + tl.t1) / 2, w = (tl.t1 - tl.t0) / 3;
      tl.t0 = c - w; tl.t1 = c + w; tl._paint();
    }}""")
    checked, bad = page.evaluate(CHECK_BUCKETS)
    assert checked >= 20 and not bad, (checked, bad)


def test_a_window_request_the_view_moved_past_is_cancelled(page):
    failed, asked = [], []
    page.on("requestfailed", lambda r: failed.append(r.url) if "/window" in r.url else None)
    page.on("request", lambda r: asked.append(r.url) if "/window" in r.url else None)
    r = call(page, f"""async () => {{
      const tl = {TL}, w = (tl.t1 - tl.t0) / 50;
      const first = tl.setRange(tl.t0 + w, tl.t0 + 2 * w);       // its request starts at once
      const before = tl.dropped;
      const last = tl.setRange(tl.t1 - 2 * w, tl.t1 - w);        // far past it: that request is stale
      await Promise.all([first, last]);
      const s = tl.data.params.segs;
      return {{dropped: tl.dropped - before, t0: tl.realOf(tl.t0), t1: tl.realOf(tl.t1), got0: s[0].t0, got1: s[s.length - 1].t1}};
    }}""")
    assert r["dropped"] == 1
    assert r["got0"] <= r["t0"] and r["t1"] <= r["got1"]  # what is drawn is the answer for the latest view
    page.wait_for_timeout(100)
    assert len(failed) == 1 and failed[0] == asked[-2], (failed, asked)  # the stale one, cancelled in the browser
    # a move within the margin of the request in flight keeps it
    r = call(page, f"""async () => {{
      const tl = {TL}, [u0, u1] = tl.wholeRange(), w = (u1 - u0) / 50, c = (u0 + u1) / 2;
      await tl.setRange(c - w / 2, c + w / 2);
      const before = tl.dropped;
      const a = tl.setRange(tl.t0 - 4 * w, tl.t1 - 4 * w);
      const asked = !!tl._inflight;
      const b = tl.setRange(tl.t0 + w / 10, tl.t1 + w / 10);
      await Promise.all([a, b]);
      return {{asked, dropped: tl.dropped - before}};
    }}""")
    assert r == {"asked": True, "dropped": 0}


def test_wheel_events_are_applied_once_per_frame(page):
    asked = []
    page.on("request", lambda r: asked.append(r.url) if "/window" in r.url else None)
    r = call(page, f"""async () => {{
      const tl = {TL}, rect = tl.canvas.getBoundingClientRect();
      const frames = tl.wheelFrames || 0, w0 = tl.t1 - tl.t0;
      const x = Math.round(rect.left + 230 + tl.plotW * 0.75), t = tl.vOf(x - rect.left);  // clientX is whole pixels
      for (let i = 0; i < 20; i++)
        tl.canvas.dispatchEvent(new WheelEvent("wheel", {{deltaY: -10, ctrlKey: true, clientX: x, clientY: rect.top + 30,
                                                          bubbles: true, cancelable: true}}));
      const same = tl.t1 - tl.t0 === w0;  // nothing applied before the frame
      await new Promise((res) => requestAnimationFrame(() => requestAnimationFrame(res)));
      await tl.refresh();
      return {{same, frames: tl.wheelFrames - frames, ratio: (tl.t1 - tl.t0) / w0, moved: tl.vOf(x - rect.left) - t,
               ns_px: (tl.t1 - tl.t0) / tl.plotW}};
    }}""")
    assert r["same"] and r["frames"] == 1
    assert abs(r["ratio"] - np.exp(-2.0)) < 1e-6  # twenty steps of exp(-0.1), at once
    assert abs(r["moved"]) <= r["ns_px"]  # zoomed at the pointer
    assert len(asked) == 1, asked  # one request for the twenty events


def test_a_window_answer_decodes_in_the_page_to_the_packed_arrays(page, server):
    from tilescope.explorer._binary import unpack

    p = page.evaluate(f"() => {{ const s = {TL}.data.params.segs[0]; return {{t0: s.t0, t1: s.t1, px: s.px, lanes: {TL}.data.params.lanes}}; }}")
    url = server.url.rstrip("/") + f"/api/p/p0/window?t0={p['t0']}&t1={p['t1']}&px={p['px']}&lanes={p['lanes']}&color=op"
    with urllib.request.urlopen(url) as f:
        header, arrays = unpack(f.read())
    got = call(page, """async (url) => {
      const { getPacked } = await import("/static/js/api.js");
      const r = await getPacked(url);
      return Object.fromEntries(Object.entries(r.arrays).map(([k, v]) => [k, [v.constructor.name, Array.from(v)]]));
    }""", url[url.index("/api/"):])
    assert set(got) == set(arrays)
    kinds = {"f64": "Float64Array", "u32": "Uint32Array", "u16": "Uint16Array", "u8": "Uint8Array"}
    for spec in header["arrays"]:
        name = spec["name"]
        assert got[name][0] == kinds[spec["dtype"]], name
        np.testing.assert_array_equal(np.asarray(got[name][1], dtype=arrays[name].dtype), arrays[name], err_msg=name)
    assert len(arrays["bk_lane"]) > 100  # the whole trace: buckets, not only events


def test_a_coarse_first_answer_that_is_exact_is_the_first_view(browser, server):
    pg = browser.new_page()
    asked = []
    pg.on("request", lambda r: asked.append(r.url) if "/window" in r.url else None)
    pg.goto(server.url.rstrip("/") + "/#/p1/trace")
    pg.wait_for_function(f"() => window.tilescope && window.tilescope.app.view && {TL} && {TL}.lastFetch")
    call(pg, f"() => {TL}.refresh()")
    r = pg.evaluate(f"() => ({{exact: {TL}.data.header.exact, coarse: !!{TL}.lastFetch.coarse, events: {TL}.data.arrays.ev_ref.length, total: {TL}.data.header.total}})")
    pg.close()
    assert r["exact"] and r["coarse"] and r["events"] == r["total"] > 800 and len(asked) == 1, (r, asked)

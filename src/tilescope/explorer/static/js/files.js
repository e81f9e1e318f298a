// The opened profile's own files, the only files the explorer serves (download, e.g. to load the
// Chrome trace into Perfetto).
import { getJSON, href } from "./api.js";
import { bytes, esc } from "./format.js";

export class FilesView {
  constructor(app, profile, meta, params, signal) { this.profile = profile; this.signal = signal; this.el = document.createElement("div"); this.el.className = "page"; }

  async mount(main) {
    main.appendChild(this.el);
    const r = await getJSON(`/api/p/${this.profile.id}/files`, undefined, this.signal);
    const rows = r.files.map((f) => `<tr><td class="text"><a href="${href(`/api/p/${this.profile.id}/file`, { path: f.name })}" download>${esc(f.name)}</a></td><td>${bytes(f.bytes)}</td></tr>`).join("");
    this.el.innerHTML = `<h2>Files of ${esc(this.profile.label)}</h2>
      <p class="muted">The explorer serves these files and nothing else. The Chrome-format traces open in Perfetto or chrome://tracing.</p>
      <table class="data" style="max-width:800px" data-testid="files"><tr><th class="text">file</th><th>size</th></tr>${rows}</table>`;
  }

  destroy() { this.el.remove(); }
}

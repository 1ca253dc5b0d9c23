// Viking Engine's live memory panel: RAM, swap (and its rate), what is pinned per model and
// backend, the budget and what bounds it, and VRAM. Polls GET /viking/status: every second
// while a prompt runs, every five seconds otherwise, never while the tab is hidden.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

function human(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes ?? 0;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

function row(panel, className, text) {
  const line = document.createElement("div");
  line.className = className;
  line.textContent = text;
  panel.appendChild(line);
  return line;
}

app.registerExtension({
  name: "viking_engine.panel",
  async setup() {
    const panel = document.createElement("div");
    panel.id = "viking-panel";
    panel.title = "Viking Engine memory panel";
    Object.assign(panel.style, {
      // Bottom left, beside the sidebar: newer frontends (1.49) put their minimap bottom right.
      position: "fixed", left: "64px", bottom: "12px", zIndex: 10000, maxWidth: "460px",
      background: "rgba(18, 22, 30, 0.92)", color: "#d8dee9", border: "1px solid #4c566a",
      borderRadius: "6px", padding: "6px 10px", font: "12px/1.45 monospace", whiteSpace: "pre-wrap",
      pointerEvents: "none",
    });
    document.body.appendChild(panel);

    let previous = null; // {time, in, out} for the swap rate
    let running = false;
    let timer = null;

    function render(status) {
      panel.replaceChildren();
      const memory = status.memory;
      const paging = status.paging;
      row(panel, "viking-title", `Viking Engine ${status.version}: ${human(status.pinned_bytes)} pinned`);
      // In a container the limit is the RAM there is (available is measured against it too).
      const ram = memory.container_limit ?? memory.total_ram;
      row(panel, "viking-ram", `RAM ${human(ram - memory.available_ram)} used, ${human(memory.available_ram)} available`
        + (memory.container_limit ? ` (container limit ${human(memory.container_limit)})` : ""));
      if (memory.given_back_under_pressure) {
        row(panel, "viking-pressure", `Memory pressure: ${human(memory.given_back_under_pressure)} of pins given back`);
      }
      const now = performance.now();
      let rate = "";
      if (previous && paging.swapped_in_since_start != null) {
        const seconds = (now - previous.time) / 1000;
        const inRate = (paging.swapped_in_since_start - previous.in) / seconds;
        const outRate = (paging.swapped_out_since_start - previous.out) / seconds;
        rate = `, in ${human(Math.max(0, inRate))}/s, out ${human(Math.max(0, outRate))}/s`;
      }
      previous = { time: now, in: paging.swapped_in_since_start ?? 0, out: paging.swapped_out_since_start ?? 0 };
      row(panel, "viking-swap", `Swap ${human(paging.swap_used)} of ${human(paging.swap_total)}${rate}`);
      for (const owner of status.owners) {
        const backends = Object.entries(owner.by_backend).map(([name, bytes]) => `${name} ${human(bytes)}`).join(", ") || "none";
        const swapped = owner.swapped_bytes ? `, ${human(owner.swapped_bytes)} swapped` : "";
        const vram = owner.vram_bytes ? `, ${human(owner.vram_bytes)} in VRAM` : "";
        const home = owner.home_bytes ? ` (pinned home ${human(owner.home_bytes)})` : "";
        // file pages still being locked on Viking's own thread (counted as pinned already)
        const pending = owner.pending_bytes ? `, ${human(owner.pending_bytes)} of it still locking` : "";
        const line = row(panel, "viking-owner", `  ${owner.label || owner.owner}: ${human(owner.pinned_bytes)} pinned (${backends})${pending}${swapped}${vram}${home}`);
        line.dataset.owner = String(owner.owner);
        line.dataset.pinnedBytes = String(owner.pinned_bytes);
        line.dataset.label = owner.label;
        const dynamic = owner.dynamic; // ComfyUI 0.33's dynamic VRAM mode: its own staging of this model
        if (dynamic) {
          row(panel, "viking-dynamic", `    ComfyUI staged ${human(dynamic.staged_bytes)} (${human(dynamic.staged_pinned_bytes)} pinned); `
            + `checkpoint in RAM ${human(dynamic.checkpoint_resident_bytes)} of ${human(dynamic.checkpoint_bytes)}`
            + (dynamic.file_residency === false ? "; its file pages not kept (file_residency off)" : ""));
        }
      }
      if (status.comfy && status.comfy.mode === "dynamic") {
        row(panel, "viking-comfy", `ComfyUI ${status.comfy.version} dynamic VRAM: pin ceiling ${human(status.comfy.pin_ceiling_bytes)}, `
          + `${human(status.comfy.pinned_bytes)} pinned by ComfyUI`);
      }
      row(panel, "viking-budget", `Budget ${human(status.budget.limit_bytes)}: ${status.budget.reason}`);
      const cuda = status.cuda;
      row(panel, "viking-vram", cuda.available
        ? `VRAM ${human(cuda.total_bytes - cuda.free_bytes)} used of ${human(cuda.total_bytes)} (${cuda.device.name})`
        : "VRAM: no CUDA device in use");
    }

    async function refresh() {
      if (!document.hidden) {
        try {
          const answer = await api.fetchApi("/viking/status");
          if (answer.ok) render(await answer.json());
          else panel.textContent = `Viking: status unavailable (${answer.status})`;
        } catch (error) {
          panel.textContent = "Viking: status unavailable";
        }
      }
      clearTimeout(timer);
      timer = setTimeout(refresh, running ? 1000 : 5000);
    }

    api.addEventListener("execution_start", () => { running = true; refresh(); });
    api.addEventListener("executing", ({ detail }) => { if (detail == null) { running = false; refresh(); } });
    api.addEventListener("execution_success", () => { running = false; refresh(); });
    refresh();
  },
});

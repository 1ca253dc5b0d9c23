// Viking Engine's live memory view, in two places: a tab of ComfyUI's sidebar (docked beside
// the canvas: the whole status) and a small floating line at the bottom left (the verdict: how
// much of the models' RAM is safe from swap; a click unfolds RAM, swap and its rate, what is
// pinned per model and backend, the budget and what bounds it, and VRAM). Both poll
// GET /viking/status: every second while a prompt runs, every five seconds otherwise, never
// while the tab is hidden. The floating line starts folded (so it covers no node; unfolding is
// remembered in this browser); Settings > Viking Engine > Panel hides it.
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

const FOLDED_KEY = "viking.panel.folded";

// The status, drawn into `target`: the verdict line first, then (unless folded) the details.
// `onTitleClick`: what a click on the verdict does (null: nothing).
function draw(target, status, folded, onTitleClick) {
  target.replaceChildren();
  const memory = status.memory;
  const paging = status.paging;
  const verdict = (status.text ?? "").split("\n")[0] || `Viking Engine: ${human(status.pinned_bytes)} pinned`;
  const title = row(target, "viking-title", onTitleClick ? `${folded ? "▸" : "▾"} ${verdict}` : verdict);
  if (onTitleClick) {
    // The floating line stays one line (ellipsis where a long verdict would wrap: it is whole
    // on hover and in the sidebar tab).
    Object.assign(title.style, { cursor: "pointer", whiteSpace: "nowrap", overflow: "hidden", textOverflow: "ellipsis" });
    title.title = verdict;
    title.addEventListener("click", onTitleClick);
  }
  target.dataset.folded = folded ? "1" : "0";
  if (!status.owners.length) {
    row(target, "viking-hint", "Nothing pinned yet: put a Viking Pin Model after a loader, or switch on engine mode "
      + "(Settings > Viking Engine).");
  }
  if (folded) return;
  // In a container the limit is the RAM there is (available is measured against it too).
  const ram = memory.container_limit ?? memory.total_ram;
  row(target, "viking-ram", `RAM ${human(ram - memory.available_ram)} used, ${human(memory.available_ram)} available`
    + (memory.container_limit ? ` (container limit ${human(memory.container_limit)})` : ""));
  // The pressure governor gave pins back because the machine stalled (src/pressure.rs).
  const given = status.pressure?.last_give_back;
  if (given) {
    const at = new Date(given.unix_time * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    const again = status.pressure.ceiling_bytes != null ? `; pins again after ${Math.round(status.pressure.hold_seconds)} s without stalls` : "";
    row(target, "viking-pressure", `Memory pressure: gave back ${human(given.bytes)} at ${at}: ${given.reason}${again}`);
  }
  // Windows reports its pagefile where Linux has swap (it also reports a commit charge).
  const swapName = paging.commit_limit ? "Pagefile" : "Swap";
  row(target, "viking-swap", `${swapName} ${human(paging.swap_used)} of ${human(paging.swap_total)}${swapRate.text}`);
  for (const owner of status.owners) {
    const backends = Object.entries(owner.by_backend).map(([name, bytes]) => `${name} ${human(bytes)}`).join(", ") || "none";
    const swapped = owner.swapped_bytes ? `, ${human(owner.swapped_bytes)} swapped` : "";
    const vram = owner.vram_bytes ? `, ${human(owner.vram_bytes)} in VRAM` : "";
    const home = owner.home_bytes ? ` (pinned home ${human(owner.home_bytes)})` : "";
    // file pages still being locked on Viking's own thread (counted as pinned already)
    const pending = owner.pending_bytes ? `, ${human(owner.pending_bytes)} of it still locking` : "";
    const line = row(target, "viking-owner", `  ${owner.label || owner.owner}: ${human(owner.pinned_bytes)} pinned (${backends})${pending}${swapped}${vram}${home}`);
    line.dataset.owner = String(owner.owner);
    line.dataset.pinnedBytes = String(owner.pinned_bytes);
    line.dataset.label = owner.label;
    const dynamic = owner.dynamic; // ComfyUI 0.33's dynamic VRAM mode: its own staging of this model
    if (dynamic) {
      row(target, "viking-dynamic", `    ComfyUI staged ${human(dynamic.staged_bytes)} (${human(dynamic.staged_pinned_bytes)} pinned)`
        // the residency figures come from a sample made off ComfyUI's execution thread (null before the first)
        + (dynamic.checkpoint_bytes == null ? "" : `; checkpoint in RAM ${human(dynamic.checkpoint_resident_bytes)} of ${human(dynamic.checkpoint_bytes)}`)
        + (dynamic.file_residency === false ? "; its file pages not kept (file_residency off)" : ""));
    }
  }
  if (status.comfy && status.comfy.mode === "dynamic") {
    row(target, "viking-comfy", `ComfyUI ${status.comfy.version} dynamic VRAM: pin ceiling ${human(status.comfy.pin_ceiling_bytes)}, `
      + `${human(status.comfy.pinned_bytes)} pinned by ComfyUI`);
  }
  row(target, "viking-budget", `Budget ${human(status.budget.limit_bytes)}: ${status.budget.reason}`);
  const cuda = status.cuda;
  row(target, "viking-vram", cuda.available
    ? `VRAM ${human(cuda.total_bytes - cuda.free_bytes)} used of ${human(cuda.total_bytes)} (${cuda.device.name})`
    : "VRAM: no CUDA device in use");
}

// The swap-in/out rate between two status reads (one reader: the poll below).
const swapRate = { previous: null, text: "" };

function measureSwapRate(paging) {
  const now = performance.now();
  const previous = swapRate.previous;
  if (previous && paging.swapped_in_since_start != null) {
    const seconds = (now - previous.time) / 1000;
    const inRate = (paging.swapped_in_since_start - previous.in) / seconds;
    const outRate = (paging.swapped_out_since_start - previous.out) / seconds;
    swapRate.text = `, in ${human(Math.max(0, inRate))}/s, out ${human(Math.max(0, outRate))}/s`;
  }
  swapRate.previous = { time: now, in: paging.swapped_in_since_start ?? 0, out: paging.swapped_out_since_start ?? 0 };
}

app.registerExtension({
  name: "viking_engine.panel",
  settings: [
    {
      id: "Viking.ShowPanel",
      category: ["Viking Engine", "Panel", "Show the memory panel"],
      name: "Show Viking's floating memory line (bottom left of the canvas; the sidebar's Viking tab has it all)",
      type: "boolean",
      defaultValue: true,
      onChange: (shown) => {
        const panel = document.getElementById("viking-panel");
        if (panel) panel.style.display = shown === false ? "none" : "";
      },
    },
  ],
  async setup() {
    const panel = document.createElement("div");
    panel.id = "viking-panel";
    panel.title = "Viking Engine memory: click the first line to unfold or fold it";
    Object.assign(panel.style, {
      // Bottom left, right of the canvas's info text (LiteGraph draws it in the canvas's bottom
      // left 160 px); newer frontends (1.49) put their minimap bottom right. Under ComfyUI's modal
      // dialogs (PrimeVue's masks start at z-index 1100), which dim it as they dim the canvas.
      position: "fixed", left: "240px", bottom: "12px", zIndex: 1000, maxWidth: "min(900px, calc(100vw - 560px))",
      background: "rgba(18, 22, 30, 0.92)", color: "#d8dee9", border: "1px solid #4c566a",
      borderRadius: "6px", padding: "6px 10px", font: "12px/1.45 monospace", whiteSpace: "pre-wrap",
    });
    if (app.extensionManager?.setting?.get?.("Viking.ShowPanel") === false) panel.style.display = "none";
    document.body.appendChild(panel);
    let folded = localStorage.getItem(FOLDED_KEY) !== "0"; // folded unless this browser unfolded it
    let last = null; // the last status, to draw again when folded or unfolded
    let sidebar = null; // the sidebar tab's element while the tab is open
    let running = false;
    let timer = null;

    function toggle() {
      folded = !folded;
      localStorage.setItem(FOLDED_KEY, folded ? "1" : "0");
      render(last);
    }

    function render(status) {
      last = status;
      draw(panel, status, folded, toggle);
      if (sidebar && sidebar.isConnected) draw(sidebar, status, false, null);
    }

    // Docked where ComfyUI's frontend keeps such views (frontends without sidebar tabs: the
    // floating line only).
    app.extensionManager?.registerSidebarTab?.({
      id: "viking-engine",
      icon: "pi pi-server",
      title: "Viking",
      tooltip: "Viking Engine: what is pinned in RAM, the budget, RAM, swap and VRAM",
      type: "custom",
      render: (element) => {
        sidebar = document.createElement("div");
        sidebar.id = "viking-sidebar";
        Object.assign(sidebar.style, { padding: "10px", font: "12px/1.5 monospace", whiteSpace: "pre-wrap" });
        element.replaceChildren(sidebar);
        if (last) draw(sidebar, last, false, null);
      },
    });

    async function refresh() {
      if (!document.hidden) {
        try {
          const answer = await api.fetchApi("/viking/status");
          if (answer.ok) {
            const status = await answer.json();
            measureSwapRate(status.paging);
            render(status);
          } else panel.textContent = `Viking: status unavailable (${answer.status})`;
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

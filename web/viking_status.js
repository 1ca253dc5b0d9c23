// Shows the text a Viking node returns (ui.text) in the node's body. ComfyUI's stock frontend
// draws ui.text only for its own "Preview as Text" node, so Viking adds a read-only text box.
import { app } from "../../scripts/app.js";
import { ComfyWidgets } from "../../scripts/widgets.js";

const VIKING_NODES = ["VikingPinModel", "VikingPinCLIP", "VikingPinVAE", "VikingMemoryStatus", "VikingUnpin"];

app.registerExtension({
  name: "viking_engine.node_text",
  settings: [
    {
      id: "Viking.EngineMode",
      category: ["Viking Engine", "Engine mode", "Pin every model"],
      name: "Pin every model ComfyUI loads (engine mode), without Viking nodes in the graph",
      type: "boolean",
      defaultValue: false,
      // Called at start with the saved value too, so the server follows the UI setting.
      onChange: (enabled) =>
        fetch("/viking/engine", {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ enabled: Boolean(enabled) }),
        }).catch(() => {}),
    },
    {
      id: "Viking.HeadroomGiB",
      category: ["Viking Engine", "Budget", "RAM headroom"],
      name: "RAM headroom: GiB that Viking's pins always leave free for everything else (0 = auto, 20% of RAM, 4-16 GiB)",
      type: "number",
      attrs: { min: 0, max: 4096, step: 0.5 },
      defaultValue: 0,
      // The server reads the saved value itself at start; only a change the user makes is sent.
      onChange: (gib, previous) => {
        if (previous === undefined) return;
        fetch("/viking/headroom", {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ headroom_gib: Number(gib) || 0 }),
        }).catch(() => {});
      },
    },
  ],
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!VIKING_NODES.includes(nodeData.name)) return;
    const previous = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      previous?.apply(this, arguments);
      const text = (message?.text ?? []).join("\n");
      let box = this.widgets?.find((w) => w.name === "viking_text");
      if (!box) {
        box = ComfyWidgets.STRING(this, "viking_text", ["STRING", { multiline: true }], app).widget;
        if (box.inputEl) box.inputEl.readOnly = true;
        box.serialize = false; // display only: not part of the saved workflow values
      }
      box.value = text;
      this.setDirtyCanvas(true, true);
    };
  },
});

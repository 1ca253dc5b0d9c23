"""Writes the example workflows in workflows/ (ComfyUI's UI format, which ComfyUI lists as
templates of this node pack). Run after changing a node's inputs: python scripts/make_workflows.py"""

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "workflows"
CKPT = "synthetic_sd15.safetensors"  # the tests' checkpoint; pick your own in the UI


class Graph:
    def __init__(self):
        self.nodes, self.links = [], []

    def node(self, kind, pos, widgets=(), inputs=(), outputs=(), title=None, size=(320, 130)):
        """inputs: [(name, type)], outputs: [(name, type)]. Returns the node id."""
        node_id = len(self.nodes) + 1
        node = {
            "id": node_id, "type": kind, "pos": list(pos), "size": list(size), "flags": {},
            "order": node_id - 1, "mode": 0,
            "inputs": [{"name": n, "type": t, "link": None} for n, t in inputs],
            "outputs": [{"name": n, "type": t, "links": [], "slot_index": i} for i, (n, t) in enumerate(outputs)],
            "properties": {"Node name for S&R": kind},
            "widgets_values": list(widgets),
        }
        if title:
            node["title"] = title
        self.nodes.append(node)
        return node_id

    def link(self, src, src_slot, dst, dst_input):
        link_id = len(self.links) + 1
        source, target = self.nodes[src - 1], self.nodes[dst - 1]
        slot = next(i for i, x in enumerate(target["inputs"]) if x["name"] == dst_input)
        kind = source["outputs"][src_slot]["type"]
        source["outputs"][src_slot]["links"].append(link_id)
        target["inputs"][slot]["link"] = link_id
        self.links.append([link_id, src, src_slot, dst, slot, kind])

    def ui(self):
        return {"last_node_id": len(self.nodes), "last_link_id": len(self.links), "nodes": self.nodes,
                "links": self.links, "groups": [], "config": {}, "extra": {}, "version": 0.4}


def pin_settings(budget_gib=0.0, headroom_gib=0.0, backend="auto", priority=0, pinned_home=True):
    return [budget_gib, headroom_gib, backend, priority, pinned_home]


def model_pin_settings(vram_cap_gib=0.0, prefetch=True, **settings):
    return pin_settings(**settings) + [vram_cap_gib, prefetch]


def txt2img(width, height, steps, model_settings, note):
    g = Graph()
    ckpt = g.node("CheckpointLoaderSimple", (0, 200), [CKPT], outputs=[("MODEL", "MODEL"), ("CLIP", "CLIP"), ("VAE", "VAE")])
    pin_model = g.node("VikingPinModel", (360, 0), model_settings, inputs=[("model", "MODEL")], outputs=[("MODEL", "MODEL")], size=(320, 200))
    pin_clip = g.node("VikingPinCLIP", (360, 240), pin_settings(), inputs=[("clip", "CLIP")], outputs=[("CLIP", "CLIP")], size=(320, 200))
    pin_vae = g.node("VikingPinVAE", (360, 480), pin_settings(), inputs=[("vae", "VAE")], outputs=[("VAE", "VAE")], size=(320, 200))
    positive = g.node("CLIPTextEncode", (720, 0), ["a viking longship on a calm fjord"], inputs=[("clip", "CLIP")], outputs=[("CONDITIONING", "CONDITIONING")])
    negative = g.node("CLIPTextEncode", (720, 180), ["blurry"], inputs=[("clip", "CLIP")], outputs=[("CONDITIONING", "CONDITIONING")])
    latent = g.node("EmptyLatentImage", (720, 360), [width, height, 1], outputs=[("LATENT", "LATENT")])
    sampler = g.node("KSampler", (1080, 0), [42, "fixed", steps, 7.0, "euler", "normal", 1.0],
                     inputs=[("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"), ("latent_image", "LATENT")],
                     outputs=[("LATENT", "LATENT")], size=(320, 260))
    decode = g.node("VAEDecode", (1440, 0), inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=[("IMAGE", "IMAGE")])
    save = g.node("SaveImage", (1440, 120), ["viking"], inputs=[("images", "IMAGE")], size=(320, 300))
    status = g.node("VikingMemoryStatus", (1080, 450), inputs=[("after", "*")], outputs=[("text", "STRING"), ("json", "STRING")], size=(520, 320))
    g.node("Note", (0, 480), [note], size=(330, 200))
    for src, slot, dst, name in [
        (ckpt, 0, pin_model, "model"), (ckpt, 1, pin_clip, "clip"), (ckpt, 2, pin_vae, "vae"),
        (pin_clip, 0, positive, "clip"), (pin_clip, 0, negative, "clip"),
        (pin_model, 0, sampler, "model"), (positive, 0, sampler, "positive"), (negative, 0, sampler, "negative"),
        (latent, 0, sampler, "latent_image"), (sampler, 0, decode, "samples"), (pin_vae, 0, decode, "vae"),
        (decode, 0, save, "images"), (decode, 0, status, "after"),
    ]:
        g.link(src, slot, dst, name)
    return g.ui()


WORKFLOWS = {
    "viking_pin_checkpoint": txt2img(
        64, 64, 2, model_pin_settings(),
        "Viking Engine: the checkpoint's MODEL, CLIP and VAE are pinned in RAM (no swapping, full-speed "
        "copies to the GPU) within the shared RAM budget. Viking Memory Status shows what is pinned."),
    "viking_lowvram": txt2img(
        512, 512, 4, model_pin_settings(vram_cap_gib=4.0, priority=10),
        "Low-VRAM use: Viking Pin Model keeps at most 4 GiB of the diffusion model's weights in VRAM "
        "(vram_cap_gib); the rest stays in RAM, pinned, and is copied to the GPU at every step. "
        "Priority 10: the diffusion model keeps its pins first when the RAM budget is short."),
}

if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for name, workflow in WORKFLOWS.items():
        (OUT / f"{name}.json").write_text(json.dumps(workflow, indent=1) + "\n")
        print(f"wrote workflows/{name}.json")

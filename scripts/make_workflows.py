"""Writes the example workflows in workflows/ (ComfyUI's UI format, which ComfyUI lists as
templates of this node pack). Run after changing a node's inputs: python scripts/make_workflows.py"""

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "workflows"
CKPT = "synthetic_sd15.safetensors"  # the tests' checkpoint; pick your own in the UI
CKPT_SECOND = "synthetic_sd15_second.safetensors"  # the two-model workflow's second one (the tests make it)


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


# Widget values in the nodes' input order; file_residency is every Pin node's last (optional) input.
def pin_settings(budget_gib=0.0, headroom_gib=0.0, backend="auto", priority=0, pinned_home=True, file_residency=True):
    return [budget_gib, headroom_gib, backend, priority, pinned_home, file_residency]


def model_pin_settings(vram_cap_gib=0.0, prefetch=True, file_residency=True, **settings):
    # The Pin Model's own inputs stand between the shared ones and file_residency.
    return pin_settings(**settings)[:-1] + [vram_cap_gib, prefetch, file_residency]


# One helper per node kind the workflows use: its widgets, inputs and outputs in one place.
def checkpoint_loader(g, pos, ckpt_name, title=None):
    return g.node("CheckpointLoaderSimple", pos, [ckpt_name], outputs=[("MODEL", "MODEL"), ("CLIP", "CLIP"), ("VAE", "VAE")],
                  title=title)


# A Pin node's height in the frontend with its widgets and its status text below them: what the
# layouts leave between one Pin node and the next below it.
PIN_HEIGHT = {"Model": 310, "CLIP": 260, "VAE": 260}


def pin_node(g, kind, pos, settings, title=None):
    """A Viking Pin node: kind is "Model", "CLIP" or "VAE"; its input is named after it."""
    typ = kind.upper()
    return g.node(f"VikingPin{kind}", pos, settings, inputs=[(typ.lower(), typ)], outputs=[(typ, typ)],
                  size=(320, PIN_HEIGHT[kind]), title=title)


def text_encode(g, pos, text):
    return g.node("CLIPTextEncode", pos, [text], inputs=[("clip", "CLIP")], outputs=[("CONDITIONING", "CONDITIONING")])


SAMPLER_INPUTS = [("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"), ("latent_image", "LATENT")]


def decode_save_status(g, x, note, note_pos=(0, 480)):
    """VAE decode, save, Viking Memory Status after the decode, and the note. Returns (decode, save, status)."""
    decode = g.node("VAEDecode", (x, 0), inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=[("IMAGE", "IMAGE")])
    save = g.node("SaveImage", (x, 120), ["viking"], inputs=[("images", "IMAGE")], size=(320, 300))
    status = g.node("VikingMemoryStatus", (x - 360, 450), inputs=[("after", "*")], outputs=[("text", "STRING"), ("json", "STRING")],
                    size=(520, 320))
    g.node("Note", note_pos, [note], size=(330, 200))
    return decode, save, status


def txt2img(width, height, steps, model_settings, note):
    g = Graph()
    ckpt = checkpoint_loader(g, (0, 200), CKPT)
    pin_model = pin_node(g, "Model", (360, 0), model_settings)
    pin_clip = pin_node(g, "CLIP", (360, 340), pin_settings())
    pin_vae = pin_node(g, "VAE", (360, 630), pin_settings())
    positive = text_encode(g, (720, 0), "a viking longship on a calm fjord")
    negative = text_encode(g, (720, 180), "blurry")
    latent = g.node("EmptyLatentImage", (720, 360), [width, height, 1], outputs=[("LATENT", "LATENT")])
    sampler = g.node("KSampler", (1080, 0), [42, "fixed", steps, 7.0, "euler", "normal", 1.0],
                     inputs=SAMPLER_INPUTS, outputs=[("LATENT", "LATENT")], size=(320, 260))
    decode, save, status = decode_save_status(g, 1440, note)
    for src, slot, dst, name in [
        (ckpt, 0, pin_model, "model"), (ckpt, 1, pin_clip, "clip"), (ckpt, 2, pin_vae, "vae"),
        (pin_clip, 0, positive, "clip"), (pin_clip, 0, negative, "clip"),
        (pin_model, 0, sampler, "model"), (positive, 0, sampler, "positive"), (negative, 0, sampler, "negative"),
        (latent, 0, sampler, "latent_image"), (sampler, 0, decode, "samples"), (pin_vae, 0, decode, "vae"),
        (decode, 0, save, "images"), (decode, 0, status, "after"),
    ]:
        g.link(src, slot, dst, name)
    return g.ui()


def two_models(width, height, steps, switch_at, note):
    """Two diffusion models sharing one sampling run, as Wan 2.2's high- and low-noise experts or
    an SDXL base and refiner do: the first model takes steps [0, switch_at) and hands its latent
    over with the noise left in it, the second finishes. A Pin Model after each loader."""
    g = Graph()
    first = checkpoint_loader(g, (0, 0), CKPT, title="First model (high-noise expert / base)")
    second = checkpoint_loader(g, (0, 340), CKPT_SECOND, title="Second model (low-noise expert / refiner)")
    pin_first = pin_node(g, "Model", (360, 0), model_pin_settings(), title="Viking Pin Model (first)")
    pin_second = pin_node(g, "Model", (360, 340), model_pin_settings(), title="Viking Pin Model (second)")
    pin_clip = pin_node(g, "CLIP", (360, 680), pin_settings())
    pin_vae = pin_node(g, "VAE", (360, 970), pin_settings())
    positive = text_encode(g, (720, 0), "a viking longship on a calm fjord")
    negative = text_encode(g, (720, 180), "blurry")
    latent = g.node("EmptyLatentImage", (720, 360), [width, height, 1], outputs=[("LATENT", "LATENT")])
    # KSamplerAdvanced: add_noise, noise_seed (+ its control), steps, cfg, sampler, scheduler,
    # start_at_step, end_at_step, return_with_leftover_noise.
    sample_first = g.node("KSamplerAdvanced", (1080, 0),
                          ["enable", 42, "fixed", steps, 7.0, "euler", "normal", 0, switch_at, "enable"],
                          inputs=SAMPLER_INPUTS, outputs=[("LATENT", "LATENT")], size=(320, 370), title="First model's steps")
    sample_second = g.node("KSamplerAdvanced", (1080, 400),
                           ["disable", 42, "fixed", steps, 7.0, "euler", "normal", switch_at, 10000, "disable"],
                           inputs=SAMPLER_INPUTS, outputs=[("LATENT", "LATENT")], size=(320, 370), title="Second model's steps")
    decode, save, status = decode_save_status(g, 1800, note, note_pos=(0, 680))
    for src, slot, dst, name in [
        (first, 0, pin_first, "model"), (second, 0, pin_second, "model"),
        (first, 1, pin_clip, "clip"), (first, 2, pin_vae, "vae"),
        (pin_clip, 0, positive, "clip"), (pin_clip, 0, negative, "clip"),
        (pin_first, 0, sample_first, "model"), (positive, 0, sample_first, "positive"),
        (negative, 0, sample_first, "negative"), (latent, 0, sample_first, "latent_image"),
        (pin_second, 0, sample_second, "model"), (positive, 0, sample_second, "positive"),
        (negative, 0, sample_second, "negative"), (sample_first, 0, sample_second, "latent_image"),
        (sample_second, 0, decode, "samples"), (pin_vae, 0, decode, "vae"),
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
    "viking_two_models": two_models(
        64, 64, 4, 2,
        "Two models in one sampling run (Wan 2.2's high- and low-noise experts, an SDXL base and refiner): "
        "a Viking Pin Model after each loader keeps both models' weights in RAM, pinned, within the shared RAM "
        "budget, so the turn from one to the other does not wait on swap or a re-read from disk. When the budget "
        "is short, the model with the lower priority gives way first (in ComfyUI 0.33's dynamic VRAM mode: which "
        "model's staging ComfyUI keeps). Swap in your own loaders (UNETLoader for Wan or Flux) and keep a Pin Model "
        "after each."),
}

if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for name, workflow in WORKFLOWS.items():
        (OUT / f"{name}.json").write_text(json.dumps(workflow, indent=1) + "\n")
        print(f"wrote workflows/{name}.json")

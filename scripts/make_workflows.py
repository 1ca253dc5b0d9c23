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


def txt2img(width, height, steps, model_settings, note, ckpt_name=CKPT, positive_text="a viking longship on a calm fjord",
            negative_text="blurry"):
    g = Graph()
    ckpt = checkpoint_loader(g, (0, 200), ckpt_name)
    pin_model = pin_node(g, "Model", (360, 0), model_settings)
    pin_clip = pin_node(g, "CLIP", (360, 340), pin_settings())
    pin_vae = pin_node(g, "VAE", (360, 630), pin_settings())
    positive = text_encode(g, (720, 0), positive_text)
    negative = text_encode(g, (720, 180), negative_text)
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


def sampler_pair(g, steps, cfg, scheduler, switch_at, titles):
    """Two KSamplerAdvanced sharing one sampling run: the first takes steps [0, switch_at) and
    hands its latent over with the noise left in it, the second finishes. Widgets: add_noise,
    noise_seed (+ its control), steps, cfg, sampler, scheduler, start_at_step, end_at_step,
    return_with_leftover_noise."""
    first = g.node("KSamplerAdvanced", (1080, 0), ["enable", 42, "fixed", steps, cfg, "euler", scheduler, 0, switch_at, "enable"],
                   inputs=SAMPLER_INPUTS, outputs=[("LATENT", "LATENT")], size=(320, 370), title=titles[0])
    second = g.node("KSamplerAdvanced", (1080, 400), ["disable", 42, "fixed", steps, cfg, "euler", scheduler, switch_at, 10000, "disable"],
                    inputs=SAMPLER_INPUTS, outputs=[("LATENT", "LATENT")], size=(320, 370), title=titles[1])
    return first, second


def pair_links(models, positive, negative, latent, samplers):
    """The links of a sampler_pair: each model to its sampler, both prompts, the latent through both."""
    (model_first, model_second), (first, second) = models, samplers
    return [(model_first, 0, first, "model"), (positive, 0, first, "positive"), (negative, 0, first, "negative"),
            (latent, 0, first, "latent_image"), (model_second, 0, second, "model"), (positive, 0, second, "positive"),
            (negative, 0, second, "negative"), (first, 0, second, "latent_image")]


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
    sample_first, sample_second = sampler_pair(g, steps, 7.0, "normal", switch_at, ("First model's steps", "Second model's steps"))
    decode, save, status = decode_save_status(g, 1800, note, note_pos=(0, 680))
    for src, slot, dst, name in [
        (first, 0, pin_first, "model"), (second, 0, pin_second, "model"),
        (first, 1, pin_clip, "clip"), (first, 2, pin_vae, "vae"),
        (pin_clip, 0, positive, "clip"), (pin_clip, 0, negative, "clip"),
        *pair_links((pin_first, pin_second), positive, negative, latent, (sample_first, sample_second)),
        (sample_second, 0, decode, "samples"), (pin_vae, 0, decode, "vae"),
        (decode, 0, save, "images"), (decode, 0, status, "after"),
    ]:
        g.link(src, slot, dst, name)
    return g.ui()


# ---- templates for the models people run, under the file names those models ship under ---------
# (ComfyUI's own example workflows use the same names). Each note says which files go where.
def loader(g, kind, pos, widgets, outputs, title=None):
    return g.node(kind, pos, widgets, outputs=outputs, title=title)


def unet_loader(g, pos, name, title=None):
    return loader(g, "UNETLoader", pos, [name, "default"], [("MODEL", "MODEL")], title=title)


def flux(note):
    """Flux dev from its diffusion model, text encoders and VAE files; 1024x1024, 20 steps."""
    g = Graph()
    unet = unet_loader(g, (0, 0), "flux1-dev.safetensors")
    clip = loader(g, "DualCLIPLoader", (0, 160), ["clip_l.safetensors", "t5xxl_fp16.safetensors", "flux", "default"],
                  [("CLIP", "CLIP")])
    vae = loader(g, "VAELoader", (0, 360), ["ae.safetensors"], [("VAE", "VAE")])
    pin_model = pin_node(g, "Model", (360, 0), model_pin_settings(priority=10))
    pin_clip = pin_node(g, "CLIP", (360, 340), pin_settings())
    pin_vae = pin_node(g, "VAE", (360, 630), pin_settings())
    positive = text_encode(g, (720, 0), "a viking longship on a calm fjord at dawn, detailed, photograph")
    guidance = g.node("FluxGuidance", (720, 180), [3.5], inputs=[("conditioning", "CONDITIONING")],
                      outputs=[("CONDITIONING", "CONDITIONING")])
    negative = text_encode(g, (720, 300), "")
    latent = g.node("EmptySD3LatentImage", (720, 480), [1024, 1024, 1], outputs=[("LATENT", "LATENT")])
    sampler = g.node("KSampler", (1080, 0), [42, "fixed", 20, 1.0, "euler", "simple", 1.0],
                     inputs=SAMPLER_INPUTS, outputs=[("LATENT", "LATENT")], size=(320, 260))
    decode, save, status = decode_save_status(g, 1440, note, note_pos=(0, 520))
    for src, slot, dst, name in [
        (unet, 0, pin_model, "model"), (clip, 0, pin_clip, "clip"), (vae, 0, pin_vae, "vae"),
        (pin_clip, 0, positive, "clip"), (pin_clip, 0, negative, "clip"), (positive, 0, guidance, "conditioning"),
        (pin_model, 0, sampler, "model"), (guidance, 0, sampler, "positive"), (negative, 0, sampler, "negative"),
        (latent, 0, sampler, "latent_image"), (sampler, 0, decode, "samples"), (pin_vae, 0, decode, "vae"),
        (decode, 0, save, "images"), (decode, 0, status, "after"),
    ]:
        g.link(src, slot, dst, name)
    return g.ui()


def sdxl(note):
    """SDXL base from its checkpoint; 1024x1024, 25 steps: the checkpoint graph, with its file."""
    return txt2img(1024, 1024, 25, model_pin_settings(), note, ckpt_name="sd_xl_base_1.0.safetensors",
                   positive_text="a viking longship on a calm fjord at dawn, detailed, photograph", negative_text="blurry, lowres")


def wan22(note):
    """Wan 2.2 14B text to video with its two experts: the high-noise expert takes the first
    10 of 20 steps, the low-noise expert the rest; a Pin Model after each; 640x640, 33 frames."""
    g = Graph()
    high = unet_loader(g, (0, 0), "wan2.2_t2v_high_noise_14B_fp16.safetensors", title="High-noise expert")
    low = unet_loader(g, (0, 160), "wan2.2_t2v_low_noise_14B_fp16.safetensors", title="Low-noise expert")
    clip = loader(g, "CLIPLoader", (0, 320), ["umt5_xxl_fp16.safetensors", "wan", "default"], [("CLIP", "CLIP")])
    vae = loader(g, "VAELoader", (0, 480), ["wan_2.1_vae.safetensors"], [("VAE", "VAE")])
    pin_high = pin_node(g, "Model", (360, 0), model_pin_settings(priority=10), title="Viking Pin Model (high-noise)")
    pin_low = pin_node(g, "Model", (360, 340), model_pin_settings(), title="Viking Pin Model (low-noise)")
    pin_clip = pin_node(g, "CLIP", (360, 680), pin_settings())
    pin_vae = pin_node(g, "VAE", (360, 970), pin_settings())
    shift_high = g.node("ModelSamplingSD3", (720, 0), [8.0], inputs=[("model", "MODEL")], outputs=[("MODEL", "MODEL")])
    shift_low = g.node("ModelSamplingSD3", (720, 120), [8.0], inputs=[("model", "MODEL")], outputs=[("MODEL", "MODEL")])
    positive = text_encode(g, (720, 240), "a viking longship sails across a calm fjord at dawn")
    negative = text_encode(g, (720, 420), "blurry, static, low quality")
    latent = g.node("EmptyHunyuanLatentVideo", (720, 600), [640, 640, 33, 1], outputs=[("LATENT", "LATENT")])
    sample_high, sample_low = sampler_pair(g, 20, 3.5, "simple", 10, ("High-noise steps", "Low-noise steps"))
    decode = g.node("VAEDecode", (1440, 0), inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=[("IMAGE", "IMAGE")])
    save = g.node("SaveAnimatedWEBP", (1440, 120), ["viking", 16.0, False, 90, "default"], inputs=[("images", "IMAGE")],
                  size=(320, 300))
    status = g.node("VikingMemoryStatus", (1080, 800), inputs=[("after", "*")], outputs=[("text", "STRING"), ("json", "STRING")],
                    size=(520, 320))
    g.node("Note", (0, 640), [note], size=(330, 260))
    for src, slot, dst, name in [
        (high, 0, pin_high, "model"), (low, 0, pin_low, "model"), (clip, 0, pin_clip, "clip"), (vae, 0, pin_vae, "vae"),
        (pin_high, 0, shift_high, "model"), (pin_low, 0, shift_low, "model"),
        (pin_clip, 0, positive, "clip"), (pin_clip, 0, negative, "clip"),
        *pair_links((shift_high, shift_low), positive, negative, latent, (sample_high, sample_low)),
        (sample_low, 0, decode, "samples"), (pin_vae, 0, decode, "vae"), (decode, 0, save, "images"), (decode, 0, status, "after"),
    ]:
        g.link(src, slot, dst, name)
    return g.ui()


# The files each real-model template expects, by ComfyUI models folder (the test validates the
# templates with stand-ins of these names).
TEMPLATE_FILES = {
    "viking_flux": {"diffusion_models": ["flux1-dev.safetensors"], "text_encoders": ["clip_l.safetensors", "t5xxl_fp16.safetensors"],
                    "vae": ["ae.safetensors"]},
    "viking_sdxl": {"checkpoints": ["sd_xl_base_1.0.safetensors"]},
    "viking_wan22_two_experts": {"diffusion_models": ["wan2.2_t2v_high_noise_14B_fp16.safetensors",
                                                      "wan2.2_t2v_low_noise_14B_fp16.safetensors"],
                                 "text_encoders": ["umt5_xxl_fp16.safetensors"], "vae": ["wan_2.1_vae.safetensors"]},
}


def files_note(name):
    return " ".join(f"models/{folder}/: {', '.join(files)}." for folder, files in TEMPLATE_FILES[name].items())


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
    "viking_flux": flux(
        "Flux dev with Viking Engine. Expects " + files_note("viking_flux") + " The Pin nodes keep what ComfyUI parks in "
        "RAM page-locked: no swapping, full-speed copies to the GPU. On a 12-16 GB card most of the 23.8 GB model streams "
        "from RAM at every step. For a GGUF file use ComfyUI-GGUF's Unet Loader (GGUF) in place of Load Diffusion Model. "
        "For fp8-scaled files see the README's Known limits."),
    "viking_sdxl": sdxl(
        "SDXL with Viking Engine. Expects " + files_note("viking_sdxl") + " The Pin nodes keep the checkpoint's weights "
        "that ComfyUI parks in RAM page-locked: they cannot be swapped out, and reloading them runs at full DMA speed."),
    "viking_wan22_two_experts": wan22(
        "Wan 2.2 text to video, its two experts taking turns. Expects " + files_note("viking_wan22_two_experts")
        + " A Pin Model after each expert keeps both in RAM, page-locked, within the shared budget, so the turn from one "
        "to the other does not wait on swap or a re-read from disk; the high-noise expert (priority 10) keeps its pins "
        "first when RAM is short."),
}


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for name, workflow in WORKFLOWS.items():
        (OUT / f"{name}.json").write_text(json.dumps(workflow, indent=1) + "\n")
        print(f"wrote workflows/{name}.json")

"""Writes the example workflows in workflows/ (ComfyUI's UI format, which ComfyUI lists as
templates of this node pack) and a thumbnail of each, drawn from its graph (<name>.jpg beside it,
the picture ComfyUI's Templates dialog shows). Run after changing a node's inputs:
python scripts/make_workflows.py (needs Pillow: run it with .venv/bin/python)."""

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "workflows"
# The templates for any checkpoint leave the file to the user: an empty choice, which ComfyUI's
# frontend shows as an empty list entry and the server refuses until one is picked. (The tests
# pick the synthetic checkpoint in its place: tests/comfy_server.py, api_prompt_from_ui_workflow.)
PICK = ""


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
    save = g.node("SaveImage", (x, 180), ["viking"], inputs=[("images", "IMAGE")], size=(320, 300))
    status = g.node("VikingMemoryStatus", (x - 360, 520), inputs=[("after", "*")], outputs=[("text", "STRING"), ("json", "STRING")],
                    size=(520, 320))
    g.node("Note", note_pos, [note], size=(330, 200))
    return decode, save, status


def txt2img(width, height, steps, model_settings, note, ckpt_name=PICK, positive_text="a viking longship on a calm fjord",
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
    first = checkpoint_loader(g, (0, 0), PICK, title="First model (high-noise expert / base)")
    second = checkpoint_loader(g, (0, 340), PICK, title="Second model (low-noise expert / refiner)")
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
    negative = text_encode(g, (720, 340), "")
    latent = g.node("EmptySD3LatentImage", (720, 520), [1024, 1024, 1], outputs=[("LATENT", "LATENT")])
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
    shift_low = g.node("ModelSamplingSD3", (720, 160), [8.0], inputs=[("model", "MODEL")], outputs=[("MODEL", "MODEL")])
    positive = text_encode(g, (720, 320), "a viking longship sails across a calm fjord at dawn")
    negative = text_encode(g, (720, 500), "blurry, static, low quality")
    latent = g.node("EmptyHunyuanLatentVideo", (720, 680), [640, 640, 33, 1], outputs=[("LATENT", "LATENT")])
    sample_high, sample_low = sampler_pair(g, 20, 3.5, "simple", 10, ("High-noise steps", "Low-noise steps"))
    decode = g.node("VAEDecode", (1440, 0), inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=[("IMAGE", "IMAGE")])
    save = g.node("SaveAnimatedWEBP", (1440, 180), ["viking", 16.0, False, 90, "default"], inputs=[("images", "IMAGE")],
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


PICK_NOTE = "Pick your own checkpoint in Load Checkpoint (any SD1.5 or SDXL checkpoint in models/checkpoints/) and queue. "

# What each template is for, in a line: drawn under its thumbnail (the Templates dialog itself
# shows only the file name) and the first sentence of its note.
DESCRIPTIONS = {
    "viking_pin_checkpoint": "Any checkpoint: its model, text encoder and VAE pinned in RAM",
    "viking_lowvram": "Any checkpoint, low VRAM: at most 4 GiB of the model in VRAM, the rest streamed from pinned RAM",
    "viking_two_models": "Two checkpoints taking turns in one sampling run, each pinned (expert pair, base and refiner)",
    "viking_flux": "Flux dev: diffusion model, both text encoders and the VAE pinned",
    "viking_sdxl": "SDXL base checkpoint, pinned",
    "viking_wan22_two_experts": "Wan 2.2 text to video: its two experts taking turns, each pinned",
}

WORKFLOWS = {
    "viking_pin_checkpoint": txt2img(
        64, 64, 2, model_pin_settings(),
        PICK_NOTE + "Viking Engine: the checkpoint's MODEL, CLIP and VAE are pinned in RAM (no swapping, full-speed "
        "copies to the GPU) within the shared RAM budget. Viking Memory Status shows what is pinned. 64x64 and 2 "
        "steps: a quick check; raise the size and steps in Empty Latent Image and KSampler for real pictures."),
    "viking_lowvram": txt2img(
        512, 512, 4, model_pin_settings(vram_cap_gib=4.0, priority=10),
        PICK_NOTE + "Low-VRAM use: Viking Pin Model keeps at most 4 GiB of the diffusion model's weights in VRAM "
        "(vram_cap_gib); the rest stays in RAM, pinned, and is copied to the GPU at every step. "
        "Priority 10: the diffusion model keeps its pins first when the RAM budget is short."),
    "viking_two_models": two_models(
        64, 64, 4, 2,
        "Pick your own two checkpoints, one in each Load Checkpoint (the same one twice works too), and queue. "
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


# ---- thumbnails: each graph drawn as ComfyUI's canvas shows it (dark theme, links in the colours
# of their types), the Viking nodes in their own colour, the description underneath -------------
THUMB_SIZE = 512          # ComfyUI's template cards are square
CAPTION_HEIGHT = 96
CANVAS, NODE_BODY, NODE_TITLE, TITLE_TEXT = "#202020", "#353535", "#272727", "#d8d8d8"
VIKING_TITLE, VIKING_BODY = "#1f5f5b", "#2d4443"
NOTE_TITLE, NOTE_BODY = "#443322", "#665533"
LINK_COLOURS = {"MODEL": "#b39ddb", "CLIP": "#ffd500", "VAE": "#ff6e6e", "CONDITIONING": "#ffa931",
                "LATENT": "#ff9cf9", "IMAGE": "#64b5f6", "*": "#9a9a9a"}
TITLE_HEIGHT, SLOT_HEIGHT = 30, 20   # LiteGraph's, in graph units
NODE_NAMES = {"CheckpointLoaderSimple": "Load Checkpoint", "UNETLoader": "Load Diffusion Model",
              "DualCLIPLoader": "DualCLIPLoader", "CLIPLoader": "Load CLIP", "VAELoader": "Load VAE",
              "CLIPTextEncode": "CLIP Text Encode", "EmptyLatentImage": "Empty Latent Image",
              "EmptySD3LatentImage": "EmptySD3LatentImage", "EmptyHunyuanLatentVideo": "EmptyHunyuanLatentVideo",
              "KSampler": "KSampler", "KSamplerAdvanced": "KSampler (Advanced)", "VAEDecode": "VAE Decode",
              "SaveImage": "Save Image", "SaveAnimatedWEBP": "SaveAnimatedWEBP", "FluxGuidance": "FluxGuidance",
              "ModelSamplingSD3": "ModelSamplingSD3", "Note": "Note", "VikingPinModel": "Viking Pin Model (swap, offload)",
              "VikingPinCLIP": "Viking Pin CLIP", "VikingPinVAE": "Viking Pin VAE",
              "VikingMemoryStatus": "Viking Memory Status (swap, pagefile)"}


def thumbnail_layout(ui):
    """Where the graph goes in the thumbnail: (scale, x offset, y offset) mapping graph units to
    pixels, the graph centred in the square above the caption."""
    left = min(n["pos"][0] for n in ui["nodes"])
    top = min(n["pos"][1] - TITLE_HEIGHT for n in ui["nodes"])
    right = max(n["pos"][0] + n["size"][0] for n in ui["nodes"])
    bottom = max(n["pos"][1] + n["size"][1] for n in ui["nodes"])
    margin = 12
    area_w, area_h = THUMB_SIZE - 2 * margin, THUMB_SIZE - CAPTION_HEIGHT - 2 * margin
    scale = min(area_w / (right - left), area_h / (bottom - top))
    x0 = margin + (area_w - (right - left) * scale) / 2 - left * scale
    y0 = margin + (area_h - (bottom - top) * scale) / 2 - top * scale
    return scale, x0, y0


def node_box(node, layout):
    """The node's box in pixels, title bar included: (left, top, right, bottom)."""
    scale, x0, y0 = layout
    x, y = node["pos"]
    w, h = node["size"]
    return (x0 + x * scale, y0 + (y - TITLE_HEIGHT) * scale, x0 + (x + w) * scale, y0 + (y + h) * scale)


def node_colours(node):
    """(title bar, body) of a node in the thumbnail."""
    if node["type"].startswith("Viking"):
        return VIKING_TITLE, VIKING_BODY
    if node["type"] == "Note":
        return NOTE_TITLE, NOTE_BODY
    return NODE_TITLE, NODE_BODY


def draw_thumbnail(name, ui):
    """The thumbnail of one workflow: its nodes where they stand, their titles, their links, and
    the template's description underneath. Returns a PIL image."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (THUMB_SIZE, THUMB_SIZE), CANVAS)
    draw = ImageDraw.Draw(image)
    layout = thumbnail_layout(ui)
    scale = layout[0]
    nodes = {n["id"]: n for n in ui["nodes"]}

    def slot_point(node, index, output):
        left, top, right, _ = node_box(node, layout)
        return (right if output else left), top + (TITLE_HEIGHT + SLOT_HEIGHT * (index + 0.5)) * scale

    for _, src, src_slot, dst, dst_slot, kind in ui["links"]:
        (ax, ay), (bx, by) = slot_point(nodes[src], src_slot, True), slot_point(nodes[dst], dst_slot, False)
        bend = max(20.0, abs(bx - ax) * 0.5)
        points = []
        for step in range(33):   # a cubic Bezier, as LiteGraph draws its splines
            t = step / 32
            u = 1 - t
            points.append((u**3 * ax + 3 * u * u * t * (ax + bend) + 3 * u * t * t * (bx - bend) + t**3 * bx,
                           u**3 * ay + 3 * u * u * t * ay + 3 * u * t * t * by + t**3 * by))
        draw.line(points, fill=LINK_COLOURS.get(kind, LINK_COLOURS["*"]), width=2)

    title_font = ImageFont.load_default(size=max(8, round(TITLE_HEIGHT * scale * 0.8)))
    for node in ui["nodes"]:
        left, top, right, bottom = node_box(node, layout)
        title_colour, body_colour = node_colours(node)
        draw.rounded_rectangle((left, top, right, bottom), radius=4, fill=body_colour)
        draw.rounded_rectangle((left, top, right, top + TITLE_HEIGHT * scale), radius=4, fill=title_colour)
        title = node.get("title") or NODE_NAMES.get(node["type"], node["type"])
        while title and draw.textlength(title, font=title_font) > right - left - 6:
            title = title[:-2] + "\u2026" if len(title) > 2 else ""
        draw.text((left + 3, top + TITLE_HEIGHT * scale / 2), title, fill=TITLE_TEXT, font=title_font, anchor="lm")
        for inp in range(len(node["inputs"])):
            x, y = slot_point(node, inp, False)
            draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=LINK_COLOURS.get(node["inputs"][inp]["type"], "#9a9a9a"))
        for out in range(len(node["outputs"])):
            x, y = slot_point(node, out, True)
            draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=LINK_COLOURS.get(node["outputs"][out]["type"], "#9a9a9a"))

    caption_top = THUMB_SIZE - CAPTION_HEIGHT
    draw.rectangle((0, caption_top, THUMB_SIZE, THUMB_SIZE), fill="#111111")
    heading, body = ImageFont.load_default(size=22), ImageFont.load_default(size=17)
    draw.text((14, caption_top + 10), name, fill="#ffffff", font=heading)
    y = caption_top + 40
    for line in wrap(DESCRIPTIONS[name], body, draw, THUMB_SIZE - 28):
        draw.text((14, y), line, fill="#c8c8c8", font=body)
        y += 22
    return image


def wrap(text, font, draw, width):
    """`text` in lines no wider than `width` pixels (at most two; the rest is cut off with an ellipsis)."""
    lines, line = [], ""
    for word in text.split():
        candidate = f"{line} {word}".strip()
        if line and draw.textlength(candidate, font=font) > width:
            lines.append(line)
            line = word
        else:
            line = candidate
    lines.append(line)
    if len(lines) > 2:
        lines = lines[:2]
        lines[1] = lines[1].rsplit(" ", 1)[0] + " \u2026"
    return lines


def thumbnail_path(name):
    return OUT / f"{name}.jpg"


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for name, workflow in WORKFLOWS.items():
        (OUT / f"{name}.json").write_text(json.dumps(workflow, indent=1) + "\n")
        draw_thumbnail(name, workflow).save(thumbnail_path(name), quality=90)
        print(f"wrote workflows/{name}.json and {thumbnail_path(name).name}")

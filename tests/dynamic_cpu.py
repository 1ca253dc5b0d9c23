"""ComfyUI 0.33's dynamic VRAM mode as far as it goes on the CPU, for tests/dynamic_check.py and
bench/probes/event_cost.py: a model in comfy-aimdo's own mapping of a safetensors file, a
patcher with the dynamic patcher's staging calls, ComfyUI's record of a staged module, and the
two settings dynamic mode starts with. A real dynamic patcher needs a CUDA device (ComfyUI's
ModelPatcherDynamic turns into a plain ModelPatcher on the CPU). Import once ComfyUI is
importable (sys.path) and its arguments are parsed."""

import comfy.memory_management
import comfy.model_management
import comfy.model_patcher
import comfy.utils
import torch

from comfy_node import comfy as seam


class StagingPatcher(comfy.model_patcher.ModelPatcher):
    """The per-model staging calls of 0.33's dynamic patcher, over plain attributes: what Viking
    reads and sets of a dynamic patcher."""
    current_prompt = False

    def is_dynamic(self):
        return True

    def set_in_use_by_current_prompt(self, in_use):
        self.current_prompt = in_use

    def loaded_ram_size(self):
        """ComfyUI's staging total (0.33 keeps it in its pin stacks, a read costs nothing): here
        the bytes of the modules `stage` marked, counted again only after a stage or unstage."""
        cached = vars(self).get("_staged_total")
        if cached is None or cached[0] != _staging_changes[0]:
            total = sum(t.nbytes for m in self.model.modules() if seam.staged(m) for t in m.parameters(recurse=False))
            cached = self._staged_total = (_staging_changes[0], total)
        return cached[1]

    pinned_memory_size = loaded_ram_size

    def partially_unload_ram(self, ram_to_unload, subsets=None):
        """ComfyUI's release of staging copies: module by module until enough is given back."""
        freed = 0
        for module in self.model.modules():
            if freed >= ram_to_unload:
                break
            if seam.staged(module):
                freed += sum(t.nbytes for t in module.parameters(recurse=False))
                unstage(module)
        return freed

    unregister_inactive_pins = partially_unload_ram


def mapped_model(path, patcher_class=comfy.model_patcher.ModelPatcher):
    """A model of one bias-free Linear per weight of the file, the weights aimdo's mapped
    tensors (what dynamic mode's loaders make)."""
    state, _ = comfy.utils.load_safetensors(path)
    weights = [state[f"{i}.weight"] for i in range(len(state))]
    net = torch.nn.Sequential(*[torch.nn.Linear(w.shape[1], w.shape[0], bias=False) for w in weights])
    net.load_state_dict(state, assign=True)
    return patcher_class(net, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))


_staging_changes = [0]  # bumped by stage and unstage: the staging totals are counted again


def stage(module):
    """ComfyUI's record of a module its staging holds (`module._pins[subset]["pin"]`; a real pin
    needs cudaHostRegister)."""
    module._pins = {"weights": {"pin": torch.empty(0), "registered": True}}
    _staging_changes[0] += 1


def unstage(module):
    del module._pins
    _staging_changes[0] += 1


def enter_dynamic_mode(ceiling_bytes=8 << 30):
    """What main.py sets when dynamic VRAM starts on an NVIDIA machine: aimdo on, and ComfyUI's
    pin ceiling (-1 under --cpu)."""
    comfy.memory_management.aimdo_enabled = True
    comfy.model_management.MAX_PINNED_MEMORY = ceiling_bytes
    seam._initial_ceiling.cache_clear()

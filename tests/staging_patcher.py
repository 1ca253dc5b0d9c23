"""A ModelPatcher with the per-model staging calls of ComfyUI 0.33's dynamic patcher, over
plain attributes: what Viking reads and sets of a dynamic patcher, without the CUDA device a
real one needs (ComfyUI's ModelPatcherDynamic turns into a plain ModelPatcher on the CPU).
Import after ComfyUI's comfy.model_patcher is importable (sys.path)."""

import comfy.model_patcher


class StagingPatcher(comfy.model_patcher.ModelPatcher):
    current_prompt = False

    def is_dynamic(self):
        return True

    def set_in_use_by_current_prompt(self, in_use):
        self.current_prompt = in_use

    def loaded_ram_size(self):
        return 0

    pinned_memory_size = loaded_ram_size

    def partially_unload_ram(self, ram_to_unload, subsets=None):
        return 0

    unregister_inactive_pins = partially_unload_ram

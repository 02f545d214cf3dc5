"""The bench's step timer: wall time of each optimizer step and, on extra steps, of each model phase."""

from __future__ import annotations

import time


class StepTimer:
    """Trainer callback: wall time of each optimizer step, and per-phase times when `phases` is on."""

    def __init__(self, model, timed_from: int, phase_from: int, skip: int | None = None):
        import torch

        self.torch = torch
        self.timed_from, self.phase_from = timed_from, phase_from
        self.skip = skip  # a step neither timed nor phased (the profiled one), counted after its end
        self.step_times: list[float] = []
        self.data_times: list[float] = []
        self.phase: dict[str, float] = {}
        self.phase_steps = 0
        self._t_begin = self._t_end = None
        self._marks: dict[str, float] = {}
        self._hooks = []
        core = model
        while not hasattr(core, "vision_tower") and hasattr(core, "model"):
            core = core.model
        self.core = core  # Gemma3Model: vision_tower, multi_modal_projector, language_model

    def _sync(self) -> float:
        if self.torch.cuda.is_available():
            self.torch.cuda.synchronize()
        return time.perf_counter()

    def _add(self, name: str, dt: float) -> None:
        self.phase[name] = self.phase.get(name, 0.0) + dt

    def _wrap(self, module, name: str) -> None:
        def pre(_m, _a):
            self._marks[name] = self._sync()

        def post(_m, _a, _o):
            self._add(name, self._sync() - self._marks.pop(name))

        self._hooks += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

    def _phases_on(self, state) -> bool:
        return state.global_step >= self.phase_from

    def get_callback(self):
        from transformers import TrainerCallback

        timer = self

        class _Cb(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                now = timer._sync()
                if timer._t_end is not None and state.global_step >= timer.timed_from:
                    timer.data_times.append(now - timer._t_end)
                if timer._phases_on(state) and not timer._hooks:
                    timer._wrap(timer.core.vision_tower, "vision_tower")
                    timer._wrap(timer.core.multi_modal_projector, "projector")
                    timer._wrap(timer.core.language_model, "language_model")
                timer._t_begin = now

            def on_pre_optimizer_step(self, args, state, control, **kw):
                if timer._phases_on(state):
                    timer._marks["optimizer"] = timer._sync()

            def on_optimizer_step(self, args, state, control, **kw):
                if "optimizer" in timer._marks:
                    timer._add("optimizer", timer._sync() - timer._marks.pop("optimizer"))

            def on_step_end(self, args, state, control, **kw):
                now = timer._sync()
                step = state.global_step  # already incremented
                if step == timer.skip:
                    pass
                elif timer.timed_from < step <= timer.phase_from:
                    timer.step_times.append(now - timer._t_begin)
                elif step > timer.phase_from:
                    timer._add("step", now - timer._t_begin)
                    timer.phase_steps += 1
                timer._t_end = now

        return _Cb()

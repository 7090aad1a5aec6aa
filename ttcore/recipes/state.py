"""What a checkpoint's train state carries beside the weights: the optimizer's state and the mask stream."""

import torch

RESEED_STRIDE = 1_000_003  # a run moved between CPU and CUDA reseeds its mask stream from seed + stride * step


def optimizer_state(opt) -> tuple[dict, dict]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for key, val in st.items():
            if torch.is_tensor(val):
                tensors[f"opt.{pid}.{key}"] = val
            else:
                scalars[f"{pid}.{key}"] = val
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer_state(opt, tensors: dict, meta: dict) -> None:
    state: dict = {}
    for name, val in tensors.items():
        if name.startswith("opt."):
            _, pid, key = name.split(".", 2)
            state.setdefault(int(pid), {})[key] = val
    for name, val in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = val
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def restore_generator(gen: torch.Generator, state: torch.Tensor, meta: dict, seed: int) -> None:
    """The mask stream continues exactly on the device type it was saved on. A run that moves between
    CPU and CUDA cannot continue it (the generators' states differ in kind), so it reseeds from
    (seed, step), which is deterministic too, and the move is recorded in the metadata."""
    saved_on = torch.device(meta.get("device", "cpu")).type
    if saved_on == gen.device.type:
        gen.set_state(state)
        return
    gen.manual_seed(seed + RESEED_STRIDE * meta["step"])
    meta.setdefault("device_moves", []).append({"step": meta["step"], "from": saved_on, "to": gen.device.type})

"""The vLLM side of the engine oracle: run with the vLLM venv's python.

    python vllm_side.py save MODEL_DIR OUT_DIR --tp T [--pp P]
        builds vLLM's model for every (pp rank, tp rank) of a faked group, loads
        MODEL_DIR the engine's normal way (DefaultModelLoader.load_weights: the
        model's own load_weights over the checkpoint's tensors), and writes what
        ShardedStateLoader.save_model writes at that point (before
        process_weights_after_loading, which is the state ShardedStateLoader
        loads into) into OUT_DIR, file names rendered by vLLM's own pattern.
    python vllm_side.py load SHARDED_DIR --tp T [--pp P]
        builds a fresh model per rank and loads SHARDED_DIR with vLLM's
        ShardedStateLoader (load_format "sharded_state").

Prints one JSON object per rank on stdout: {"tp_rank", "pp_rank", "ok", "error"}.
Nothing here reads tpshard's code or output except the files given to `load`.
"""
import argparse
import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM's CPU platform (no GPU here)
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402

import fakegroup  # noqa: E402
import patches  # noqa: E402


def build_and_load(model_dir, tp, pp, tp_rank, pp_rank, load_format):
    import vllm.distributed.parallel_state as ps
    from vllm.config import (DeviceConfig, LoadConfig, ModelConfig, ParallelConfig, VllmConfig,
                             set_current_vllm_config)
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.utils.torch_utils import set_default_torch_dtype

    fakegroup.install_vllm(ps, tp, pp, tp_rank, pp_rank)
    mc = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True, dtype="auto",
                     enforce_eager=True)
    lc = LoadConfig(load_format=load_format)
    vc = VllmConfig(model_config=mc, load_config=lc,
                    parallel_config=ParallelConfig(tensor_parallel_size=tp,
                                                   pipeline_parallel_size=pp),
                    device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(vc):
        loader = get_model_loader(lc)
        with set_default_torch_dtype(mc.dtype), torch.device("cpu"):
            model = loader.create_model(vc, mc)
        # DefaultModelLoader.load_model() = create_model + load_weights +
        # process_weights_after_loading; the sharded state is the one in between.
        loader.load_weights(model, mc)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("action", choices=["save", "load"])
    ap.add_argument("model")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--pp", type=int, default=1)
    a = ap.parse_args()
    patches.apply_vllm()
    from vllm.model_executor.model_loader.sharded_state_loader import ShardedStateLoader
    for pp_rank in range(a.pp):
        for tp_rank in range(a.tp):
            res = {"tp_rank": tp_rank, "pp_rank": pp_rank, "ok": True, "error": ""}
            try:
                if a.action == "save":
                    model = build_and_load(a.model, a.tp, a.pp, tp_rank, pp_rank, "auto")
                    os.makedirs(a.out, exist_ok=True)
                    ShardedStateLoader.save_model(model, a.out)
                else:
                    build_and_load(a.model, a.tp, a.pp, tp_rank, pp_rank, "sharded_state")
            except Exception as e:  # reported, the driver decides
                res["ok"] = False
                res["error"] = f"{type(e).__name__}: {e}"[:2000]
                traceback.print_exc(file=sys.stderr)
            print(json.dumps(res), flush=True)
    print(json.dumps({"patches": patches.PATCHES}), flush=True)


if __name__ == "__main__":
    main()

"""The SGLang side of the engine oracle: run with the SGLang venv's python.

    python sglang_side.py save MODEL_DIR OUT_DIR --tp T
        builds SGLang's model for every tp rank of a faked group (SGLang's own
        test fixture sglang.test.parallel_groups.publish: the runtime context
        published for world rank r, group handles as metadata only), loads
        MODEL_DIR with its DefaultModelLoader.load_model (the model's
        load_weights, then process_weights_after_loading), and writes it with
        SGLang's ShardedStateLoader.save_model: SGLang's loader runs
        process_weights_after_loading before it reads the files, so the files
        hold the processed state.
    python sglang_side.py load SHARDED_DIR --tp T
        a fresh model per rank, loaded by ShardedStateLoader.load_model.

Prints one JSON object per rank: {"tp_rank", "pp_rank", "ok", "error"}.
"""
import argparse
import json
import os
import sys
import traceback



import torch  # noqa: E402

import fakegroup  # noqa: E402
import patches  # noqa: E402


def build_and_load(model_dir, tp, tp_rank, load_format):
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model_loader
    from sglang.srt.runtime_context import SpawnRanks, get_parallel
    from sglang.srt.server_args import ServerArgs
    from sglang.test.parallel_groups import publish
    import sglang.srt.distributed.parallel_state as ps

    sa = ServerArgs(model_path=model_dir, tp_size=tp, device="cpu", load_format=load_format,
                    skip_tokenizer_init=True, dtype="auto")
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=tp_rank))
    fakegroup.install_sglang(ps, get_parallel(), tp, tp_rank)
    mc = ModelConfig.from_server_args(sa)
    lc = LoadConfig(load_format=load_format)
    loader = get_model_loader(lc)
    return loader.load_model(model_config=mc, device_config=DeviceConfig(device="cpu"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("action", choices=["save", "load"])
    ap.add_argument("model")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--tp", type=int, required=True)
    a = ap.parse_args()
    patches.apply_sglang()
    from sglang.srt.model_loader.loader import ShardedStateLoader
    for tp_rank in range(a.tp):
        res = {"tp_rank": tp_rank, "pp_rank": 0, "ok": True, "error": ""}
        try:
            if a.action == "save":
                model = build_and_load(a.model, a.tp, tp_rank, "auto")
                os.makedirs(a.out, exist_ok=True)
                ShardedStateLoader.save_model(model, a.out)
            else:
                build_and_load(a.model, a.tp, tp_rank, "sharded_state")
        except Exception as e:
            res["ok"] = False
            res["error"] = f"{type(e).__name__}: {e}"[:2000]
            traceback.print_exc(file=sys.stderr)
        print(json.dumps(res), flush=True)
    print(json.dumps({"patches": patches.PATCHES}), flush=True)


if __name__ == "__main__":
    main()

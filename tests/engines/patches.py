"""Every change this harness makes to the engines' code, with why.

Rule (DESIGN.md, "The engines as oracle"): only a kernel-selection check that
refuses on a CPU may be patched, never a loaded value.  Each entry of PATCHES
is printed by `run.py --patches` and listed in the README.
"""
PATCHES = []


def _note(engine, where, why):
    PATCHES.append((engine, where, why))


def apply_vllm():
    from vllm.model_executor.kernels.linear.scaled_mm import cpu as scaled_mm_cpu

    ok = classmethod(lambda cls, compute_capability=None: (True, None))
    for name in ("CPUFp8BlockScaledMMKernel", "CPUFp8PerTensorScaledMMLinearKernel"):
        getattr(scaled_mm_cpu, name).is_supported = ok
        _note("vllm", f"model_executor/kernels/linear/scaled_mm/cpu.py {name}.is_supported",
              "answers True: the FP8 W8A16 CPU GEMM wants AMX tiles and the fp8_scaled_mm_cpu op, "
              "absent from the CUDA wheel on this CPU, so no FP8 linear kernel is found and the "
              "layer refuses to be built; the kernel only runs at forward and in "
              "process_weights_after_loading, neither of which the oracle runs, and "
              "the parameters are created by Fp8LinearMethod.create_weights whatever the kernel")


def apply_sglang():
    pass

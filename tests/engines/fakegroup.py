"""A stand-in for the engines' process-group coordinators: it carries the
world size and this process's rank, which is all that building a model and
loading its weights read.  Any collective (all_reduce, broadcast, ...) raises:
none runs while a model is built and loaded, and one that did would mean the
loaded state depends on other ranks."""


class _TorchGroup:
    """What a torch.distributed ProcessGroup answers without communicating."""

    def __init__(self, world_size, rank):
        self._size, self._rank = world_size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


class FakeGroup:
    def __init__(self, world_size, rank):
        self.world_size = world_size
        self.rank_in_group = rank
        self.rank = rank
        self.local_rank = rank
        self.ranks = list(range(world_size))
        self.device_group = _TorchGroup(world_size, rank)
        self.cpu_group = _TorchGroup(world_size, rank)
        self.device_communicator = None
        self.unique_name = "fake"

    first_rank = property(lambda s: s.ranks[0])
    last_rank = property(lambda s: s.ranks[-1])
    is_first_rank = property(lambda s: s.rank == s.ranks[0])
    is_last_rank = property(lambda s: s.rank == s.ranks[-1])
    next_rank = property(lambda s: s.ranks[(s.rank + 1) % s.world_size])
    prev_rank = property(lambda s: s.ranks[(s.rank - 1) % s.world_size])

    def __getattr__(self, name):
        raise AttributeError(f"FakeGroup.{name}: a collective or an unmodelled group "
                             "attribute was used while building or loading the model")


def install_vllm(ps, tp, pp, tp_rank, pp_rank):
    """vllm.distributed.parallel_state keeps each group in a module global;
    get_tensor_model_parallel_world_size/rank, get_pp_group etc. read them."""
    ps._TP = FakeGroup(tp, tp_rank)
    ps._PP = FakeGroup(pp, pp_rank)
    ps._WORLD = FakeGroup(tp * pp, pp_rank * tp + tp_rank)
    ps._DP = FakeGroup(1, 0)
    ps._DCP = FakeGroup(1, 0)
    ps._PCP = FakeGroup(1, 0)
    # Expert parallelism off (the default): the EP group is the TP group's size,
    # only read to decide that experts are not distributed.
    ps._EP = FakeGroup(tp, tp_rank)


def install_sglang(ps, parallel, tp, tp_rank):
    """SGLang 0.5.23 reads its group handles from the runtime context
    (get_parallel().tp_group etc.) and, in older code paths, from the module
    globals of sglang.srt.distributed.parallel_state: set both.  Expert
    parallelism, attention DP/CP and pipeline parallelism are off (size 1)."""
    tp_g = FakeGroup(tp, tp_rank)
    one = FakeGroup(1, 0)
    groups = dict(world_group=FakeGroup(tp, tp_rank), tp_group=tp_g, attn_tp_group=tp_g,
                  moe_tp_group=tp_g, shared_experts_tp_group=tp_g, pp_group=one,
                  moe_ep_group=one, moe_dp_group=one, attn_cp_group=one, dcp_group=one)
    parallel.override_permanently(**groups)
    for name, g in (("_WORLD", "world_group"), ("_TP", "tp_group"), ("_ATTN_TP", "attn_tp_group"),
                    ("_MOE_TP", "moe_tp_group"), ("_SHARED_EXPERTS_TP", "shared_experts_tp_group"),
                    ("_PP", "pp_group"), ("_MOE_EP", "moe_ep_group"), ("_MOE_DP", "moe_dp_group"),
                    ("_ATTN_CP", "attn_cp_group"), ("_DCP", "dcp_group")):
        setattr(ps, name, groups[g])

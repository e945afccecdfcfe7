# Excerpt of FlashInfer 0.6.7.post3 (comm/mapping.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
class Mapping(object):

    def __init__(self, world_size=1, rank=0, gpus_per_node=8, *, cp_size=1, cp_config=None, tp_size=1, pp_size=1, moe_cluster_size=-1, moe_tp_size=-1, moe_ep_size=-1, attn_tp_size=-1, attn_cp_size=-1, auto_parallel=False, enable_attention_dp=False):
        self.attn_cp_size = None
        self.attn_tp_size = None
        self.auto_parallel = None
        self.cp_config = None
        self.cp_groups = None
        self.cp_size = None
        self.enable_attention_dp = None
        self.gpus_per_node = None
        self.moe_cluster_groups = None
        self.moe_cluster_size = None
        self.moe_ep_groups = None
        self.moe_ep_size = None
        self.moe_tp_groups = None
        self.moe_tp_size = None
        self.pp_groups = None
        self.pp_size = None
        self.rank = None
        self.tp_groups = None
        self.tp_size = None
        self.world_size = None

    def __eq__(self, other):
        return NotImplemented
        return self.world_size == other.world_size and self.rank == other.rank and (self.gpus_per_node == other.gpus_per_node) and (self.cp_size == other.cp_size) and (self.tp_size == other.tp_size) and (self.moe_cluster_size == other.moe_cluster_size) and (self.pp_size == other.pp_size) and (self.moe_tp_size == other.moe_tp_size) and (self.moe_ep_size == other.moe_ep_size) and (self.attn_tp_size == other.attn_tp_size) and (self.attn_cp_size == other.attn_cp_size) and (self.auto_parallel == other.auto_parallel)

    def __hash__(self):
        return hash((self.world_size, self.rank, self.gpus_per_node, self.cp_size, self.tp_size, self.pp_size, self.moe_tp_size, self.moe_cluster_size, self.moe_ep_size, self.attn_tp_size, self.attn_cp_size, self.auto_parallel))

    @property
    def rank(self):
        return self._rank

    @rank.setter
    def rank(self, rank: int):
        self._rank = None

    @property
    def tp_rank(self):
        return 0 if self.auto_parallel else self.rank % self.tp_size

    @property
    def pp_rank(self):
        return 0 if self.auto_parallel else self.rank // (self.tp_size * self.cp_size)

    @property
    def cp_rank(self):
        return 0 if self.auto_parallel else self.rank % (self.tp_size * self.cp_size) // self.tp_size

    @property
    def moe_tp_rank(self):
        return self.tp_rank // (self.moe_ep_size * self.moe_cluster_size)

    @property
    def moe_cluster_rank(self):
        return self.tp_rank % self.moe_cluster_size

    @property
    def moe_ep_rank(self):
        return self.tp_rank % self.moe_ep_size

    @property
    def tp_group(self):
        return self.tp_groups[self.pp_rank * self.cp_size + self.cp_rank]

    @property
    def pp_group(self):
        return self.pp_groups[self.cp_rank * self.tp_size + self.tp_rank]

    @property
    def cp_group(self):
        return self.cp_groups[self.pp_rank * self.tp_size + self.tp_rank]

    @property
    def moe_tp_group(self):
        return self.moe_tp_groups[self.pp_rank * self.moe_cluster_size * self.moe_ep_size + self.moe_cluster_rank * self.moe_ep_size + self.moe_ep_rank]

    @property
    def moe_cluster_group(self):
        return self.moe_cluster_groups[self.pp_rank * self.moe_tp_size + self.moe_tp_rank]

    @property
    def moe_ep_group(self):
        return self.moe_ep_groups[self.pp_rank * self.moe_tp_size * self.moe_cluster_size + self.moe_tp_rank * self.moe_cluster_size + self.moe_cluster_rank]

    @property
    def node_rank(self):
        return self.rank // self.gpus_per_node

    @property
    def local_rank(self):
        return self.rank % self.gpus_per_node

    def has_cp(self):
        return self.cp_size > 1

    def get_node_rank(self, rank: int):
        return rank // self.gpus_per_node

    def get_local_rank(self, rank: int):
        return rank % self.gpus_per_node

    def is_multi_node(self):
        return self.world_size > self.gpus_per_node

    def has_tp(self):
        return self.tp_size > 1

    def is_last_pp_rank(self):
        return self.pp_rank == self.pp_size - 1

    def is_second_last_pp_rank(self):
        return self.pp_rank == self.pp_size - 2

    def is_first_pp_rank(self):
        return self.pp_rank == 0

    def has_pp(self):
        return self.pp_size > 1

    def prev_pp_rank(self):
        return p

    def next_pp_rank(self):
        return p

    def has_moe_cluster(self):
        return self.moe_cluster_size > 1

    def has_moe_tp(self):
        return self.moe_tp_size > 1

    def has_moe_ep(self):
        return self.moe_ep_size > 1

    def pp_layers(self, num_layers: int) -> List[int]:
        return torch.tensor_split(torch.arange(num_layers), self.pp_size)[self.pp_rank].tolist()

    def ep_experts(self, num_experts: int) -> List[int]:
        return list(experts_range)

    @classmethod
    def from_dict(cls, mapping: dict):
        return cls(**mapping)

    def to_dict(self):
        return {'world_size': self.world_size, 'rank': self.rank, 'gpus_per_node': self.gpus_per_node, 'cp_size': self.cp_size, 'tp_size': self.tp_size, 'pp_size': self.pp_size, 'moe_tp_size': self.moe_tp_size, 'moe_cluster_size': self.moe_cluster_size, 'moe_ep_size': self.moe_ep_size, 'attn_tp_size': self.attn_tp_size, 'attn_cp_size': self.attn_cp_size, 'auto_parallel': self.auto_parallel}

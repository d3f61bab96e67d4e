"""The backbone's shape: one dataclass every family's config reader fills (families/, docs/MODELS.md)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class BackboneConfig:
    family: str  # a name of families.FAMILIES
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden: int
    vocab_size: int
    rope_theta: float
    norm_eps: float
    qkv_bias: bool
    mask_id: int
    stop_ids: list[int] = field(default_factory=list)
    pad_id: int | None = None
    logit_shift: bool = False  # Dream: logits for token j come from row j-1
    attn_head_dim: int | None = None  # per-head width when not d_model / n_heads (Qwen3: 128)
    qk_norm: bool = False  # RMSNorm over each query/key head before RoPE (Qwen3, SDAR)
    tie_embeddings: bool = False  # the LM head is the embedding matrix
    #: None: bidirectional attention; n: block-causal over blocks of n positions (position // n),
    #: bidirectional inside a block (SDAR, Fast-dLLM v2; docs/MODELS.md)
    block_size: int | None = None
    #: RoPE on the first ``rope_dim`` channels of each head only, the rest passed through
    #: (partial rotary: LLaDA2.0's ``partial_rotary_factor`` 0.5); None: the whole head
    rope_dim: int | None = None
    #: mixture-of-experts FFN (dlmpipe/backbones/moe.py; docs/MODELS.md): 0 experts = every layer
    #: dense. ``dense_layers``: the layers whose FFN is a dense SwiGLU of ``mlp_hidden`` anyway
    n_experts: int = 0
    experts_per_token: int = 0
    expert_hidden: int = 0
    shared_expert_hidden: int = 0  # 0: no shared expert
    dense_layers: list[int] = field(default_factory=list)
    #: ``softmax_biased`` (LLaDA-MoE) or ``sigmoid_grouped`` (LLaDA2.0); moe.py states each
    router: str = ""
    router_bias: bool = False  # a per-expert bias added to the routing scores
    n_group: int = 1  # grouped (group-limited) routing: experts in n_group groups ...
    topk_group: int = 1  # ... of which each token may use topk_group
    routed_scaling: float = 1.0  # routed experts' weights are multiplied by this

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.d_model // self.n_heads

    def is_moe_layer(self, layer: int) -> bool:
        return self.n_experts > 0 and layer not in self.dense_layers

    def to_dict(self) -> dict:
        return asdict(self)

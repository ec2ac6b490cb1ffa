"""A BitNet b1.58 decoder (the 2B4T architecture) on the GPU, run as recorded graphs.

    config = BitNetConfig.preset("2b4t")
    model = BitNetModel.random(config, seed=0)                 # or BitNetModel.from_pretrained(...)
    logits = model.forward(token_ids)                          # [B, T, vocab] float32
    ids = model.generate(prompt, max_new_tokens=64)            # prompt + 64 new token ids

Architecture (transformers' BitNetForCausalLM): token embedding; per layer
    h = x + o_proj(attn_sub_norm(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))))
        with n = input_layernorm(x)
    x = h + down_proj(ffn_sub_norm(relu2(gate_proj(m)) * up_proj(m))),  m =
    post_attention_layernorm(h)
then norm and the (float) language-model head, tied to the embedding unless lm_head.weight is
given. Every projection is a BitLinear: per-token int8 activations times ternary weights
(docs/NUMERICS.md). RMSNorm eps and RoPE theta come from the config; attention is causal with
grouped-query heads and a KV cache on the device.

The package, a module a job (docs/ARCHITECTURE.md draws the layers):
    config           BitNetConfig, the checkpoint's tensor names
    weights          the parameters on the device, from a checkpoint's tensors or random
    screened_head    the head's int8 screening copy
    step             Step (one replay: slots, ids, positions, the pick), StepPlan, DecodePolicy
    recording        a StepPlan's graph, its inputs and outputs
    graph_cache      the recorded graphs of a pool, by plan
    cache_pool       KV cache slots
    runner           Steps run over a pool, with the model's choices
    session          DecodeSession: the decode-step API
    generation       GenerationOptions, the stop rule, the generation loop
    text_generation  prompts and replies as text
    model            BitNetModel, the user's surface
"""

from .cache_pool import CachePool
from .config import PROJECTIONS, BitNetConfig, weight_names
from .generation import GenerateOutput, GenerationOptions
from .model import BitNetModel
from .screened_head import screening_tables
from .session import DecodeSession
from .step import DecodePolicy, Pick, Step, StepPlan
from .weights import unpack_hf_ternary

__all__ = [
    "BitNetConfig",
    "BitNetModel",
    "CachePool",
    "DecodePolicy",
    "DecodeSession",
    "GenerateOutput",
    "GenerationOptions",
    "PROJECTIONS",
    "Pick",
    "Step",
    "StepPlan",
    "weight_names",
    "unpack_hf_ternary",
    "screening_tables",
]

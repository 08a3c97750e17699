"""The PyTorch model's parameters are exactly Hugging Face `LlamaForCausalLM`'s."""

from __future__ import annotations

import torch

from mindmotor.model.config import LlamaConfig
from mindmotor.trainer.model import LlamaForCausalLM


def hf_names(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The tensor names and shapes of a HF Llama checkpoint, written out from the HF layout."""
    h, i, hd = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    names = {"model.embed_tokens.weight": (config.vocab_size, h), "model.norm.weight": (h,)}
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        names.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i)})
        if config.attention_bias:
            names.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                          p + "self_attn.v_proj.bias": (kv,)})
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = (config.vocab_size, h)
    return names


def config(**overrides) -> LlamaConfig:
    fields = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    return LlamaConfig(**{**fields, **overrides})


def test_state_dict_has_the_hf_names_and_shapes():
    for cfg in (config(), config(tie_word_embeddings=True), config(attention_bias=True)):
        model = LlamaForCausalLM(cfg)
        tensors = model.hf_state_dict()
        assert {k: tuple(v.shape) for k, v in tensors.items()} == hf_names(cfg)
        assert all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors.values())


def test_tied_embeddings_share_one_tensor_and_reload():
    model = LlamaForCausalLM(config(tie_word_embeddings=True))
    model.init_weights(0.02, torch.Generator().manual_seed(0))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    again = LlamaForCausalLM(config(tie_word_embeddings=True))
    again.load_hf_state_dict(model.hf_state_dict())
    ids = torch.randint(0, 300, (1, 8))
    assert torch.equal(model(ids), again(ids))


def test_attention_is_causal():
    model = LlamaForCausalLM(config()).eval()
    model.init_weights(0.2, torch.Generator().manual_seed(0))
    ids = torch.randint(0, 300, (1, 12))
    changed = ids.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 300
    with torch.no_grad():
        assert torch.allclose(model(ids)[0, :8], model(changed)[0, :8])
        assert not torch.allclose(model(ids)[0, 8:], model(changed)[0, 8:])

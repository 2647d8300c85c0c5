"""transformers' DeepseekV4ForCausalLM with the weights of a deepseek4 GGUF (dequantized by gguf's
reference code), the reference the DeepSeek V4 tests compare strata against."""

from __future__ import annotations

import gguf
import numpy as np

from float64_reference import Float64, q8_0_round_trip, run_in_float64


def _meta(r: gguf.GGUFReader, key: str, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    vals = [f.parts[i] for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(vals[0]).decode()
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        return [v.item() for v in vals]
    return vals[0].item()


def hf_config(path: str):
    """The DeepseekV4Config a deepseek4 GGUF's metadata describes."""
    import transformers

    r = gguf.GGUFReader(path)
    a = "deepseek4."
    L = _meta(r, a + "block_count") - _meta(r, a + "nextn_predict_layers", 0)
    hash_layers = _meta(r, a + "hash_layer_count")
    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    ratios = _meta(r, a + "attention.compress_ratios")[:L]
    hd = _meta(r, a + "attention.key_length")
    clamp = _meta(r, a + "swiglu_clamp_exp")
    rope = {"rope_type": "default"}
    if _meta(r, a + "rope.scaling.type") == "yarn":
        rope = {"rope_type": "yarn", "factor": _meta(r, a + "rope.scaling.factor"),
                "original_max_position_embeddings": _meta(r, a + "rope.scaling.original_context_length"),
                "beta_fast": _meta(r, a + "rope.scaling.yarn_beta_fast", 32.0),
                "beta_slow": _meta(r, a + "rope.scaling.yarn_beta_slow", 1.0)}
    vocab = int(next(t for t in r.tensors if t.name == "token_embd.weight").shape[1])
    return transformers.DeepseekV4Config(
        vocab_size=vocab, hidden_size=_meta(r, a + "embedding_length"),
        moe_intermediate_size=_meta(r, a + "expert_feed_forward_length"), num_hidden_layers=L,
        num_attention_heads=_meta(r, a + "attention.head_count"), num_key_value_heads=1, head_dim=hd,
        q_lora_rank=_meta(r, a + "attention.q_lora_rank"), num_experts_per_tok=_meta(r, a + "expert_used_count"),
        n_routed_experts=_meta(r, a + "expert_count"), n_shared_experts=_meta(r, a + "expert_shared_count"),
        scoring_func="sqrtsoftplus", norm_topk_prob=bool(_meta(r, a + "expert_weights_norm")),
        routed_scaling_factor=_meta(r, a + "expert_weights_scale"),
        max_position_embeddings=_meta(r, a + "context_length"), rope_theta=_meta(r, a + "rope.freq_base"),
        layer_types=[kinds[x] for x in ratios], compress_rope_theta=_meta(r, a + "attention.compress_rope_freq_base"),
        hc_mult=_meta(r, a + "hyper_connection.count"),
        hc_sinkhorn_iters=_meta(r, a + "hyper_connection.sinkhorn_iterations"),
        hc_eps=_meta(r, a + "hyper_connection.epsilon"),
        mlp_layer_types=["hash_moe"] * hash_layers + ["moe"] * (L - hash_layers),
        swiglu_limit=clamp[0] if isinstance(clamp, list) else clamp,
        sliding_window=_meta(r, a + "attention.sliding_window"),
        o_groups=_meta(r, a + "attention.output_group_count"), o_lora_rank=_meta(r, a + "attention.output_lora_rank"),
        index_n_heads=_meta(r, a + "attention.indexer.head_count"),
        index_head_dim=_meta(r, a + "attention.indexer.key_length"),
        index_topk=_meta(r, a + "attention.indexer.top_k"),
        partial_rotary_factor=_meta(r, a + "rope.dimension_count") / hd,
        rms_norm_eps=_meta(r, a + "attention.layer_norm_rms_epsilon"), rope_parameters=rope,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
    )


def _tensors(path: str) -> dict[str, np.ndarray]:
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(int(x) for x in reversed(t.shape))
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            out[t.name] = np.asarray(t.data).reshape(shape)
        else:
            out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
    return out


def _experts_with_q8_0_inputs(self, hidden_states, top_k_index, top_k_weights):
    """DeepseekV4Experts.forward with the routed experts' input rows and the down projection's input
    quantized to q8_0, where strata's MMQ layout quantizes them (the shared expert stays float)."""
    import torch

    F = torch.nn.functional
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        k_pos, rows = torch.where((top_k_index == e).T)
        if rows.numel() == 0:
            continue
        x = q8_0_round_trip(hidden_states[rows], (id(self), e, 0), rows)
        h = self._apply_gate(F.linear(x, self.gate_up_proj[e]))
        y = F.linear(q8_0_round_trip(h, (id(self), e, 1), rows), self.down_proj[e])
        out.index_add_(0, rows, y * top_k_weights[rows, k_pos, None])
    return out


def hf_model(path: str, q8_experts: bool = False):
    """DeepseekV4ForCausalLM (float32, eval) with the GGUF's weights; with q8_experts, in float64
    (float64_reference) with the routed experts' inputs through q8_0 as in strata's MMQ layout."""
    import contextlib
    import types

    import torch
    import transformers

    cfg = hf_config(path)
    torch.manual_seed(0)
    with Float64() if q8_experts else contextlib.nullcontext():
        model = transformers.DeepseekV4ForCausalLM(cfg)
    model = (model.double() if q8_experts else model.float()).eval()
    g = _tensors(path)
    sd: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": g["token_embd.weight"], "lm_head.weight": g["output.weight"],
        "model.norm.weight": g["output_norm.weight"], "model.hc_head.hc_fn": g["output_hc_fn.weight"],
        "model.hc_head.hc_base": g["output_hc_base.weight"], "model.hc_head.hc_scale": g["output_hc_scale.weight"],
    }
    for i, kind in enumerate(cfg.layer_types):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        at = p + "self_attn."
        sd.update({
            at + "q_a_proj.weight": g[b + "attn_q_a.weight"], at + "q_a_norm.weight": g[b + "attn_q_a_norm.weight"],
            at + "q_b_proj.weight": g[b + "attn_q_b.weight"], at + "kv_proj.weight": g[b + "attn_kv.weight"],
            at + "kv_norm.weight": g[b + "attn_kv_a_norm.weight"],
            at + "o_a_proj.weight": g[b + "attn_output_a.weight"],
            at + "o_b_proj.weight": g[b + "attn_output_b.weight"], at + "sinks": g[b + "attn_sinks.weight"],
            p + "input_layernorm.weight": g[b + "attn_norm.weight"],
            p + "post_attention_layernorm.weight": g[b + "ffn_norm.weight"],
        })
        for site in ("attn", "ffn"):
            for part in ("fn", "base", "scale"):
                sd[f"{p}{site}_hc.{part}"] = g[f"{b}hc_{site}_{part}.weight"]
        if kind != "sliding_attention":
            c = at + "compressor."
            sd.update({c + "kv_proj.weight": g[b + "attn_compressor_kv.weight"],
                       c + "gate_proj.weight": g[b + "attn_compressor_gate.weight"],
                       c + "position_bias": g[b + "attn_compressor_ape.weight"],
                       c + "kv_norm.weight": g[b + "attn_compressor_norm.weight"]})
        if kind == "compressed_sparse_attention":
            x = at + "compressor.indexer."
            sd.update({x + "kv_proj.weight": g[b + "indexer_compressor_kv.weight"],
                       x + "gate_proj.weight": g[b + "indexer_compressor_gate.weight"],
                       x + "position_bias": g[b + "indexer_compressor_ape.weight"],
                       x + "kv_norm.weight": g[b + "indexer_compressor_norm.weight"],
                       x + "q_b_proj.weight": g[b + "indexer.attn_q_b.weight"],
                       x + "scorer.weights_proj.weight": g[b + "indexer.proj.weight"]})
        m = p + "mlp."
        sd[m + "gate.weight"] = g[b + "ffn_gate_inp.weight"]
        if cfg.mlp_layer_types[i] == "hash_moe":
            sd[m + "gate.tid2eid"] = g[b + "ffn_gate_tid2eid.weight"].astype(np.int64)
        else:
            sd[m + "gate.e_score_correction_bias"] = g[b + "exp_probs_b.bias"]
        sd[m + "experts.gate_up_proj"] = np.concatenate([g[b + "ffn_gate_exps.weight"], g[b + "ffn_up_exps.weight"]], 1)
        sd[m + "experts.down_proj"] = g[b + "ffn_down_exps.weight"]
        sd[m + "shared_experts.gate_proj.weight"] = g[b + "ffn_gate_shexp.weight"]
        sd[m + "shared_experts.up_proj.weight"] = g[b + "ffn_up_shexp.weight"]
        sd[m + "shared_experts.down_proj.weight"] = g[b + "ffn_down_shexp.weight"]
    own = model.state_dict()
    missing = [k for k in own if k not in sd and "rotary_emb" not in k]
    if missing:
        raise KeyError(f"no GGUF tensor for {missing[:5]}")
    with torch.no_grad():
        for k, v in sd.items():
            want = own[k]
            t = torch.from_numpy(np.ascontiguousarray(v)).to(want.dtype).reshape(want.shape)
            want.copy_(t)
    # transformers has one swiglu_limit for every layer and for the routed and the shared experts; the
    # file has one per layer for each, read as llama.cpp and strata read them: no routed limit (or 0) is
    # no clamp, no shared limit (or a negative one) is the routed one.
    L = len(cfg.layer_types)
    routed = _per_layer(_meta_of(path, "deepseek4.swiglu_clamp_exp", None), L) or [0.0] * L
    shared = _per_layer(_meta_of(path, "deepseek4.swiglu_clamp_shexp", None), L) or [-1.0] * L
    shared = [r if s < 0 else s for r, s in zip(routed, shared, strict=True)]
    for layer, lim, shlim in zip(model.model.layers, routed, shared, strict=True):
        layer.mlp.experts.limit = lim if lim > 0 else float("inf")
        layer.mlp.shared_experts.limit = shlim if shlim > 0 else float("inf")
        if not cfg.norm_topk_prob:  # transformers' V4 routers always renormalize the top-k weights
            layer.mlp.gate.forward = types.MethodType(_unnormalized_router(layer.mlp.gate.forward), layer.mlp.gate)
    if q8_experts:
        for layer in model.model.layers:
            layer.mlp.experts.forward = types.MethodType(_experts_with_q8_0_inputs, layer.mlp.experts)
        return run_in_float64(model)
    return model


def _meta_of(path: str, key: str, default):
    return _meta(gguf.GGUFReader(path), key, default)


def _per_layer(v, n: int) -> list[float] | None:
    """A per-layer value (an array, or one scalar for every layer) as n floats; None when absent."""
    if v is None:
        return None
    return [float(x) for x in v[:n]] if isinstance(v, list) else [float(v)] * n


def _unnormalized_router(forward):
    """A V4 router's forward with the top-k weights left as scored (expert_weights_norm false)."""

    def run(self, hidden_states, *args):
        logits, _, indices = forward(hidden_states, *args)
        raw = self.score_fn(logits).gather(1, indices)
        return logits, raw * self.routed_scaling_factor, indices

    return run

"""Why bf16 outputs differ from plain greedy ``generate()``: does a linear layer of the target give each row the same
bits when it multiplies M rows at once (a verification forward of M tree tokens) as when it multiplies that row
alone (one-token decoding)? Public API only (``hf_spec.load_packaged_model``, torch).

For each distinct linear shape of the packaged SmolLM2-135M-Instruct and M = 2..32, it multiplies M rows of the
target's own activations (a forward of a fixed prompt, captured at that layer's input) both ways and prints the
largest difference; then the same for the whole model: the last position's logits of one forward of 8 tokens
against 8 one-token forwards on the same cache.

    python benchmarks/fresh_machine/bf16_rounding.py [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from hf_spec import load_packaged_model

PROMPT = "Explain how a hash map handles collisions, then write a short Python example that counts words in a text."


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", type=int, nargs="+", default=[2, 4, 6, 8, 16, 32])
    args = parser.parse_args()
    model, tokenizer = load_packaged_model("smollm2-135m-instruct", dtype=getattr(torch, args.dtype))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
    layer = model.model.layers[len(model.model.layers) // 2]
    linears = {"q_proj": layer.self_attn.q_proj, "k_proj": layer.self_attn.k_proj, "o_proj": layer.self_attn.o_proj,
               "gate_proj": layer.mlp.gate_proj, "down_proj": layer.mlp.down_proj}  # fmt: skip
    inputs = {}

    def capture(name):
        def hook(module, args, output):  # returns None: the output is left as it is
            inputs.setdefault(name, args[0][0].detach())
        return hook

    hooks = [m.register_forward_hook(capture(name)) for name, m in linears.items()]
    with torch.inference_mode():
        model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    result = {"dtype": args.dtype, "threads": torch.get_num_threads(), "linear": {}, "model": {}}
    with torch.inference_mode():
        for name, module in linears.items():
            x, weight = inputs[name], module.weight
            row = {}
            for m in args.rows:
                together = F.linear(x[:m], weight)
                alone = torch.cat([F.linear(x[i : i + 1], weight) for i in range(m)])
                row[m] = (together.float() - alone.float()).abs().max().item()
            result["linear"][f"{name} ({weight.shape[1]} -> {weight.shape[0]})"] = row
        prefix, n = ids.shape[1] - 8, 8
        cache = DynamicCache()
        model(input_ids=ids[:, :prefix], past_key_values=cache, use_cache=True)
        together = model(input_ids=ids[:, prefix:], past_key_values=cache, use_cache=True).logits[0]
        cache.crop(-n)
        alone = torch.cat([model(input_ids=ids[:, i : i + 1], past_key_values=cache, use_cache=True).logits[0]
                           for i in range(prefix, prefix + n)])  # fmt: skip
        result["model"] = {"max_logit_difference": (together.float() - alone.float()).abs().max().item(),
                           "same_argmax": (together.argmax(-1) == alone.argmax(-1)).tolist()}  # fmt: skip
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

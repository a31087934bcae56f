"""bf16 forward cost of the Qwen targets and of the S2D drafter's exits on this machine (2 threads)."""
import time, sys, json, torch
import hf_spec
from hf_spec import load_packaged_model
torch.set_num_threads(2)
out = {}
for name in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"):
    model, _ = load_packaged_model(name, dtype=torch.bfloat16)
    model.eval()
    ids = torch.randint(100, 20000, (1, 200))
    res = {}
    with torch.inference_mode():
        pre = model(ids, use_cache=True)
        for k in (1, 2, 4, 8, 16):
            best = 1e9
            for _ in range(4):
                cache = pre.past_key_values
                import copy
                c = copy.deepcopy(cache)
                x = torch.randint(100, 20000, (1, k))
                t = time.perf_counter(); model(x, past_key_values=c, use_cache=True); best = min(best, time.perf_counter() - t)
            res[k] = round(best * 1000, 1)
    out[name] = res
    print(name, res, flush=True)
    del model
json.dump(out, open(sys.argv[1], "w"), indent=1)

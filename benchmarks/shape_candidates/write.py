"""Write the measured shape candidates (candidates.json) into the shipped SmolLM2 drafter folders.

    python benchmarks/shape_candidates/write.py benchmarks/shape_candidates/candidates.json
"""
import json, sys
from hf_spec.tune import write_shape_candidates

measured = json.load(open(sys.argv[1]))
for name, entry in measured["drafters"].items():
    provenance = {"by": "benchmarks/shape_candidates/measure.py", "prompts": measured["prompts"],
                  "dtype": measured["dtype"], "max_new_tokens": measured["max_new_tokens"], "date": measured["date"]}
    print("updated", write_shape_candidates(entry["path"], entry["candidates"], provenance))

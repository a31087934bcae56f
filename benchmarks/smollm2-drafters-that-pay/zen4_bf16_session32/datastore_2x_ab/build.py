"""Session 32: a datastore over the shipped 3,200 turns' answers + the next 3,200 self-distilled turns' answers."""
import shutil, time, sys
from hf_spec.drafters.datastore import NGramDatastore, datastore_from_feature_cache, find_datastore
t = time.time()
shipped = find_datastore("drafters/smollm2-135m-instruct-eagle")
extra = datastore_from_feature_cache("runs/features/smollm2-sharegpt-next3200")
big = NGramDatastore.merge([shipped, extra])
print(len(shipped), len(extra), len(big), "%.1f s" % (time.time() - t))
for name in ["eagle"]:
    dst = f"runs/ds33/{name}-ds2"
    shutil.copytree(f"drafters/smollm2-135m-instruct-{name}", dst, dirs_exist_ok=True)
    big.save(dst)

import json, os
out = os.environ["STEP_OUTPUT_DIR"]
json.dump({"sources": ["a"]}, open(os.path.join(out, "sources.json"), "w"))

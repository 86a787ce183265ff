"""Counts the words of each note (the folder given as the first argument) into counts.json."""

import json
import os
import re
import sys
from collections import Counter

notes = sys.argv[1]
counts = {}
for name in sorted(os.listdir(notes)):
    if name.endswith(".md"):
        with open(os.path.join(notes, name)) as f:
            words = re.findall(r"[a-z']+", f.read().lower())
        counts[name] = dict(Counter(words).most_common())

with open(os.path.join(os.environ["STEP_OUTPUT_DIR"], "counts.json"), "w") as f:
    json.dump({"notes": counts}, f, indent=2, sort_keys=True)
print(f"counted the words of {len(counts)} notes")

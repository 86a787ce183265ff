"""Adds up the counts of every note and lists the ten most frequent words in top.md."""

import json
import os
from collections import Counter

execution = os.environ["STEP_EXECUTION_DIR"]
with open(os.path.join(execution, "count-words", "counts.json")) as f:
    notes = json.load(f)["notes"]

total = Counter()
for counts in notes.values():
    total.update(counts)

lines = ["# The ten most frequent words", ""]
for word, n in sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:10]:
    lines.append(f"- {word}: {n}")
with open(os.path.join(os.environ["STEP_OUTPUT_DIR"], "top.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"{len(total)} distinct words in {len(notes)} notes")

"""Groups the exported tickets by priority into digest.md and records the digest in the db."""

import json
import os
from collections import defaultdict
from datetime import datetime, timezone

import trellis_db

execution = os.environ["STEP_EXECUTION_DIR"]
with open(os.path.join(execution, "export-open", "open_tickets.json")) as f:
    tickets = json.load(f)["tickets"]

by_priority = defaultdict(list)
for t in tickets:
    by_priority[t["priority"]].append(t)

team = os.environ.get("VAR_TEAM", "the team")
lines = [f"# Open tickets for {team}", ""]
for priority in ("high", "normal", "low"):
    rows = by_priority.get(priority, [])
    lines.append(f"## {priority.capitalize()} ({len(rows)})")
    for t in rows:
        opened = datetime.fromisoformat(t["opened_at"].replace("Z", "+00:00"))
        lines.append(f"- #{t['id']} {t['subject']} ({t['customer']}, opened {opened:%d %b})")
    lines.append("")

with open(os.path.join(os.environ["STEP_OUTPUT_DIR"], "digest.md"), "w") as f:
    f.write("\n".join(lines))

trellis_db.execute(
    "INSERT INTO digests (written_at, tickets, high) VALUES (?, ?, ?)",
    [datetime.now(timezone.utc).isoformat(timespec="seconds"), len(tickets), len(by_priority["high"])],
)
print(f"digest of {len(tickets)} tickets, {len(by_priority['high'])} of high priority")

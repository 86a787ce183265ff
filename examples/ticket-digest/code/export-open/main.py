"""Exports the open tickets as JSON and CSV into the step's output folder."""

import csv
import json
import os

import trellis_db

out = os.environ["STEP_OUTPUT_DIR"]
tickets = trellis_db.query(
    "SELECT id, subject, customer, priority, opened_at FROM tickets"
    " WHERE status = ? ORDER BY opened_at",
    ["open"],
)

with open(os.path.join(out, "open_tickets.json"), "w") as f:
    json.dump({"count": len(tickets), "tickets": tickets}, f, indent=2)

with open(os.path.join(out, "open_tickets.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=["id", "subject", "customer", "priority", "opened_at"])
    writer.writeheader()
    writer.writerows(tickets)

print(f"exported {len(tickets)} open tickets")

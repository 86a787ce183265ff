"""Fetches the product's releases from the release API and stores them in db/db.sqlite.

The API's URL is the workflow variable `api_url` (VAR_API_URL). The step's
agent_configs.allowed_hosts lists the API's host: any other host is refused by the
runtime before a byte is sent. When the operator sets SECRET_RELEASES_TOKEN, the
script sends its placeholder in Authorization and the runtime puts the token in its
place, only for an origin the operator approved for it (--allow-key).
"""

import datetime
import json
import os
import sqlite3

import trellis_http

url = os.environ["VAR_API_URL"]
headers = {"Accept": "application/json"}
token = os.environ.get("SECRET_RELEASES_TOKEN")
if token:
    headers["Authorization"] = f"Bearer {token}"

payload = trellis_http.get_json(url, headers=headers)
releases = payload["releases"]
fetched_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

db = sqlite3.connect(os.environ["DB_PATH"])
db.executemany(
    "INSERT OR REPLACE INTO releases (version, released_on, breaking, notes, source, fetched_at) "
    "VALUES (?, ?, ?, ?, ?, ?)",
    [
        (r["version"], r["date"], int(bool(r["breaking"])), r["notes"].strip(), url, fetched_at)
        for r in releases
    ],
)
db.commit()
stored = db.execute("SELECT COUNT(*) FROM releases").fetchone()[0]

with open(os.path.join(os.environ["STEP_OUTPUT_DIR"], "fetched.json"), "w") as f:
    json.dump(
        {"source": url, "fetched_at": fetched_at, "count": len(releases), "stored": stored},
        f,
        indent=2,
    )
print(f"stored {len(releases)} releases of {payload['product']} from {url}")

CREATE TABLE tickets (
  id INTEGER PRIMARY KEY,
  subject TEXT NOT NULL,
  customer TEXT NOT NULL,
  priority TEXT NOT NULL CHECK (priority IN ('high', 'normal', 'low')),
  status TEXT NOT NULL,
  opened_at TEXT NOT NULL
);
INSERT INTO tickets VALUES
  (1, 'Refund for a double charge', 'acme', 'high', 'open', '2026-11-02T09:14:00Z'),
  (2, 'Cannot log in after the password reset', 'globex', 'high', 'open', '2026-11-03T11:40:00Z'),
  (3, 'Invoice address is wrong', 'initech', 'normal', 'open', '2026-11-03T16:05:00Z'),
  (4, 'Feature request: dark mode', 'acme', 'low', 'open', '2026-11-04T08:30:00Z'),
  (5, 'Export to CSV times out', 'umbrella', 'normal', 'closed', '2026-10-28T13:00:00Z');
CREATE TABLE digests (
  id INTEGER PRIMARY KEY,
  written_at TEXT NOT NULL,
  tickets INTEGER NOT NULL,
  high INTEGER NOT NULL
);

CREATE TABLE releases (
    version TEXT PRIMARY KEY,
    released_on TEXT NOT NULL,
    breaking INTEGER NOT NULL,
    notes TEXT NOT NULL,
    source TEXT NOT NULL,
    fetched_at TEXT NOT NULL
);

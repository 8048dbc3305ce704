-- History, part two: fleets, throughput signals, downsampled tiers, the policy audit trail
-- and operator annotations. Forward-only: 0001 has shipped and is never edited.

-- A fleet groups the replicas and routers one operator steers together. Row 1 is the
-- fleet that replicas belong to until they are assigned elsewhere.
CREATE TABLE fleets (
    id         INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL UNIQUE,
    created_ms INTEGER NOT NULL
);
INSERT INTO fleets (id, name, created_ms) VALUES (1, 'default', 0);

-- NULL means the default fleet (1): SQLite cannot add a foreign-key column whose default
-- is not NULL, and replicas stored before this migration have no fleet yet.
ALTER TABLE replicas ADD COLUMN fleet_id INTEGER REFERENCES fleets (id);

-- Throughput in tokens per second between two scrapes; NULL until the engine reports it.
ALTER TABLE samples ADD COLUMN prompt_tok_s REAL;
ALTER TABLE samples ADD COLUMN gen_tok_s REAL;

-- Per-replica tiers: means of the raw samples in each bucket (NULLs ignored, as AVG does),
-- with the number of raw samples behind them. Built from raw samples before those expire.
CREATE TABLE samples_10s (
    replica_id   INTEGER NOT NULL REFERENCES replicas (id),
    bucket_ms    INTEGER NOT NULL,
    n            INTEGER NOT NULL,
    queue_depth  REAL,
    running      REAL,
    kv_usage     REAL,
    hit_rate     REAL,
    ttft_p50_s   REAL,
    ttft_p95_s   REAL,
    prompt_tok_s REAL,
    gen_tok_s    REAL,
    PRIMARY KEY (replica_id, bucket_ms)
) WITHOUT ROWID;
CREATE INDEX samples_10s_by_time ON samples_10s (bucket_ms);

CREATE TABLE samples_1m (
    replica_id   INTEGER NOT NULL REFERENCES replicas (id),
    bucket_ms    INTEGER NOT NULL,
    n            INTEGER NOT NULL,
    queue_depth  REAL,
    running      REAL,
    kv_usage     REAL,
    hit_rate     REAL,
    ttft_p50_s   REAL,
    ttft_p95_s   REAL,
    prompt_tok_s REAL,
    gen_tok_s    REAL,
    PRIMARY KEY (replica_id, bucket_ms)
) WITHOUT ROWID;
CREATE INDEX samples_1m_by_time ON samples_1m (bucket_ms);

-- Fleet tiers: one row per fleet and bucket with the fleet-level values that comparisons
-- read, so comparing days of history reads thousands of rows, not millions. Load
-- imbalance is kept as the first two moments of per-replica load (queue + running) across
-- replicas, because SQLite has no square root here; readers derive the coefficient of
-- variation from them.
CREATE TABLE fleet_10s (
    fleet_id         INTEGER NOT NULL REFERENCES fleets (id),
    bucket_ms        INTEGER NOT NULL,
    replicas         INTEGER NOT NULL,
    samples          INTEGER NOT NULL,
    hit_rate         REAL,
    ttft_p50_s       REAL,
    ttft_p95_s       REAL,
    queue_depth      REAL,
    throughput_tok_s REAL,
    load_n           INTEGER NOT NULL,
    load_mean        REAL,
    load_sq_mean     REAL,
    PRIMARY KEY (fleet_id, bucket_ms)
) WITHOUT ROWID;

CREATE TABLE fleet_1m (
    fleet_id         INTEGER NOT NULL REFERENCES fleets (id),
    bucket_ms        INTEGER NOT NULL,
    replicas         INTEGER NOT NULL,
    samples          INTEGER NOT NULL,
    hit_rate         REAL,
    ttft_p50_s       REAL,
    ttft_p95_s       REAL,
    queue_depth      REAL,
    throughput_tok_s REAL,
    load_n           INTEGER NOT NULL,
    load_mean        REAL,
    load_sq_mean     REAL,
    PRIMARY KEY (fleet_id, bucket_ms)
) WITHOUT ROWID;

-- How far each tier has been built: raw samples before done_until_ms are summarised.
CREATE TABLE downsample_progress (
    tier          TEXT    PRIMARY KEY,
    done_until_ms INTEGER NOT NULL
);

-- Routers the app pushes policies to. The admin token is never stored here: token_path
-- names a file only the user can read (mode 0600) that holds it.
CREATE TABLE routers (
    id         INTEGER PRIMARY KEY,
    fleet_id   INTEGER NOT NULL REFERENCES fleets (id),
    url        TEXT    NOT NULL UNIQUE,
    token_path TEXT
);

-- Every policy version ever created: the spec as written, when, by whom.
CREATE TABLE policy_versions (
    id         INTEGER PRIMARY KEY,
    fleet_id   INTEGER NOT NULL REFERENCES fleets (id),
    label      TEXT    NOT NULL UNIQUE,
    spec       TEXT    NOT NULL,
    created_ms INTEGER NOT NULL,
    author     TEXT    NOT NULL
);

-- The routers a version was meant for.
CREATE TABLE policy_targets (
    version_id INTEGER NOT NULL REFERENCES policy_versions (id),
    router_id  INTEGER NOT NULL REFERENCES routers (id),
    PRIMARY KEY (version_id, router_id)
) WITHOUT ROWID;

-- Each push of a version to a router and what came of it: ok with the version the router
-- then reported running (acked_label), or the error.
CREATE TABLE pushes (
    id          INTEGER PRIMARY KEY,
    version_id  INTEGER NOT NULL REFERENCES policy_versions (id),
    router_id   INTEGER NOT NULL REFERENCES routers (id),
    pushed_ms   INTEGER NOT NULL,
    ok          INTEGER NOT NULL CHECK (ok IN (0, 1)),
    acked_label TEXT,
    error       TEXT
);
CREATE INDEX pushes_by_time ON pushes (pushed_ms);

-- Operator notes and incidents, at a moment or over a span (end_ms).
CREATE TABLE annotations (
    id       INTEGER PRIMARY KEY,
    fleet_id INTEGER NOT NULL REFERENCES fleets (id),
    start_ms INTEGER NOT NULL,
    end_ms   INTEGER,
    kind     TEXT    NOT NULL CHECK (kind IN ('note', 'incident')),
    author   TEXT    NOT NULL,
    text     TEXT    NOT NULL
);
CREATE INDEX annotations_by_time ON annotations (start_ms);

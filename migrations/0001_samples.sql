-- Replicas and their scraped signals: the foundation of Fleetdeck's history.
-- Forward-only: never edit a migration that has shipped; add a new one.

-- A replica is identified by its metrics URL and the model it serves, so a restarted
-- replica keeps its history while a redeployed one (new model) starts afresh.
CREATE TABLE replicas (
    id            INTEGER PRIMARY KEY,
    url           TEXT    NOT NULL,
    model         TEXT    NOT NULL,
    first_seen_ms INTEGER NOT NULL,
    UNIQUE (url, model)
);

-- One row per good scrape. NULL means "not provided by this engine" (or no traffic in the
-- interval for rates and quantiles), which is not the same as zero.
CREATE TABLE samples (
    replica_id  INTEGER NOT NULL REFERENCES replicas (id),
    ts_ms       INTEGER NOT NULL,
    queue_depth REAL,
    running     REAL,
    kv_usage    REAL,
    hit_rate    REAL,
    ttft_p50_s  REAL,
    ttft_p95_s  REAL,
    PRIMARY KEY (replica_id, ts_ms)
) WITHOUT ROWID;

CREATE INDEX samples_by_time ON samples (ts_ms);

-- One status refresh for every process (`herald serve` and `herald api`
-- replicas): the process holding the lease takes the figures every
-- interval and stores them here, the others read them, so the aggregate
-- queries run once per interval rather than once per process. The lease
-- is compared with the database's clock, as relay claims are.
CREATE TABLE status_snapshot (
    id             INTEGER PRIMARY KEY,
    figures        TEXT,
    taken_at_ms    BIGINT NOT NULL,
    holder         TEXT,
    lease_until_ms BIGINT NOT NULL
);
INSERT INTO status_snapshot (id, figures, taken_at_ms, holder, lease_until_ms) VALUES (1, NULL, 0, NULL, 0);

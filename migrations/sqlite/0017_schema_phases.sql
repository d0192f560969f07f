-- phase: expand
-- Upgrades (issue 24): from this release on only `herald migrate` changes
-- the schema, and every role checks at start that it may run on what it
-- finds (herald-store's `schema`). A schema newer than a role is fine while
-- the migrations it does not know only expanded it; a contract migration
-- (one that drops or renames what an older release reads) records the
-- oldest schema version whose releases still run on it. Migrations 1-16
-- came before the rule: ARCHITECTURE.md, "Upgrades", lists their phases.
CREATE TABLE schema_phases (
    version      BIGINT PRIMARY KEY,
    phase        TEXT   NOT NULL CHECK (phase IN ('expand', 'contract')),
    readers_from BIGINT NOT NULL
);

-- Releases of schema 16 read nothing this adds.
INSERT INTO schema_phases (version, phase, readers_from) VALUES (17, 'expand', 16);

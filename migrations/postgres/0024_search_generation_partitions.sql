-- phase: expand
-- Search documents are partitioned by generation, so a rebuild can load a
-- new generation into a table of its own with its primary key only, build
-- the other indexes once over the loaded rows (about twice as cheap for
-- PostgreSQL as maintaining them row by row: BENCHMARKS.md, "Rebuild") and
-- attach it as the generation's partition (herald-projections'
-- `search::load`). Live traffic writes a generation being loaded into the
-- default partition; the attach merges those rows under the version guard.
--
-- `projection_generations.storage` names the table holding a generation's
-- rows once it has one, so live writes go there straight: routing each
-- statement through the partitioned parent costs PostgreSQL 8-19 % more
-- (BENCHMARKS.md, "Loaded, then indexed once"). Empty: write the parent.
--
-- The table as it was becomes the partition of the generations it holds
-- now (a one-time scan to check them); an empty default partition takes
-- any other. Older releases read and write the same `search_documents`
-- with the same statements; the indexes are the parent's, so every
-- partition has them.
DO $migration$
DECLARE
    held TEXT;
BEGIN
    SELECT string_agg(DISTINCT g::text, ', ') INTO held FROM (
        SELECT generation AS g FROM search_documents
        UNION SELECT generation FROM active_generations WHERE projection = 'search'
        UNION SELECT 1
    ) AS known;
    ALTER TABLE search_documents RENAME TO search_documents_legacy;
    ALTER INDEX search_documents_pkey RENAME TO search_documents_legacy_pkey;
    ALTER INDEX search_documents_by_caller RENAME TO search_documents_legacy_by_caller;
    ALTER INDEX search_documents_query_trgm RENAME TO search_documents_legacy_query_trgm;
    ALTER INDEX search_documents_tombstones RENAME TO search_documents_legacy_tombstones;
    CREATE TABLE search_documents (LIKE search_documents_legacy) PARTITION BY LIST (generation);
    ALTER TABLE search_documents ADD PRIMARY KEY (generation, job_id);
    CREATE INDEX search_documents_by_caller ON search_documents (generation, caller, completed_at_ms DESC);
    CREATE INDEX search_documents_query_trgm ON search_documents USING gin (lower(query) gin_trgm_ops)
        WITH (gin_pending_list_limit = 512);
    CREATE INDEX search_documents_tombstones ON search_documents (deleted_at_ms) WHERE deleted_at_ms IS NOT NULL;
    EXECUTE format('ALTER TABLE search_documents ATTACH PARTITION search_documents_legacy FOR VALUES IN (%s)', held);
    -- Made beside the parent, so its indexes have names of their own.
    CREATE TABLE search_documents_default (LIKE search_documents_legacy, PRIMARY KEY (generation, job_id));
    CREATE INDEX search_documents_default_by_caller ON search_documents_default (generation, caller, completed_at_ms DESC);
    CREATE INDEX search_documents_default_query_trgm ON search_documents_default USING gin (lower(query) gin_trgm_ops)
        WITH (gin_pending_list_limit = 512);
    CREATE INDEX search_documents_default_tombstones ON search_documents_default (deleted_at_ms)
        WHERE deleted_at_ms IS NOT NULL;
    ALTER TABLE search_documents ATTACH PARTITION search_documents_default DEFAULT;
    ALTER TABLE projection_generations ADD COLUMN storage TEXT;
    EXECUTE format('UPDATE projection_generations SET storage = %L WHERE projection = %L AND generation IN (%s)',
        'search_documents_legacy', 'search', held);
END
$migration$;
INSERT INTO schema_phases (version, phase, readers_from) VALUES (24, 'expand', 16);

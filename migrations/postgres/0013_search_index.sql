-- Search without a full scan of the generation.
--
-- `GET /v1/search` finds a caller's exports whose query contains a text,
-- case-insensitively: `lower(query) LIKE '%text%'`. A trigram GIN index on
-- `lower(query)` answers such a LIKE (three characters or more) from the
-- index; the btree on (generation, caller, completed_at_ms) serves the
-- caller scope and the newest-first order, alone for short texts, and with
-- the trigram index through a bitmap AND for long ones. pg_trgm is a
-- trusted extension: the database's owner may create it.
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX search_documents_by_caller ON search_documents (generation, caller, completed_at_ms DESC);
CREATE INDEX search_documents_query_trgm ON search_documents USING gin (lower(query) gin_trgm_ops);

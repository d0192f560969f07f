-- Deleted exports: the search projection keeps a tombstone per deleted job
-- (deleted_at_ms set, other fields blanked) carrying the business version, so
-- an older `completed` delivered after the delete never brings the document
-- back. Reads skip tombstones.
ALTER TABLE search_documents ADD COLUMN deleted_at_ms BIGINT;

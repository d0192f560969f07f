-- Search without a full scan of the generation.
--
-- An FTS5 index of every document's query with the trigram tokenizer
-- (case-insensitive), kept by triggers in the same transactions as the
-- documents: a search for three characters or more reads the matching rows'
-- ids from it, then applies the exact `lower(query) LIKE` to them. It
-- indexes `search_documents` by rowid (external content), and `VACUUM` may
-- renumber those: after a VACUUM, run
--   INSERT INTO search_fts(search_fts) VALUES ('rebuild');
CREATE INDEX search_documents_by_caller ON search_documents (generation, caller, completed_at_ms DESC);
CREATE VIRTUAL TABLE search_fts USING fts5(
    query, content = 'search_documents', content_rowid = 'rowid', tokenize = 'trigram case_sensitive 0'
);
INSERT INTO search_fts (rowid, query) SELECT rowid, query FROM search_documents;
CREATE TRIGGER search_fts_after_insert AFTER INSERT ON search_documents BEGIN
    INSERT INTO search_fts (rowid, query) VALUES (new.rowid, new.query);
END;
CREATE TRIGGER search_fts_after_delete AFTER DELETE ON search_documents BEGIN
    INSERT INTO search_fts (search_fts, rowid, query) VALUES ('delete', old.rowid, old.query);
END;
CREATE TRIGGER search_fts_after_update AFTER UPDATE OF query ON search_documents BEGIN
    INSERT INTO search_fts (search_fts, rowid, query) VALUES ('delete', old.rowid, old.query);
    INSERT INTO search_fts (rowid, query) VALUES (new.rowid, new.query);
END;

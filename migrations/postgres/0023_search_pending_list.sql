-- phase: expand
-- The trigram GIN defers its insertions into a pending list, and the insert
-- that finds the list over its limit merges all of it into the index before
-- its statement returns. At the server's default of 4 MB that is about
-- 10,000 documents' trigrams: at 10,000 events/s one search transaction a
-- second waited 100-370 ms for the merge (BENCHMARKS.md, "Latency", "The
-- search insert's stalls"). 512 kB merges an eighth as much eight times as
-- often: no insert over 100 ms at the same load. Older releases write the
-- same index and are unaffected.
ALTER INDEX search_documents_query_trgm SET (gin_pending_list_limit = 512);
INSERT INTO schema_phases (version, phase, readers_from) VALUES (23, 'expand', 16);

-- phase: expand
-- PostgreSQL's trigram index gets a smaller pending list (its 0023); SQLite
-- has no such index. The version is shipped by both dialects alike.
INSERT INTO schema_phases (version, phase, readers_from) VALUES (23, 'expand', 16);

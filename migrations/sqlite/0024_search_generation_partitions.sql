-- phase: expand
-- PostgreSQL partitions search documents by generation (its 0024); SQLite
-- has no partitions and keeps one table. The version is shipped by both
-- dialects alike.
INSERT INTO schema_phases (version, phase, readers_from) VALUES (24, 'expand', 16);

-- phase: expand
-- PostgreSQL partitions search documents by generation (its 0024); SQLite
-- has no partitions and keeps one table. Both dialects gain
-- `projection_generations.storage` (the table holding a generation's rows,
-- when its projection keeps one per generation; never set on SQLite), so
-- the engine reads generations with one statement on both.
ALTER TABLE projection_generations ADD COLUMN storage TEXT;
INSERT INTO schema_phases (version, phase, readers_from) VALUES (24, 'expand', 16);

-- phase: expand
-- PostgreSQL's outbox trigger now notifies the slice written (see
-- migrations/postgres/0019_notify_by_slice.sql); SQLite has no
-- notifications, so only the version moves, keeping both dialects in step.
INSERT INTO schema_phases (version, phase, readers_from) VALUES (19, 'expand', 18);

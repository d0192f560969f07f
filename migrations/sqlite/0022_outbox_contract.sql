-- phase: expand
-- The public outbox contract (issue 23): what an application's own INSERT
-- sets beside Herald's columns (docs/outbox-contract.md). content_type: the
-- data's media type (application/avro, application/json); existing rows are
-- Avro. extensions: CloudEvents extension attributes as a JSON object of
-- strings. An empty topic means "route by the relay's configuration".
ALTER TABLE outbox ADD COLUMN content_type TEXT NOT NULL DEFAULT 'application/avro';
ALTER TABLE outbox ADD COLUMN extensions TEXT;
INSERT INTO schema_phases (version, phase, readers_from) VALUES (22, 'expand', 16);
